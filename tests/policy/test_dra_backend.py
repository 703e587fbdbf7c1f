"""The dra backend: whole profiles as native, shared profiles through gpuwarden's DRA claim.

Facts from kubernetes v1.37.2: a pod-level claim from a template (core/v1 PodResourceClaim
resourceClaimTemplateName) that containers name in resources.claims; a request that names no
capacity consumes a device whole (k8s.io/dynamic-resource-allocation
structured/internal/incubating/consumable_capacity.go, fillEmptyRequest).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpuwarden.policy import AdmissionRequest, ClusterView, PolicySet, admit, mutate
from gpuwarden.policy.admission.jobs import admit_job
from gpuwarden.policy.lint import lint_findings
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.spec.loader import PolicyError

from .support import EXAMPLES, apply_ops, container, create, gpu_pod, policies_from, read_yaml

DRA = "{type: dra, deviceClassName: gpu.example.com, coresCapacity: cores}"
SPEC = (
    """
backend: DRA
profiles:
  - {name: whole, gpuShare: false, gpus: 2}
  - {name: shared, gpuShare: true, maxMemory: 16Gi, threadPercentage: 25}
  - {name: shared-two, gpuShare: true, gpus: 2, maxMemory: 8Gi}
  - {name: mps, gpuShare: true, maxMemory: 8Gi, backend: nvidia}
tenants:
  - {name: team, namespaces: [team]}
