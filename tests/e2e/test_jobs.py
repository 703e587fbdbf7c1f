"""Kubeflow jobs governed at submit, through the real API server (issue 30).

A PyTorchJob CRD (a minimal structural one, generated here: the Training Operator's own CRD is
not copied into this repository) is installed, and the chart's job webhooks point at gpuwarden
serve. An over-limit job is refused by the API server with the replica's message; an allowed one
is stored with its templates mutated, and the pod its controller would create from them passes
the pod webhooks unchanged.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.gpuwardenserver import POLICIES_DIR
from gpuwarden.lab.cluster.trainingoperator import delete_jobs
from gpuwarden.lab.cluster.webhookstack import (
    KUBEFLOW_PROFILE_LABELS,
    SERVER_SET_METADATA,
    Obj,
    WebhookStack,
    api_defaults,
    create_pod,
    parse_warning,
)
from gpuwarden.policy import AdmissionRequest, ClusterView
from gpuwarden.policy.admission.jobs import admit_job
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.render.scope import job_needs_review

from .controlplane import REPO_ROOT
from .webhook import api_error, serve_crd

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
JOB_FILE = REPO_ROOT / "examples" / "jobs" / "pytorchjob.yaml"
GITOPS_POLICY = Path(__file__).parent / "policies" / "01-e2e-gitops.yaml"


def pytorchjob_crd() -> Obj:
    """A structural CRD for kubeflow.org/v1 PyTorchJob that keeps whatever the spec holds (the
    names as pkg/apis/kubeflow.org/v1/pytorch_types.go of the Training Operator v1.8.1 gives
    them; its own CRD types every field, which nothing here needs)."""
    return keeping_crd("PyTorchJob", PLURAL, VERSION)


def keeping_crd(
    kind: str,
    plural: str,
    versions: str | Sequence[str],
    group: str = GROUP,
    *,
    stored: str | None = None,
    spec: Obj | None = None,
) -> Obj:
    """A structural CRD of ``kind`` (a kubeflow.org one by default) whose status keeps any
    fields, and whose spec does too unless ``spec`` gives its schema, served at each of
    ``versions``; ``stored`` (the last by default) is stored (no conversion: the fields are the
    same in each)."""
    served = (versions,) if isinstance(versions, str) else tuple(versions)
    keep = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    properties = {"spec": keep if spec is None else spec, "status": keep}
    schema = {"openAPIV3Schema": {"type": "object", "properties": properties}}
    storage = served[-1] if stored is None else stored
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": version == storage,
                    "schema": schema,
                    "subresources": {"status": {}},
                }
                for version in served
            ],
        },
    }


@pytest.fixture(scope="module")
def gpuwarden_policies() -> Sequence[Path]:
    return (GITOPS_POLICY, POLICIES_DIR)


@pytest.fixture(scope="module")
def pytorchjobs(gpuwarden: WebhookStack) -> Iterator[k8s_client.CustomObjectsApi]:
    """The PyTorchJob CRD, established and served."""
    yield serve_crd(gpuwarden.api, pytorchjob_crd())
    delete_jobs(gpuwarden.api)


def job_in(namespace: str, *, worker_gpus: str = "1") -> Obj:
    job: Obj = yaml.safe_load(JOB_FILE.read_text())
    job["metadata"]["namespace"] = namespace
    job["metadata"]["name"] = f"bert-{uuid.uuid4().hex[:6]}"
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"]["nvidia.com/gpu"] = worker_gpus
    return job


def create_job(objects: k8s_client.CustomObjectsApi, job: Obj) -> tuple[Obj, tuple[str, ...]]:
    """POST the job; the stored object and the response's warnings."""
    response: Any = objects.create_namespaced_custom_object(
        GROUP, VERSION, job["metadata"]["namespace"], PLURAL, job, _preload_content=False
    )
    warnings = tuple(parse_warning(h) for h in response.headers.getlist("Warning"))
    return json.loads(response.data), warnings


