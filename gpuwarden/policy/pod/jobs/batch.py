"""batch/v1 Jobs (Katib's trials among them): one template, ``spec.template``.

Sources:
- kubernetes v1.37 pkg/registry/batch/job/strategy.go (PrepareForCreate, generateSelector): the
  API server adds ``job-name`` and ``batch.kubernetes.io/job-name`` (the Job's name) and
  ``controller-uid`` and ``batch.kubernetes.io/controller-uid`` (its uid) to the template's labels,
  unless ``spec.manualSelector``; that runs after the mutating webhooks, so the job webhooks see
  the uid only while validating. The predicted pod carries the uid labels with the uid when the
  object has one and empty otherwise: a selector on their existence matches as it will on the
  pod; one on a single Job's uid cannot be foretold.
- pkg/controller/job/job_controller.go (manageJob): pods are created with generateName
  ``<job>-``, and for ``completionMode: Indexed`` ``<job>-<index>-`` with the
  ``batch.kubernetes.io/job-completion-index`` label.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.policy.pod.jobs.base import (
    JobKind,
    JobShapeError,
    ReplicaTemplate,
    TemplateSite,
    metadata_of,
    name_of,
    pod_template,
    whole_number,
)

GROUP = "batch"
VERSION = "v1"
JOB_LABELS = ("job-name", "batch.kubernetes.io/job-name")
UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
#: The one replica of a batch Job, as messages name it.
REPLICA = "Job"


def template(spec: Mapping[str, Any]) -> ReplicaTemplate:
    """A batch Job spec's one replica (``parallelism`` pods at once)."""
    found = pod_template("spec.template", spec.get("template"))
    return ReplicaTemplate(
        REPLICA, ("spec", "template"), found, None, whole_number(spec.get("parallelism", 1))
    )


def _indexed(job: Mapping[str, Any]) -> bool:
    spec = job.get("spec")
    return isinstance(spec, Mapping) and spec.get("completionMode") == "Indexed"


@dataclass(frozen=True)
class BatchJobKind(JobKind):
    group: str = GROUP
    version: str = VERSION
    kind: str = "Job"
    plural: str = "jobs"
    # The Job controller names its pods by generateName (CreatePodsWithGenerateName).
    generate_name: bool = True

    @property
    def sites(self) -> tuple[TemplateSite, ...]:
        return (TemplateSite(("spec", "template")),)

    def templates(self, job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
        spec = job.get("spec")
        if not isinstance(spec, Mapping):
            raise JobShapeError(f"{self.kind} has no spec")
        return (template(spec),)

    def labels(self, job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
        """What the API server (job-name, controller-uid) and the Job controller (the
        completion index) add to the pod."""
        spec = job.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        labels: dict[str, str] = {}
        if spec.get("manualSelector") is not True:
            uid = metadata_of(job).get("uid")
            labels |= dict.fromkeys(JOB_LABELS, name_of(job))
            labels |= dict.fromkeys(UID_LABELS, uid if isinstance(uid, str) else "")
            # generateSelector keeps the values a template already has (validation judges them).
            template = spec.get("template")
            meta = template.get("metadata") if isinstance(template, Mapping) else None
            own = meta.get("labels") if isinstance(meta, Mapping) else None
            for key in JOB_LABELS + UID_LABELS:
                if isinstance(own, Mapping) and isinstance(own.get(key), str):
                    labels[key] = own[key]
        if _indexed(job):
            labels[INDEX_LABEL] = str(index)
        return labels

    def pod_name(self, job: Mapping[str, Any], replica: str, index: int) -> str:
        return f"{name_of(job)}-{index}-" if _indexed(job) else f"{name_of(job)}-"


BATCH_JOB = BatchJobKind()
