"""Pods as Kubeflow's controllers create them, by workload kind: the labels and annotations the
real controllers set (the same evidence gpuwarden.policy.pod.workloads reads) and the container
that asks for GPUs. The lab and `gpuwarden simulate` create these pods; gpuwarden's webhook
then decides what each one gets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from gpuwarden.lab.cluster.nodes import SHARED_PRODUCT_SUFFIX
from gpuwarden.lab.cluster.stages import COMPLETE_AFTER, go_duration

WorkloadKind = Literal[
    "kfp-step", "training-job", "trainjob", "katib-trial", "notebook", "kserve-predictor"
]
WORKLOAD_KINDS: tuple[str, ...] = get_args(WorkloadKind)
_IMAGE = "registry.invalid/gpuwarden-lab/workload:latest"  # never pulled: KWOK runs nothing
_NAME_UNSAFE = re.compile(r"[^a-z0-9-]+")


def dns_label(text: str, limit: int = 40) -> str:
    """``text`` as the start of an object name (lower case, dashes, no leading/trailing dash)."""
    return _NAME_UNSAFE.sub("-", text.lower()).strip("-")[:limit].strip("-") or "w"


def _metadata(kind: str, workload: str) -> tuple[dict[str, str], dict[str, str], str]:
    """(labels, annotations, GPU container name) the controller of ``kind`` gives its pods."""
    if kind == "kfp-step":
        workflow = f"{workload}-run"
        return (
            {
                "pipelines.kubeflow.org/v2_component": "true",
                "workflows.argoproj.io/workflow": workflow,
            },
            {
                "pipelines.kubeflow.org/v2_component": "true",
                "workflows.argoproj.io/node-name": f"{workflow}.root.{workload}.executor",
            },
            "main",
        )
    if kind == "training-job":
        return (
            {
                "training.kubeflow.org/job-name": workload,
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
            },
            {},
            "pytorch",
        )
    if kind == "trainjob":
        return (
            {
                "jobset.sigs.k8s.io/jobset-name": workload,
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
            },
            {},
            "node",
        )
    if kind == "katib-trial":
        return (
            {
                "katib.kubeflow.org/experiment": workload,
                "katib.kubeflow.org/trial": f"{workload}-t",
            },
            {},
            "training-container",
        )
    if kind == "notebook":
        return ({"notebook-name": workload, "statefulset": workload}, {}, workload)
    if kind == "kserve-predictor":
        return (
            {"serving.kserve.io/inferenceservice": workload, "component": "predictor"},
            {},
            "kserve-container",
        )
    raise ValueError(f"unknown workload kind {kind!r}; one of {', '.join(WORKLOAD_KINDS)}")


def workload_pod(
    kind: str,
    *,
    name: str,
    namespace: str,
    workload: str,
    gpus: int,
    labels: Mapping[str, str] | None = None,
    runs_for: float | None = None,
    products: Sequence[str] = (),
) -> dict[str, Any]:
    """A pod of ``kind`` for ``workload`` (task, job, trial, notebook or service name) whose GPU
    container asks for ``gpus`` whole GPUs; it completes ``runs_for`` seconds after it started
    running (never, when None). ``products`` are the GPU Feature Discovery products it may run
    on (any, when empty), as a required node affinity that also names each product's
    ``-SHARED`` form, which GFD labels a shared node with where its replicas are not renamed
    (a renamed one keeps the plain product)."""
    kind_labels, annotations, container = _metadata(kind, dns_label(workload))
    if runs_for is not None:
        annotations[COMPLETE_AFTER] = go_duration(runs_for)
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec: dict[str, Any] = {
        # Servers restart; jobs, steps and trials run once.
        "restartPolicy": "Always" if kind in ("notebook", "kserve-predictor") else "Never",
        "containers": [{"name": container, "image": _IMAGE, "resources": resources}],
    }
    if products:
        values = [
            name for product in products for name in (product, product + SHARED_PRODUCT_SUFFIX)
        ]
        term = {"key": "nvidia.com/gpu.product", "operator": "In", "values": values}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [term]}]
                }
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**kind_labels, **dict(labels or {})},
            "annotations": annotations,
        },
        "spec": spec,
    }
