"""Kubeflow Notebooks governed at submit, through the real API server (issue 30).

The Notebook CRD here is a minimal structural one with the real group, kind, plural and versions
(kubeflow/notebooks v1.11.0 components/notebook-controller/config/crd/bases/
kubeflow.org_notebooks.yaml: v1 stored, v1beta1 and v1alpha1 served, conversion None) and the
real shape of ``spec.template``, which holds only ``spec`` (api/v1/notebook_types.go), so the
API server prunes a template's metadata as it does with the real CRD; the pod spec itself keeps
any field. The notebook controller's module is not on the Go module proxy (docs/jobs.md), so hack/build-tools.sh
cannot build it and these tests build the pod from the stored Notebook as the controller does.
With ``NOTEBOOK_CONTROLLER`` naming a notebook-controller binary (built from kubeflow/notebooks
v1.11.0 ``components/notebook-controller``), the last test runs it, with kube-controller-manager's
StatefulSet controller, and holds the real pod to the prediction.
"""

from __future__ import annotations

import copy
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.controllermanager import running_controller_manager
from gpuwarden.lab.cluster.controlplane import free_ports
from gpuwarden.lab.cluster.gpuwardenserver import POLICIES_DIR, wait_for
from gpuwarden.lab.cluster.webhookstack import (
    KUBEFLOW_PROFILE_LABELS,
    SERVER_SET_METADATA,
    Obj,
    WebhookStack,
    api_defaults,
    create_pod,
    parse_warning,
)
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.pod.jobs import notebooks
from gpuwarden.policy.render.scope import job_needs_review

from .controlplane import REPO_ROOT, ControlPlane, Tools
from .test_jobs import keeping_crd, predicted
from .test_jobs_operator import MUTATION_AUDIT, contained, predicted_pods
from .webhook import AuditLog, api_error, serve_crd, webhook_audit

GROUP, PLURAL = "kubeflow.org", "notebooks"
VERSIONS = ("v1", "v1beta1", "v1alpha1")
NOTEBOOK_FILE = REPO_ROOT / "examples" / "jobs" / "notebook.yaml"
GITOPS_POLICY = Path(__file__).parent / "policies" / "01-e2e-gitops.yaml"


def notebook_crd() -> Obj:
    """kubeflow.org's Notebook, stored at v1; its pod template's spec keeps any fields."""
    keep = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    template = {"type": "object", "properties": {"spec": keep}}
    spec = {"type": "object", "properties": {"template": template}}
    return keeping_crd("Notebook", PLURAL, VERSIONS, stored="v1", spec=spec)


@pytest.fixture(scope="module")
def gpuwarden_policies() -> Sequence[Path]:
    return (GITOPS_POLICY, POLICIES_DIR)


@pytest.fixture(scope="module")
def objects(gpuwarden: WebhookStack) -> Iterator[k8s_client.CustomObjectsApi]:
    """The Notebook CRD, established and served at every version."""
    api = serve_crd(gpuwarden.api, notebook_crd())
    yield api
    for nb in api.list_cluster_custom_object(GROUP, "v1", PLURAL)["items"]:
        meta = nb["metadata"]
        api.delete_namespaced_custom_object(GROUP, "v1", meta["namespace"], PLURAL, meta["name"])


def notebook_in(namespace: str, *, gpus: str = "1", version: str = "v1") -> Obj:
    nb: Obj = yaml.safe_load(NOTEBOOK_FILE.read_text())
    nb["apiVersion"] = f"{GROUP}/{version}"
    nb["metadata"]["namespace"] = namespace
    nb["metadata"]["name"] = f"nb-{uuid.uuid4().hex[:6]}"
    container = nb["spec"]["template"]["spec"]["containers"][0]
    container["name"] = nb["metadata"]["name"]
    container["resources"]["limits"]["nvidia.com/gpu"] = gpus
    return nb


def create(objects: k8s_client.CustomObjectsApi, nb: Obj) -> tuple[Obj, tuple[str, ...]]:
    """POST the Notebook at its version; the stored object and the response's warnings."""
    version = nb["apiVersion"].rpartition("/")[2]
    response: Any = objects.create_namespaced_custom_object(
        GROUP, version, nb["metadata"]["namespace"], PLURAL, nb, _preload_content=False
    )
    warnings = tuple(parse_warning(h) for h in response.headers.getlist("Warning"))
    return json.loads(response.data), warnings


