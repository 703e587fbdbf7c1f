"""A workload's own GPU count survives admission unless the policy sets one; limits deny, never cut.

Also every other value of the pod that a profile replaces is said in a warning, never silently.
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from gpuwarden.policy import ClusterView, PolicySet, admit, admitted_gpu_memory, mutate
from gpuwarden.policy.admission.placement import place
from gpuwarden.policy.lint import lint_errors

from .support import REPO, apply_ops, container, create, example, gpu_pod, policies_from, read_yaml

GI = 2**30
TEST_PODS = REPO / "policies" / "tests" / "pods"
SPEC = """
backend: {type: volcano, queue: q}
profiles:
  - {name: whole, gpuShare: false, maxMemory: 80Gi}
  - {name: four, gpuShare: false, gpus: 4}
  - {name: shared, maxMemory: 16Gi, overcommitRatio: 2.0, threadPercentage: 50}
  - {name: mps, maxMemory: 8Gi, backend: nvidia}
  - {name: hami, maxMemory: 8Gi, backend: hami}
  - {name: native, maxMemory: 8Gi, backend: native}
  - {name: fed, gpuShare: false, hostMemory: 32Gi, cpu: "4", nodeSelector: {pool: a100}}
  - {name: cpu-only, gpus: 0}
workloads:
  - {name: pair, match: {kind: selector, labels: {matchLabels: {app: pair}}}, profile: whole,
     containers: [main, side]}
tenants:
  - name: team
    namespaces: [team]
    limits: {maxGpusPerPod: 16}
  - name: memory
    namespaces: [memory]
    limits: {maxGpuMemoryPerPod: 320Gi}
  - name: small
    namespaces: [small]
    limits: {maxGpusPerPod: 2}
    overrides:
      whole: {gpus: 1}
