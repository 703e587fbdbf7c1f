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

batch/v1 Jobs (Katib's trials among them) have one template, ``spec.template``. Sources:
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
- kubeflow/katib v0.19.0: a trial's Job is owned by its Trial (``kind: Trial``,
  ``apiVersion: kubeflow.org/v1beta1``, pkg/webhook/v1beta1/pod/const.go) and named as it
  (pkg/controller.v1beta1/trial/trial_controller.go, reconcileJob). Katib's pod webhook
  (pkg/webhook/v1beta1/pod/inject_webhook.go, Mutate; utils.go, mutatePodMetadata) copies the
  Trial's labels onto each pod (``katib.kubeflow.org/experiment`` among them) and adds
  ``katib.kubeflow.org/trial`` with the Trial's name; it also adds the metrics collector sidecar
  (``metrics-logger-and-collector``, or ``metrics-collector``), the ``KATIB_TRIAL_NAME``
  environment variable on the primary container, shareProcessNamespace and the metrics volume,
  none of which asks a GPU. The predicted pod of a job a Trial owns (a batch Job or a Training
  Operator job) carries the trial label; the Trial's own labels are not on the job and are not
  foretold.

A Katib Experiment (``kubeflow.org/v1beta1``) whose ``spec.trialTemplate.trialSpec`` is a batch
Job is read as that Job's one template, at ``spec.trialTemplate.trialSpec.spec.template``. Katib
v0.19.0 makes each trial from it (pkg/controller.v1beta1/experiment/experiment_controller_util.go,
createTrialInstance; manifest/generator.go, GetRunSpecWithHyperParameters: the ``${trialParameters.*}``
placeholders replaced, the Job named as the Trial, ``<experiment>-<8 random characters>``), and
the Trial's labels are the Experiment's labels plus ``katib.kubeflow.org/experiment``
(pkg/controller.v1beta1/util/labels.go, TrialLabels), which Katib's pod webhook copies onto the
pods. The predicted pod is that Job's, for a trial named ``<experiment>-trial``. A template whose
resources are set by trial parameters is not judged here: each trial is, as Katib creates its Job.
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

# kubernetes pkg/apis/batch/types.go: LegacyJobNameLabel, JobNameLabel, LegacyControllerUidLabel,
# ControllerUidLabel, JobCompletionIndexAnnotation (also the label's key).
BATCH_GROUP = "batch"
BATCH_VERSION = "v1"
BATCH_JOB_LABELS = ("job-name", "batch.kubernetes.io/job-name")
BATCH_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
BATCH_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# kubeflow/katib v0.19.0 pkg/webhook/v1beta1/pod/const.go (TrialKind, TrialAPIVersion) and
# pkg/controller.v1beta1/consts/const.go (LabelTrialName).
KATIB_TRIAL_KIND = "Trial"
KATIB_TRIAL_API_VERSION = "kubeflow.org/v1beta1"
KATIB_TRIAL_LABEL = "katib.kubeflow.org/trial"
KATIB_EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"
KATIB_VERSION = "v1beta1"
#: The name the predicted pod of an Experiment's trial template gives its trial (Katib names
#: each trial ``<experiment>-<8 random characters>``).
TRIAL_STAND_IN = "{experiment}-trial"
_TRIAL_PARAMETER = "${trialParameters."
#: The replica name of a batch Job's one template, which prefixes its messages (``Job: ...``).
BATCH_REPLICA = "Job"

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
    group: str = JOB_GROUP
    version: str = JOB_VERSION
    # A batch/v1 Job: one template at spec.template, pods from the Job controller.
    batch: bool = False
    # A Katib Experiment: its trialSpec's template, as the pods of each trial's Job.
    experiment: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


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
#: Katib's Experiment, judged by its trial template where that is a batch Job.
EXPERIMENT = JobKind(
    "Experiment",
    "experiments",
    "trialTemplate",
    "experiment-controller",
    lambda replicas, replica, index: False,
    version=KATIB_VERSION,
    experiment=True,
)
JOB_PLURALS = frozenset(k.plural for k in (*JOB_KINDS.values(), EXPERIMENT))
#: batch/v1 Job, as Katib creates its trials (and as any user may).
BATCH_JOB = JobKind(
    "Job",
    "jobs",
    "template",
    "job-controller",
    lambda replicas, replica, index: False,
    group=BATCH_GROUP,
    version=BATCH_VERSION,
    batch=True,
)


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
    """The Training Operator kind of ``obj``, :data:`BATCH_JOB` for a batch/v1 Job, or None for
    anything else."""
    kind = obj.get("kind")
    api_version = obj.get("apiVersion", f"{JOB_GROUP}/{JOB_VERSION}")
    if not isinstance(kind, str):
        return None
    if kind == BATCH_JOB.kind and api_version == BATCH_JOB.api_version:
        return BATCH_JOB
    if kind == EXPERIMENT.kind and api_version == EXPERIMENT.api_version:
        return EXPERIMENT
    if api_version != f"{JOB_GROUP}/{JOB_VERSION}":
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
    if kind.batch:
        return (_batch_template(spec),)
    if kind.experiment:
        return _trial_templates(job)
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


def _batch_template(spec: Mapping[str, Any]) -> ReplicaTemplate:
    template = spec.get("template")
    if not isinstance(template, Mapping):
        raise JobShapeError("spec.template must be an object")
    if not isinstance(template.get("spec", {}), Mapping):
        raise JobShapeError("spec.template.spec must be an object")
    count = spec.get("parallelism", 1)
    return ReplicaTemplate(
        BATCH_REPLICA,
        ("spec", "template"),
        template,
        None,
        count if isinstance(count, int) and not isinstance(count, bool) else 1,
    )