"""
).replace("DRA", DRA)
CLAIM = {"name": "gpuwarden-gpu", "resourceClaimTemplateName": "gpuwarden-shared"}


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return policies_from(SPEC)


def labelled(profile: str, gpus: str | None = "1", **spec: Any) -> dict[str, Any]:
    pod = gpu_pod(labels={"gpuwarden.io/profile": profile}, gpus=gpus)
    pod["spec"].update(copy.deepcopy(spec))
    return pod


def admitted(policies: PolicySet, pod: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    result = admit(create(pod), policies, ClusterView())
    assert result.allowed, result.validation.message
    return dict(result.pod), result.warnings


def denial(policies: PolicySet, pod: dict[str, Any]) -> str:
    result = admit(create(pod), policies, ClusterView())
    assert not result.allowed
    return result.validation.message


def test_a_shared_pod_gets_the_claim_and_loses_its_gpu_resource(policies: PolicySet) -> None:
    pod, warnings = admitted(policies, labelled("shared"))
    main = container(pod, "main")
    assert main["resources"] == {"limits": {}, "claims": [{"name": "gpuwarden-gpu"}]}
    assert pod["spec"]["resourceClaims"] == [CLAIM]
    assert "schedulerName" not in pod["spec"]
    assert pod["metadata"]["annotations"]["gpuwarden.io/gpu-shared"] == "true"
    assert pod["metadata"]["annotations"]["gpuwarden.io/backend"] == "dra"
    text = "\n".join(warnings)
    assert (
        "gpuwarden: main: nvidia.com/gpu 1 replaced by claim gpuwarden-gpu "
        "(template gpuwarden-shared)" in warnings
    )
    assert (
        "gpuwarden: DRA claim gpuwarden-gpu from template gpuwarden-shared, a share of a "
        "gpu.example.com device" in warnings
    )
    assert "main: 1 shared GPU, 16Gi GPU-memory cap on dra, claimed of the device's memory" in text


def test_the_mutated_pod_is_settled_on_reinvocation(policies: PolicySet) -> None:
    pod, _ = admitted(policies, labelled("shared"))
    again = mutate(create(pod), policies, ClusterView())
    assert again.allowed and not again.patch


def test_a_shared_pod_that_asks_for_no_gpu_count_still_gets_the_claim(
    policies: PolicySet,
) -> None:
    pod, _ = admitted(policies, labelled("shared", gpus=None))
    assert container(pod, "main")["resources"]["claims"] == [{"name": "gpuwarden-gpu"}]
    assert pod["spec"]["resourceClaims"] == [CLAIM]


def test_the_users_own_claims_stay_beside_gpuwardens(policies: PolicySet) -> None:
    pod = labelled("shared", resourceClaims=[{"name": "nic", "resourceClaimName": "nic"}])
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "nic"}]
    decision = mutate(create(pod), policies, ClusterView())
    out = apply_ops(pod, decision)
    assert out["spec"]["resourceClaims"] == [{"name": "nic", "resourceClaimName": "nic"}, CLAIM]
    assert container(out, "main")["resources"]["claims"] == [
        {"name": "nic"},
        {"name": "gpuwarden-gpu"},
    ]
    # The tenant does not allow claims of its own: the nic claim is denied, gpuwarden's is not.
    message = denial(policies, pod)
    assert "spec.resourceClaims[nic], spec.containers[main].resources.claims" in message
    assert "gpuwarden-gpu" not in message


def test_a_whole_pod_is_patched_as_on_native(policies: PolicySet) -> None:
    pod, _ = admitted(policies, labelled("whole"))
    assert container(pod, "main")["resources"] == {
        "limits": {"nvidia.com/gpu": "2"},
        "requests": {"nvidia.com/gpu": "2"},
    }
    assert "resourceClaims" not in pod["spec"]
    native = policies_from(SPEC.replace(DRA, "native"))
    on_native = mutate(create(labelled("whole")), native, ClusterView()).patch
    on_dra = mutate(create(labelled("whole")), policies, ClusterView()).patch
    # The same patch, but for the backend the decision records.
    assert str(on_dra) == str(on_native).replace("'native'", "'dra'")


def test_a_shared_profile_of_two_gpus_is_denied_with_the_fix(policies: PolicySet) -> None:
    message = denial(policies, labelled("shared-two"))
    assert "profile shared-two sets gpus: 2" in message
    assert "a pod gets one claim (gpuwarden-gpu) on a share of one device" in message
    assert "use an exclusive profile (label gpuwarden.io/profile)" in message


def test_a_container_asking_two_shared_gpus_is_denied(policies: PolicySet) -> None:
    message = denial(policies, labelled("shared", gpus="2"))
    assert "spec.containers[main] asks for 2 GPUs" in message
    assert "ask for 1 GPU, or use an exclusive profile" in message


def test_a_pod_bringing_gpuwardens_claim_name_is_denied(policies: PolicySet) -> None:
    forged = {"name": "gpuwarden-gpu", "resourceClaimName": "someone-elses"}
    message = denial(policies, labelled("whole", resourceClaims=[forged]))
    assert "spec.resourceClaims[gpuwarden-gpu]: claim gpuwarden-gpu is gpuwarden's" in message
    assert "profile whole (label) takes no claim; remove the entry" in message


def test_a_shared_pod_bringing_its_own_gpuwarden_gpu_entry_is_denied(policies: PolicySet) -> None:
    forged = {"name": "gpuwarden-gpu", "resourceClaimTemplateName": "gpuwarden-big"}
    pod = labelled("shared", resourceClaims=[forged])
    out = apply_ops(pod, mutate(create(pod), policies, ClusterView()))
    assert out["spec"]["resourceClaims"] == [forged]  # never replaced silently
    message = denial(policies, pod)
    assert "spec.resourceClaims[gpuwarden-gpu]: only gpuwarden sets gpuwarden-gpu" in message
    assert "takes claim gpuwarden-gpu from template gpuwarden-shared" in message


def test_another_profiles_template_is_denied(policies: PolicySet) -> None:
    other = {"name": "extra", "resourceClaimTemplateName": "gpuwarden-whole"}
    message = denial(policies, labelled("shared", resourceClaims=[other]))
    assert "spec.resourceClaims[extra]" in message
    assert "takes claim gpuwarden-gpu from template gpuwarden-shared" in message
    # Also in a namespace of no tenant, where no limit would deny a claim.
    pod = labelled("whole", resourceClaims=[other])
    pod["metadata"]["namespace"] = "elsewhere"
    result = admit(create(pod), policies, ClusterView())
    assert not result.allowed
    assert "template gpuwarden-whole is gpuwarden's" in result.validation.message


def test_a_sidecar_using_the_claim_is_denied(policies: PolicySet) -> None:
    pod = labelled("shared")
    pod["spec"]["containers"].append(
        {
            "name": "sidecar",
            "image": "busybox",
            "resources": {"claims": [{"name": "gpuwarden-gpu"}]},
        }
    )
    message = denial(policies, pod)
    assert "spec.containers[main, sidecar] would each get a shared GPU" in message
    assert "spec.containers[sidecar].resources.claims[gpuwarden-gpu]: gpuwarden gives" in message


def test_other_backends_never_write_claims(policies: PolicySet) -> None:
    pod, _ = admitted(policies, labelled("mps"))
    assert "resourceClaims" not in pod["spec"]
    assert "claims" not in container(pod, "main")["resources"]


JOB_SPEC = SPEC.replace("tenants:", "defaultProfile: shared\ntenants:")


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_a_jobs_pods_get_the_claim_whether_or_not_the_job_can_hold_it(kind: str) -> None:
    policies = policies_from(JOB_SPEC)
    job = read_yaml(EXAMPLES / "jobs" / f"{kind}.yaml")
    job["metadata"]["namespace"] = "team"
    result = admit_job(AdmissionRequest("CREATE", "team", job), policies, ClusterView())
    assert result.allowed
    mutated = apply_ops(job, result.mutation)
    for replica in jobs.replica_templates(mutated):
        pod = jobs.replica_pod(mutated, replica, "team")
        # The API server refuses a pod template whose containers name a claim the pod lacks
        # (kubernetes pkg/apis/core/validation, validateResourceClaimNames).
        named = {c["name"] for c in pod["spec"].get("resourceClaims", [])}
        for body in pod["spec"]["containers"]:
            assert {c["name"] for c in body.get("resources", {}).get("claims", [])} <= named
        if kind == "trainjob":
            # No TrainJob field holds a pod's claims: the template keeps its GPU resource (the
            # API server would refuse containers naming a claim the pod lacks).
            assert "resourceClaims" not in pod["spec"]
            assert "each pod gets these when it is created" in result.mutation.warnings[-1]
        final = admit(AdmissionRequest("CREATE", "team", pod), policies, ClusterView())
        assert final.allowed, final.validation.message
        assert final.pod["spec"]["resourceClaims"] == [CLAIM]
        assert "nvidia.com/gpu" not in json.dumps(final.pod["spec"]["containers"])


def test_a_whole_resource_gpuwarden_does_not_count_is_refused_at_load() -> None:
    with pytest.raises(PolicyError) as raised:
        policies_from(SPEC.replace("coresCapacity: cores}", "wholeResourceName: example.com/gpu}"))
    assert "spec.backend.wholeResourceName: 'example.com/gpu' is not a GPU count gpuwarden" in (
        str(raised.value)
    )


PREFERRING = SPEC.replace(
    DRA, "{type: dra, deviceClassName: gpu.example.com, sharedNodeLabels: {gpu-pool: shared}}"
)
PREFERRED_TERMS = ("affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
SHARED_NODES_TERM = {
    "weight": 100,
    "preference": {
        "matchExpressions": [{"key": "gpu-pool", "operator": "In", "values": ["shared"]}]
    },
}


def _preferred(pod: dict[str, Any]) -> Any:
    found: Any = pod["spec"]
    for key in PREFERRED_TERMS:
        found = found.get(key) if isinstance(found, dict) else None
    return found


def test_shared_claims_prefer_the_backends_shared_nodes_and_whole_pods_do_not() -> None:
    policies = policies_from(PREFERRING)
    shared, _ = admitted(policies, labelled("shared"))
    assert _preferred(shared) == [SHARED_NODES_TERM]
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution"
        not in shared["spec"]["affinity"]["nodeAffinity"]
    )
    whole, _ = admitted(policies, labelled("whole"))
    assert "affinity" not in whole["spec"]
    # Without the field nothing is preferred.
    plain, _ = admitted(policies_from(SPEC), labelled("shared"))
    assert "affinity" not in plain["spec"]


def test_the_users_own_preferences_stay_and_a_reinvocation_settles() -> None:
    policies = policies_from(PREFERRING)
    own = {
        "weight": 5,
        "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
    }
    pod, _ = admitted(
        policies,
        labelled(
            "shared",
            affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [own]}},
        ),
    )
    assert _preferred(pod) == [own, SHARED_NODES_TERM]
    again = mutate(create(pod), policies, ClusterView())
    assert again.allowed and not again.patch
    # Another webhook moved the pod to a whole profile: gpuwarden's term goes, the user's stays.
    pod["metadata"]["labels"]["gpuwarden.io/profile"] = "whole"
    moved = apply_ops(pod, mutate(create(pod), policies, ClusterView()))
    assert _preferred(moved) == [own]
    alone, _ = admitted(policies, labelled("shared"))
    alone["metadata"]["labels"]["gpuwarden.io/profile"] = "whole"
    assert (
        "affinity" not in apply_ops(alone, mutate(create(alone), policies, ClusterView()))["spec"]
    )


def test_lint_says_where_the_shares_land() -> None:
    _, notes = lint_findings(policies_from(SPEC))
    assert (
        "profiles shared, shared-two: shared claims on the dra backend may land on any node "
        "(kube-scheduler scores a pod whose GPU is a claim by its CPU and memory alone), which "
        "can leave no node whole for multi-GPU pods; set backend.sharedNodeLabels to keep them "
        "together"
    ) in notes
    _, notes = lint_findings(policies_from(PREFERRING))
    assert (
        "profiles shared, shared-two: shared claims on the dra backend prefer nodes labelled "
        "gpu-pool=shared; label as many nodes as the shares need at their peak"
    ) in notes
