"""Recognise Kubeflow workloads from the labels and annotations their controllers really set.

Sources (upstream constants):
- Kubeflow Pipelines v2 on Argo: every pod of a v2 run carries ``pipelines.kubeflow.org/v2_component``
  (label and annotation, from the workflow's podMetadata) and Argo's ``workflows.argoproj.io/workflow``
  label and ``workflows.argoproj.io/node-name`` annotation. User code runs in the Argo template
  ``system-container-impl`` (pod name ``<wf>-system-container-impl-<hash>``, or a ``retry-`` /
  ``metadata-N-M-`` variant) in the container ``main``; its node name is
  ``<wf>.root[.<sub-dag>...].<task>.executor``. Drivers (``system-container-driver``,
  ``system-dag-driver``, node ``...<task>-driver``) and importers (``system-importer``) are not user code.
- Training Operator v1: ``training.kubeflow.org/job-name``, ``/replica-type`` (lower case), ``/replica-index``,
  ``/operator-name`` (e.g. ``pytorchjob-controller``).
- Trainer v2: JobSet's ``jobset.sigs.k8s.io/jobset-name`` and ``jobset.sigs.k8s.io/replicatedjob-name``
  (``node``, ``dataset-initializer``, ``model-initializer``, ``launcher``); trainer container ``node``.
- Katib: ``katib.kubeflow.org/trial`` and ``katib.kubeflow.org/experiment``, which Katib's own pod webhook
  copies onto trial pods. That webhook may run after ours: the chart sets ``reinvocationPolicy:
  IfNeeded``, so the API server calls gpuwarden again once the labels are there.
- Notebooks: ``notebook-name`` and ``statefulset`` labels (pod owned by the Notebook's StatefulSet).
- KServe: ``serving.kserve.io/inferenceservice`` and ``component: predictor``; container ``kserve-container``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuwarden.policy.resources import annotations_of, labels_of, metadata_of

KFP_V2_COMPONENT = "pipelines.kubeflow.org/v2_component"
ARGO_WORKFLOW = "workflows.argoproj.io/workflow"
ARGO_NODE_NAME = "workflows.argoproj.io/node-name"
TRAINING_JOB_NAME = "training.kubeflow.org/job-name"
TRAINING_REPLICA_TYPE = "training.kubeflow.org/replica-type"
TRAINING_OPERATOR_NAME = "training.kubeflow.org/operator-name"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
KATIB_TRIAL = "katib.kubeflow.org/trial"
KATIB_EXPERIMENT = "katib.kubeflow.org/experiment"
NOTEBOOK_NAME = "notebook-name"
KSERVE_ISVC = "serving.kserve.io/inferenceservice"
KSERVE_COMPONENT = "component"

WorkloadKind = Literal[
    "kfp-step",
    "kfp-system",
    "training-job",
    "trainjob",
    "katib-trial",
    "notebook",
    "kserve-predictor",
]

# Default container per Training Operator job kind (upstream *DefaultContainerName constants).
_TRAINING_CONTAINERS = {
    "pytorchjob": "pytorch",
    "tfjob": "tensorflow",
    "mpijob": "mpi",
    "xgboostjob": "xgboost",
    "paddlejob": "paddle",
    "jaxjob": "jax",
}
# Sidecars that never get a GPU by default.
SIDECARS = frozenset(
    {"istio-proxy", "metrics-logger-and-collector", "metrics-collector", "wait", "queue-proxy"}
)
_KFP_SYSTEM_TEMPLATE = re.compile(r"-system-(container-driver|dag-driver|importer)(-|$)")
_KFP_IMPL_TEMPLATE = re.compile(r"-system-container-impl-")
_EXECUTOR_NODE = re.compile(r"^executor(\(\d+\))?$")


@dataclass(frozen=True)
class Workload:
    """What a pod is, as far as its own metadata tells."""

    kind: WorkloadKind
    name: str | None  # task, job, trainjob, trial, notebook or inference service name
    detail: str | None = None  # replica type, replicated job, experiment or component
    container: str | None = None  # the controller's main container, when it has a fixed name
    evidence: str = ""

    def describe(self) -> str:
        parts: list[str] = [self.kind]
        if self.name:
            parts.append(self.name)
        if self.detail:
            parts.append(f"({self.detail})")
        return " ".join(parts)


def _kfp(
    meta_labels: Mapping[str, str], annotations: Mapping[str, str], pod_name: str
) -> Workload | None:
    if KFP_V2_COMPONENT not in meta_labels and KFP_V2_COMPONENT not in annotations:
        return None
    node_name = annotations.get(ARGO_NODE_NAME, "")
    segments = node_name.split(".") if node_name else []
    last = segments[-1] if segments else ""
    evidence = f"{KFP_V2_COMPONENT} label, node {node_name or '?'}"
    if _EXECUTOR_NODE.match(last) or _KFP_IMPL_TEMPLATE.search(pod_name):
        task = segments[-2] if _EXECUTOR_NODE.match(last) and len(segments) >= 2 else None
        return Workload("kfp-step", task, container="main", evidence=evidence)
    if last.endswith("-driver") or last == "root" or _KFP_SYSTEM_TEMPLATE.search(pod_name):
        return Workload("kfp-system", last or None, evidence=evidence)
    # An importer's node is named after its task; it has no executor segment either.
    return Workload("kfp-system", last or None, detail="importer or unknown", evidence=evidence)


def identify(
    pod: Mapping[str, Any],
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Workload | None:
    """The Kubeflow workload this pod belongs to, or None for any other pod.

    ``labels`` and ``annotations`` save reading them again where the caller already has them.
    """
    labels = labels_of(pod) if labels is None else labels
    annotations = annotations_of(pod) if annotations is None else annotations
    pod_name = str(metadata_of(pod).get("name") or metadata_of(pod).get("generateName") or "")
    if KATIB_TRIAL in labels:
        # Trial pods are also Jobs, PyTorchJobs or KFP runs underneath: the trial wins.
        return Workload(
            "katib-trial",
            labels[KATIB_TRIAL],
            labels.get(KATIB_EXPERIMENT),
            evidence=f"{KATIB_TRIAL} label",
        )
    kfp = _kfp(labels, annotations, pod_name)
    if kfp is not None:
        return kfp
    if TRAINING_JOB_NAME in labels:
        operator = labels.get(TRAINING_OPERATOR_NAME, "")
        job_kind = operator.removesuffix("-controller")
        return Workload(
            "training-job",
            labels[TRAINING_JOB_NAME],
            labels.get(TRAINING_REPLICA_TYPE),
            container=_TRAINING_CONTAINERS.get(job_kind),
            evidence=f"{TRAINING_JOB_NAME} label",
        )
    if JOBSET_REPLICATED_JOB in labels:
        replicated = labels[JOBSET_REPLICATED_JOB]
        return Workload(
            "trainjob",
            labels.get(JOBSET_NAME),
            replicated,
            container="node" if replicated in ("node", "launcher") else replicated,
            evidence=f"{JOBSET_REPLICATED_JOB} label",
        )
    if KSERVE_ISVC in labels:
        component = labels.get(KSERVE_COMPONENT)
        if component in (None, "predictor"):
            return Workload(
                "kserve-predictor",
                labels[KSERVE_ISVC],
                "predictor",
                container="kserve-container",
                evidence=f"{KSERVE_ISVC} label",
            )
        return None
    if NOTEBOOK_NAME in labels:
        return Workload(
            "notebook",
            labels[NOTEBOOK_NAME],
            container=labels[NOTEBOOK_NAME],
            evidence=f"{NOTEBOOK_NAME} label",
        )
    return None
