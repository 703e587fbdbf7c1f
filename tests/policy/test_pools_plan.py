"""The pool planner (issue 33 item 4): the decisions a platform engineer checks before letting
a controller relabel GPU nodes."""

from __future__ import annotations

import datetime
from dataclasses import replace
from typing import Any

import pytest

from gpuwarden.policy.render.pools import (
    ANNOTATION_MOVED_AT,
    ANNOTATION_TARGET,
    SETTLE_SECONDS,
    Ask,
    GpuUse,
    NodeChange,
    PoolNode,
    PoolSettings,
    gpu_use,
    plan,
    pool_nodes,
    pool_settings,
    timestamp,
)
from gpuwarden.policy.spec.model import NvidiaPools

from .support import gpu_pod, policies_from

LABEL = "nvidia.com/device-plugin.config"
NOW = datetime.datetime(2026, 12, 5, 3, 0, tzinfo=datetime.UTC)


def settings(**pools: Any) -> PoolSettings:
    return PoolSettings(
        NvidiaPools(
            **{"whole_config": "whole", "shared_config": "mps", "hold_seconds": 600, **pools}
        ),
        replicas=4,
        shared_resource="nvidia.com/gpu.shared",
    )


def node(
    name: str,
    config: str,
    gpus: int = 8,
    *,
    held_gpus: int = 0,
    held_replicas: int = 0,
    cordoned: bool = False,
    target: str | None = None,
    moved_seconds_ago: float | None = None,
    **labels: str,
) -> PoolNode:
    annotations = {}
    if target is not None:
        annotations[ANNOTATION_TARGET] = target
    if moved_seconds_ago is not None:
        moved = NOW - datetime.timedelta(seconds=moved_seconds_ago)
        annotations[ANNOTATION_MOVED_AT] = timestamp(moved)
    return PoolNode(
        name,
        {LABEL: config, **labels},
        gpus,
        unschedulable=cordoned,
        annotations=annotations,
        held_gpus=held_gpus,
        held_replicas=held_replicas,
    )


def shared(replicas: int = 1, count: int = 1) -> list[Ask]:
    return [Ask(0, replicas)] * count


def whole(gpus: int = 1, count: int = 1) -> list[Ask]:
    return [Ask(gpus, 0)] * count


def moves(changes: list[NodeChange]) -> list[tuple[str, str, str]]:
    """(node, event, target) of each change."""
    return [(c.node, c.event, c.target) for c in changes]


def test_an_empty_whole_node_moves_at_once_when_shared_pods_wait() -> None:
    nodes = [
        node("a", "whole", held_gpus=2),
        node("b", "whole"),
        node("s", "mps", held_replicas=32),
    ]
    [change] = plan(settings(), nodes, shared(count=3), NOW)
    assert moves([change]) == [("b", "started", "mps")]
    # Cordoned first, so that a pod bound to it meanwhile is seen by the next plan...
    assert change.merge_patch() == {
        "metadata": {"annotations": {ANNOTATION_TARGET: "mps"}},
        "spec": {"unschedulable": True},
    }
    assert "offers 32 replicas for the 35 its pods hold and wait for" in change.reason
    assert "relabelled at the next plan if it still holds none" in change.reason
    # ... which relabels it, still cordoned until the device plugin advertises the new config.
    cordoned = node("b", "whole", cordoned=True, target="mps")
    [change] = plan(settings(), [nodes[0], cordoned, nodes[2]], shared(count=3), NOW)
    assert moves([change]) == [("b", "finished", "mps")]
    assert change.merge_patch() == {
        "metadata": {
            "labels": {LABEL: "mps"},
            "annotations": {
                ANNOTATION_MOVED_AT: "2026-12-05T03:00:00.000000Z",
                ANNOTATION_TARGET: "mps",
            },
        },
        "spec": {"unschedulable": True},
    }
    # A pod bound to it just before the cordon: it drains instead.
    bound = replace(cordoned, held_replicas=0, held_gpus=1)
    assert plan(settings(), [nodes[0], bound, nodes[2]], shared(count=3), NOW) == []