def trial_spec(experiment: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """An Experiment's ``spec.trialTemplate.trialSpec`` when it is a batch Job, else None (a
    trialSpec of another kind, or one in a ConfigMap, is judged as Katib creates each trial)."""
    spec = experiment.get("spec")
    template = spec.get("trialTemplate") if isinstance(spec, Mapping) else None
    trial = template.get("trialSpec") if isinstance(template, Mapping) else None
    if not isinstance(trial, Mapping) or job_kind(trial) is not BATCH_JOB:
        return None
    return trial


def _parameterised(template: Mapping[str, Any]) -> bool:
    """Whether trial parameters set a container's resources, known only per trial."""
    spec = template.get("spec")
    for field in ("containers", "initContainers"):
        items = spec.get(field) if isinstance(spec, Mapping) else None
        for c in items if isinstance(items, list) else ():
            if isinstance(c, Mapping) and _TRIAL_PARAMETER in str(c.get("resources")):
                return True
    return False


def _trial_templates(experiment: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
    trial = trial_spec(experiment)
    if trial is None:
        return ()
    spec = trial.get("spec")
    if not isinstance(spec, Mapping):
        raise JobShapeError("spec.trialTemplate.trialSpec has no spec")
    try:
        template = _batch_template(spec)
    except JobShapeError as exc:
        raise JobShapeError(f"spec.trialTemplate.trialSpec.{exc}") from None
    if _parameterised(template.template):
        return ()
    return (
        ReplicaTemplate(
            "Trial",
            ("spec", "trialTemplate", "trialSpec", *template.path),
            template.template,
            None,
            template.replicas,
        ),
    )


def _trial_job(experiment: Mapping[str, Any]) -> Mapping[str, Any]:
    """The Job Katib creates for a trial of ``experiment``: its trialSpec, named as a stand-in
    trial that owns it."""
    trial = trial_spec(experiment) or {}
    name = TRIAL_STAND_IN.format(experiment=_name(experiment))
    owner = {"apiVersion": KATIB_TRIAL_API_VERSION, "kind": KATIB_TRIAL_KIND, "name": name}
    return {**trial, "metadata": {"name": name, "ownerReferences": [owner]}}


def _pod_job(job: Mapping[str, Any]) -> Mapping[str, Any]:
    """The job whose controller creates the pods: an Experiment's trial Job, else the job."""
    kind = job_kind(job)
    return _trial_job(job) if kind is not None and kind.experiment else job


def trial_of(job: Mapping[str, Any]) -> str | None:
    """The Katib Trial that owns ``job``, by name, or None."""
    meta = job.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for owner in owners if isinstance(owners, list) else ():
        if (
            isinstance(owner, Mapping)
            and owner.get("kind") == KATIB_TRIAL_KIND
            and owner.get("apiVersion") == KATIB_TRIAL_API_VERSION
            and isinstance(owner.get("name"), str)
        ):
            return str(owner["name"])
    return None


def _indexed(job: Mapping[str, Any]) -> bool:
    spec = job.get("spec")
    return isinstance(spec, Mapping) and spec.get("completionMode") == "Indexed"


def _batch_labels(job: Mapping[str, Any], index: int) -> dict[str, str]:
    """What the API server (job-name, controller-uid) and the Job controller (the completion
    index) add to a batch Job's pod."""
    spec = job.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    labels: dict[str, str] = {}
    if spec.get("manualSelector") is not True:
        meta = job.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        labels |= dict.fromkeys(BATCH_JOB_LABELS, _name(job))
        labels |= dict.fromkeys(BATCH_UID_LABELS, uid if isinstance(uid, str) else "")
        # generateSelector keeps the values a template already has (validation then judges them).
        template = spec.get("template")
        meta = template.get("metadata") if isinstance(template, Mapping) else None
        own = meta.get("labels") if isinstance(meta, Mapping) else None
        for key in BATCH_JOB_LABELS + BATCH_UID_LABELS:
            if isinstance(own, Mapping) and isinstance(own.get(key), str):
                labels[key] = own[key]
    if _indexed(job):
        labels[BATCH_INDEX_LABEL] = str(index)
    return labels


def controller_labels(job: Mapping[str, Any], replica: str, index: int = 0) -> dict[str, str]:
    """The labels the kind's controller puts on the pod of ``replica`` number ``index``."""
    made_by = _pod_job(job)
    labels = _controller_labels(made_by, replica, index)
    # Katib's pod webhook labels every pod of a Trial's job, whatever its kind (getKatibJob
    # follows the pod's owners up to the Trial), with the Trial's labels and name.
    if made_by is not job:
        meta = job.get("metadata")
        own = meta.get("labels") if isinstance(meta, Mapping) else None
        labels |= {str(k): str(v) for k, v in (own if isinstance(own, Mapping) else {}).items()}
        labels[KATIB_EXPERIMENT_LABEL] = _name(job)
    trial = trial_of(made_by)
    if trial is not None:
        labels[KATIB_TRIAL_LABEL] = trial
    return labels


def _controller_labels(job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
    kind = job_kind(job)
    assert kind is not None
    if kind.batch:
        return _batch_labels(job, index)
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
    job = _pod_job(job)
    kind = job_kind(job)
    name = _name(job)
    if kind is not None and kind.batch:
        return f"{name}-{index}-" if _indexed(job) else f"{name}-"
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
    kind = job_kind(_pod_job(job))
    # The Job controller names its pods by generateName (CreatePodsWithGenerateName).
    meta["generateName" if kind is not None and kind.batch else "name"] = pod_name(
        job, replica.name, index
    )
    meta["namespace"] = namespace
    spec = dict(template.get("spec") or {})
    if replica.restart_policy is not None:
        exit_code = replica.restart_policy == _EXIT_CODE
        spec["restartPolicy"] = "Never" if exit_code else replica.restart_policy
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
