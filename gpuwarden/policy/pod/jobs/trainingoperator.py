"""The Kubeflow Training Operator's jobs (PyTorchJob and its kin, ``kubeflow.org/v1``).

Sources: the Training Operator v1.8.1 (github.com/kubeflow/training-operator, tag v1.8.1).
- The kinds, their replica-spec fields and replica types: pkg/apis/kubeflow.org/v1/*_types.go
  (``pytorchReplicaSpecs``, ``tfReplicaSpecs``, ``mpiReplicaSpecs``, ``xgbReplicaSpecs``,
  ``paddleReplicaSpecs``, ``mxReplicaSpecs``). JAXJob (``jaxReplicaSpecs``) arrived after v1.8.1
  (kubeflow/trainer release-1.9, pkg/apis/kubeflow.org/v1/jax_types.go) on the same controller.
- The labels on each pod: pkg/controller.v1/common/job_controller.go (GenLabels: operator-name,
  job-name with "/" made "-") and pkg/controller.v1/common/pod.go (createNewPod: replica-type in
  lower case, replica-index, job-role ``master`` where the kind's IsMasterRole says so; the pod is
  named ``<job>-<type>-<index>`` by GenGeneralName, its restartPolicy the replica's through
  pkg/core/pod.go SetRestartPolicy, ExitCode becoming Never). MPIJob builds its pods in
  pkg/controller.v1/mpi/mpijob_controller.go (newWorker ``<job>-worker-<i>``, newLauncher
  ``<job>-launcher`` with job-role master) with the same labels.
- Each controller's name (the operator-name label): ``controllerName`` in
  pkg/controller.v1/<framework>/*_controller.go.

What the controllers add to a pod beyond that (PyTorch's ``init-pytorch`` init container for
workers when a Master exists, the framework's environment variables, MPI's kubectl-delivery
volumes) asks no GPU and is not read here: a policy decides on the template's containers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.policy.pod.jobs.base import (
    JobKind,
    JobShapeError,
    ReplicaTemplate,
    TemplateSite,
    name_of,
    object_at,
    pod_template,
    whole_number,
)

GROUP = "kubeflow.org"
VERSION = "v1"

# The Training Operator's pod labels (pkg/apis/kubeflow.org/v1/common_types.go).
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"

_EXIT_CODE = "ExitCode"

Replicas = Mapping[str, Any]
MasterRole = Callable[[Replicas, str, int], bool]


def _role_is(*types: str) -> MasterRole:
    return lambda replicas, replica, index: replica in types


def _master_or_worker0(*masters: str) -> MasterRole:
    """PyTorchJob and TFJob: the master types when the job has one, else worker 0."""

    def role(replicas: Replicas, replica: str, index: int) -> bool:
        if any(m in replicas for m in masters):
            return replica in masters
        return replica == "Worker" and index == 0

    return role


@dataclass(frozen=True)
class TrainingOperatorKind(JobKind):
    """One Training Operator kind: where its replicas are and how its controller names pods."""

    kind: str
    plural: str
    replica_field: str  # under spec
    controller: str  # the operator-name label's value
    master_role: MasterRole
    # MPIJob names its pods itself (newWorker, newLauncher) rather than by GenGeneralName.
    mpi: bool = False
    group: str = GROUP
    version: str = VERSION

    @property
    def sites(self) -> tuple[TemplateSite, ...]:
        return (TemplateSite(("spec", self.replica_field), per_replica=True),)

    def templates(self, job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
        spec = job.get("spec")
        if not isinstance(spec, Mapping):
            raise JobShapeError(f"{self.kind} has no spec")
        replicas = spec.get(self.replica_field)
        where = f"spec.{self.replica_field}"
        if replicas is None:
            raise JobShapeError(f"{self.kind} has no {where}")
        if not isinstance(replicas, Mapping):
            raise JobShapeError(f"{where} must be an object of replica types")
        found = []
        for name, replica in replicas.items():
            replica = object_at(f"{where}.{name}", replica)
            template = pod_template(f"{where}.{name}.template", replica.get("template", {}))
            policy = replica.get("restartPolicy")
            if isinstance(policy, str):
                policy = "Never" if policy == _EXIT_CODE else policy
            found.append(
                ReplicaTemplate(
                    str(name),
                    ("spec", self.replica_field, str(name), "template"),
                    template,
                    policy if isinstance(policy, str) else None,
                    whole_number(replica.get("replicas", 1)),
                )
            )
        return tuple(found)

    def labels(self, job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
        spec = job.get("spec")
        replicas = spec.get(self.replica_field, {}) if isinstance(spec, Mapping) else {}
        labels = {
            OPERATOR_NAME_LABEL: self.controller,
            JOB_NAME_LABEL: name_of(job).replace("/", "-"),
            REPLICA_TYPE_LABEL: replica.lower(),
        }
        # MPIJob's launcher has no index (newLauncher); its workers do (newWorker's caller).
        if not (self.mpi and replica == "Launcher"):
            labels[REPLICA_INDEX_LABEL] = str(index)
        if self.master_role(replicas, replica, index):
            labels[JOB_ROLE_LABEL] = "master"
        return labels

    def pod_name(self, job: Mapping[str, Any], replica: str, index: int) -> str:
        if self.mpi and replica == "Launcher":
            return f"{name_of(job)}-launcher"
        return f"{name_of(job)}-{replica.lower()}-{index}"


KINDS: tuple[TrainingOperatorKind, ...] = (
    TrainingOperatorKind(
        "PyTorchJob",
        "pytorchjobs",
        "pytorchReplicaSpecs",
        "pytorchjob-controller",
        _master_or_worker0("Master"),
    ),
    TrainingOperatorKind(
        "TFJob",
        "tfjobs",
        "tfReplicaSpecs",
        "tfjob-controller",
        _master_or_worker0("Chief", "Master"),
    ),
    TrainingOperatorKind(
        "MPIJob", "mpijobs", "mpiReplicaSpecs", "mpijob-controller", _role_is("Launcher"), mpi=True
    ),
    TrainingOperatorKind(
        "XGBoostJob", "xgboostjobs", "xgbReplicaSpecs", "xgboostjob-controller", _role_is("Master")
    ),
    TrainingOperatorKind(
        "PaddleJob", "paddlejobs", "paddleReplicaSpecs", "paddlejob-controller", _role_is("Master")
    ),
    TrainingOperatorKind(
        "MXJob", "mxjobs", "mxReplicaSpecs", "mxjob-controller", _role_is("Server")
    ),
    # kubeflow/trainer release-1.9 pkg/controller.v1/jax/jaxjob_controller.go: IsMasterRole is
    # index 0 of any type.
    TrainingOperatorKind(
        "JAXJob",
        "jaxjobs",
        "jaxReplicaSpecs",
        "jaxjob-controller",
        lambda replicas, replica, index: index == 0,
    ),
)