def relabelled(config: str, seconds_ago: float, **allocatable: int) -> PoolNode:
    moved = node("b", config, cordoned=True, target=config, moved_seconds_ago=seconds_ago)
    return replace(moved, allocatable=allocatable)


def test_a_relabelled_node_is_uncordoned_once_the_plugin_advertises_its_config() -> None:
    busy = node("a", "whole", held_gpus=8)
    # The kubelet still shows the old config: it stays cordoned, and counts in its new pool.
    waiting = relabelled("mps", 5, **{"nvidia.com/gpu": 0})
    assert plan(settings(), [busy, waiting], shared(count=3), NOW) == []
    advertised = relabelled("mps", 5, **{"nvidia.com/gpu.shared": 32, "nvidia.com/gpu": 0})
    [ready] = plan(settings(), [busy, advertised], shared(count=3), NOW)
    assert (ready.event, ready.message) == ("ready", "pool node ready")
    assert ready.merge_patch() == {
        "metadata": {"annotations": {ANNOTATION_TARGET: None}},
        "spec": {"unschedulable": None},
    }
    # Past SETTLE_SECONDS it is uncordoned whatever the plugin advertises, and says so.
    [late] = plan(settings(), [busy, relabelled("mps", SETTLE_SECONDS)], [], NOW)
    assert late.event == "ready" and "uncordoned anyway" in late.reason


def test_under_one_resource_name_the_count_tells_the_configs_apart() -> None:
    plain = settings()._replace(shared_resource="nvidia.com/gpu")
    assert plan(plain, [relabelled("mps", 5, **{"nvidia.com/gpu": 8})], [], NOW) == []
    [ready] = plan(plain, [relabelled("mps", 5, **{"nvidia.com/gpu": 32})], [], NOW)
    assert ready.event == "ready"
    assert plan(plain, [relabelled("whole", 5, **{"nvidia.com/gpu": 32})], [], NOW) == []
    assert plan(plain, [relabelled("whole", 5, **{"nvidia.com/gpu": 8})], [], NOW) != []


def test_a_busy_node_is_cordoned_and_moves_when_its_pods_are_gone() -> None:
    busy = node("a", "whole", held_gpus=1)
    [change] = plan(settings(), [busy, node("b", "whole", held_gpus=4)], shared(), NOW)
    assert moves([change]) == [("a", "started", "mps")]
    assert change.merge_patch() == {
        "metadata": {"annotations": {ANNOTATION_TARGET: "mps"}},
        "spec": {"unschedulable": True},
    }
    assert "cordoned until the pods holding its 1 whole GPU finish" in change.reason

    draining = node("a", "whole", held_gpus=1, cordoned=True, target="mps")
    others = [node("b", "whole", held_gpus=4)]
    assert plan(settings(), [draining, *others], shared(), NOW) == []

    drained = node("a", "whole", cordoned=True, target="mps")
    [done] = plan(settings(), [drained, *others], shared(), NOW)
    assert moves([done]) == [("a", "finished", "mps")]
    assert done.merge_patch() == {
        "metadata": {
            "labels": {LABEL: "mps"},
            "annotations": {ANNOTATION_MOVED_AT: timestamp(NOW), ANNOTATION_TARGET: "mps"},
        },
        "spec": {"unschedulable": True},
    }
    assert "so it is relabelled, and cordoned until the device plugin advertises" in done.reason


def test_the_move_is_cancelled_when_the_demand_is_gone() -> None:
    draining = node("a", "whole", held_gpus=1, cordoned=True, target="mps")
    [change] = plan(settings(), [draining], [], NOW)
    assert moves([change]) == [("a", "cancelled", "mps")]
    assert change.merge_patch() == {
        "metadata": {"annotations": {ANNOTATION_TARGET: None}},
        "spec": {"unschedulable": None},
    }
    assert "covers the 0 replicas its pods hold and wait for with 0 without it" in change.reason


def test_a_node_that_empties_takes_over_from_a_busy_one_draining() -> None:
    draining = node("a", "whole", held_gpus=1, cordoned=True, target="mps")
    freed = node("b", "whole")
    changes = plan(settings(), [draining, freed], shared(), NOW)
    assert moves(changes) == [("b", "started", "mps"), ("a", "cancelled", "mps")]


