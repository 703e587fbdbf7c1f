"""Kubeflow jobs admitted at submit (issue 30): each replica decided as the pod its controller
will create, the job denied with the replica's message, its templates mutated so the pod webhook
finds nothing left to change."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.policy import AdmissionRequest, ClusterView, PolicySet, admit, load_texts
from gpuwarden.policy.admission.jobs import admit_job
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.pod.jobs import trainingoperator
from gpuwarden.policy.render.scope import (
    MAX_CONTAINERS,
    MAX_ITEMS,
    MAX_REPLICA_TYPES,
    job_needs_review,
)

from .support import EXAMPLES, read_yaml
from .test_property import CLUSTER, FUZZ, POLICY_SETS, pods

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
    trial = copy.deepcopy(dict(mutated))
    trial["metadata"] = {
        "name": "random-search-8hq2v4xk",
        "labels": {"team": "vision"},
        "ownerReferences": [
            {
                "apiVersion": "kubeflow.org/v1beta1",
                "kind": "Trial",
                "name": "random-search-8hq2v4xk",
            }
        ],
    }
    again = admit_job(create(trial), default_policies, cluster)
    assert again.allowed and again.mutation.patch == ()
    # Over the tenant's limit: refused at submit, before any trial.
    over = experiment()
    container = over["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]
    container["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 8
    denied = admit_job(create(over, "tenant-b"), default_policies, cluster)
    assert denied.validation.message.startswith("Trial: gpuwarden denied the pod: ")


def test_experiments_the_job_webhooks_do_not_judge() -> None:
    """Trial templates of other kinds, or whose resources trial parameters set, are judged per
    trial; the CEL twin sends only batch trialSpecs that ask for GPUs."""
    exp = experiment()
    assert job_needs_review(exp)
    parameterised = experiment()
    spec = parameterised["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]
    spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "${trialParameters.gpus}"
    assert jobs.replica_templates(parameterised) == ()
    other = experiment()
    other["spec"]["trialTemplate"]["trialSpec"] = {**job_of("PyTorchJob")}
    assert jobs.replica_templates(other) == ()
    assert not job_needs_review(other)
    cpu = experiment()
    spec = cpu["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]
    spec["containers"][0]["resources"] = {}
    assert not job_needs_review(cpu)
