"""NVIDIA's device plugin sharing GPUs through MPS (backend nvidia): what a pod and a lint show.

Facts from NVIDIA/k8s-device-plugin: the MPS control daemon gives each client total/replicas of
memory and 100/replicas of threads (cmd/mps-control-daemon/mps/daemon.go); replicas keep the
name nvidia.com/gpu unless renameByDefault; a container gets at most one replica unless
failRequestsGreaterThanOne is false (api/config/v1/config.go, internal/rm/rm.go); GFD labels a
shared node's nvidia.com/gpu.sharing-strategy (internal/lm/resource.go).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.policy import ClusterView, PolicySet, admit, mutate
from gpuwarden.policy.admission.decision import MAX_WARNING
from gpuwarden.policy.lint import lint_warnings

from .support import apply_ops, container, create, gpu_pod, policies_from

SPEC = """
backend: nvidia
profiles:
  - {name: whole, gpuShare: false}
  - {name: shared, maxMemory: 16Gi, threadPercentage: 50, overcommitRatio: 1.5}
  - {name: shared-plain, maxMemory: 4Gi}
  - name: shared-many
    maxMemory: 8Gi
    backend: {type: nvidia, failRequestsGreaterThanOne: false}
  - {name: whole-on-mps, gpuShare: false, nodeSelector: {nvidia.com/gpu.sharing-strategy: mps}}
  - {name: volcano-whole, gpuShare: false, backend: volcano}
tenants:
  - {name: team, namespaces: [team], limits: {maxGpusPerPod: 8}}
"""
AWAY_FROM_SHARED = {
    "key": "nvidia.com/gpu.sharing-strategy",
    "operator": "NotIn",
    "values": ["mps", "time-slicing"],
}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return policies_from(SPEC)


def decide(policies: PolicySet, pod: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    decision = mutate(create(pod), policies, ClusterView())
    assert decision.allowed
    return apply_ops(pod, decision), decision.warnings


def with_profile(profile: str, gpus: str = "1", **spec: Any) -> dict[str, Any]:
    pod = gpu_pod(labels={"gpuwarden.io/profile": profile}, gpus=gpus)
    pod["spec"].update(copy.deepcopy(spec))
    return pod


def terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = pod["spec"]["affinity"]["nodeAffinity"][REQUIRED][
        "nodeSelectorTerms"
    ]
    return found


def node_affinity(*terms: dict[str, Any], preferred: bool = False) -> dict[str, Any]:
    affinity: dict[str, Any] = {REQUIRED: {"nodeSelectorTerms": list(terms)}}
    if preferred:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 1, "preference": {"matchExpressions": [_in("zone", "a")]}}
        ]
    return {"nodeAffinity": affinity}


def _in(key: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": list(values)}


# --- item 8: exclusive pods stay off shared GPUs ---------------------------------------------


def test_an_exclusive_pod_is_kept_off_nodes_whose_gpus_are_shared(policies: PolicySet) -> None:
    pod, _ = decide(policies, with_profile("whole", gpus="2"))
    assert container(pod, "main")["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert terms(pod) == [{"matchExpressions": [AWAY_FROM_SHARED]}]


def test_the_expression_joins_every_term_of_the_users_own_and_changes_nothing_else(
    policies: PolicySet,
) -> None:
    gpu_pool = {"matchExpressions": [_in("pool", "a100")]}
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    matches_nothing: dict[str, Any] = {}
    affinity = node_affinity(gpu_pool, by_name, matches_nothing, preferred=True)
    pod, warnings = decide(policies, with_profile("whole", affinity=affinity))
    assert terms(pod) == [
        {"matchExpressions": [_in("pool", "a100"), AWAY_FROM_SHARED]},
        {**by_name, "matchExpressions": [AWAY_FROM_SHARED]},
        {},  # an empty term matches no node; an expression would make it match some
    ]
    preferred = pod["spec"]["affinity"]["nodeAffinity"]
    assert (
        preferred["preferredDuringSchedulingIgnoredDuringExecution"]
        == (affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"])
    )
    assert not [w for w in warnings if "shared GPUs" in w]


def test_a_pod_that_picks_shared_gpus_itself_is_told_not_overridden(policies: PolicySet) -> None:
    pod, warnings = decide(
        policies, with_profile("whole", nodeSelector={"nvidia.com/gpu.sharing-strategy": "mps"})
    )
    assert "affinity" not in pod["spec"]
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.sharing-strategy": "mps"}
    assert (
        "gpuwarden: kept nodeSelector nvidia.com/gpu.sharing-strategy=mps: it picks shared GPUs, "
        "not profile whole's whole GPUs"
    ) in warnings


def test_a_term_that_picks_shared_gpus_is_kept_and_the_others_get_the_expression(
    policies: PolicySet,
) -> None:
    shared_a100 = {
        "matchExpressions": [_in("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB-SHARED")]
    }
    many = {
        "matchExpressions": [{"key": "nvidia.com/gpu.replicas", "operator": "Gt", "values": ["1"]}]
    }
    h100 = {"matchExpressions": [_in("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]}
    pod, warnings = decide(
        policies, with_profile("whole", affinity=node_affinity(shared_a100, many, h100))
    )
    assert terms(pod) == [
        shared_a100,
        many,
        {"matchExpressions": [*h100["matchExpressions"], AWAY_FROM_SHARED]},
    ]
    assert (
        "gpuwarden: kept node affinity term 0: it picks shared GPUs, not profile whole's whole GPUs"
        in warnings
    )
    assert any(w.startswith("gpuwarden: kept node affinity term 1:") for w in warnings)


def test_a_term_that_also_allows_unshared_gpus_is_narrowed_to_them(policies: PolicySet) -> None:
    """The lab's product affinity names a product and its -SHARED form: whole GPUs remain."""
    either = {
        "matchExpressions": [
            _in("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-SHARED")
        ]
    }
    pod, warnings = decide(policies, with_profile("whole", affinity=node_affinity(either)))
    assert terms(pod) == [{"matchExpressions": [*either["matchExpressions"], AWAY_FROM_SHARED]}]
    assert not [w for w in warnings if "kept" in w]


