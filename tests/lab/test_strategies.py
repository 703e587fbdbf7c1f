"""Tenant queues for the scheduling lab's strategies, without a cluster: how the quotas are
split over the lab's whole GPUs and MPS nodes, and what ``render --kueue`` then gives Kueue."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpuwarden.lab.planning.strategies import (
    SHARING_ONLY_POLICY,
    Layout,
    entitled_quotas,
    kueue_variant,
    queue_objects,
    shared_quotas,
    strategy_from_texts,
)
from gpuwarden.policy.render.objects import RenderOptions, render


def test_shared_quotas_follow_the_shared_demand_within_each_quota() -> None:
    # b asks for the most shared work but holds a quota of 1: it gets 1, and the 3 GPUs its
    # demand would take past it go to a (c asks for none).
    assert shared_quotas({"a": 6, "b": 1, "c": 1}, {"a": 3, "b": 5, "c": 0}, 4) == {
        "a": 3,
        "b": 1,
        "c": 0,
    }
    # Plain proportion, whole GPUs by largest remainder (ties by name).
    assert shared_quotas({"a": 4, "b": 4}, {"a": 1, "b": 1}, 3) == {"a": 2, "b": 1}
    # No shared demand at all (MPS nodes given anyway): by the quotas.
    assert shared_quotas({"a": 3, "b": 1}, {}, 2) == {"a": 2, "b": 0}
    # Everyone's demand is past its quota: every quota is all shared, as many GPUs as there are.
    assert shared_quotas({"a": 1, "b": 2}, {"a": 9, "b": 9}, 3) == {"a": 1, "b": 2}
    assert shared_quotas({"a": 1}, {"a": 1}, 0) == {"a": 0}
    with pytest.raises(ValueError, match="do not fit"):
        shared_quotas({"a": 1, "b": 1}, {"a": 1}, 3)


@pytest.mark.parametrize("gpus", [0, 1, 5, 13, 32])
def test_shared_quotas_add_up_and_stay_within_each_quota(gpus: int) -> None:
    demands = [0.0, 0.4, 1.0, 2.5, 7.0]
    for a, b, c in itertools.product(demands, repeat=3):
        quotas = entitled_quotas({"a": 1 + a, "b": 1 + b, "c": 1 + c}, 32)
        shared = shared_quotas(quotas, {"a": a, "b": b, "c": c}, gpus)
        assert sum(shared.values()) == gpus, (a, b, c)
        assert all(0 <= shared[ns] <= quotas[ns] for ns in quotas), (quotas, shared)
        # The rest of each quota is whole GPUs, which add up to the rest of the cluster.
        assert sum(quotas[ns] - shared[ns] for ns in quotas) == 32 - gpus


def _nominal(objects: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """(tenant, flavor) -> nominalQuota of its GPU resource, over the ClusterQueues."""
    out: dict[tuple[str, str], int] = {}
    for obj in objects:
        if obj["kind"] != "ClusterQueue":
            continue
        for group in obj["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                for entry in flavor["resources"]:
                    if entry["nominalQuota"] != "0":
                        out[(obj["metadata"]["name"], flavor["name"])] = int(entry["nominalQuota"])
    return out


def test_tenant_queues_give_kueue_the_labs_whole_gpus_and_mps_slices() -> None:
    """Two nodes of 4 GPUs, one of them MPS with 4 replicas a GPU: Kueue's quotas hold the 4
    whole GPUs and the 16 replicas, no more (not each tenant's quota in both pools)."""
    base = strategy_from_texts("sharing-only", [("sharing-only", SHARING_ONLY_POLICY)])
    layout = Layout(nodes=2, gpus_per_node=4, mps_nodes=1, mps_replicas=4)
    namespaces: dict[str, dict[str, str]] = {"a": {}, "b": {}}
    strategy = kueue_variant(base, namespaces, {"a": 3.0, "b": 1.0}, layout, {"a": 1.0, "b": 3.0})
    assert strategy.queues == {"a": 6, "b": 2}
    # b's demand would take 3 of the 4 MPS GPUs, past its quota of 2: the rest goes to a.
    assert strategy.shared_gpus == {"a": 2, "b": 2}
    assert strategy.mps_nodes == 1
    nominal = _nominal(queue_objects(strategy))
    assert nominal == {
        ("a", "gpuwarden-mps-gpus"): 8,  # 2 GPUs x 4 replicas
        ("a", "gpuwarden-whole-gpus"): 4,
        ("b", "gpuwarden-mps-gpus"): 8,  # b's whole-GPU quota is 0: it only borrows them
    }
    mps = sum(n for (_, flavor), n in nominal.items() if flavor == "gpuwarden-mps-gpus")
    whole = sum(n for (_, flavor), n in nominal.items() if flavor == "gpuwarden-whole-gpus")
    assert (mps, whole) == (4 * 4, 4)
    # The policy's nvidia backend now says the lab's replicas: no assumption to warn about.
    assert strategy.policies is not None
    rendering = render(strategy.policies, RenderOptions(kueue=True))
    assert not [w for w in rendering.warnings if "mpsReplicas" in w]


def test_a_strategy_that_shares_needs_its_mps_nodes_resolved() -> None:
    base = strategy_from_texts("sharing-only", [("sharing-only", SHARING_ONLY_POLICY)])
    with pytest.raises(ValueError, match="resolve its MPS nodes first"):
        kueue_variant(base, {"a": {}}, {"a": 1.0}, Layout(nodes=1), {})
