"""Shared helpers for the policy-core tests: example pods, requests, and applying patches."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    Decision,
    PolicySet,
    load_texts,
    mutate,
)

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
EXAMPLES = REPO / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
NAMESPACES_FILE = EXAMPLES / "namespaces.yaml"
EXAMPLE_PODS = sorted(p for p in EXAMPLES.glob("*.yaml") if p != NAMESPACES_FILE)


#: The quota keys of the default gpuDeviceClasses, rendered at 0 for a tenant that may not use DRA
#: (issue 29 item 3): the API server's backstop for the webhook's denial.
NO_DRA_GPUS = {
    f"requests.deviceclass.resource.kubernetes.io/{name}": "0"
    for name in ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
}


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def example(name: str) -> dict[str, Any]:
    """An example pod by file stem, e.g. ``kfp-train-step``."""
    pod: dict[str, Any] = read_yaml(EXAMPLES / f"{name}.yaml")
    return pod


def namespace_labels() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for doc in yaml.safe_load_all(NAMESPACES_FILE.read_text(encoding="utf-8")):
        out[doc["metadata"]["name"]] = dict(doc["metadata"].get("labels") or {})
    return out


def create(
    pod: Mapping[str, Any], namespace: str | None = None, **changes: Any
) -> AdmissionRequest:
    """A CREATE request for the pod, in its own namespace unless one is given."""
    ns = namespace or str((pod.get("metadata") or {}).get("namespace") or "default")
    return AdmissionRequest(operation="CREATE", namespace=ns, pod=pod, **changes)


def apply_ops(pod: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
    """The pod with the decision's patch applied by an independent RFC 6902 implementation."""
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(dict(pod)), list(decision.patch))
    return result


def mutated(
    pod: Mapping[str, Any],
    policies: PolicySet,
    cluster: ClusterView,
    namespace: str | None = None,
) -> dict[str, Any]:
    return apply_ops(pod, mutate(create(pod, namespace), policies, cluster))


def policy_text(spec: str, name: str = "test") -> str:
    """A GPUPolicy document around an indented YAML ``spec`` body."""
    body = "\n".join("  " + line for line in spec.strip("\n").splitlines())
    return (
        f"apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata:\n  name: {name}\n"
        f"spec:\n{body}\n"
    )


def policies_from(spec: str) -> PolicySet:
    return load_texts([("test.yaml", policy_text(spec))])


def gpu_pod(
    name: str = "job",
    namespace: str = "team",
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    gpus: str | None = "1",
    container: str = "main",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A plain pod with one container, asking for ``gpus`` nvidia.com/gpu when given."""
    body: dict[str, Any] = {"name": container, "image": "pytorch/pytorch:2.4.1"}
    if gpus is not None:
        body["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    body.update(extra or {})
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [body]}}


def container(pod: Mapping[str, Any], name: str) -> dict[str, Any]:
    for field in ("containers", "initContainers", "ephemeralContainers"):
        for body in pod["spec"].get(field) or []:
            if body.get("name") == name:
                found: dict[str, Any] = body
                return found
    raise KeyError(name)
