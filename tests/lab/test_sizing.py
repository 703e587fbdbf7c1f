"""How many MPS nodes `--mps-nodes auto` gives a sharing strategy, on node lists of mixed sizes:
enough GPUs for the shared peak, never the whole-GPU pods starved (pure: no cluster)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuwarden.lab.cluster.controlplane import REPO_ROOT
from gpuwarden.lab.cluster.nodes import GpuNodePool
from gpuwarden.lab.inputs.defaulttrace import default_namespaces
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.lab.planning.plan import plan_strategy
from gpuwarden.lab.planning.sizing import WholeDemand, shared_gpu_hours, size_mps_nodes
from gpuwarden.lab.planning.strategies import Layout, builtin_strategies

HOUR = 3600.0
NONE = WholeDemand(0, 0, 0.0)


def test_mixed_node_sizes_are_counted_by_their_own_gpus() -> None:
    # 25 slices at 4 per GPU need 7 GPUs: on 2-GPU nodes that is 4 nodes, not one "8-GPU node"
    # (one whole GPU asked too: else every node would share, see the next test).
    one = WholeDemand(1, 1, 1.0)
    sized = size_mps_nodes([2] * 10 + [8] * 3, 25, one, 4)
    assert sized.nodes == 4
    assert "4 of 13, 8 GPUs (at most 25 slices asked at once, 4 per GPU;" in sized.note
    # Node sizes in the order they become MPS nodes: 4 + 2 + 8 GPUs hold 14 * 4 >= 50 slices.
    assert size_mps_nodes([4, 2, 8, 8], 50, one, 4).nodes == 3
    assert size_mps_nodes([8, 8], 0, NONE, 4).nodes == 0


def test_whole_gpu_pods_keep_their_peak_when_both_fit() -> None:
    # 8 + 8 + 4 + 4 GPUs; the shared peak needs 9 GPUs (two 8-GPU nodes), whole-GPU pods ask
    # 10 at once: one MPS node leaves 16, two would leave 8.
    sized = size_mps_nodes([8, 8, 4, 4], 36, WholeDemand(10, 4, 100.0), 4)
    assert sized.nodes == 1
    assert "2 would leave them too few" in sized.note
    assert size_mps_nodes([8, 8, 4, 4], 36, WholeDemand(8, 4, 100.0), 4).nodes == 2


def test_never_every_node_mps_while_whole_gpu_pods_exist() -> None:
    # Four openb-like nodes of three models (2, 4, 8, 2 GPUs): the shared peak asks more than
    # all of them hold, the training tenant's whole-GPU pods ask 8 GPUs and one pod 8 of them.
    sized = size_mps_nodes([2, 4, 8, 2], 200, WholeDemand(8, 8, 50.0), 4, shared_hours=50.0)
    assert sized.nodes < 4
    assert "both peaks do not fit in 16 GPUs" in sized.note
    # The nodes left whole hold the largest whole-GPU pod: the 8-GPU node stays whole.
    assert sized.nodes == 2
    # Split by the GPU-hours asked: a little shared work gets the first node only.
    assert size_mps_nodes([2, 4, 8, 2], 200, WholeDemand(40, 2, 900.0), 4, 10.0).nodes == 1


def test_a_saturated_trace_splits_the_gpus_by_the_work_each_pool_is_asked() -> None:
    # 8 nodes of 8: shared peak 200 slices (50 GPUs), whole peak 100. Shared work 1/4 of the
    # GPU-hours asked: 16 of the 64 GPUs, 2 nodes.
    sized = size_mps_nodes([8] * 8, 200, WholeDemand(100, 8, 300.0), 4, shared_hours=100.0)
    assert sized.nodes == 2
    assert "split by the GPU-hours held, 100 shared to 300 whole" in sized.note


def _trial(row: int, at: float) -> TraceRow:
    return TraceRow(
        row=row,
        at=at,
        namespace="batch",
        kind="katib-trial",
        name="hpo",
        gpus=1,
        duration=HOUR,
        memory_used=Decimal(10 * 2**30),
        busy=0.8,
    )


def test_the_default_policy_on_a_mixed_node_list_sizes_by_the_nodes_it_picks() -> None:
    # 48 one-GPU Katib trials at once, shared 4 to a GPU by the default policy: 48 slices, 12
    # GPUs; 2 + 2 + 2 + 8 GPUs would hold them. No pod asks whole GPUs, so every node shares:
    # a node left whole would serve no one (issue 33: Alibaba's gpushare100 list, every GPU pod
    # a share, queued its Katib trials on 1 MPS node of 1,213 for hours).
    strategy = next(
        s for s in builtin_strategies(REPO_ROOT / "policies") if s.name == "default-policy"
    )
    layout = Layout(
        node_pools=(GpuNodePool("small", 3, 2), GpuNodePool("big", 2, 8)), mps_replicas=4
    )
    assert layout.mps_candidates == [2, 2, 2, 8, 8]
    rows = [_trial(i, 0.0) for i in range(1, 49)]
    plan = plan_strategy(strategy, layout, rows, default_namespaces())
    assert plan.layout.mps_nodes == 5, plan.notes
    assert plan.notes == (
        "MPS nodes: all 5, 22 GPUs (no pod asks whole GPUs; at most 48 slices asked at once, "
        "4 per GPU)",
    )


def test_a_capped_trial_holds_its_slice_longer_than_its_duration() -> None:
    # The default policy shares a Katib trial under a 25% SM cap: at busy 0.8 it runs at
    # 0.25 / 0.8 of its speed, so its hour of work holds a quarter GPU for 3.2 hours.
    strategy = next(
        s for s in builtin_strategies(REPO_ROOT / "policies") if s.name == "default-policy"
    )
    rows = [_trial(1, 0.0)]
    plan = plan_strategy(strategy, Layout(), rows, default_namespaces())
    assert shared_gpu_hours(rows, plan.decisions, 4) == pytest.approx(3.2 / 4)
