"""Kubeflow job reviews reach the policy core through /mutate and /validate (issue 30): the
template patch, the replica's denial, a job that cannot be read, and a job while no policy is
loaded."""

from __future__ import annotations

import copy
from typing import Any

from .support import POLICY, Webhook, Workdir, apply_response, review

JOB_KIND = {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"}
JOBS = {"group": "kubeflow.org", "version": "v1", "resource": "pytorchjobs"}
LIMITED = POLICY.replace(
    "{name: team-a, namespaces: [team-a]}",
    "{name: team-a, namespaces: [team-a], limits: {maxGpusPerPod: 2}}",
)


def pytorchjob(gpus: str = "1") -> dict[str, Any]:
    container = {
        "name": "pytorch",
        "image": "trainer:1",
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "bert", "namespace": "team-a"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": 2, "template": {"spec": {"containers": [container]}}}
            }
        },
    }


def job_review(job: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return review(job, kind=JOB_KIND, resource=JOBS, **changes)


async def test_a_job_gets_its_templates_mutated_and_passes_validation(webhook: Webhook) -> None:
    job = pytorchjob()
    response = await webhook.admit("mutate", job_review(job))
    assert response["allowed"] is True
    assert (
        "gpuwarden: Worker: profile light-training via default (tenant team-a)"
        in (response["warnings"])
    )
    mutated = apply_response(job, response)
    template = mutated["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert template["metadata"]["annotations"]["gpuwarden.io/profile"] == "light-training"
    assert template["spec"]["schedulerName"] == "volcano"
    again = await webhook.admit("mutate", job_review(mutated))
    assert "patch" not in again  # nothing left to do
    validation = await webhook.admit("validate", job_review(mutated))
    assert validation["allowed"] is True


async def test_an_over_limit_job_is_refused_with_the_replicas_message(
    make_webhook: Any, workdir: Workdir
) -> None:
    workdir.write_policy(LIMITED)
    webhook: Webhook = await make_webhook()
    job = pytorchjob("8")
    mutated = apply_response(job, await webhook.admit("mutate", job_review(job)))
    response = await webhook.admit("validate", job_review(mutated))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"].startswith("Worker: gpuwarden denied the pod: ")
    assert "tenant team-a allows at most 2 per pod" in response["status"]["message"]
    # An update that leaves the replicas alone (a label on the job) is not judged again.
    relabelled = copy.deepcopy(mutated)
    relabelled["metadata"]["labels"] = {"owner": "alice"}
    update = job_review(relabelled, operation="UPDATE", old=mutated)
    assert (await webhook.admit("validate", update))["allowed"] is True


async def test_a_job_that_cannot_be_read_is_refused_naming_the_field(webhook: Webhook) -> None:
    job = pytorchjob()
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"] = "pytorch"
    response = await webhook.admit("validate", job_review(job))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["message"] == (
        "gpuwarden cannot read the PyTorchJob's replicas: request.object.spec."
        "pytorchReplicaSpecs.Worker.template.spec.containers must be an array, not string"
    )


async def test_a_gpu_job_waits_for_a_policy_and_a_cpu_job_goes_ahead(
    make_webhook: Any, workdir: Workdir
) -> None:
    workdir.write_policy("not: [a policy")
    webhook: Webhook = await make_webhook()
    response = await webhook.admit("validate", job_review(pytorchjob()))
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("gpuwarden has no valid GPU policy loaded")
    cpu = pytorchjob()
    cpu["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].pop(
        "resources"
    )
    assert (await webhook.admit("validate", job_review(cpu)))["allowed"] is True


async def test_an_update_is_mutated_only_where_it_changes_a_replica(webhook: Webhook) -> None:
    old = apply_response(pytorchjob(), await webhook.admit("mutate", job_review(pytorchjob())))
    # Kueue's unsuspend, or a label on the job: the templates stay, nothing to do.
    new = copy.deepcopy(old)
    new["spec"]["runPolicy"] = {"suspend": False}
    response = await webhook.admit("mutate", job_review(new, operation="UPDATE", old=old))
    assert response["allowed"] is True
    assert "patch" not in response
    # A new replica type is decided and its template mutated.
    new["spec"]["pytorchReplicaSpecs"]["Master"] = copy.deepcopy(
        pytorchjob()["spec"]["pytorchReplicaSpecs"]["Worker"]
    )
    response = await webhook.admit("mutate", job_review(new, operation="UPDATE", old=old))
    mutated = apply_response(new, response)
    master = mutated["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert master["metadata"]["annotations"]["gpuwarden.io/profile"] == "light-training"
    deleted = await webhook.admit("validate", job_review(None, operation="DELETE", old=old))
    assert deleted["allowed"] is True
