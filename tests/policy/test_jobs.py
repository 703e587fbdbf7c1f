"""Kubeflow jobs admitted at submit (issue 30): each replica decided as the pod its controller
will create, the job denied with the replica's message, its templates mutated so the pod webhook
finds nothing left to change."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

from gpuwarden.policy import AdmissionRequest, ClusterView, PolicySet, admit, load_texts
from gpuwarden.policy.admission.jobs import admit_job
from gpuwarden.policy.admission.twins import field_name
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.pod.jobs import trainingoperator
from gpuwarden.policy.render.scope import (
    MAX_CONTAINERS,
    MAX_ITEMS,
    MAX_REPLICA_TYPES,
    job_needs_review,
)

from .support import EXAMPLES, read_yaml
from .test_property import CLUSTER, FUZZ, NAMESPACES, POLICY_SETS, pods, resource_map

# Each kind's replica types as its *_types.go names them (Training Operator v1.8.1).
KIND_REPLICAS = {
    "PyTorchJob": ("Master", "Worker"),
    "TFJob": ("Chief", "PS", "Worker"),
    "MPIJob": ("Launcher", "Worker"),
    "XGBoostJob": ("Master", "Worker"),
    "PaddleJob": ("Master", "Worker"),
    "MXJob": ("Scheduler", "Server", "Worker"),
    "JAXJob": ("Worker",),
}


def pytorchjob() -> dict[str, Any]:
    job: dict[str, Any] = read_yaml(EXAMPLES / "jobs" / "pytorchjob.yaml")
    return job


def with_worker_gpus(job: dict[str, Any], gpus: str) -> dict[str, Any]:
    job = copy.deepcopy(job)
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"]["nvidia.com/gpu"] = gpus
    return job


def job_of(kind: str) -> dict[str, Any]:
    """A job of ``kind`` with one GPU container per replica, no template metadata at all."""
    field = jobs.TRAINING_OPERATOR_KINDS[kind].replica_field
    container = {
        "name": "main",
        "image": "trainer:1",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    replicas = {
        name: {
            "replicas": 2,
            "restartPolicy": "ExitCode",
            "template": {"spec": {"containers": [container]}},
        }
        for name in KIND_REPLICAS[kind]
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": kind,
        "metadata": {"name": "run-7", "namespace": "tenant-a"},
        "spec": {field: replicas},
    }


def create(job: dict[str, Any], namespace: str = "tenant-a") -> AdmissionRequest:
    return AdmissionRequest("CREATE", namespace, job)


def test_an_over_limit_job_is_denied_with_the_workers_message(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    job = with_worker_gpus(pytorchjob(), "8")
    result = admit_job(create(job, "tenant-b"), default_policies, cluster)
    assert not result.allowed
    # The worker's pod, as the controller creates it, gets the very same denial.
    worker = next(r for r in jobs.replica_templates(job) if r.name == "Worker")
    pod = jobs.replica_pod(job, worker, "tenant-b")
    alone = admit(AdmissionRequest("CREATE", "tenant-b", pod), default_policies, cluster)
    assert not alone.allowed
    assert result.validation.message == f"Worker: {alone.validation.message}"
    assert "tenant tenant-b allows at most 2 per pod" in result.validation.message
    assert result.validation.code == 403
    # The master asks for one GPU: allowed, and said so per replica.
    verdicts = {r.replica.name: r.admission.allowed for r in result.replicas}
    assert verdicts == {"Master": True, "Worker": False}


def test_under_audit_an_over_limit_job_is_admitted_saying_what_enforcing_would_deny(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """A job follows the enforcementAction its pods get (issue 32's audit mode): under audit the
    job is stored, and the replica's denial comes back as the would-deny annotations."""
    job = with_worker_gpus(pytorchjob(), "8")
    result = admit_job(create(job, "tenant-b"), default_policies, cluster, default_action="audit")
    assert result.allowed
    worker = next(r for r in result.replicas if r.replica.name == "Worker")
    would_deny = worker.admission.validation.audit_annotations["would-deny-message"]
    assert "tenant tenant-b allows at most 2 per pod" in would_deny
    assert result.validation.audit_annotations["would-deny-message"] == would_deny
    assert any("would deny the pod" in line for line in result.mutation.warnings)
    enforced = admit_job(create(job, "tenant-b"), default_policies, cluster)
    assert not enforced.allowed


def test_the_controllers_pods_from_the_mutated_job_need_no_change(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    job = pytorchjob()
    result = admit_job(create(job), default_policies, cluster)
    assert result.allowed
    assert result.mutation.patch
    mutated = jsonpatch.apply_patch(copy.deepcopy(job), list(result.mutation.patch))
    assert mutated == result.pod
    worker = mutated["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert worker["metadata"]["labels"] == {"team": "nlp"}  # the controller's labels stay out
    assert worker["spec"]["schedulerName"] == "volcano"
    assert worker["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert worker["metadata"]["annotations"]["gpuwarden.io/profile"] == "heavy-training"
    for replica, decided in zip(jobs.replica_templates(mutated), result.replicas, strict=True):
        pod = jobs.replica_pod(mutated, replica, "tenant-a")
        again = admit(AdmissionRequest("CREATE", "tenant-a", pod), default_policies, cluster)
        assert again.allowed
        assert again.mutation.patch == ()  # the pod webhook finds nothing to do
        assert pod == decided.admission.pod  # field for field what the pod webhook made


@pytest.mark.parametrize("kind", sorted(KIND_REPLICAS))
def test_every_kind_is_read_and_its_templates_mutated(
    default_policies: PolicySet, cluster: ClusterView, kind: str
) -> None:
    job = job_of(kind)
    result = admit_job(create(job), default_policies, cluster)
    assert [r.replica.name for r in result.replicas] == list(KIND_REPLICAS[kind])
    assert result.allowed
    paths = {op["path"] for op in result.mutation.patch}
    field = jobs.TRAINING_OPERATOR_KINDS[kind].replica_field
    for name in KIND_REPLICAS[kind]:
        assert f"/spec/{field}/{name}/template/spec/schedulerName" in paths
    mutated = jsonpatch.apply_patch(copy.deepcopy(job), list(result.mutation.patch))
    for replica in jobs.replica_templates(mutated):
        pod = jobs.replica_pod(mutated, replica, "tenant-a")
        assert pod["spec"]["restartPolicy"] == "Never"  # ExitCode, as SetRestartPolicy makes it
        labels = pod["metadata"]["labels"]
        assert labels[trainingoperator.REPLICA_TYPE_LABEL] == replica.name.lower()
        assert labels[trainingoperator.OPERATOR_NAME_LABEL] == f"{kind.lower()}-controller"
        again = admit(AdmissionRequest("CREATE", "tenant-a", pod), default_policies, cluster)
        assert again.mutation.patch == ()


def test_the_master_role_is_the_controllers() -> None:
    pytorch = job_of("PyTorchJob")
    assert (
        jobs.controller_labels(pytorch, "Master").get(trainingoperator.JOB_ROLE_LABEL) == "master"
    )
    assert trainingoperator.JOB_ROLE_LABEL not in jobs.controller_labels(pytorch, "Worker")
    del pytorch["spec"]["pytorchReplicaSpecs"]["Master"]
    assert jobs.controller_labels(pytorch, "Worker", 0)[trainingoperator.JOB_ROLE_LABEL] == "master"
    assert trainingoperator.JOB_ROLE_LABEL not in jobs.controller_labels(pytorch, "Worker", 1)
    mpi = job_of("MPIJob")
    assert jobs.pod_name(mpi, "Launcher") == "run-7-launcher"
    assert trainingoperator.REPLICA_INDEX_LABEL not in jobs.controller_labels(mpi, "Launcher")
    assert jobs.pod_name(mpi, "Worker", 1) == "run-7-worker-1"


KEEP = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: gitops}
spec:
  backend: volcano
  profiles:
    - {name: training, gpuShare: false, maxMemory: 80Gi, priority: 100}
  workloads:
    - {name: training-jobs, match: {kind: training-job}, profile: training}
  tenants:
    - {name: ml, namespaces: [ml], jobTemplates: keep, limits: {maxGpusPerPod: 2}}
"""


def test_keep_leaves_the_job_as_written_and_says_what_the_pods_will_get() -> None:
    policies = load_texts([("gitops.yaml", KEEP)])
    job = pytorchjob()
    before = copy.deepcopy(job)
    result = admit_job(create(job, "ml"), policies, ClusterView())
    assert result.allowed
    assert result.mutation.patch == ()
    assert result.pod == before
    assert "gpuwarden: Worker: profile training via rule/training-jobs (tenant ml)" in (
        result.mutation.warnings
    )
    assert result.mutation.warnings[-1].startswith("gpuwarden: the PyTorchJob is kept as written")
    denied = admit_job(create(with_worker_gpus(job, "8"), "ml"), policies, ClusterView())
    assert denied.validation.message.startswith("Worker: gpuwarden denied the pod: ")


def test_an_update_decides_only_the_replicas_it_changes(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    old = pytorchjob()
    new = with_worker_gpus(old, "2")
    request = AdmissionRequest("UPDATE", "tenant-a", new, old_pod=old)
    result = admit_job(request, default_policies, cluster)
    assert [r.replica.name for r in result.replicas] == ["Worker"]
    assert all("/Master/" not in op["path"] for op in result.mutation.patch)
    unchanged = AdmissionRequest("UPDATE", "tenant-a", old, old_pod=old)
    assert admit_job(unchanged, default_policies, cluster).replicas == ()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "has no spec.pytorchReplicaSpecs"),
        ({"pytorchReplicaSpecs": []}, "spec.pytorchReplicaSpecs must be an object"),
        ({"pytorchReplicaSpecs": {"Worker": {"template": "x"}}}, "Worker.template must be"),
    ],
)
def test_a_job_that_cannot_be_read_is_refused_naming_the_field(
    default_policies: PolicySet, cluster: ClusterView, spec: dict[str, Any], field: str
) -> None:
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "x"}}
    result = admit_job(create({**job, "spec": spec}), default_policies, cluster)
    assert not result.allowed
    assert result.validation.code == 400
    assert result.validation.message.startswith("gpuwarden cannot read the PyTorchJob's replicas")
    assert field in result.validation.message


ROLES = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: roles}
spec:
  backend: volcano
  profiles:
    - {name: coordinator, gpuShare: false, maxMemory: 80Gi, priority: 300}
    - {name: training, gpuShare: false, maxMemory: 80Gi, priority: 100}
  workloads:
    - name: masters
      match: {kind: selector, labels: {matchLabels: {training.kubeflow.org/job-role: master}}}
      profile: coordinator
    - {name: training-jobs, match: {kind: training-job}, profile: training}
  tenants:
    - {name: ml, namespaces: [ml], limits: {allowedProfiles: [coordinator]}}
"""


def test_the_pods_after_the_first_are_judged_where_the_policy_tells_them_apart() -> None:
    """Without a Master, PyTorch's worker 0 has the master role and worker 1 does not: a rule
    on job-role gives them different profiles, and worker 1's is not allowed."""
    policies = load_texts([("roles.yaml", ROLES)])
    job = pytorchjob()
    del job["spec"]["pytorchReplicaSpecs"]["Master"]
    result = admit_job(create(job, "ml"), policies, ClusterView())
    assert not result.allowed
    assert result.validation.message.startswith("Worker: gpuwarden denied the pod: ")
    assert "training" in result.validation.message
    assert (
        "gpuwarden: Worker: pods after the first get profile training (the template has the "
        "first's)" in result.mutation.warnings
    )
    # With one worker only, there is no second pod to judge.
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 1
    assert admit_job(create(job, "ml"), policies, ClusterView()).allowed


@pytest.mark.parametrize("policy_set", sorted(POLICY_SETS))
@FUZZ
@given(generated=pods(), keep_metadata=st.booleans())
def test_a_template_mutated_is_the_pod_mutated(
    policy_set: str, generated: tuple[str, dict[str, Any]], keep_metadata: bool
) -> None:
    """Any pod as a PyTorchJob's worker template: the job's patch applies, and the pod its
    controller makes of the mutated template is the pod the pod webhooks make of the first,
    which they then leave alone."""
    policies = POLICY_SETS[policy_set]
    namespace, pod = generated
    meta = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")}
    template = {"metadata": meta, "spec": pod["spec"]} if keep_metadata else {"spec": pod["spec"]}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "fuzz", "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": template}}},
    }
    original = copy.deepcopy(job)
    result = admit_job(create(job, namespace), policies, CLUSTER)
    assert job == original  # nothing is modified in place
    mutated = jsonpatch.apply_patch(copy.deepcopy(job), list(result.mutation.patch))
    assert mutated == result.pod
    (replica,) = jobs.replica_templates(mutated)
    rebuilt = jobs.replica_pod(mutated, replica, namespace)
    (decided,) = result.replicas
    assert rebuilt == decided.admission.pod
    again = admit(AdmissionRequest("CREATE", namespace, rebuilt), policies, CLUSTER)
    assert again.mutation.patch == ()