def test_nothing_moves_back_within_hold_seconds() -> None:
    just_moved = node("s", "mps", moved_seconds_ago=599.5)
    busy_whole = node("w", "whole", held_gpus=8)
    assert plan(settings(), [just_moved, busy_whole], whole(2), NOW) == []
    later = node("s", "mps", moved_seconds_ago=600)
    assert moves(plan(settings(), [later, busy_whole], whole(2), NOW)) == [
        ("s", "started", "whole")
    ]
    # Fractional holds, as the lab's scaled replay passes them.
    quick = settings(hold_seconds=0.25)
    recent = node("s", "mps", moved_seconds_ago=0.2)
    assert (
        plan(
            quick._replace(pools=quick.pools.model_copy(update={"hold_seconds": 0.25})),
            [recent, busy_whole],
            whole(2),
            NOW,
        )
        == []
    )


def test_a_node_an_admin_cordoned_is_never_touched_nor_counted() -> None:
    admin = node("a", "whole", cordoned=True)
    changes = plan(settings(), [admin, node("b", "whole", held_gpus=3)], shared(), NOW)
    assert moves(changes) == [("b", "started", "mps")]
    admin_shared = node("s", "mps", cordoned=True)
    # Its replicas are no part of the shared pool: an empty whole node is still moved.
    assert moves(plan(settings(), [admin_shared, node("b", "whole")], shared(), NOW)) == [
        ("b", "started", "mps")
    ]
    # And it is never uncordoned, whatever the demand.
    assert plan(settings(), [admin_shared, node("b", "whole", held_gpus=8)], whole(1), NOW) == []


def test_shrinking_only_when_whole_pods_wait_and_the_target_stays_covered() -> None:
    busy_whole = node("w", "whole", held_gpus=8)
    s1 = node("s1", "mps", held_replicas=3)
    s2 = node("s2", "mps", held_replicas=1)
    # No whole pod waits: the shared pool keeps its slack.
    assert plan(settings(), [busy_whole, s1, s2], [], NOW) == []
    # Whole pods wait: the shared node holding the fewest replicas drains, since 32 replicas
    # cover the 3 + 1 + 4 waiting without it.
    [change] = plan(settings(), [busy_whole, s1, s2], [*whole(2), *shared(4)], NOW)
    assert moves([change]) == [("s2", "started", "whole")]
    assert "1 whole-GPU pod waits for 2 GPUs" in change.reason
    assert "cordoned until the pods holding its 1 shared replica finish" in change.reason
    # The pods on the node that leaves finish there; the other node must take what the rest
    # hold and all that waits: 3 + 29 fit in 32; with 32 waiting neither node can go.
    assert plan(settings(), [busy_whole, s1, s2], [*whole(2), *shared(1, 29)], NOW) != []
    assert plan(settings(), [busy_whole, s1, s2], [*whole(2), *shared(1, 32)], NOW) == []


def test_a_draining_shared_node_comes_back_when_shared_demand_rises() -> None:
    busy_whole = node("w", "whole", held_gpus=8)
    draining = node("s2", "mps", held_replicas=1, cordoned=True, target="whole")
    # Too small for the 4-GPU pod that waits, and full.
    s1 = node("s1", "mps", 2, held_replicas=8)
    [change] = plan(settings(), [busy_whole, s1, draining], [*whole(4), *shared(1, 4)], NOW)
    assert moves([change]) == [("s2", "cancelled", "whole")]
    assert change.reason.startswith("the shared pool needs it")
    [change] = plan(settings(), [busy_whole, s1, draining], [], NOW)
    assert change.reason == "no whole-GPU pod waits any more"