"""
CLUSTER = ClusterView()


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return policies_from(SPEC)


def labelled(profile: str, gpus: str | None = "1", namespace: str = "team") -> dict[str, Any]:
    return gpu_pod(namespace=namespace, labels={"gpuwarden.io/profile": profile}, gpus=gpus)


def resources(pod: dict[str, Any], name: str = "main") -> dict[str, Any]:
    found: dict[str, Any] = container(pod, name)["resources"]
    return found


def admitted_pod(pod: dict[str, Any], policies: PolicySet) -> tuple[dict[str, Any], Any]:
    result = admit(create(pod), policies, CLUSTER)
    assert result.allowed, result.validation.message
    return dict(result.pod), result


# --- exclusive profiles without gpus keep the container's count ----------------------------


@pytest.mark.parametrize("gpus", ["1", "2", "8", "16"])
def test_an_exclusive_profile_without_gpus_keeps_the_count_asked(
    policies: PolicySet, gpus: str
) -> None:
    pod, result = admitted_pod(labelled("whole", gpus), policies)
    assert resources(pod)["limits"]["nvidia.com/gpu"] == gpus
    assert resources(pod)["requests"]["nvidia.com/gpu"] == gpus
    assert pod["metadata"]["annotations"]["gpuwarden.io/gpu-count"] == gpus
    assert f"gpuwarden: main: {gpus} whole GPU(s) on volcano" in result.warnings


def test_a_count_given_only_as_a_request_is_kept(policies: PolicySet) -> None:
    pod = labelled("whole", None)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "3"}}
    out, _ = admitted_pod(pod, policies)
    assert resources(out)["limits"]["nvidia.com/gpu"] == "3"


def test_a_container_that_names_no_count_gets_one(policies: PolicySet) -> None:
    pod = labelled("whole", None)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpumem": "4000"}}
    out, _ = admitted_pod(pod, policies)
    assert resources(out)["limits"] == {"nvidia.com/gpu": "1"}


def test_each_target_container_keeps_its_own_count(policies: PolicySet) -> None:
    pod = gpu_pod(namespace="team", labels={"app": "pair"}, gpus="2")
    pod["spec"]["containers"].append(
        {"name": "side", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    )
    out, _ = admitted_pod(pod, policies)
    assert resources(out, "main")["limits"]["nvidia.com/gpu"] == "2"
    assert resources(out, "side")["limits"]["nvidia.com/gpu"] == "1"
    # The pod-level annotation carries the largest; quota accounting reads each container.
    assert out["metadata"]["annotations"]["gpuwarden.io/gpu-count"] == "2"
    assert admitted_gpu_memory(out) == Decimal(3 * 80 * GI)


def test_the_count_survives_reinvocation(policies: PolicySet) -> None:
    pod = labelled("whole", "8")
    once = apply_ops(pod, mutate(create(pod), policies, CLUSTER))
    assert mutate(create(once), policies, CLUSTER).patch == ()
    assert admit(create(once), policies, CLUSTER).allowed


# --- the policy's explicit count wins, with a warning ---------------------------------------


def test_a_profile_that_sets_gpus_sets_them_and_says_so(policies: PolicySet) -> None:
    out, result = admitted_pod(labelled("four", "8"), policies)
    assert resources(out)["limits"]["nvidia.com/gpu"] == "4"
    assert "gpuwarden: main asked for 8 GPUs; profile four sets gpus: 4" in result.warnings


def test_a_tenant_override_that_sets_gpus_sets_them_and_says_so(policies: PolicySet) -> None:
    out, result = admitted_pod(labelled("whole", "2", namespace="small"), policies)
    assert resources(out)["limits"]["nvidia.com/gpu"] == "1"
    assert "gpuwarden: main asked for 2 GPUs; tenant small's override sets gpus: 1" in (
        result.warnings
    )


def test_a_profile_with_no_gpu_takes_the_asked_gpu_away_and_says_so(policies: PolicySet) -> None:
    out, result = admitted_pod(labelled("cpu-only", "2"), policies)
    assert "resources" not in container(out, "main") or not resources(out).get("limits")
    assert (
        "gpuwarden: main: no GPU for this profile (main asked for 2; profile cpu-only sets gpus: 0)"
        in result.warnings
    )


def test_no_count_warning_when_the_policy_and_the_pod_agree(policies: PolicySet) -> None:
    _, result = admitted_pod(labelled("four", "4"), policies)
    assert not [w for w in result.warnings if "asked for" in w]


def test_placement_says_which_count_won(policies: PolicySet) -> None:
    kept = place(labelled("whole", "8"), "team", {}, policies).container_grants[0]
    assert (kept.gpus, kept.count_reason()) == (
        8,
        "the count it asks for; profile whole sets none",
    )
    forced = place(labelled("four", "8"), "team", {}, policies).container_grants[0]
    assert (forced.gpus, forced.count_reason()) == (4, "profile four sets gpus: 4 (it asked for 8)")


# --- tenant limits deny with the container, the count, the limit and the fix ----------------


def test_more_gpus_than_the_tenant_allows_are_denied_not_cut(policies: PolicySet) -> None:
    result = admit(create(labelled("whole", "4", namespace="small")), policies, CLUSTER)
    # The override pins 1 GPU in `small`, so ask through a profile that keeps the count.
    assert result.allowed
    pod = labelled("shared", "4", namespace="small")
    result = admit(create(pod), policies, CLUSTER)
    assert not result.allowed
    assert result.validation.reason == "TenantLimit"
    assert (
        "container main asks for 4 GPUs (profile shared, label) but tenant small allows at most "
        "2 per pod; ask for at most 2 in spec.containers[main].resources"
    ) in result.validation.message
    # The mutation did not shrink the request on its way to the denial.
    assert resources(dict(result.pod))["limits"]["volcano.sh/vgpu-number"] == "4"


def test_the_pod_total_counts_against_the_limit(policies: PolicySet) -> None:
    pod = gpu_pod(namespace="team", labels={"app": "pair"}, gpus="10")
    pod["spec"]["containers"].append(
        {"name": "side", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    )
    result = admit(create(pod), policies, CLUSTER)
    assert not result.allowed
    assert (
        "the pod would get 18 GPUs (main 10, side 8; profile whole, rule/pair) but tenant team "
        "allows at most 16 per pod; ask for fewer GPUs per container"
    ) in result.validation.message


def test_gpu_memory_per_pod_follows_the_count(policies: PolicySet) -> None:
    assert admit(create(labelled("whole", "4", namespace="memory")), policies, CLUSTER).allowed
    result = admit(create(labelled("whole", "5", namespace="memory")), policies, CLUSTER)
    assert "the pod would get 400Gi of GPU memory (profile whole)" in result.validation.message


# --- shared profiles: N slices where the backend gives each its own GPU, else a denial ------


def test_a_shared_volcano_profile_gives_one_slice_per_gpu_asked(policies: PolicySet) -> None:
    out, result = admitted_pod(labelled("shared", "2"), policies)
    assert resources(out)["limits"] == {
        "volcano.sh/vgpu-number": "2",
        "volcano.sh/vgpu-memory": "16384",
        "volcano.sh/vgpu-cores": "50",
    }
    assert {
        "gpuwarden: main: 2 shared GPU, 16Gi GPU-memory cap on volcano, requested and enforced "
        "by HAMi-core",
        "gpuwarden: main: overcommit 2 holds 8Gi per GPU only on nodes whose deviceMemoryScaling "
        "is 2",
        "gpuwarden: volcano.sh/vgpu-cores 50: at most 2 such pods share a GPU (a core reservation)",
    } <= set(result.warnings)


def test_a_shared_hami_profile_gives_one_slice_per_gpu_asked(policies: PolicySet) -> None:
    out, _ = admitted_pod(labelled("hami", "3"), policies)
    assert resources(out)["limits"] == {"nvidia.com/gpu": "3", "nvidia.com/gpumem": "8192"}


def test_the_native_backend_gives_whole_gpus_for_a_shared_profile(policies: PolicySet) -> None:
    out, _ = admitted_pod(labelled("native", "2"), policies)
    assert resources(out)["limits"] == {"nvidia.com/gpu": "2"}


def test_more_than_one_mps_replica_is_denied_with_what_to_change(policies: PolicySet) -> None:
    pod = labelled("mps", "2")
    result = admit(create(pod), policies, CLUSTER)
    assert result.mutation.patch == ()  # left as asked, for the validator to refuse
    assert not result.allowed
    assert result.validation.reason == "ProfileSelection"
    assert (
        "spec.containers[main] asks for 2 GPUs, but profile mps shares GPUs through MPS on the "
        "nvidia backend, where a container gets 1 replica; ask for 1 GPU, or use an exclusive "
        "profile (label gpuwarden.io/profile)"
    ) in result.validation.message
    assert admit(create(labelled("mps", "1")), policies, CLUSTER).allowed


# --- counts that are not whole numbers ------------------------------------------------------


@pytest.mark.parametrize("value", ["1.5", "500m", "one"])
def test_a_count_that_is_not_whole_is_denied_once_and_left_as_asked(
    policies: PolicySet, value: str
) -> None:
    result = admit(create(labelled("whole", value)), policies, CLUSTER)
    assert result.mutation.patch == ()
    assert not result.allowed
    message = result.validation.message
    assert "spec.containers[main].resources.limits[nvidia.com/gpu]: " in message
    assert message.count("spec.containers[main].resources.limits[nvidia.com/gpu]") == 1


# --- other values a profile replaces are said, never silent ---------------------------------


def test_replaced_host_memory_cpu_and_node_selector_are_warned(policies: PolicySet) -> None:
    pod = labelled("fed", "1")
    body = pod["spec"]["containers"][0]
    body["resources"] = {
        "limits": {"nvidia.com/gpu": "1", "memory": "8Gi"},
        "requests": {"memory": "8Gi", "cpu": "2"},
    }
    pod["spec"]["nodeSelector"] = {"pool": "t4"}
    out, result = admitted_pod(pod, policies)
    assert resources(out)["requests"]["cpu"] == "4"
    assert resources(out)["limits"]["memory"] == "32Gi"
    assert out["spec"]["nodeSelector"] == {"pool": "a100"}
    warnings = result.warnings
    assert "gpuwarden: main: cpu 2 -> 4 (profile fed sets it)" in warnings
    assert "gpuwarden: main: memory 8Gi -> 32Gi (profile fed sets it)" in warnings
    assert (
        "gpuwarden: replaced nodeSelector pool=t4 with pool=a100 (profile fed's GPU pool)"
        in warnings
    )


def test_equal_quantities_written_differently_are_not_a_change(policies: PolicySet) -> None:
    pod = labelled("fed", "1")
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = "32768Mi"
    _, result = admitted_pod(pod, policies)
    assert not [w for w in result.warnings if "memory" in w]


def test_a_removed_gpu_memory_request_is_warned(policies: PolicySet) -> None:
    pod = labelled("whole", "1")
    pod["spec"]["containers"][0]["resources"]["limits"]["volcano.sh/vgpu-memory"] = "4000"
    out, result = admitted_pod(pod, policies)
    assert "volcano.sh/vgpu-memory" not in resources(out)["limits"]
    assert "gpuwarden: main: removed volcano.sh/vgpu-memory 4000 (profile whole sets it)" in (
        result.warnings
    )


def test_a_replaced_priority_class_is_warned(policies: PolicySet) -> None:
    pod = labelled("whole", "1")
    pod["spec"]["priorityClassName"] = "high"
    out, result = admitted_pod(pod, policies)
    assert out["spec"]["priorityClassName"] == "gpuwarden-whole"
    assert (
        "gpuwarden: replaced priorityClassName high with gpuwarden-whole (profile whole sets the "
        "priority)" in result.warnings
    )


def test_a_cpu_limit_below_the_profile_request_is_denied_with_the_fix(
    policies: PolicySet,
) -> None:
    pod = labelled("fed", "1")
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1"
    result = admit(create(pod), policies, CLUSTER)
    assert not result.allowed
    assert result.validation.reason == "RequestAboveLimit"
    assert (
        "spec.containers[main].resources.requests[cpu] 4 is more than its limit 1; raise "
        "limits[cpu] to at least the request or remove it"
    ) in result.validation.message


# --- the default policies, as the issue found them ------------------------------------------


@pytest.mark.parametrize(
    ("pod_file", "name", "gpus"),
    [("pytorchjob-worker-8-gpus", "pytorch", "8"), ("trainjob-node-4-gpus", "node", "4")],
)
def test_default_policies_keep_a_training_job_gpu_count(
    default_policies: PolicySet, cluster: ClusterView, pod_file: str, name: str, gpus: str
) -> None:
    pod = read_yaml(TEST_PODS / f"{pod_file}.yaml")
    result = admit(create(pod), default_policies, cluster)
    assert result.allowed, result.validation.message
    assert container(dict(result.pod), name)["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert not [w for w in result.warnings if "asked for" in w]


def test_default_policies_deny_a_trainer_node_over_the_tenant_limit(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = read_yaml(TEST_PODS / "trainjob-node-4-gpus.yaml")
    pod["metadata"]["namespace"] = "tenant-b"
    result = admit(create(pod), default_policies, cluster)
    assert not result.allowed
    assert result.validation.message.startswith(
        "gpuwarden denied the pod: container node asks for 4 GPUs (profile heavy-training, "
        "rule/trainer-nodes) but tenant tenant-b allows at most 2 per pod; ask for at most 2 in "
        "spec.containers[node].resources"
    )


def test_the_one_gpu_examples_are_unchanged(
    classic_policies: PolicySet, cluster: ClusterView
) -> None:
    for name, target in (("pytorchjob-worker", "pytorch"), ("katib-trial", "training-container")):
        pod = copy.deepcopy(example(name))
        out = dict(admit(create(pod), classic_policies, cluster).pod)
        assert container(out, target)["resources"]["limits"]["nvidia.com/gpu"] == "1"


SIZED_RULES = """
backend: {type: nvidia, sharedResourceName: nvidia.com/gpu.shared}
profiles:
  - {name: shared, maxMemory: 16Gi}
  - {name: whole, gpuShare: false, maxMemory: 80Gi}