def test_a_selector_for_unshared_gpus_is_no_conflict(policies: PolicySet) -> None:
    selector = {"nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none"}
    pod, warnings = decide(policies, with_profile("whole", nodeSelector=selector))
    assert terms(pod) == [{"matchExpressions": [AWAY_FROM_SHARED]}]
    assert not [w for w in warnings if "kept" in w]


@pytest.mark.parametrize("profile", ["shared", "shared-plain", "volcano-whole"])
def test_profiles_that_may_use_shared_gpus_or_other_backends_get_no_affinity(
    policies: PolicySet, profile: str
) -> None:
    pod, _ = decide(policies, with_profile(profile))
    assert "affinity" not in pod["spec"]


def test_a_reinvocation_onto_a_shared_profile_takes_back_only_gpuwardens_expression(
    policies: PolicySet,
) -> None:
    """Another webhook's labels can move a pod to another profile on reinvocation."""
    pool = {"matchExpressions": [_in("pool", "a100")]}
    first, _ = decide(policies, with_profile("whole", affinity=node_affinity(pool)))
    assert terms(first) == [{"matchExpressions": [_in("pool", "a100"), AWAY_FROM_SHARED]}]
    first["metadata"]["labels"]["gpuwarden.io/profile"] = "shared"
    again, _ = decide(policies, first)
    assert again["spec"]["affinity"] == node_affinity(pool)

    alone, _ = decide(policies, with_profile("whole"))
    alone["metadata"]["labels"]["gpuwarden.io/profile"] = "shared"
    bare, _ = decide(policies, alone)
    assert "affinity" not in bare["spec"]


def test_a_policy_that_sends_an_exclusive_profile_to_shared_gpus_is_linted(
    policies: PolicySet,
) -> None:
    assert (
        "profile whole-on-mps: nodeSelector nvidia.com/gpu.sharing-strategy=mps picks shared "
        "GPUs, but the profile is exclusive: its pods would get MPS replicas, not whole GPUs"
    ) in lint_warnings(policies)


NODE_KEYS = ["pool", "nvidia.com/gpu.sharing-strategy", "nvidia.com/gpu.replicas"]
expressions = st.fixed_dictionaries(
    {
        "key": st.sampled_from(NODE_KEYS),
        "operator": st.sampled_from(["In", "NotIn", "Exists", "Gt"]),
        "values": st.lists(st.sampled_from(["mps", "none", "1", "4", "a100"]), max_size=2),
    }
)
node_terms = st.fixed_dictionaries(
    {},
    optional={
        "matchExpressions": st.lists(st.one_of(expressions, st.just(AWAY_FROM_SHARED)), max_size=3),
        "matchFields": st.just([{"key": "metadata.name", "operator": "In", "values": ["n1"]}]),
    },
)
affinities = st.one_of(
    st.none(),
    st.just({}),
    st.just({"nodeAffinity": {}}),
    st.lists(node_terms, max_size=3).map(lambda ts: node_affinity(*ts)),
)