def test_mixed_sizes_take_the_smallest_node_that_covers_the_shortfall() -> None:
    nodes = [node("big", "whole", 8), node("mid", "whole", 4), node("small", "whole", 2)]
    # 6 replicas missing: a 2-GPU node gives 8.
    assert moves(plan(settings(), nodes, shared(1, 6), NOW)) == [("small", "started", "mps")]
    # 12 missing: the 4-GPU node gives 16.
    assert moves(plan(settings(), nodes, shared(1, 12), NOW)) == [("mid", "started", "mps")]
    # 40 missing: the largest first, then what covers the rest.
    assert moves(plan(settings(), nodes, shared(1, 40), NOW)) == [
        ("big", "started", "mps"),
        ("small", "started", "mps"),
    ]
    # A whole pod of 4 GPUs cannot use a 2-GPU shared node.
    shared_nodes = [node("s2", "mps", 2), node("s8", "mps", 8), node("w", "whole", 8, held_gpus=8)]
    assert moves(plan(settings(), shared_nodes, whole(4), NOW)) == [("s8", "started", "whole")]


def test_headroom_and_floors() -> None:
    nodes = [node("a", "whole"), node("b", "whole")]
    assert moves(plan(settings(shared_headroom=1), nodes, [], NOW)) == [("a", "started", "mps")]
    assert moves(plan(settings(min_shared_nodes=1), nodes, [], NOW)) == [("a", "started", "mps")]
    # minWholeNodes keeps the last whole node whatever waits.
    assert moves(plan(settings(min_whole_nodes=1), nodes, shared(1, 40), NOW)) == [
        ("a", "started", "mps")
    ]
    two_shared = [node("a", "mps"), node("b", "mps")]
    assert moves(plan(settings(min_whole_nodes=1), two_shared, [], NOW)) == [
        ("a", "started", "whole")
    ]
    assert plan(settings(min_shared_nodes=2), two_shared, whole(1), NOW) == []


def test_nodes_outside_the_selector_or_the_two_configs_stay() -> None:
    pools = settings(node_selector={"pool": "flex"})
    nodes = [node("fixed", "whole"), node("other", "default"), node("flex", "whole", pool="flex")]
    assert moves(plan(pools, nodes, shared(), NOW)) == [("flex", "started", "mps")]
    # A fixed shared node still counts: its free replicas cover the demand.
    covered = [node("fixed", "mps"), node("flex", "whole", pool="flex")]
    assert plan(pools, covered, shared(), NOW) == []


def test_a_target_that_names_no_other_pool_is_dropped() -> None:
    stale = node("a", "whole", cordoned=True, target="retired")
    [change] = plan(settings(), [stale], [], NOW)
    assert change.event == "cancelled" and change.unschedulable is False
    assert change.reason == "its target 'retired' is neither pool"