def exists(objects: k8s_client.CustomObjectsApi, namespace: str, name: str) -> bool:
    try:
        objects.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_an_over_limit_notebook_is_refused_at_submit(
    gpuwarden: WebhookStack, objects: k8s_client.CustomObjectsApi, version: str
) -> None:
    """tenant-b allows 2 GPUs a pod: a Notebook asking 8 is never stored, at any served version
    (the job webhooks' rules name v1; matchPolicy Equivalent sends v1beta1 converted)."""
    ns = gpuwarden.tenant_namespace(name="tenant-b")
    nb = notebook_in(ns, gpus="8", version=version)
    with pytest.raises(ApiException) as refused:
        create(objects, nb)
    status, text = api_error(refused.value)
    assert status == 403
    assert 'admission webhook "validate-jobs.gpuwarden.io" denied the request: Notebook: ' in text
    assert "tenant tenant-b allows at most 2 per pod" in text
    assert text.endswith(predicted(gpuwarden, nb).validation.message)
    assert not exists(objects, ns, nb["metadata"]["name"])


def test_an_allowed_notebook_is_stored_as_its_pod_will_be(
    gpuwarden: WebhookStack, objects: k8s_client.CustomObjectsApi
) -> None:
    """Stored with exactly what `gpuwarden apply` predicts: the template's spec mutated, the
    pod's annotations on the Notebook (the controller copies them onto the pod); the pod the
    controller builds from it passes the pod webhooks unchanged. Then the culler stops it: the
    update is let through and nothing is patched again."""
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    nb = notebook_in(ns)
    stored, warnings = create(objects, nb)
    expected = predicted(gpuwarden, nb)
    assert expected.allowed
    assert stored["spec"] == expected.pod["spec"]
    assert stored["metadata"]["annotations"] == expected.pod["metadata"]["annotations"]
    assert stored["metadata"]["annotations"]["gpuwarden.io/profile"] == "notebook"
    assert stored["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    assert "gpuwarden: Notebook: profile notebook via rule/notebooks (tenant tenant-a)" in (
        warnings
    )
    (replica,) = jobs.replica_templates(stored)
    pod = jobs.replica_pod(stored, replica, ns)
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": stored["metadata"]["name"],
            "uid": str(uuid.uuid4()),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    created = create_pod(gpuwarden.api, pod, dry_run=True).pod
    for key in SERVER_SET_METADATA:
        created["metadata"].pop(key, None)
    created.pop("status", None)
    assert created == api_defaults(gpuwarden.api, pod)

    name = stored["metadata"]["name"]
    before = gpuwarden.server.requests_answered(endpoint="mutate")
    stop = {"metadata": {"annotations": {notebooks.STOP_ANNOTATION: "2026-12-04T23:00:00Z"}}}
    stopped: Any = objects.patch_namespaced_custom_object(GROUP, "v1", ns, PLURAL, name, stop)
    assert gpuwarden.server.requests_answered(endpoint="mutate") == before + 1  # sent, judged not
    assert stopped["spec"] == stored["spec"]
    assert stopped["metadata"]["annotations"] == {
        **stored["metadata"]["annotations"],
        notebooks.STOP_ANNOTATION: "2026-12-04T23:00:00Z",
    }
    start = {"metadata": {"annotations": {notebooks.STOP_ANNOTATION: None}}}
    started: Any = objects.patch_namespaced_custom_object(GROUP, "v1", ns, PLURAL, name, start)
    assert started["spec"] == stored["spec"]
    assert started["metadata"]["annotations"] == stored["metadata"]["annotations"]


def test_validate_only_keeps_the_notebook_as_written(
    gpuwarden: WebhookStack, objects: k8s_client.CustomObjectsApi
) -> None:
    ns = gpuwarden.tenant_namespace(
        "e2e-gitops", {**KUBEFLOW_PROFILE_LABELS, "e2e.gpuwarden.io/tenant": "gitops"}
    )
    nb = notebook_in(ns)
    stored, warnings = create(objects, copy.deepcopy(nb))
    assert stored["spec"] == nb["spec"]
    assert stored["metadata"]["labels"] == nb["metadata"]["labels"]
    assert stored["metadata"]["annotations"] == nb["metadata"]["annotations"]
    assert any(w.startswith("gpuwarden: the Notebook is kept as written") for w in warnings)
    with pytest.raises(ApiException) as refused:
        create(objects, notebook_in(ns, gpus="8"))
    assert (
        "denied the request: Notebook: gpuwarden denied the pod: " in (api_error(refused.value)[1])
    )