workloads:
  - {name: small, match: {kind: selector, labels: {matchLabels: {app: serve}}}, profile: shared,
     maxGpuRequest: 1}
  - {name: large, match: {kind: selector, labels: {matchLabels: {app: serve}}}, profile: whole}
tenants:
  - {name: team, namespaces: [team]}
"""


@pytest.mark.parametrize(
    ("gpus", "rule", "resource", "count"),
    [("1", "small", "nvidia.com/gpu.shared", "1"), ("2", "large", "nvidia.com/gpu", "2")],
)
def test_max_gpu_request_sends_a_larger_pod_to_the_next_rule(
    gpus: str, rule: str, resource: str, count: str
) -> None:
    policies = policies_from(SIZED_RULES)
    pod = gpu_pod(labels={"app": "serve"}, gpus=gpus)
    decision = mutate(create(pod), policies, CLUSTER)
    assert decision.allowed, decision.message
    limits = resources(apply_ops(pod, decision))["limits"]
    assert limits[resource] == count
    assert place(pod, "team", {}, policies).rule.name == rule  # type: ignore[union-attr]


def test_max_gpu_request_counts_a_pod_naming_no_gpu_count_as_within_it() -> None:
    """GPU memory alone names no count: the sized rule takes the pod, and keeps taking it once
    the decision gave it a slice (a second decision changes nothing)."""
    policies = policies_from(SIZED_RULES)
    pod = gpu_pod(labels={"app": "serve"}, gpus=None)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpumem": "1000"}}
    assert place(pod, "team", {}, policies).rule.name == "small"  # type: ignore[union-attr]
    once = apply_ops(pod, mutate(create(pod), policies, CLUSTER))
    assert mutate(create(once), policies, CLUSTER).patch == ()


def test_max_gpu_request_says_why_a_rule_did_not_match() -> None:
    policies = policies_from(SIZED_RULES)
    placement = place(gpu_pod(labels={"app": "serve"}, gpus="2"), "team", {}, policies)
    reasons = dict(placement.trace)
    assert "a container asks for 2 GPUs (the rule: at most 1)" in reasons["small"].reason
    assert reasons["large"].matched


def test_max_gpu_request_needs_a_gpu_request() -> None:
    policies = policies_from(SIZED_RULES)
    placement = place(gpu_pod(labels={"app": "serve"}, gpus=None), "team", {}, policies)
    assert placement.rule is not None and placement.rule.name == "large"
    assert "asks for no GPU" in dict(placement.trace)["small"].reason


def test_lint_flags_a_rule_behind_a_catch_all_but_not_behind_a_sized_one() -> None:
    spec = """