def test_the_job_webhooks_see_gpu_jobs_and_jobs_gpuwarden_changed() -> None:
    """job_needs_review, the twin of the job webhooks' CEL (held to the API server's in
    tests/e2e/test_jobs.py)."""
    gpu = pytorchjob()
    assert job_needs_review(gpu)
    cpu = copy.deepcopy(gpu)
    for replica in cpu["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert not job_needs_review(cpu)
    cpu["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"] = {
        "gpuwarden.io/profile": "heavy-training"
    }
    assert job_needs_review(cpu)
    for kind in KIND_REPLICAS:
        assert job_needs_review(job_of(kind))


def test_job_templates_too_large_to_look_into_are_sent_unread() -> None:
    """The bounds that keep the API server's cost of the job condition small (issue 29's
    item 6, for jobs): past any of them, a CPU job is sent."""
    cpu = pytorchjob()
    for replica in cpu["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert not job_needs_review(cpu)
    worker = cpu["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    container = worker["spec"]["containers"][0]
    for grow in (
        lambda job: job["spec"]["pytorchReplicaSpecs"].update(
            {f"Extra{i}": {"template": {}} for i in range(MAX_REPLICA_TYPES)}
        ),
        lambda job: job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
            "containers"
        ].extend([container] * MAX_CONTAINERS),
        lambda job: job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][
            0
        ]["resources"]["limits"].update({f"example.com/r{i}": "1" for i in range(MAX_ITEMS)}),
        lambda job: job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"].update(
            {"annotations": {f"a{i}": "x" for i in range(MAX_ITEMS + 1)}}
        ),
    ):
        grown = copy.deepcopy(cpu)
        grow(grown)
        assert job_needs_review(grown)
    assert not job_needs_review({**job_of("TFJob"), "kind": "PyTorchJob"})