def test_the_api_server_sends_the_notebooks_the_twin_says(
    gpuwarden: WebhookStack, objects: k8s_client.CustomObjectsApi
) -> None:
    """The chart's CEL against its Python twin: a CPU Notebook is never sent; a GPU one is, and
    so is a CPU one whose own metadata (the pod's) carries gpuwarden's keys."""
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    cpu = notebook_in(ns)
    cpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    marked = copy.deepcopy(cpu)
    marked["metadata"]["name"] += "-marked"
    marked["metadata"]["labels"]["gpuwarden.io/profile"] = "light-training"
    for nb, sent in ((cpu, False), (notebook_in(ns), True), (marked, True)):
        assert job_needs_review(nb) is sent
        before = gpuwarden.server.requests_answered(endpoint="mutate")
        create(objects, nb)
        after = gpuwarden.server.requests_answered(endpoint="mutate")
        assert after - before == (1 if sent else 0), nb["metadata"]["name"]


NOTEBOOK_CONTROLLER = os.environ.get("NOTEBOOK_CONTROLLER")


@pytest.fixture(scope="module")
def notebook_controller(
    control_plane: ControlPlane, e2e_tools: Tools, objects: k8s_client.CustomObjectsApi
) -> Iterator[None]:
    """The notebook controller (off-cluster, Istio off, no culling) and the StatefulSet
    controller that makes its pod."""
    if not NOTEBOOK_CONTROLLER:
        pytest.skip("NOTEBOOK_CONTROLLER names no notebook-controller binary")
    metrics, probe = free_ports(2)
    argv = [
        NOTEBOOK_CONTROLLER,
        f"--kubeconfig={control_plane.kubeconfig_path}",
        f"--metrics-addr=127.0.0.1:{metrics}",
        f"--probe-addr=127.0.0.1:{probe}",
    ]
    process = control_plane.spawn("notebook-controller", argv)

    def healthy() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{probe}/healthz", timeout=5) as answer:
            return bool(answer.status == 200)

    with running_controller_manager(control_plane, e2e_tools, ("statefulset-controller",)):
        control_plane.poll("the notebook controller", healthy, [process], time.monotonic() + 60)
        yield
        process.terminate(control_plane.stop_timeout)


def test_the_notebook_controllers_pod_is_what_apply_predicted(
    gpuwarden: WebhookStack,
    objects: k8s_client.CustomObjectsApi,
    notebook_controller: None,
    audit_log: AuditLog,
    tmp_path: Path,
) -> None:
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    nb = notebook_in(ns)
    name = nb["metadata"]["name"]
    (expected,) = predicted_pods(nb, gpuwarden, tmp_path).values()
    assert expected["metadata"]["name"] == f"{name}-0"
    create(objects, nb)
    core: Any = k8s_client.CoreV1Api(gpuwarden.api)

    def the_pod() -> Obj | None:
        response: Any = core.list_namespaced_pod(
            ns, label_selector=f"{notebooks.NOTEBOOK_NAME_LABEL}={name}", _preload_content=False
        )
        items = json.loads(response.data)["items"]
        return {"apiVersion": "v1", "kind": "Pod", **items[0]} if items else None

    real = wait_for(f"the pod of Notebook {name}", the_pod, timeout=60)
    assert contained(expected, real) == []
    # The API server's record: gpuwarden's pod webhook was called and changed nothing.
    rounds = webhook_audit(audit_log.pod_creation(ns, f"{name}-0"), MUTATION_AUDIT)
    ours = [r for r in rounds.values() if r.get("webhook") == "mutate.gpuwarden.io"]
    assert [r["mutated"] for r in ours] == [False]
    # Stopped as the culler and the idle rule stop it: let through, and the controller scales
    # the StatefulSet to zero; started again, back to one.
    apps: Any = k8s_client.AppsV1Api(gpuwarden.api)
    for value, replicas in (("2026-12-05T00:00:00Z", 0), (None, 1)):
        stop = {"metadata": {"annotations": {notebooks.STOP_ANNOTATION: value}}}
        objects.patch_namespaced_custom_object(GROUP, "v1", ns, PLURAL, name, stop)

        def scaled(want: int = replicas) -> bool:
            return bool(apps.read_namespaced_stateful_set(name, ns).spec.replicas == want)

        wait_for(f"the StatefulSet of {name} at {replicas} replicas", scaled, timeout=30)
