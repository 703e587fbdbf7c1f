"""Kubeflow Trainer v2 TrainJobs (``trainer.kubeflow.org/v1alpha1``), read by what they say of
the trainer node's container: ``spec.trainer.resourcesPerNode``.

Sources: kubeflow/trainer v2.0.0 (github.com/kubeflow/trainer/v2) and the JobSet it builds on,
kubernetes-sigs/jobset v0.8.2 (its go.mod's).
- A TrainJob's pods come from its runtime (``spec.runtimeRef``: a ClusterTrainingRuntime or a
  TrainingRuntime, pkg/apis/trainer/v1alpha1/trainjob_types.go, trainingruntime_types.go): the
  runtime's JobSet template, made a JobSet named as the TrainJob
  (pkg/runtime/framework/plugins/jobset/jobset.go, Build). The pure core cannot read the runtime,
  so a TrainJob is judged by the one container it describes itself.
- pkg/runtime/framework/plugins/jobset/builder.go (Trainer): in each replicated job whose Job
  template carries ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``, the container named
  ``node`` takes the TrainJob's ``spec.trainer`` image, command, args and env (merged into the
  runtime's), and its ``resourcesPerNode`` *replaces* the container's resources whenever it sets
  limits or requests. ``numNodes`` is that Job's parallelism (plugins/torch/torch.go,
  plainml/plainml.go). The trainer job is ``node`` in the Torch runtimes (torch-distributed,
  torchtune-*), ``launcher`` in the MPI ones (mpi-, deepspeed-, mlx-distributed, with
  runLauncherAsNode: manifests/base/runtimes/); the predicted pod is the ``node`` job's.
- The Torch plugin reads ``resourcesPerNode`` for ``numProcPerNode: auto`` only to ask whether a
  resource name contains "gpu" (torch.go, EnforceMLPolicy): the shared and vGPU resource names
  gpuwarden writes do, so the mutation leaves ``PET_NPROC_PER_NODE`` as it was.
- jobset pkg/controllers/jobset_controller.go (labelAndAnnotateObject): each pod's labels
  ``jobset.sigs.k8s.io/jobset-name`` (the TrainJob's name), ``replicatedjob-name``,
  ``replicatedjob-replicas`` (1: the Trainer sets every replicated job's replicas to 1),
  ``job-index`` (0); the Job is ``<jobset>-<replicated job>-<index>`` (placement.GenJobName) and
  Indexed (pkg/webhooks/jobset_webhook.go defaults completionMode), so the batch Job's labels
  follow (:mod:`.batch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.policy.pod.jobs import batch
from gpuwarden.policy.pod.jobs.base import (
    JobKind,
    JobShapeError,
    ReplicaTemplate,
    TemplateSite,
    name_of,
    object_at,
    whole_number,
)
from gpuwarden.policy.pod.workloads import JOBSET_NAME, JOBSET_REPLICATED_JOB, TRAINER_NODE

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
# jobset api/jobset/v1alpha2/jobset_types.go: ReplicatedJobReplicas, JobIndexKey.
JOBSET_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_LABELS = (JOBSET_NAME, JOBSET_REPLICATED_JOB, JOBSET_REPLICAS, JOBSET_JOB_INDEX)
_RESOURCES = ("spec", "trainer", "resourcesPerNode")
# The spec.trainer fields the Trainer copies onto the node container, by their container names,
# with the JSON type each must have (checked here, so that errors name the TrainJob's field).
_CONTAINER_SHAPES: tuple[tuple[str, type, str], ...] = (
    ("image", str, "a string"),
    ("command", list, "an array"),
    ("args", list, "an array"),
    ("env", list, "an array"),
)
_CONTAINER_FIELDS = tuple(field for field, _, _ in _CONTAINER_SHAPES)


def _job_of(trainjob: Mapping[str, Any]) -> dict[str, Any]:
    """The Indexed batch Job JobSet makes of the trainer node's replicated job."""
    name = f"{name_of(trainjob)}-{TRAINER_NODE}-0"
    return {"metadata": {"name": name}, "spec": {"completionMode": "Indexed"}}


def _check_quantities(where: str, values: Any) -> None:
    """``values`` checked to be a map of resource names to quantities, naming the field (the
    pod's own shape check would name the predicted pod's fields instead)."""
    if values is None:
        return
    for name, value in object_at(where, values).items():
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise JobShapeError(f"{where}[{name!r}] must be a quantity (string or number)")


@dataclass(frozen=True)
class TrainJobKind(JobKind):
    """A TrainJob, judged as the trainer node's pod where it sets ``resourcesPerNode``."""

    group: str = GROUP
    version: str = VERSION
    kind: str = "TrainJob"
    plural: str = "trainjobs"
    generate_name: bool = batch.BATCH_JOB.generate_name

    @property
    def sites(self) -> tuple[TemplateSite, ...]:
        return (TemplateSite(_RESOURCES, shape="resources"),)

    def templates(self, job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
        spec = job.get("spec")
        if not isinstance(spec, Mapping):
            raise JobShapeError(f"{self.kind} has no spec")
        trainer = spec.get("trainer")
        if trainer is None:
            return ()
        trainer = object_at("spec.trainer", trainer)
        resources = trainer.get("resourcesPerNode")
        if resources is None:
            return ()  # the runtime's resources, judged as each pod is created
        resources = object_at("spec.trainer.resourcesPerNode", resources)
        if resources.get("limits") is None and resources.get("requests") is None:
            return ()  # builder.go keeps the runtime's resources then
        for section in ("limits", "requests"):
            _check_quantities(f"spec.trainer.resourcesPerNode.{section}", resources.get(section))
        for field, kind, shape in _CONTAINER_SHAPES:
            if trainer.get(field) is not None and not isinstance(trainer[field], kind):
                raise JobShapeError(f"spec.trainer.{field} must be {shape}")
        container = {
            "name": TRAINER_NODE,
            **{k: trainer[k] for k in _CONTAINER_FIELDS if k in trainer},
            "resources": resources,
        }
        return (
            ReplicaTemplate(
                TRAINER_NODE,
                _RESOURCES,
                {"spec": {"containers": [container]}},
                None,
                whole_number(trainer.get("numNodes", 1)),
                # Only the node container's resources have a twin in the TrainJob; the rest of
                # what the pod webhook does is done on each pod.
                twins=(("/spec/containers/0/resources", "/" + "/".join(_RESOURCES)),),
            ),
        )

    def labels(self, job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
        return {
            JOBSET_NAME: name_of(job),
            JOBSET_REPLICATED_JOB: replica,
            JOBSET_REPLICAS: "1",
            JOBSET_JOB_INDEX: "0",
            **batch.BATCH_JOB.labels(_job_of(job), replica, index),
        }

    def pod_name(self, job: Mapping[str, Any], replica: str, index: int) -> str:
        return batch.BATCH_JOB.pod_name(_job_of(job), replica, index)


TRAINJOB = TrainJobKind()