profiles:
  - {name: shared, maxMemory: 16Gi}
  - {name: whole, gpuShare: false, maxMemory: 80Gi}
workloads:
  - {name: small, match: {kind: kserve-predictor}, profile: shared, maxGpuRequest: 1}
  - {name: large, match: {kind: kserve-predictor}, profile: whole}
  - {name: never, match: {kind: kserve-predictor}, profile: whole}
"""
    shadowed = [w for w in lint_errors(policies_from(spec)) if "never matches" in w]
    assert shadowed == ["rule never: never matches, rule large takes every kserve-predictor first"]


def test_a_skip_rule_never_admits_gpus_past_the_tenants_limit(cluster: ClusterView) -> None:
    policies = policies_from(
        """
profiles:
  - {name: whole, gpuShare: false, maxMemory: 80Gi}
workloads:
  - {name: exporters, match: {kind: selector, labels: {matchLabels: {app: exporter}}}, skip: true}
tenants:
  - {name: team, namespaces: [team], limits: {maxGpusPerPod: 2}}
"""
    )
    small = gpu_pod(labels={"app": "exporter"}, gpus="2")
    assert admit(create(small), policies, cluster).allowed
    large = gpu_pod(labels={"app": "exporter"}, gpus="4")
    verdict = admit(create(large), policies, cluster)
    assert not verdict.allowed
    assert (
        "rule exporters leaves the pod untouched, but it asks for 4 GPUs and tenant team allows "
        "at most 2 per pod; ask for at most 2" in verdict.validation.message
    )
    assert verdict.mutation.patch == ()


def test_an_explicit_zero_gpu_request_stays_zero(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """``nvidia.com/gpu: "0"`` asks for no GPU: the notebook stays a CPU pod, not a vGPU one."""
    pod = example("notebook")
    for section in pod["spec"]["containers"][0]["resources"].values():
        if "nvidia.com/gpu" in section:
            section["nvidia.com/gpu"] = "0"
    verdict = admit(create(pod), default_policies, cluster)
    assert verdict.allowed, verdict.validation.message
    assert verdict.mutation.patch == ()
    assert dict(verdict.pod) == pod