POLICIES = policies_from(SPEC)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    profile=st.sampled_from(["whole", "shared", "whole-on-mps", "volcano-whole"]),
    affinity=affinities,
    selector=st.dictionaries(
        st.sampled_from(NODE_KEYS), st.sampled_from(["mps", "none", "2", "a100"]), max_size=2
    ),
    then=st.sampled_from(["whole", "shared", "volcano-whole", None]),
)
def test_the_affinity_decision_is_idempotent_and_keeps_the_users_expressions(
    profile: str,
    affinity: dict[str, Any] | None,
    selector: dict[str, str],
    then: str | None,
) -> None:
    spec: dict[str, Any] = {"nodeSelector": selector} if selector else {}
    if affinity is not None:
        spec["affinity"] = affinity
    original = with_profile(profile, **spec)
    once, _ = decide(POLICIES, original)
    assert mutate(create(once), POLICIES, ClusterView()).patch == ()
    before = original["spec"].get("affinity", {}).get("nodeAffinity", {}).get(REQUIRED, {})
    after = once["spec"].get("affinity", {}).get("nodeAffinity", {}).get(REQUIRED, {})

    def users(terms: list[dict[str, Any]]) -> list[tuple[list[Any], Any]]:
        """Each term's own expressions and fields; a term that held only gpuwarden's expression
        goes with it (an empty term would match no node)."""
        out = []
        for term in terms:
            kept = [e for e in term.get("matchExpressions", []) if e != AWAY_FROM_SHARED]
            if kept or term.get("matchFields") or term == {}:
                out.append((kept, term.get("matchFields")))
        return out

    assert users(after.get("nodeSelectorTerms", [])) == users(before.get("nodeSelectorTerms", []))
    if then is not None:
        # A reinvocation under another profile settles at once as well.
        once["metadata"]["labels"]["gpuwarden.io/profile"] = then
        twice, _ = decide(POLICIES, once)
        assert mutate(create(twice), POLICIES, ClusterView()).patch == ()


# --- item 7: what MPS does to caps and to overcommit ------------------------------------------


def test_a_shared_pod_is_told_that_mps_bounds_its_caps_and_ignores_overcommit(
    policies: PolicySet,
) -> None:
    pod, warnings = decide(policies, with_profile("shared"))
    assert {e["name"]: e["value"] for e in container(pod, "main")["env"]} == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16384M",
    }
    assert (
        "gpuwarden: NVIDIA's MPS daemon gives a client 1/replicas of a GPU; maxMemory and "
        "threadPercentage only lower that"
    ) in warnings
    assert (
        "gpuwarden: overcommitRatio 1.5 does not change scheduling on nvidia: a pod reserves "
        "one MPS replica"
    ) in warnings
    assert all(len(w) < MAX_WARNING and not w.endswith("...") for w in warnings)


def test_a_shared_pod_without_overcommit_is_told_only_about_its_cap(
    policies: PolicySet,
) -> None:
    _, warnings = decide(policies, with_profile("shared-plain"))
    assert [w for w in warnings if "MPS" in w] == [
        "gpuwarden: NVIDIA's MPS daemon gives a client 1/replicas of a GPU; maxMemory only "
        "lowers that"
    ]


def test_lint_says_what_the_mps_equal_share_and_replica_scheduling_do(policies: PolicySet) -> None:
    warnings = lint_warnings(policies)
    assert (
        "profile shared: NVIDIA's MPS control daemon gives each client 1/replicas of a GPU's "
        "memory and 100/replicas percent of its threads, and a client can only lower that: "
        "maxMemory 16Gi and threadPercentage 50 above the equal share is lowered to it, unless "
        "gpuwarden's node agent sets the daemon's limits (nodeAgent.mps)"
    ) in warnings
    assert (
        "profile shared: overcommitRatio 1.5 has no scheduling effect on nvidia: each pod "
        "reserves one MPS replica, whatever its maxMemory; the replicas per GPU in the device "
        "plugin's sharing config set how many pods share a GPU"
    ) in warnings
    assert not [w for w in warnings if w.startswith("profile shared-plain: overcommitRatio")]


# --- failRequestsGreaterThanOne ----------------------------------------------------------------


def test_more_than_one_replica_is_denied_where_the_plugin_refuses_it(policies: PolicySet) -> None:
    result = admit(create(with_profile("shared", gpus="2")), policies, ClusterView())
    assert not result.allowed
    assert "where a container gets 1 replica; ask for 1 GPU" in result.validation.message


def test_a_plugin_that_allows_several_replicas_gets_them(policies: PolicySet) -> None:
    pod, warnings = decide(policies, with_profile("shared-many", gpus="2"))
    assert container(pod, "main")["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert {e["name"]: e["value"] for e in container(pod, "main")["env"]} == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M,1=8192M",
    }
    assert not [w for w in warnings if "replica;" in w]
