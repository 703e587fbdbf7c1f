"""How many MPS nodes `--mps-nodes auto` gives a sharing strategy, on node lists of mixed sizes:
enough GPUs for the shared peak, never the whole-GPU pods starved (pure: no cluster)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal

import pytest

from gpuwarden.lab.cluster.controlplane import REPO_ROOT
from gpuwarden.lab.cluster.nodes import SHARES_LABEL, GpuNodePool
from gpuwarden.lab.inputs.defaulttrace import default_namespaces
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.lab.planning.plan import (
    plan_strategy,
    services_note,
    settle_split,
    split_candidates,
    split_plan,
)
from gpuwarden.lab.planning.sizing import (
    WholeDemand,
    probe_counts,
    services_peak,
    shared_gpu_hours,
    size_mps_nodes,
    sweep_candidates,
    whole_node_counts,
)
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


def test_sweep_counts_leave_the_largest_whole_pod_a_node() -> None:
    # 8 nodes of 8: an 8-GPU pod needs one node whole; with none, every node may share.
    assert whole_node_counts([8] * 8, 8) == [1, 2, 3, 4, 5, 6, 7]
    assert whole_node_counts([8] * 4, 0) == [1, 2, 3, 4]
    # 2 + 4 + 8 + 2 GPUs, a pod of 8: only counts that keep the 8-GPU node whole.
    assert whole_node_counts([2, 4, 8, 2], 8) == [1, 2]
    # Nothing leaves it room: one node still shares (sizing never gives a sharer none).
    assert whole_node_counts([4, 4], 8) == [1]
    assert whole_node_counts([], 8) == []


def test_sweep_candidates_surround_the_auto_estimate() -> None:
    counts = [1, 2, 3, 4, 5, 6, 7]
    assert sweep_candidates(4, counts, 3) == [3, 4, 5]
    assert sweep_candidates(4, counts, 5) == [2, 3, 4, 5, 6]
    # Four: the fewer nodes first where two are as near.
    assert sweep_candidates(4, counts, 4) == [2, 3, 4, 5]
    # At an end, the neighbours are on one side.
    assert sweep_candidates(1, counts, 3) == [1, 2, 3]
    assert sweep_candidates(7, counts, 3) == [5, 6, 7]
    # Fewer counts than asked: all of them.
    assert sweep_candidates(1, [1, 2], 5) == [1, 2]
    assert sweep_candidates(2, [1], 3) == [1]


def test_sweep_candidates_are_the_auto_estimate_and_the_splits_that_leave_most_reachable() -> None:
    # The oversubscribed week's split bounds (shares of the work ceiling) by MPS nodes: auto
    # gives 4, the bound is highest at 5, then 6, and 3 leaves far less.
    bounds = {1: 0.45, 2: 0.63, 3: 0.76, 4: 0.86, 5: 0.92, 6: 0.915, 7: 0.88}
    assert sweep_candidates(4, list(bounds), 3, bounds) == [4, 5, 6]
    # The busy week's: auto 2 is the best; then 3, then 1.
    busy = {1: 0.91, 2: 0.993, 3: 0.969, 4: 0.855}
    assert sweep_candidates(2, list(busy), 3, busy) == [1, 2, 3]
    # Equal bounds: nearer the auto estimate, then fewer nodes.
    flat = dict.fromkeys(range(1, 8), 1.0)
    assert sweep_candidates(4, list(flat), 3, flat) == [3, 4, 5]


def _notebooks_and_a_node_job() -> list[TraceRow]:
    """40 notebooks at once (10 shared GPUs) and an 8-GPU job."""
    return [
        TraceRow(i, 0.0, "algo-team", "notebook", "nb", 1, 8 * HOUR, Decimal(10 * 2**30), busy=0.1)
        for i in range(40)
    ] + [TraceRow(40, 0.0, "data-team", "training-job", "big", 8, 8 * HOUR, Decimal(60 * 2**30))]


def test_a_sized_strategy_sweeps_around_its_auto_estimate() -> None:
    strategies = {s.name: s for s in builtin_strategies(REPO_ROOT / "policies")}
    rows = _notebooks_and_a_node_job()
    planned = plan_strategy(strategies["default-policy"], Layout(), rows, default_namespaces())
    auto = planned.layout.mps_nodes
    assert auto is not None
    counts = split_candidates(planned, rows, 3)
    assert auto in counts and len(counts) == 3 and max(counts) <= 7
    split = split_plan(planned, counts[0])
    assert split.strategy.name == f"default-policy@{counts[0]}"
    assert split.layout.mps_nodes == counts[0]
    assert split.decisions is planned.decisions
    # A strategy that shares nothing has no split to sweep.
    free = plan_strategy(strategies["no-governance"], Layout(), rows, default_namespaces())
    assert split_candidates(free, rows, 3) == []


def test_a_sized_split_gives_way_only_to_one_that_leaves_clearly_more_reachable() -> None:
    strategies = {s.name: s for s in builtin_strategies(REPO_ROOT / "policies")}
    rows = _notebooks_and_a_node_job()
    planned = plan_strategy(strategies["default-policy"], Layout(), rows, default_namespaces())
    auto = planned.layout.mps_nodes
    assert auto == 2  # 40 slices: 10 GPUs, two 8-GPU nodes

    def bounds(table: dict[int, float]) -> Callable[[int], float]:
        return lambda n: table.get(n, 0.0)

    # 3 nodes leave 5% more reachable: the plan takes it and says why.
    settled = settle_split(planned, rows, bounds({2: 1000.0, 3: 1050.0}))
    assert settled.layout.mps_nodes == 3
    assert settled.notes[-1].startswith(
        "MPS nodes: 3, not 2: any scheduler delivers at most 1,050 GPU-hours with 3, 1,000 with 2"
    )
    # Within 2%: the sized split stays, its plan unchanged.
    assert settle_split(planned, rows, bounds({2: 1000.0, 3: 1015.0})) is planned
    # A tenant-queue variant keeps the split its quotas were made for.
    queued = replace(planned, strategy=replace(planned.strategy, mps_nodes=2))
    assert settle_split(queued, rows, bounds({2: 1000.0, 3: 2000.0})) is queued


def test_long_node_lists_probe_a_spread_of_counts_and_the_auto_neighbourhood() -> None:
    assert probe_counts([1, 2, 3], 2) == [1, 2, 3]
    probed = probe_counts(list(range(1, 1213)), 600, most=16)
    assert len(probed) <= 19 and {1, 599, 600, 601, 1212} <= set(probed)


def _service(row: int, at: float, hours: float, kind: str = "notebook") -> TraceRow:
    return TraceRow(row, at, "algo-team", kind, "nb", 1, hours * HOUR, Decimal(6 * 2**30), busy=0.1)


def test_the_services_peak_counts_only_services_and_the_time_they_ask_more_than_the_gpus() -> None:
    rows = [
        _service(0, 0.0, 4),  # 0h-4h
        _service(1, 1 * HOUR, 2),  # 1h-3h
        _service(2, 3 * HOUR, 2),  # 3h-5h: starts as row 1 ends, never on top of it
        replace(_trial(3, 0.0), duration=10 * HOUR),  # batch: not a service
    ]
    peak = services_peak(rows, lambda row: 0.5, 1, 4 * HOUR)
    assert peak.gpus == 1.0 and peak.seconds_over == 0.0
    # At a whole GPU each, two GPUs at once from 1h to 4h: one GPU is short for 3 hours.
    peak = services_peak(rows, lambda row: 1.0, 1, 4 * HOUR)
    assert (peak.gpus, peak.seconds_over) == (2.0, 3 * HOUR)
    # A refused service holds nothing.
    assert services_peak(rows, lambda row: None, 1, 4 * HOUR).gpus == 0.0


def test_the_plan_notes_what_the_services_ask_at_the_strategys_shares() -> None:
    strategies = {s.name: s for s in builtin_strategies(REPO_ROOT / "policies")}
    # 40 notebooks at once: whole GPUs as their controllers made them, a share each under the
    # default policy (a quarter slice on MPS nodes; 20 of a device's 100 cores on DRA nodes).
    rows = _notebooks_and_a_node_job()
    free = plan_strategy(strategies["no-governance"], Layout(), rows, default_namespaces())
    assert services_note(free, rows, 8 * HOUR) == (
        "services (notebooks, predictors) at its shares, each from its arrival: at most 40 GPUs "
        "at once (62% of the 64)"
    )
    small = Layout(nodes=4)
    free = plan_strategy(strategies["no-governance"], small, rows, default_namespaces())
    assert services_note(free, rows, 8 * HOUR) == (
        "services (notebooks, predictors) at its shares, each from its arrival: at most 40 GPUs "
        "at once (125% of the 32), more than the GPUs for 8.0h: some wait whatever the scheduler"
    )
    shared = plan_strategy(strategies["default-policy"], Layout(), rows, default_namespaces())
    assert services_note(shared, rows, 8 * HOUR) == (
        "services (notebooks, predictors) at its shares, each from its arrival: at most 10 GPUs "
        "at once (16% of the 64); its MPS nodes have 16"
    )
    on_dra = {s.name: s for s in builtin_strategies(REPO_ROOT / "policies", "dra")}
    dra = plan_strategy(on_dra["default-policy"], Layout(dra=True), rows, default_namespaces())
    assert services_note(dra, rows, 8 * HOUR) == (
        "services (notebooks, predictors) at its shares, each from its arrival: at most 8 GPUs "
        "at once (13% of the 64)"
    )
    # A trace of batch work only has no services to speak of.
    assert services_note(shared, [_trial(0, 0.0)], HOUR) is None


def test_on_dra_the_shares_prefer_nodes_sized_to_them() -> None:
    # kube-scheduler scores a claim-only pod alike on every node: the stand-in's shares prefer
    # labelled nodes, as many as their peak needs, so an 8-GPU job still finds a whole node.
    on_dra = {s.name: s for s in builtin_strategies(REPO_ROOT / "policies", "dra")}
    rows = _notebooks_and_a_node_job()
    plan = plan_strategy(on_dra["default-policy"], Layout(dra=True), rows, default_namespaces())
    assert plan.layout.shares_nodes == 1
    assert plan.notes == (
        "nodes its shares prefer sized to its shared demand: 1 of 8, 8 GPUs (shares of at most "
        "8 GPUs at once; whole-GPU pods ask at most 8 GPUs at once)",
    )
    pools = {pool.name: pool for pool in plan.layout.pools(True)}
    assert (pools["gpu"].count, pools["gpu-shares"].count) == (7, 1)
    assert (
        pools["gpu-shares"].node_manifest("gpu-shares-0")["metadata"]["labels"][SHARES_LABEL]
        == "true"
    )
    assert SHARES_LABEL not in pools["gpu"].node_manifest("gpu-0")["metadata"]["labels"]
    notebook = plan.decisions[0].pod["spec"]
    assert notebook["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ] == [
        {
            "weight": 100,
            "preference": {
                "matchExpressions": [{"key": SHARES_LABEL, "operator": "In", "values": ["true"]}]
            },
        }
    ]
    assert "affinity" not in plan.decisions[40].pod["spec"]  # the whole-GPU job
    # Without governance nothing is shared, and no node is labelled.
    free = plan_strategy(on_dra["no-governance"], Layout(dra=True), rows, default_namespaces())
    assert (free.layout.shares_nodes, free.notes) == (0, ())
    assert [pool.name for pool in free.layout.pools(False)] == ["gpu"]


def test_on_dra_claims_that_no_gpu_can_hold_are_named() -> None:
    # The default policy caps a Katib trial's GPU memory at 20Gi: on 16 GB T4s its claim fits no
    # device, as a Volcano vgpu-memory request of that size would not, so the plan says so.
    on_dra = {s.name: s for s in builtin_strategies(REPO_ROOT / "policies", "dra")}
    t4 = Layout(dra=True, node_pools=(GpuNodePool("t4-2", 2, 2, gpu_memory_mib=15360),))
    rows = [_trial(i, 0.0) for i in range(3)]
    plan = plan_strategy(on_dra["default-policy"], t4, rows, default_namespaces())
    assert (
        "claims of template gpuwarden-batch-hpo ask 20Gi of GPU memory, more than any GPU here "
        "has (15,360 MiB): its 3 pods are never placed"
    ) in plan.notes
    h100 = plan_strategy(on_dra["default-policy"], Layout(dra=True), rows, default_namespaces())
    assert not [note for note in h100.notes if "never placed" in note]
