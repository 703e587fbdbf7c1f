"""Reading a Kubeflow job object: its replicas' pod templates and the pod each one's controller
creates from it.

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

JOB_GROUP = "kubeflow.org"
JOB_VERSION = "v1"

# pkg/apis/kubeflow.org/v1/common_types.go
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
# pkg/apis/kubeflow.org/v1/common_types.go RestartPolicyExitCode, which a pod cannot hold.
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
class JobKind:
    """One Training Operator kind: where its replicas are and how its controller names pods."""

    kind: str
    plural: str
    replica_field: str  # under spec
    controller: str  # the operator-name label's value
    master_role: MasterRole
    # MPIJob names its pods itself (newWorker, newLauncher) rather than by GenGeneralName.
    mpi: bool = False


JOB_KINDS: Mapping[str, JobKind] = {
    k.kind: k
    for k in (
        JobKind(
            "PyTorchJob",
            "pytorchjobs",
            "pytorchReplicaSpecs",
            "pytorchjob-controller",
            _master_or_worker0("Master"),
        ),
        JobKind(
            "TFJob",
            "tfjobs",
            "tfReplicaSpecs",
            "tfjob-controller",
            _master_or_worker0("Chief", "Master"),
        ),
        JobKind(
            "MPIJob",
            "mpijobs",
            "mpiReplicaSpecs",
            "mpijob-controller",
            _role_is("Launcher"),
            mpi=True,
        ),
        JobKind(
            "XGBoostJob",
            "xgboostjobs",
            "xgbReplicaSpecs",
            "xgboostjob-controller",
            _role_is("Master"),
        ),
        JobKind(
            "PaddleJob",
            "paddlejobs",
            "paddleReplicaSpecs",
            "paddlejob-controller",
            _role_is("Master"),
        ),
        JobKind("MXJob", "mxjobs", "mxReplicaSpecs", "mxjob-controller", _role_is("Server")),
        # kubeflow/trainer release-1.9 pkg/controller.v1/jax/jaxjob_controller.go: IsMasterRole
        # is index 0 of any type.
        JobKind(
            "JAXJob",
            "jaxjobs",
            "jaxReplicaSpecs",
            "jaxjob-controller",
            lambda replicas, replica, index: index == 0,
        ),
    )
}
JOB_PLURALS = frozenset(k.plural for k in JOB_KINDS.values())


class JobShapeError(ValueError):
    """A job object whose replicas cannot be read; the message names the field."""


@dataclass(frozen=True)
class ReplicaTemplate:
    """One replica type of a job: its name (``Worker``), its template and where it sits."""

    name: str
    path: tuple[str, ...]  # of the pod template, from the job's root
    template: Mapping[str, Any]
    restart_policy: str | None
    replicas: int = 1


def job_kind(obj: Mapping[str, Any]) -> JobKind | None:
    """The Training Operator kind of ``obj``, or None for anything else."""
    kind = obj.get("kind")
    api_version = obj.get("apiVersion", f"{JOB_GROUP}/{JOB_VERSION}")
    if not isinstance(kind, str) or api_version != f"{JOB_GROUP}/{JOB_VERSION}":
        return None
    return JOB_KINDS.get(kind)


def is_job(obj: Mapping[str, Any]) -> bool:
    return job_kind(obj) is not None


def _name(job: Mapping[str, Any]) -> str:
    meta = job.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""


def replica_templates(job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
    """The replicas of a job in their document order; JobShapeError names a field no job has."""
    kind = job_kind(job)
    if kind is None:
        raise JobShapeError(f"{job.get('kind')!r} is not a Training Operator job kind")
    spec = job.get("spec")
    if not isinstance(spec, Mapping):
        raise JobShapeError(f"{kind.kind} has no spec")
    replicas = spec.get(kind.replica_field)
    where = f"spec.{kind.replica_field}"
    if replicas is None:
        raise JobShapeError(f"{kind.kind} has no {where}")
    if not isinstance(replicas, Mapping):
        raise JobShapeError(f"{where} must be an object of replica types")
    found = []
    for name, replica in replicas.items():
        if not isinstance(replica, Mapping):
            raise JobShapeError(f"{where}.{name} must be an object")
        template = replica.get("template", {})
        if not isinstance(template, Mapping):
            raise JobShapeError(f"{where}.{name}.template must be an object")
        if not isinstance(template.get("spec", {}), Mapping):
            raise JobShapeError(f"{where}.{name}.template.spec must be an object")
        policy = replica.get("restartPolicy")
        count = replica.get("replicas", 1)
        found.append(
            ReplicaTemplate(
                str(name),
                ("spec", kind.replica_field, str(name), "template"),
                template,
                policy if isinstance(policy, str) else None,
                count if isinstance(count, int) and not isinstance(count, bool) else 1,
            )
        )
    return tuple(found)


def controller_labels(job: Mapping[str, Any], replica: str, index: int = 0) -> dict[str, str]:
    """The labels the kind's controller puts on the pod of ``replica`` number ``index``."""
    kind = job_kind(job)
    assert kind is not None
    spec = job.get("spec")
    replicas = spec.get(kind.replica_field, {}) if isinstance(spec, Mapping) else {}
    labels = {
        OPERATOR_NAME_LABEL: kind.controller,
        JOB_NAME_LABEL: _name(job).replace("/", "-"),
        REPLICA_TYPE_LABEL: replica.lower(),
    }
    # MPIJob's launcher has no index (newLauncher); its workers do (newWorker's caller).
    if not (kind.mpi and replica == "Launcher"):
        labels[REPLICA_INDEX_LABEL] = str(index)
    if kind.master_role(replicas, replica, index):
        labels[JOB_ROLE_LABEL] = "master"
    return labels


def distinct_indices(job: Mapping[str, Any], replica: ReplicaTemplate) -> tuple[int, ...]:
    """The indices of a replica's pods that carry different labels beyond their index: 0, and 1
    where only the first pod has the master role (PyTorchJob and TFJob without a master, JAXJob);
    the pods after those are labelled as the second is."""
    if replica.replicas < 2:
        return (0,)
    first, second = (controller_labels(job, replica.name, i).get(JOB_ROLE_LABEL) for i in (0, 1))
    return (0,) if first == second else (0, 1)


def pod_name(job: Mapping[str, Any], replica: str, index: int = 0) -> str:
    kind = job_kind(job)
    name = _name(job)
    if kind is not None and kind.mpi and replica == "Launcher":
        return f"{name}-launcher"
    return f"{name}-{replica.lower()}-{index}"


def replica_pod(
    job: Mapping[str, Any], replica: ReplicaTemplate, namespace: str, index: int = 0
) -> dict[str, Any]:
    """The pod the job's controller creates for ``replica`` number ``index`` (its template, the
    controller's labels, name, namespace and restart policy), as the pod webhooks will see it."""
    template = replica.template
    meta = template.get("metadata")
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    meta["labels"] = {
        **(labels if isinstance(labels, Mapping) else {}),
        **controller_labels(job, replica.name, index),
    }
    meta["name"] = pod_name(job, replica.name, index)
    meta["namespace"] = namespace
    spec = dict(template.get("spec") or {})
    if replica.restart_policy is not None:
        exit_code = replica.restart_policy == _EXIT_CODE
        spec["restartPolicy"] = "Never" if exit_code else replica.restart_policy
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