def job_exists(objects: k8s_client.CustomObjectsApi, namespace: str, name: str) -> bool:
    try:
        objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def predicted(gpuwarden: WebhookStack, job: Obj) -> Any:
    """What `gpuwarden apply` says of the job, with the namespace's real labels."""
    namespace = job["metadata"]["namespace"]
    cluster = ClusterView(
        namespace_labels={namespace: gpuwarden.namespace_labels(namespace)},
        priority_classes=gpuwarden.priority_classes,
    )
    return admit_job(AdmissionRequest("CREATE", namespace, job), gpuwarden.policies, cluster)


def test_an_over_limit_pytorchjob_is_refused_at_submit(
    gpuwarden: WebhookStack, pytorchjobs: k8s_client.CustomObjectsApi
) -> None:
    """tenant-b allows 2 GPUs a pod: a job asking 8 per worker never gets stored."""
    ns = gpuwarden.tenant_namespace(name="tenant-b")
    job = job_in(ns, worker_gpus="8")
    with pytest.raises(ApiException) as refused:
        create_job(pytorchjobs, job)
    status, text = api_error(refused.value)
    assert status == 403
    assert 'admission webhook "validate-jobs.gpuwarden.io" denied the request: Worker: ' in text
    assert "container pytorch asks for 8 GPUs" in text
    assert "tenant tenant-b allows at most 2 per pod" in text
    assert text.endswith(predicted(gpuwarden, job).validation.message)
    assert not job_exists(pytorchjobs, ns, job["metadata"]["name"])