def pod(
    node_name: str | None = None, *, unschedulable: bool = False, **resources: str
) -> dict[str, Any]:
    body = gpu_pod(gpus=None)
    body["spec"]["containers"][0]["resources"] = {"limits": dict(resources)}
    if node_name:
        body["spec"]["nodeName"] = node_name
    if unschedulable:
        body["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        }
    return body


def test_pods_are_read_as_whole_gpus_or_shared_replicas() -> None:
    s = settings()
    assert gpu_use(pod("n1", **{"nvidia.com/gpu": "2"}), s) == GpuUse("n1", 2, 0, False)
    assert gpu_use(pod("n1", **{"nvidia.com/gpu.shared": "1"}), s) == GpuUse("n1", 0, 1, False)
    waiting = pod(unschedulable=True, **{"nvidia.com/gpu.shared": "1"})
    assert gpu_use(waiting, s) == GpuUse("", 0, 1, True)
    assert gpu_use(pod(**{"nvidia.com/gpu.shared": "1"}), s) is None  # not tried yet
    waiting["status"]["nominatedNodeName"] = "n1"
    assert gpu_use(waiting, s) is None  # a preemption made room for it
    done = pod("n1", **{"nvidia.com/gpu": "2"})
    done["status"] = {"phase": "Succeeded"}
    assert gpu_use(done, s) is None
    assert gpu_use(pod("n1", cpu="1"), s) is None
    # Replicas under nvidia.com/gpu: the pod's gpuwarden record says it is shared.
    plain = s._replace(shared_resource="nvidia.com/gpu")
    recorded = pod("n1", **{"nvidia.com/gpu": "1"})
    recorded["metadata"]["annotations"] = {"gpuwarden.io/gpu-shared": "true"}
    assert gpu_use(recorded, plain) == GpuUse("n1", 0, 1, False)
    assert gpu_use(pod("n1", **{"nvidia.com/gpu": "1"}), plain) == GpuUse("n1", 1, 0, False)


def test_pool_nodes_sum_what_pods_hold_and_read_the_gpu_count() -> None:
    nodes = [
        {"metadata": {"name": "a", "labels": {LABEL: "whole", "nvidia.com/gpu.count": "8"}}},
        {
            "metadata": {"name": "b", "labels": {LABEL: "mps"}, "annotations": {"x": "y"}},
            "spec": {"unschedulable": True},
            "status": {"capacity": {"nvidia.com/gpu.shared": "16"}},
        },
    ]
    uses = [GpuUse("a", 2, 0, False), GpuUse("a", 1, 0, False), GpuUse("", 0, 3, True)]
    found, pending = pool_nodes(nodes, uses, settings())
    assert found == [
        PoolNode("a", nodes[0]["metadata"]["labels"], 8, held_gpus=3),
        PoolNode("b", {LABEL: "mps"}, 4, unschedulable=True),
    ]
    assert pending == [Ask(0, 3)]


def test_pool_settings_come_from_the_first_nvidia_backend_with_pools() -> None:
    policies = policies_from(
        """
backend: volcano
profiles:
  - name: shared
    maxMemory: 8Gi
    backend: {type: nvidia, mpsReplicas: 4, pools: {wholeConfig: whole, sharedConfig: mps}}
"""
    )
    found = pool_settings(policies)
    assert found is not None and found.replicas == 4 and found.pools.shared_config == "mps"
    assert pool_settings(policies_from("backend: nvidia")) is None


@pytest.mark.parametrize("raw", ["yesterday", "2026-12-05T02:59:59"])
def test_a_moved_at_it_cannot_read_or_without_zone(raw: str) -> None:
    odd = PoolNode("s", {LABEL: "mps"}, 8, annotations={ANNOTATION_MOVED_AT: raw})
    busy = node("w", "whole", held_gpus=8)
    found = moves(plan(settings(), [odd, busy], whole(1), NOW))
    # Unreadable: as if it never moved. Without a zone: UTC, one second ago, so held.
    assert found == ([("s", "started", "whole")] if raw == "yesterday" else [])


def test_a_pod_no_node_could_hold_moves_nothing() -> None:
    nodes = [node("s", "mps", 2, held_replicas=8), node("w", "whole", 4)]
    # 17 replicas: more than any node offers (4 GPUs x 4); 5 GPUs: more than any node has.
    assert plan(settings(), nodes, [Ask(0, 17), Ask(5, 0)], NOW) == []
    assert moves(plan(settings(), nodes, [Ask(0, 16)], NOW)) == [("w", "started", "mps")]


def test_one_busy_shared_node_drains_toward_the_whole_pool_at_a_time() -> None:
    # The evening: whole pods wait, and three shared nodes still hold most of their replicas.
    shared_nodes = [
        node("s1", "mps", held_replicas=25),
        node("s2", "mps", held_replicas=26),
        node("s3", "mps", held_replicas=27),
        node("s4", "mps"),
    ]
    busy_whole = node("w", "whole", held_gpus=8)
    nodes = [busy_whole, *shared_nodes]
    # The empty node moves at once; of the busy ones, only the one holding fewest drains.
    assert moves(plan(settings(), nodes, whole(8, 4), NOW)) == [
        ("s4", "started", "whole"),
        ("s1", "started", "whole"),
    ]
    # While it drains, no other busy node starts; it stays on its way.
    s1_draining = node("s1", "mps", held_replicas=25, cordoned=True, target="whole")
    assert plan(settings(), [busy_whole, s1_draining, *shared_nodes[1:3]], whole(8, 4), NOW) == []
    # maxDrainingNodes raises the limit.
    assert moves(plan(settings(max_draining_nodes=2), nodes, whole(8, 4), NOW)) == [
        ("s4", "started", "whole"),
        ("s1", "started", "whole"),
        ("s2", "started", "whole"),
    ]
