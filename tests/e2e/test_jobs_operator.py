"""The real Training Operator v1.8.1 creates a PyTorchJob's pods from the templates gpuwarden
mutated at submit (issue 30): each pod is what `gpuwarden apply -o pods` predicted for the job,
field for field, and the pod webhook finds nothing left to change on it.

The operator is built by hack/build-tools.sh and runs off-cluster
(gpuwarden/lab/cluster/trainingoperator.py) with its own CRD from its Go module.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from gpuwarden.cli import main
from gpuwarden.lab.cluster.gpuwardenserver import wait_for
from gpuwarden.lab.cluster.trainingoperator import TrainingOperator, delete_jobs
from gpuwarden.lab.cluster.webhookstack import Obj, WebhookStack
from gpuwarden.policy.pod.jobs import trainingoperator
from gpuwarden.policy.pod.quantity import parse_quantity

from .controlplane import REPO_ROOT, ControlPlane, Tools
from .webhook import AuditLog, webhook_audit

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
JOB_FILE = REPO_ROOT / "examples" / "jobs" / "pytorchjob.yaml"
MUTATION_AUDIT = "mutation.webhook.admission.k8s.io"


@pytest.fixture(scope="module")
def training_operator(
    control_plane: ControlPlane, e2e_tools: Tools, gpuwarden: WebhookStack
) -> Iterator[TrainingOperator]:
    """The operator's manager, its PyTorchJob controller only, after gpuwarden's webhooks."""
    assert e2e_tools.training_operator is not None, "hack/build-tools.sh builds it"
    operator = TrainingOperator(control_plane, e2e_tools.training_operator)
    operator.start()
    yield operator
    operator.stop()
    delete_jobs(gpuwarden.api)


def contained(predicted: Any, real: Any, where: str = "") -> list[str]:
    """Where ``real`` lacks or differs from a field ``predicted`` has (lists of named objects
    matched by name, resource quantities compared as numbers): what the controller and the API
    server add is allowed, nothing predicted may be missing or different."""
    if isinstance(predicted, Mapping):
        if not isinstance(real, Mapping):
            return [f"{where}: {real!r} is not an object"]
        out = []
        for key, value in predicted.items():
            if key not in real:
                out.append(f"{where}.{key}: missing")
            elif where.endswith((".requests", ".limits")):
                if parse_quantity(str(value)) != parse_quantity(str(real[key])):
                    out.append(f"{where}.{key}: {real[key]!r} != {value!r}")
            else:
                out += contained(value, real[key], f"{where}.{key}")
        return out
    if isinstance(predicted, list) and all(
        isinstance(i, Mapping) and "name" in i for i in predicted
    ):
        by_name = {i.get("name"): i for i in real if isinstance(i, Mapping)}
        out = []
        for item in predicted:
            found = by_name.get(item["name"])
            if found is None:
                out.append(f"{where}[{item['name']}]: missing")
            else:
                out += contained(item, found, f"{where}[{item['name']}]")
        return out
    return [] if predicted == real else [f"{where}: {real!r} != {predicted!r}"]


def predicted_pods(job: Obj, gpuwarden: WebhookStack, workdir: Path) -> dict[str, Obj]:
    """`gpuwarden apply -o pods` on the job, with the namespace as the cluster has it."""
    namespace = job["metadata"]["namespace"]
    (workdir / "job.yaml").write_text(yaml.safe_dump(job))
    labels = gpuwarden.namespace_labels(namespace)
    ns = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": labels},
    }
    (workdir / "ns.yaml").write_text(yaml.safe_dump(ns))
    policies = [str(p) for p in gpuwarden.server.policies]
    argv = [
        "apply",
        *(f"--policies={p}" for p in policies),
        "--namespaces",
        str(workdir / "ns.yaml"),
    ]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
        assert main([*argv, "-o", "pods", str(workdir / "job.yaml")]) == 0
    return {p["metadata"]["name"]: p for p in yaml.safe_load_all(buffer.getvalue())}


def test_the_operators_pods_are_what_apply_predicted(
    gpuwarden: WebhookStack,
    training_operator: TrainingOperator,
    audit_log: AuditLog,
    tmp_path: Path,
) -> None:
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    job: Obj = yaml.safe_load(JOB_FILE.read_text())
    job["metadata"]["namespace"] = ns
    job["metadata"]["name"] = name = f"bert-{uuid.uuid4().hex[:6]}"
    predicted = predicted_pods(job, gpuwarden, tmp_path)
    assert sorted(predicted) == [f"{name}-master-0", f"{name}-worker-0"]
    objects = k8s_client.CustomObjectsApi(gpuwarden.api)
    objects.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job)
    core = k8s_client.CoreV1Api(gpuwarden.api)
    selector = f"{trainingoperator.JOB_NAME_LABEL}={name}"

    def all_pods() -> dict[str, Obj] | None:
        response: Any = core.list_namespaced_pod(
            ns, label_selector=selector, _preload_content=False
        )
        # A list's items carry no apiVersion and kind: the list has them.
        items = [
            {"apiVersion": "v1", "kind": "Pod", **p} for p in json.loads(response.data)["items"]
        ]
        return {p["metadata"]["name"]: p for p in items} if len(items) == 3 else None

    pods = wait_for(f"the operator's 3 pods of {name}", all_pods, timeout=60)
    assert sorted(pods) == [f"{name}-master-0", f"{name}-worker-0", f"{name}-worker-1"]
    for pod_name, expected in predicted.items():
        real = pods[pod_name]
        assert contained(expected, real) == [], pod_name
        # What the controller adds on its own asks for no GPU (PyTorch's init-pytorch).
        added = [
            c
            for c in real["spec"].get("initContainers") or []
            if c["name"] not in {i["name"] for i in expected["spec"].get("initContainers") or []}
        ]
        for container in added:
            assert not any(
                "gpu" in k for k in (container.get("resources") or {}).get("limits") or {}
            )
        # The API server's record: gpuwarden's pod webhook was called and changed nothing.
        event = audit_log.pod_creation(ns, pod_name)
        rounds = webhook_audit(event, MUTATION_AUDIT)
        ours = [r for r in rounds.values() if r.get("webhook") == "mutate.gpuwarden.io"]
        assert [r["mutated"] for r in ours] == [False], pod_name
    # worker-1 differs from worker-0 only in its index and name.
    one, zero = pods[f"{name}-worker-1"], pods[f"{name}-worker-0"]
    assert one["metadata"]["annotations"] == zero["metadata"]["annotations"]
    assert one["metadata"]["labels"][trainingoperator.REPLICA_INDEX_LABEL] == "1"