def test_an_allowed_pytorchjob_is_stored_with_its_templates_mutated(
    gpuwarden: WebhookStack, pytorchjobs: k8s_client.CustomObjectsApi
) -> None:
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    job = job_in(ns)
    stored, warnings = create_job(pytorchjobs, job)
    expected = predicted(gpuwarden, job)
    assert expected.allowed
    assert stored["spec"] == expected.pod["spec"]  # field for field what apply predicts
    worker = stored["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert worker["spec"]["schedulerName"] == "volcano"
    assert worker["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert worker["metadata"]["annotations"]["gpuwarden.io/profile"] == "heavy-training"
    assert "gpuwarden: Worker: pytorch: 1 whole GPU(s) on volcano" in warnings
    # The worker pod its controller creates from the stored job: the pod webhooks change nothing
    # (a server-side dry run, so it is not charged to the tenant's quota).
    replica = next(r for r in jobs.replica_templates(stored) if r.name == "Worker")
    pod = jobs.replica_pod(stored, replica, ns)
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PyTorchJob",
            "name": stored["metadata"]["name"],
            "uid": stored["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    created = create_pod(gpuwarden.api, pod, dry_run=True).pod
    for key in SERVER_SET_METADATA:
        created["metadata"].pop(key, None)
    created.pop("status", None)
    assert created == api_defaults(gpuwarden.api, pod)


def test_validate_only_keeps_the_job_as_written(
    gpuwarden: WebhookStack, pytorchjobs: k8s_client.CustomObjectsApi
) -> None:
    """The tenant's jobTemplates: keep: the stored job is the submitted one; warnings say what
    the pods will get, and the limits still refuse an over-limit job."""
    ns = gpuwarden.tenant_namespace(
        "e2e-gitops", {**KUBEFLOW_PROFILE_LABELS, "e2e.gpuwarden.io/tenant": "gitops"}
    )
    job = job_in(ns)
    stored, warnings = create_job(pytorchjobs, copy.deepcopy(job))
    assert stored["spec"] == job["spec"]
    assert stored["metadata"].get("annotations") is None
    assert "gpuwarden: Worker: pytorch: 1 whole GPU(s) on volcano" in warnings
    assert any(w.startswith("gpuwarden: the PyTorchJob is kept as written") for w in warnings)
    with pytest.raises(ApiException) as refused:
        create_job(pytorchjobs, job_in(ns, worker_gpus="8"))
    assert "denied the request: Worker: gpuwarden denied the pod: " in api_error(refused.value)[1]


def test_the_api_server_sends_the_jobs_the_twin_says(
    gpuwarden: WebhookStack, pytorchjobs: k8s_client.CustomObjectsApi
) -> None:
    """The job webhooks' CEL (the chart's, webhook.scope policies) against its Python twin: a
    job of CPU pods never reaches gpuwarden, a GPU job and one carrying gpuwarden's keys do."""
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    cpu = job_in(ns)
    for replica in cpu["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    marked = copy.deepcopy(cpu)
    marked["metadata"]["name"] += "-marked"
    marked["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"] = {
        "labels": {"gpuwarden.io/profile": "heavy-training"}
    }
    # Templates too large to look into are sent unread (the API server's comprehensions cost
    # more than linear time): a CPU job with 200 labels on a template.
    large = copy.deepcopy(cpu)
    large["metadata"]["name"] += "-large"
    large["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"] = {
        "labels": {f"team.example.com/l{i}": "x" for i in range(200)}
    }
    for job, sent in ((cpu, False), (job_in(ns), True), (marked, True), (large, True)):
        assert job_needs_review(job) is sent
        before = gpuwarden.server.requests_answered(endpoint="mutate")
        create_job(pytorchjobs, job)
        after = gpuwarden.server.requests_answered(endpoint="mutate")
        assert after - before == (1 if sent else 0), job["metadata"]["name"]


def test_batch_jobs_reach_the_job_webhooks_only_when_they_ask_for_gpus(
    gpuwarden: WebhookStack,
) -> None:
    """A Katib trial's Job is mutated at submit and an over-limit one refused with ``Job: ...``;
    a batch Job of CPU pods is never sent (the chart's CEL against its Python twin)."""
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    batch: Any = k8s_client.BatchV1Api(gpuwarden.api)
    trial = yaml.safe_load((REPO_ROOT / "examples" / "jobs" / "katib-trial-job.yaml").read_text())
    trial["metadata"] = {"name": f"trial-{uuid.uuid4().hex[:6]}", "namespace": ns}
    cpu = copy.deepcopy(trial)
    cpu["metadata"]["name"] += "-cpu"
    cpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    for job, sent in ((cpu, False), (trial, True)):
        assert job_needs_review(job) is sent
        before = gpuwarden.server.requests_answered(endpoint="mutate")
        batch.create_namespaced_job(ns, job)
        after = gpuwarden.server.requests_answered(endpoint="mutate")
        assert after - before == (1 if sent else 0), job["metadata"]["name"]
    stored = batch.read_namespaced_job(trial["metadata"]["name"], ns)
    (container,) = stored.spec.template.spec.containers
    assert "nvidia.com/gpu" not in (container.resources.limits or {})
    assert stored.spec.template.metadata.annotations["gpuwarden.io/profile"]
    over = copy.deepcopy(trial)
    over["metadata"]["name"] += "-over"
    over["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "64"}
    }
    with pytest.raises(ApiException) as refused:
        batch.create_namespaced_job(ns, over)
    assert "denied the request: Job: gpuwarden denied the pod: " in api_error(refused.value)[1]
    for job in (cpu, trial):
        batch.delete_namespaced_job(job["metadata"]["name"], ns)


def served_crd(
    gpuwarden: WebhookStack, kind: str, plural: str, version: str, group: str = GROUP
) -> Any:
    """A keeping CRD of ``kind``, created once and served; the custom objects client."""
    return serve_crd(gpuwarden.api, keeping_crd(kind, plural, version, group))


def test_an_experiments_batch_trial_template_is_judged_at_submit(gpuwarden: WebhookStack) -> None:
    """A Katib Experiment (a CRD that keeps its spec, as Katib v0.19's names it) whose trialSpec
    is a batch Job asking for a GPU: sent, stored with the template mutated, refused over the
    limit with ``Trial: ...``; one of CPU trials is never sent."""
    objects = served_crd(gpuwarden, "Experiment", "experiments", "v1beta1")
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    exp = yaml.safe_load((REPO_ROOT / "examples" / "jobs" / "katib-experiment.yaml").read_text())
    exp["metadata"] = {"name": f"hpo-{uuid.uuid4().hex[:6]}", "namespace": ns}
    trial_pod = ("spec", "trialTemplate", "trialSpec", "spec", "template", "spec")
    cpu = copy.deepcopy(exp)
    cpu["metadata"]["name"] += "-cpu"
    _at(cpu, trial_pod)["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    for job, sent in ((cpu, False), (exp, True)):
        assert job_needs_review(job) is sent
        before = gpuwarden.server.requests_answered(endpoint="mutate")
        objects.create_namespaced_custom_object(GROUP, "v1beta1", ns, "experiments", job)
        after = gpuwarden.server.requests_answered(endpoint="mutate")
        assert after - before == (1 if sent else 0), job["metadata"]["name"]
    stored = objects.get_namespaced_custom_object(
        GROUP, "v1beta1", ns, "experiments", exp["metadata"]["name"]
    )
    (container,) = _at(stored, trial_pod)["containers"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    over = copy.deepcopy(exp)
    over["metadata"]["name"] += "-over"
    _at(over, trial_pod)["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "64"}}
    with pytest.raises(ApiException) as refused:
        objects.create_namespaced_custom_object(GROUP, "v1beta1", ns, "experiments", over)
    assert "denied the request: Trial: gpuwarden denied the pod: " in api_error(refused.value)[1]
    for job in (cpu, exp):
        objects.delete_namespaced_custom_object(
            GROUP, "v1beta1", ns, "experiments", job["metadata"]["name"]
        )


def _at(obj: Any, path: Sequence[str]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def sent_once(gpuwarden: WebhookStack, create: Any, sent: bool, name: str) -> Any:
    """``create()``, checking that the API server called the job webhooks iff ``sent``."""
    before = gpuwarden.server.requests_answered(endpoint="mutate")
    created = create()
    after = gpuwarden.server.requests_answered(endpoint="mutate")
    assert after - before == (1 if sent else 0), name
    return created


def test_an_experiments_pytorchjob_trials_are_judged_at_submit(gpuwarden: WebhookStack) -> None:
    """An Experiment whose trialSpec is a PyTorchJob: its replicas judged as the trial job's
    pods, stored mutated, refused over the limit with ``Worker: ...``; the API server sends it
    as the CEL twin says (the trialSpec.kind guard)."""
    objects = served_crd(gpuwarden, "Experiment", "experiments", "v1beta1")
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    exp = yaml.safe_load((REPO_ROOT / "examples" / "jobs" / "katib-experiment.yaml").read_text())
    exp["metadata"] = {"name": f"hpo-pt-{uuid.uuid4().hex[:6]}", "namespace": ns}
    trial = job_in(ns)
    del trial["metadata"]
    exp["spec"]["trialTemplate"]["trialSpec"] = trial
    replicas = ("spec", "trialTemplate", "trialSpec", "spec", "pytorchReplicaSpecs")
    cpu = copy.deepcopy(exp)
    cpu["metadata"]["name"] += "-cpu"
    for replica in _at(cpu, replicas).values():
        replica["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    for job, sent in ((cpu, False), (exp, True)):
        assert job_needs_review(job) is sent
        sent_once(
            gpuwarden,
            lambda job=job: objects.create_namespaced_custom_object(
                GROUP, "v1beta1", ns, "experiments", job
            ),
            sent,
            job["metadata"]["name"],
        )
    stored = objects.get_namespaced_custom_object(
        GROUP, "v1beta1", ns, "experiments", exp["metadata"]["name"]
    )
    assert stored["spec"] == predicted(gpuwarden, exp).pod["spec"]
    worker = _at(stored, replicas)["Worker"]["template"]
    assert worker["metadata"]["annotations"]["gpuwarden.io/profile"]
    over = copy.deepcopy(exp)
    over["metadata"]["name"] += "-over"
    _at(over, replicas)["Worker"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "64"}
    }
    with pytest.raises(ApiException) as refused:
        objects.create_namespaced_custom_object(GROUP, "v1beta1", ns, "experiments", over)
    assert "denied the request: Worker: gpuwarden denied the pod: " in api_error(refused.value)[1]
    for job in (cpu, exp):
        objects.delete_namespaced_custom_object(
            GROUP, "v1beta1", ns, "experiments", job["metadata"]["name"]
        )


TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS = "trainer.kubeflow.org", "v1alpha1", "trainjobs"


def test_a_trainjob_is_judged_by_its_resources_per_node(gpuwarden: WebhookStack) -> None:
    """A TrainJob (a CRD that keeps its spec, with the Trainer v2.0.0's group, version, kind and
    plural): over the limit, refused with ``node: ...``; allowed, stored with resourcesPerNode
    mutated as `gpuwarden apply` predicts and nothing else changed; one asking for no GPU (or
    leaving resources to its runtime) is never sent."""
    objects = served_crd(gpuwarden, "TrainJob", TRAINJOBS, TRAINER_VERSION, TRAINER_GROUP)

    def create(job: Obj) -> Any:
        namespace = job["metadata"]["namespace"]
        return objects.create_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, namespace, TRAINJOBS, job
        )

    base = yaml.safe_load((REPO_ROOT / "examples" / "jobs" / "trainjob.yaml").read_text())
    over_ns = gpuwarden.tenant_namespace(name="tenant-b")
    over = copy.deepcopy(base)
    over["metadata"] = {"name": f"sft-{uuid.uuid4().hex[:6]}", "namespace": over_ns}
    over["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = "8"
    with pytest.raises(ApiException) as refused:
        create(over)
    status, text = api_error(refused.value)
    assert status == 403
    assert 'admission webhook "validate-jobs.gpuwarden.io" denied the request: node: ' in text
    assert "container node asks for 8 GPUs" in text
    assert text.endswith(predicted(gpuwarden, over).validation.message)

    ns = gpuwarden.tenant_namespace(name="tenant-a")
    job = copy.deepcopy(base)
    job["metadata"] = {"name": f"sft-{uuid.uuid4().hex[:6]}", "namespace": ns}
    cpu = copy.deepcopy(job)
    cpu["metadata"]["name"] += "-cpu"
    cpu["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"cpu": "4"}}
    runtime = copy.deepcopy(job)
    runtime["metadata"]["name"] += "-runtime"
    del runtime["spec"]["trainer"]["resourcesPerNode"]
    for obj, sent in ((cpu, False), (runtime, False), (job, True)):
        assert job_needs_review(obj) is sent
        stored = sent_once(gpuwarden, lambda obj=obj: create(obj), sent, obj["metadata"]["name"])
    expected = predicted(gpuwarden, job)
    assert expected.allowed
    assert stored["spec"] == expected.pod["spec"]
    changed = {k for k in job["spec"] if stored["spec"][k] != job["spec"][k]}
    assert changed == {"trainer"}
    trainer = {k: v for k, v in stored["spec"]["trainer"].items() if k != "resourcesPerNode"}
    assert trainer == {k: v for k, v in job["spec"]["trainer"].items() if k != "resourcesPerNode"}
    assert stored["spec"]["trainer"]["resourcesPerNode"]["requests"]["nvidia.com/gpu"] == "1"
    assert stored["metadata"].get("annotations") is None
    for obj in (cpu, runtime, job):
        objects.delete_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, ns, TRAINJOBS, obj["metadata"]["name"]
        )