# --- batch/v1 Jobs: Katib's trials -----------------------------------------------------------


def trial_job() -> dict[str, Any]:
    job: dict[str, Any] = read_yaml(EXAMPLES / "jobs" / "katib-trial-job.yaml")
    return job


def test_a_katib_trial_job_is_decided_as_its_pod_and_its_template_mutated(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """The pod the Job controller creates for a Trial's Job: the API server's job-name and
    controller-uid labels, Katib's trial label (from the Trial that owns the Job), generateName;
    the rule for katib-trial pods gives it its profile, and the template carries what it gets."""
    job = trial_job()
    (replica,) = jobs.replica_templates(job)
    assert (replica.name, replica.path) == ("Job", ("spec", "template"))
    pod = jobs.replica_pod(job, replica, "tenant-a")
    assert pod["metadata"]["generateName"] == "random-search-x9z4m2kt-"
    assert pod["metadata"]["labels"] == {
        "job-name": "random-search-x9z4m2kt",
        "batch.kubernetes.io/job-name": "random-search-x9z4m2kt",
        # The uid exists only once the API server stored the Job (after the mutating webhooks).
        "controller-uid": "",
        "batch.kubernetes.io/controller-uid": "",
        "katib.kubeflow.org/trial": "random-search-x9z4m2kt",
    }
    result = admit_job(create(job), default_policies, cluster)
    assert result.allowed
    assert result.mutation.rule == "rule/katib-trials"
    assert "gpuwarden: Job: profile batch-hpo via rule/katib-trials (tenant tenant-a)" in (
        result.mutation.warnings
    )
    template = result.pod["spec"]["template"]
    # The controller's and Katib's labels stay out of the template; gpuwarden's keys go in.
    assert "labels" not in template["metadata"]
    assert template["metadata"]["annotations"]["gpuwarden.io/profile"] == "batch-hpo"
    limits = template["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits and limits["volcano.sh/vgpu-number"] == "1"
    # The pod the Job controller then creates (and Katib's webhook labels) needs no change.
    (mutated,) = jobs.replica_templates(result.pod)
    again = admit(
        AdmissionRequest("CREATE", "tenant-a", jobs.replica_pod(result.pod, mutated, "tenant-a")),
        default_policies,
        cluster,
    )
    assert again.allowed and again.mutation.patch == ()


def test_a_stored_jobs_labels_and_uid_are_those_of_its_pods() -> None:
    """While validating (after the API server's generateSelector) the Job has its uid and the
    template its labels: the pod is predicted with them; a manual selector adds none."""
    job = trial_job()
    job["metadata"]["uid"] = "0f9e8d7c-0000-4000-8000-00000000abcd"
    job["spec"]["template"]["metadata"]["labels"] = {"job-name": "mine"}
    job["spec"]["completionMode"] = "Indexed"
    (replica,) = jobs.replica_templates(job)
    pod = jobs.replica_pod(job, replica, "tenant-a", 3)
    labels = pod["metadata"]["labels"]
    assert labels["job-name"] == "mine"
    assert labels["batch.kubernetes.io/job-name"] == "random-search-x9z4m2kt"
    assert labels["controller-uid"] == "0f9e8d7c-0000-4000-8000-00000000abcd"
    assert labels["batch.kubernetes.io/job-completion-index"] == "3"
    assert pod["metadata"]["generateName"] == "random-search-x9z4m2kt-3-"
    job["spec"]["manualSelector"] = True
    labels = jobs.replica_pod(job, replica, "tenant-a")["metadata"]["labels"]
    assert "controller-uid" not in labels and "batch.kubernetes.io/job-name" not in labels


def test_a_trials_pytorchjob_is_decided_as_a_katib_trial(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """Katib's pod webhook labels the pods of any job a Trial owns, a PyTorchJob's too."""
    job = pytorchjob()
    job["metadata"]["ownerReferences"] = trial_job()["metadata"]["ownerReferences"]
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
    result = admit_job(create(job), default_policies, cluster)
    assert {r.admission.mutation.rule for r in result.replicas} == {"rule/katib-trials"}


def test_an_over_limit_trial_job_is_denied_with_the_jobs_message(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    job = trial_job()
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 8
    result = admit_job(create(job, "tenant-b"), default_policies, cluster)
    assert not result.allowed
    assert result.validation.message.startswith("Job: gpuwarden denied the pod: ")
    assert "tenant tenant-b allows at most 2 per pod" in result.validation.message


def test_only_batch_jobs_that_ask_for_gpus_reach_the_job_webhooks() -> None:
    job = trial_job()
    assert job_needs_review(job)
    cpu = copy.deepcopy(job)
    cpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert not job_needs_review(cpu)  # every other batch Job in the cluster is never sent
    assert not job_needs_review({**job, "apiVersion": "batch/v2"})


def experiment() -> dict[str, Any]:
    found: dict[str, Any] = read_yaml(EXAMPLES / "jobs" / "katib-experiment.yaml")
    return found


def katib_trial(trial_spec: Any, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The job Katib creates for a trial (trial_controller.go, getDesiredJobSpec): the
    trialSpec, named as the Trial and owned by it."""
    trial = copy.deepcopy(dict(trial_spec))
    name = "random-search-8hq2v4xk"
    trial["metadata"] = {
        "name": name,
        **({"labels": labels} if labels else {}),
        "ownerReferences": [{"apiVersion": "kubeflow.org/v1beta1", "kind": "Trial", "name": name}],
    }
    return trial


def test_an_experiments_batch_trial_template_is_decided_and_mutated_for_its_trials(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """An Experiment whose trialSpec is a batch Job: its template decided as the pod of a
    trial's Job (the Trial's labels, the Experiment's among them), and mutated, so the Job Katib
    makes of it for each trial needs no further change."""
    exp = experiment()
    exp["metadata"]["labels"] = {"team": "vision"}
    (replica,) = jobs.replica_templates(exp)
    assert replica.path == ("spec", "trialTemplate", "trialSpec", "spec", "template")
    pod = jobs.replica_pod(exp, replica, "tenant-a")
    labels = pod["metadata"]["labels"]
    assert labels["katib.kubeflow.org/experiment"] == "random-search"
    assert labels["katib.kubeflow.org/trial"] == "random-search-trial"
    assert labels["team"] == "vision"
    result = admit_job(create(exp), default_policies, cluster)
    assert result.allowed and result.mutation.rule == "rule/katib-trials"
    mutated = result.pod["spec"]["trialTemplate"]["trialSpec"]
    limits = mutated["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits
    # Katib's trial: the trialSpec with its parameters replaced, named and owned by the Trial.
    trial = katib_trial(mutated, {"team": "vision"})
    again = admit_job(create(trial), default_policies, cluster)
    assert again.allowed and again.mutation.patch == ()
    # Over the tenant's limit: refused at submit, before any trial.
    over = experiment()
    container = over["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]
    container["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 8
    denied = admit_job(create(over, "tenant-b"), default_policies, cluster)
    assert denied.validation.message.startswith("Trial: gpuwarden denied the pod: ")


def test_experiments_the_job_webhooks_do_not_judge() -> None:
    """Trial templates of kinds gpuwarden does not read (an Argo Workflow), or whose resources
    trial parameters set, are judged per trial; the CEL twin sends only trialSpecs of the kinds
    it reads that ask for GPUs."""
    exp = experiment()
    assert job_needs_review(exp)
    parameterised = experiment()
    spec = parameterised["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]
    spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "${trialParameters.gpus}"
    assert jobs.replica_templates(parameterised) == ()
    other = experiment()
    other["spec"]["trialTemplate"]["trialSpec"] = {
        **job_of("PyTorchJob"),
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
    }
    assert jobs.replica_templates(other) == ()
    assert not job_needs_review(other)
    cpu = experiment()
    spec = cpu["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]
    spec["containers"][0]["resources"] = {}
    assert not job_needs_review(cpu)


# --- Katib Experiments whose trials are Training Operator jobs -------------------------------


def pytorch_experiment() -> dict[str, Any]:
    """The Katib Experiment with the PyTorchJob example as its trialSpec."""
    exp = experiment()
    trial = pytorchjob()
    del trial["metadata"]
    for replica in trial["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
    exp["spec"]["trialTemplate"]["trialSpec"] = trial
    exp["spec"]["trialTemplate"]["primaryPodLabels"] = {"training.kubeflow.org/job-role": "master"}
    return exp


def test_an_experiments_pytorchjob_trials_are_decided_as_their_pods(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """Each replica of a PyTorchJob trialSpec: the pod the Training Operator creates for a
    trial's job (named as the trial, owned by it), with Katib's labels; mutated so the job Katib
    then creates from it needs nothing more."""
    exp = pytorch_experiment()
    exp["metadata"]["labels"] = {"team": "vision"}
    replicas = jobs.replica_templates(exp)
    assert [(r.name, r.path) for r in replicas] == [
        (
            name,
            ("spec", "trialTemplate", "trialSpec", "spec", "pytorchReplicaSpecs", name, "template"),
        )
        for name in ("Master", "Worker")
    ]
    worker = jobs.replica_pod(exp, replicas[1], "tenant-a", 1)
    assert worker["metadata"]["name"] == "random-search-trial-worker-1"
    assert worker["metadata"]["labels"] == {
        "team": "vision",  # the template's own
        trainingoperator.OPERATOR_NAME_LABEL: "pytorchjob-controller",
        trainingoperator.JOB_NAME_LABEL: "random-search-trial",
        trainingoperator.REPLICA_TYPE_LABEL: "worker",
        trainingoperator.REPLICA_INDEX_LABEL: "1",
        "katib.kubeflow.org/experiment": "random-search",
        "katib.kubeflow.org/trial": "random-search-trial",
    }
    master = jobs.replica_pod(exp, replicas[0], "tenant-a")
    assert master["metadata"]["labels"][trainingoperator.JOB_ROLE_LABEL] == "master"
    result = admit_job(create(exp), default_policies, cluster)
    assert result.allowed
    assert {r.admission.mutation.rule for r in result.replicas} == {"rule/katib-trials"}
    assert "gpuwarden: Worker: profile batch-hpo via rule/katib-trials (tenant tenant-a)" in (
        result.mutation.warnings
    )
    trial = katib_trial(result.pod["spec"]["trialTemplate"]["trialSpec"])
    limits = trial["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "resources"
    ]["limits"]
    assert "nvidia.com/gpu" not in limits and limits["volcano.sh/vgpu-number"] == "1"
    # The Training Operator's pods from Katib's trial job need no further change.
    again = admit_job(create(trial), default_policies, cluster)
    assert again.allowed and again.mutation.patch == ()
    for replica, decided in zip(jobs.replica_templates(trial), result.replicas, strict=True):
        pod = jobs.replica_pod(trial, replica, "tenant-a")
        repeat = admit(AdmissionRequest("CREATE", "tenant-a", pod), default_policies, cluster)
        assert repeat.allowed and repeat.mutation.patch == ()
        assert pod["spec"] == decided.admission.pod["spec"]


def test_an_over_limit_pytorchjob_trial_refuses_the_experiment(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    exp = pytorch_experiment()
    worker = exp["spec"]["trialTemplate"]["trialSpec"]["spec"]["pytorchReplicaSpecs"]["Worker"]
    worker["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 8
    result = admit_job(create(exp, "tenant-b"), default_policies, cluster)
    assert not result.allowed
    assert result.validation.message.startswith("Worker: gpuwarden denied the pod: ")
    assert "tenant tenant-b allows at most 2 per pod" in result.validation.message


@pytest.mark.parametrize("kind", sorted(KIND_REPLICAS))
def test_every_training_operator_kind_is_read_as_a_trial(
    default_policies: PolicySet, cluster: ClusterView, kind: str
) -> None:
    exp = experiment()
    # As the API server would send it: its replicas no longer share one container object.
    trial = json.loads(json.dumps(job_of(kind)))
    del trial["metadata"]
    exp["spec"]["trialTemplate"]["trialSpec"] = trial
    assert [r.name for r in jobs.replica_templates(exp)] == list(KIND_REPLICAS[kind])
    assert job_needs_review(exp)
    result = admit_job(create(exp), default_policies, cluster)
    assert result.allowed
    field = jobs.TRAINING_OPERATOR_KINDS[kind].replica_field
    for name in KIND_REPLICAS[kind]:
        assert f"/spec/trialTemplate/trialSpec/spec/{field}/{name}/template/spec/schedulerName" in {
            op["path"] for op in result.mutation.patch
        }
    # The CEL twin: a trial of CPU pods is not sent; a trialSpec claiming another kind's
    # replicas is judged by the kind it names.
    cpu = copy.deepcopy(exp)
    for replica in cpu["spec"]["trialTemplate"]["trialSpec"]["spec"][field].values():
        replica["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert not job_needs_review(cpu)
    other = "TFJob" if kind != "TFJob" else "PyTorchJob"
    exp["spec"]["trialTemplate"]["trialSpec"]["kind"] = other
    assert not job_needs_review(exp)


def test_a_pytorchjob_trial_spec_that_cannot_be_read_names_the_field(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    exp = pytorch_experiment()
    del exp["spec"]["trialTemplate"]["trialSpec"]["spec"]["pytorchReplicaSpecs"]
    result = admit_job(create(exp), default_policies, cluster)
    assert result.validation.code == 400
    assert result.validation.message == (
        "gpuwarden cannot read the Experiment's replicas: spec.trialTemplate.trialSpec has no "
        "spec.pytorchReplicaSpecs"
    )
    exp = pytorch_experiment()
    exp["spec"]["trialTemplate"]["trialSpec"]["spec"]["pytorchReplicaSpecs"]["Worker"] = []
    result = admit_job(create(exp), default_policies, cluster)
    assert result.validation.message.endswith(
        "spec.trialTemplate.trialSpec.spec.pytorchReplicaSpecs.Worker must be an object"
    )


# --- Trainer v2 TrainJobs --------------------------------------------------------------------


def trainjob() -> dict[str, Any]:
    job: dict[str, Any] = read_yaml(EXAMPLES / "jobs" / "trainjob.yaml")
    return job


# The torch-distributed ClusterTrainingRuntime's node container (Trainer v2.0.0,
# manifests/base/runtimes/torch_distributed.yaml), as the Torch plugin leaves it.
RUNTIME_NODE = {
    "name": "node",
    "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
    "command": ["/bin/bash", "-c", "echo Torch Distributed Runtime"],
    "env": [{"name": "PET_NNODES", "value": "2"}, {"name": "PET_NPROC_PER_NODE", "value": "auto"}],
    "ports": [{"containerPort": 29500}],
}


def runtime_pod(job: dict[str, Any], namespace: str = "tenant-a") -> dict[str, Any]:
    """The trainer node pod the Trainer (builder.go, Trainer: spec.trainer's image, command and
    env on the node container, resourcesPerNode replacing its resources) and JobSet make of
    ``job`` on the torch-distributed runtime."""
    trainer = job["spec"]["trainer"]
    node = {**RUNTIME_NODE, "image": trainer["image"], "command": trainer["command"]}
    node["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
    (replica,) = jobs.replica_templates(job)
    pod = jobs.replica_pod(job, replica, namespace)
    pod["spec"] = {"restartPolicy": "OnFailure", "subdomain": job["metadata"]["name"]}
    pod["spec"]["containers"] = [node]
    return pod


def test_an_over_limit_trainjob_is_refused_with_the_nodes_message(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    job = trainjob()
    job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = "8"
    result = admit_job(create(job, "tenant-b"), default_policies, cluster)
    assert not result.allowed
    assert result.validation.message.startswith(
        "node: gpuwarden denied the pod: container node asks for 8 GPUs"
    )
    assert "tenant tenant-b allows at most 2 per pod" in result.validation.message
    # The node pod the runtime would make: the same denial.
    alone = admit(
        AdmissionRequest("CREATE", "tenant-b", runtime_pod(job, "tenant-b")),
        default_policies,
        cluster,
    )
    assert result.validation.message == f"node: {alone.validation.message}"


def test_a_trainjob_carries_the_node_resources_and_leaves_the_rest_to_the_pod_webhook(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """The mutation rewrites resourcesPerNode only; the node pod the runtime makes of the
    mutated TrainJob is then changed by the pod webhook everywhere but in the node's resources,
    and ends as the pod of the job as written would."""
    job = trainjob()
    (replica,) = jobs.replica_templates(job)
    assert (replica.name, replica.replicas) == ("node", 2)
    assert replica.twins == (("/spec/containers/0/resources", "/spec/trainer/resourcesPerNode"),)
    pod = jobs.replica_pod(job, replica, "tenant-a")
    assert pod["metadata"]["generateName"] == "llama-sft-node-0-0-"
    assert pod["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
    assert pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] == "llama-sft"
    assert pod["metadata"]["labels"]["job-name"] == "llama-sft-node-0"
    result = admit_job(create(job), default_policies, cluster)
    assert result.allowed and result.mutation.rule == "rule/trainer-nodes"
    assert [op["path"] for op in result.mutation.patch] == [
        "/spec/trainer/resourcesPerNode/requests"
    ]
    assert (
        "gpuwarden: node: each pod gets these when it is created, as no field of the TrainJob "
        "holds them: /spec/schedulerName"
    ) in "".join(result.mutation.warnings)
    mutated = jsonpatch.apply_patch(copy.deepcopy(job), list(result.mutation.patch))
    assert mutated == result.pod
    resources = mutated["spec"]["trainer"]["resourcesPerNode"]
    assert resources["requests"]["nvidia.com/gpu"] == "1"  # heavy-training: a whole GPU
    as_written = admit(
        AdmissionRequest("CREATE", "tenant-a", runtime_pod(job)), default_policies, cluster
    )
    after = admit(
        AdmissionRequest("CREATE", "tenant-a", runtime_pod(mutated)), default_policies, cluster
    )
    assert after.allowed
    assert after.mutation.patch  # the scheduler, annotations ... are the pod webhook's
    assert not any("/resources" in op["path"] for op in after.mutation.patch)
    assert after.pod == as_written.pod


SHARED_TRAINERS = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: shared-trainers}
spec:
  backend: volcano
  profiles:
    - {name: light, gpuShare: true, maxMemory: 16Gi, threadPercentage: 50, priority: 100}
  workloads:
    - {name: trainers, match: {kind: trainjob}, profile: light}
  tenants:
    - {name: ml, namespaces: [ml]}
"""


def test_a_shared_profile_renames_the_resource_in_resources_per_node() -> None:
    """What Kueue then charges for the TrainJob's nodes is the resource the pods use."""
    policies = load_texts([("shared.yaml", SHARED_TRAINERS)])
    job = trainjob()
    result = admit_job(create(job, "ml"), policies, ClusterView())
    assert result.allowed
    limits = result.pod["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert "nvidia.com/gpu" not in limits and limits["volcano.sh/vgpu-number"] == "1"
    assert limits["memory"] == "64Gi"
    after = admit(
        AdmissionRequest("CREATE", "ml", runtime_pod(dict(result.pod), "ml")),
        policies,
        ClusterView(),
    )
    assert not any("/resources" in op["path"] for op in after.mutation.patch)


def test_trainjobs_without_resources_per_node_are_left_to_the_pod_webhook() -> None:
    """The runtime's resources are not in the TrainJob: nothing to judge, and the CEL twin does
    not send it; resourcesPerNode naming a GPU is sent, one of CPUs only is not."""
    job = trainjob()
    assert job_needs_review(job)
    cpu = copy.deepcopy(job)
    cpu["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"cpu": "4"}}
    assert not job_needs_review(cpu)
    del job["spec"]["trainer"]["resourcesPerNode"]
    assert jobs.replica_templates(job) == ()
    assert not job_needs_review(job)
    job["spec"]["trainer"]["resourcesPerNode"] = {}
    assert jobs.replica_templates(job) == ()


def test_a_trainjob_that_cannot_be_read_is_refused_naming_the_field(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    for name, value, field in (
        ("resourcesPerNode", ["nvidia.com/gpu"], "spec.trainer.resourcesPerNode must be an object"),
        ("resourcesPerNode", {"limits": "8"}, "spec.trainer.resourcesPerNode.limits must be an"),
        (
            "resourcesPerNode",
            {"requests": {"nvidia.com/gpu": True}},
            "spec.trainer.resourcesPerNode.requests['nvidia.com/gpu'] must be a quantity",
        ),
        ("image", ["x"], "spec.trainer.image must be a string"),
        ("env", {"A": "1"}, "spec.trainer.env must be an array"),
    ):
        job = trainjob()
        job["spec"]["trainer"][name] = value
        result = admit_job(create(job), default_policies, cluster)
        assert result.validation.code == 400
        assert result.validation.message.startswith(
            f"gpuwarden cannot read the TrainJob's replicas: {field}"
        )


def test_an_experiment_of_trainjob_trials_is_judged_by_resources_per_node(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    exp = experiment()
    trial = trainjob()
    del trial["metadata"]
    exp["spec"]["trialTemplate"]["trialSpec"] = trial
    (replica,) = jobs.replica_templates(exp)
    assert replica.path == (
        "spec",
        "trialTemplate",
        "trialSpec",
        "spec",
        "trainer",
        "resourcesPerNode",
    )
    assert job_needs_review(exp)
    result = admit_job(create(exp), default_policies, cluster)
    assert result.allowed
    paths = [op["path"] for op in result.mutation.patch]
    assert paths and all(
        p.startswith("/spec/trialTemplate/trialSpec/spec/trainer/resourcesPerNode/") for p in paths
    )
    mutated = jsonpatch.apply_patch(copy.deepcopy(exp), list(result.mutation.patch))
    node = mutated["spec"]["trialTemplate"]["trialSpec"]["spec"]["trainer"]["resourcesPerNode"]
    assert "volcano.sh/vgpu-number" in node["limits"]


@pytest.mark.parametrize("policy_set", sorted(POLICY_SETS))
@FUZZ
@given(
    namespace=st.sampled_from(NAMESPACES),
    resources=st.fixed_dictionaries({"limits": resource_map}, optional={"requests": resource_map}),
)
def test_a_trainjobs_mutated_resources_lead_to_the_same_node_pod(
    policy_set: str, namespace: str, resources: dict[str, Any]
) -> None:
    """Any resources as a TrainJob's resourcesPerNode: the node pod the runtime makes of the
    mutated TrainJob ends, after the pod webhook, as the pod of the TrainJob as written would;
    the pod webhook no longer touches its resources."""
    policies = POLICY_SETS[policy_set]
    job = trainjob()
    job["metadata"]["namespace"] = namespace
    job["spec"]["trainer"]["resourcesPerNode"] = copy.deepcopy(resources)
    result = admit_job(create(job, namespace), policies, CLUSTER)
    event(f"allowed: {result.allowed}, changed: {bool(result.mutation.patch)}")
    assume(result.allowed)
    mutated = jsonpatch.apply_patch(copy.deepcopy(job), list(result.mutation.patch))
    as_written = admit(
        AdmissionRequest("CREATE", namespace, runtime_pod(job, namespace)), policies, CLUSTER
    )
    after = admit(
        AdmissionRequest("CREATE", namespace, runtime_pod(mutated, namespace)), policies, CLUSTER
    )
    assert after.allowed
    assert not any("/resources" in op["path"] for op in after.mutation.patch)
    assert after.pod == as_written.pod


@pytest.mark.parametrize(
    ("pointer", "name"),
    [
        ("/spec/containers/0", "spec.containers[0]"),
        ("/spec/predictor/model", "spec.predictor.model"),
        (
            "/spec/template/metadata/labels/app.kubernetes.io~1name",
            "spec.template.metadata.labels[app.kubernetes.io/name]",
        ),
        (
            "/spec/containers/1/resources/limits/nvidia.com~1gpu",
            "spec.containers[1].resources.limits[nvidia.com/gpu]",
        ),
        ("/metadata/annotations/a~0b", "metadata.annotations.a~b"),
    ],
)
def test_messages_name_a_field_as_kubernetes_field_paths_do(pointer: str, name: str) -> None:
    assert field_name(pointer) == name
