"""Reading a Kubeflow job object: its replicas' pod templates and the pod each one's controller
creates from it.

Each family of kinds lives in its own module, citing its controller's source: the Training
Operator's v1 jobs (:mod:`.trainingoperator`), batch/v1 Jobs (:mod:`.batch`), Katib's Experiments
and trials (:mod:`.katib`), Kubeflow Notebooks (:mod:`.notebooks`), the Trainer's TrainJobs
(:mod:`.trainer`), KServe's InferenceServices and LLMInferenceServices (:mod:`.kserve`). This
module holds the registry and what callers use: which kind an object is, its replica templates,
and the pod a replica becomes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwarden.policy.pod.jobs import batch, katib, kserve, notebooks, trainer, trainingoperator
from gpuwarden.policy.pod.jobs.base import (
    JobKind,
    JobShapeError,
    ReplicaTemplate,
    TemplateSite,
    metadata_of,
)
from gpuwarden.policy.pod.jobs.trainingoperator import JOB_ROLE_LABEL

__all__ = [
    "ALL_KINDS",
    "BATCH_JOB",
    "CONTROLLER_LABELS",
    "EXPERIMENT",
    "TRAINING_OPERATOR_KINDS",
    "TRAINJOB",
    "JobKind",
    "JobShapeError",
    "ReplicaTemplate",
    "TemplateSite",
    "controller_labels",
    "distinct_indices",
    "is_job",
    "job_kind",
    "kept_as_written",
    "kind_for",
    "pod_name",
    "replica_pod",
    "replica_templates",
]

TRAINING_OPERATOR_KINDS: Mapping[str, trainingoperator.TrainingOperatorKind] = {
    k.kind: k for k in trainingoperator.KINDS
}
BATCH_JOB = batch.BATCH_JOB
EXPERIMENT = katib.EXPERIMENT
TRAINJOB = trainer.TRAINJOB
#: Every kind the job webhooks admit, in the order the chart's rules list them.
ALL_KINDS: tuple[JobKind, ...] = (
    *trainingoperator.KINDS,
    BATCH_JOB,
    EXPERIMENT,
    notebooks.NOTEBOOK,
    TRAINJOB,
    *kserve.KINDS,
)
_BY_API = {
    (f"{k.group}/{version}", k.kind): k
    for k in ALL_KINDS
    for version in (k.version, *k.also_served)
}
#: Labels a controller (or the API server) writes on the pods itself: a pod patch that touches
#: one has no twin in the template.
CONTROLLER_LABELS = frozenset(
    {
        trainingoperator.JOB_NAME_LABEL,
        trainingoperator.REPLICA_TYPE_LABEL,
        trainingoperator.REPLICA_INDEX_LABEL,
        trainingoperator.OPERATOR_NAME_LABEL,
        trainingoperator.JOB_ROLE_LABEL,
        *batch.JOB_LABELS,
        *batch.UID_LABELS,
        batch.INDEX_LABEL,
        katib.TRIAL_LABEL,
        *notebooks.LABELS,
        *trainer.JOBSET_LABELS,
        *kserve.CONTROLLER_LABELS,
    }
)


def job_kind(obj: Mapping[str, Any]) -> JobKind | None:
    """The kind of job ``obj`` is, by apiVersion and kind, or None for anything else (a Training
    Operator kind may leave out its apiVersion)."""
    kind = obj.get("kind")
    if not isinstance(kind, str):
        return None
    api_version = obj.get("apiVersion", f"{trainingoperator.GROUP}/{trainingoperator.VERSION}")
    return _BY_API.get((api_version, kind))


def kind_for(group: str, kind: str = "", plural: str = "") -> JobKind | None:
    """The job kind an admission request is for, by its group and kind or resource."""
    for k in ALL_KINDS:
        if k.group == group and (k.kind == kind or k.plural == plural):
            return k
    return None


def is_job(obj: Mapping[str, Any]) -> bool:
    return job_kind(obj) is not None


def _kind(job: Mapping[str, Any]) -> JobKind:
    kind = job_kind(job)
    if kind is None:
        raise JobShapeError(f"{job.get('kind')!r} is not a Kubeflow job kind gpuwarden reads")
    return kind


def replica_templates(job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
    """The replicas of a job in their document order; JobShapeError names a field no job has."""
    return _kind(job).templates(job)


def controller_labels(job: Mapping[str, Any], replica: str, index: int = 0) -> dict[str, str]:
    """The labels the kind's controller puts on the pod of ``replica`` number ``index``."""
    kind = _kind(job)
    labels = kind.labels(job, replica, index)
    # Katib's pod webhook labels every pod of a Trial's job, whatever its kind (getKatibJob
    # follows the pod's owners up to the Trial), with the Trial's name.
    trial = katib.trial_of(kind.pod_job(job))
    if trial is not None:
        labels[katib.TRIAL_LABEL] = trial
    return labels


def distinct_indices(job: Mapping[str, Any], replica: ReplicaTemplate) -> tuple[int, ...]:
    """The indices of a replica's pods that carry different labels beyond their index: 0, and 1
    where only the first pod has the master role (PyTorchJob and TFJob without a master, JAXJob);
    the pods after those are labelled as the second is."""
    if replica.replicas < 2:
        return (0,)
    first, second = (controller_labels(job, replica.name, i).get(JOB_ROLE_LABEL) for i in (0, 1))
    return (0,) if first == second else (0, 1)


def kept_as_written(job: Mapping[str, Any]) -> str | None:
    """Why the job cannot carry what its pods will get (it is judged, and kept as written)."""
    return _kind(job).kept_as_written(job)


def pod_name(job: Mapping[str, Any], replica: str, index: int = 0) -> str:
    return _kind(job).pod_name(job, replica, index)


def replica_pod(
    job: Mapping[str, Any], replica: ReplicaTemplate, namespace: str, index: int = 0
) -> dict[str, Any]:
    """The pod the job's controller creates for ``replica`` number ``index`` (its template, the
    controller's labels, name, namespace and restart policy), as the pod webhooks will see it."""
    kind = _kind(job)
    template = replica.template
    meta = dict(metadata_of(template))
    labels = meta.get("labels")
    meta["labels"] = {
        **(labels if isinstance(labels, Mapping) else {}),
        **controller_labels(job, replica.name, index),
    }
    meta["generateName" if kind.generates_names(job) else "name"] = kind.pod_name(
        job, replica.name, index
    )
    meta["namespace"] = namespace
    spec = dict(template.get("spec") or {})
    if replica.restart_policy is not None:
        spec["restartPolicy"] = replica.restart_policy
    return kind.finish_pod(job, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
