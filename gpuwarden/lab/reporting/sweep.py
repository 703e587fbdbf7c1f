"""The pool split answered by replay (`simulate --mps-nodes sweep`): a sharing strategy replayed
with several MPS node counts, each judged against the bars the default policy is held to, and the
split recommended (pure: from the replays' reports).

The bars (issue 33): serving and notebook p95 waits at most 15 minutes, no tenant under 0.9x the
share of its asked work it gets without governance (where no governance was replayed beside it),
nothing refused, and the work thrown away by preemption at most 1% of the work delivered. The
recommended split is the one that fails the fewest bars and, of those, delivers the most work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.lab.cluster.nodes import pod_devices
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.lab.planning.sizing import slice_speed
from gpuwarden.lab.reporting.report import (
    INTERACTIVE_KINDS,
    StrategyReport,
    TraceLoad,
    fluid_ceiling,
    format_duration,
    format_share,
)
from gpuwarden.policy import Admission

#: The most an interactive pod (a notebook, a predictor) may wait at p95, seconds.
INTERACTIVE_P95 = 15 * 60
#: The least share of its asked work a tenant keeps, against no governance's.
TENANT_FLOOR = 0.9
#: The most work preemption may throw away, as a share of the work delivered.
LOST_CEILING = 0.01
#: Delivered work closer than this (a share of the best) is within run-to-run noise.
NOISE = 0.02


@dataclass(frozen=True)
class SplitFigures:
    """What one split's replay measured, as the sweep compares them."""

    mps_nodes: int
    mps_gpus: int
    delivered: float  # GPU-hours
    work_share: float | None  # of the work ceiling
    busy_share: float | None  # useful busy over the busy ceiling
    lost: float  # GPU-hours thrown away by preemption
    waits: Mapping[str, float | None]  # p95 seconds by interactive kind
    tenants: Mapping[str, float]  # delivered over asked, by tenant namespace
    never_placed: int
    refused: int
    bound: float | None = None  # GPU-hours: the most any scheduler delivers on this split

    @property
    def bound_share(self) -> float | None:
        """The split's bound over the work ceiling (how much of it the split leaves reachable)."""
        if self.bound is None or self.work_share is None or not self.work_share:
            return None
        return min(1.0, self.bound / (self.delivered / self.work_share))


def split_figures(
    report: StrategyReport,
    mps_nodes: int,
    mps_gpus: int,
    load: TraceLoad | None,
    bound: float | None = None,
) -> SplitFigures:
    work, busy = load.ceiling_shares(report) if load is not None else (None, None)
    waits: dict[str, float | None] = {}
    for kind in INTERACTIVE_KINDS:
        p95 = report.kind_waits.get(kind, {}).get("p95")
        waits[kind] = None if p95 is None else float(p95)
    return SplitFigures(
        mps_nodes=mps_nodes,
        mps_gpus=mps_gpus,
        delivered=report.delivered_gpu_hours,
        work_share=work,
        busy_share=busy,
        lost=report.lost_gpu_hours,
        waits=waits,
        tenants=tenant_shares(report),
        never_placed=report.never_placed,
        refused=report.refused,
        bound=bound,
    )


def tenant_shares(report: StrategyReport) -> dict[str, float]:
    """Each tenant's delivered work over the work it asked (tenants that asked some)."""
    return {
        ns: t["deliveredGpuHours"] / t["offeredGpuHours"]
        for ns, t in report.tenants.items()
        if t.get("offeredGpuHours")
    }


def worst_tenant(
    figures: SplitFigures, baseline: Mapping[str, float] | None
) -> tuple[str, float, float | None] | None:
    """The tenant furthest below its no-governance share (the lowest share without one): its
    name, its share, and that share over no governance's."""
    if not figures.tenants:
        return None

    def ratio(ns: str) -> float | None:
        base = baseline.get(ns) if baseline is not None else None
        return figures.tenants[ns] / base if base else None

    name = min(figures.tenants, key=lambda ns: (ratio(ns) or figures.tenants[ns], ns))
    return name, figures.tenants[name], ratio(name)


def failed_bars(figures: SplitFigures, baseline: Mapping[str, float] | None) -> list[str]:
    """The bars the split misses, each a short phrase naming the figure."""
    failed = [
        f"{kind} p95 {format_duration(p95)}"
        for kind, p95 in figures.waits.items()
        if p95 is not None and p95 > INTERACTIVE_P95
    ]
    worst = worst_tenant(figures, baseline)
    if worst is not None and worst[2] is not None and worst[2] < TENANT_FLOOR:
        failed.append(f"{worst[0]} {worst[2]:.2f}x its no-governance share")
    if figures.refused:
        failed.append(f"{figures.refused} refused")
    if figures.lost > LOST_CEILING * figures.delivered:
        failed.append(f"{figures.lost:,.0f} GPU-h thrown away")
    return failed


@dataclass(frozen=True)
class Recommendation:
    mps_nodes: int
    reason: str


def recommend(
    splits: Sequence[SplitFigures], baseline: Mapping[str, float] | None
) -> Recommendation | None:
    """The split that fails the fewest bars and, of those, delivers the most work (the fewer
    MPS nodes where two deliver the same), and why."""
    if not splits:
        return None
    ranked = sorted(
        splits, key=lambda s: (len(failed_bars(s, baseline)), -s.delivered, s.mps_nodes)
    )
    best, rest = ranked[0], ranked[1:]
    failed = failed_bars(best, baseline)
    verdict = "meets every bar" if not failed else f"misses the fewest bars ({'; '.join(failed)})"
    reason = (
        f"{best.mps_nodes} MPS nodes ({best.mps_gpus} GPUs): {verdict} and delivers "
        f"{best.delivered:,.0f} GPU-hours ({format_share(best.work_share)} of the work ceiling)"
    )
    near = [s for s in rest if abs(s.delivered - best.delivered) <= NOISE * best.delivered]
    if near:
        others = ", ".join(f"{s.mps_nodes} nodes {s.delivered:,.0f}" for s in near)
        reason += f"; within {NOISE:.0%} of its work, run-to-run noise: {others}"
    more = [s for s in rest if s.delivered > (1 + NOISE) * best.delivered]
    if more:
        others = ", ".join(
            f"{s.mps_nodes} nodes {s.delivered:,.0f} (+{s.delivered / best.delivered - 1:.0%}; "
            f"{'; '.join(failed_bars(s, baseline))})"
            for s in more
        )
        reason += f"; more work but more bars missed: {others}"
    return Recommendation(best.mps_nodes, reason)


def sweep_table(
    strategy: str,
    auto: int,
    splits: Sequence[SplitFigures],
    baseline: Mapping[str, float] | None,
) -> str:
    """A line per split (the auto estimate marked), its bars, and the recommendation."""
    kinds = [k for k in INTERACTIVE_KINDS if any(s.waits.get(k) is not None for s in splits)]
    lines = [
        f"pool split swept for {strategy} (--mps-nodes auto sized it to {auto} MPS nodes):",
        f"{'MPS nodes':>9} {'GPUs':>4} {'split bound':>11} {'delivered GPU-h':>15} "
        f"{'of work ceiling':>15} {'of busy ceiling':>15} {'lost GPU-h':>10} "
        + " ".join(f"{k + ' p95':>20}" for k in kinds)
        + f" {'worst tenant (x no gov.)':>28} {'never placed':>12} {'refused':>7}  bars missed",
    ]
    for s in sorted(splits, key=lambda s: s.mps_nodes):
        worst = worst_tenant(s, baseline)
        worst_cell = (
            "-"
            if worst is None
            else f"{worst[0]} {worst[1]:.0%}" + ("" if worst[2] is None else f" ({worst[2]:.2f}x)")
        )
        failed = failed_bars(s, baseline)
        mark = "*" if s.mps_nodes == auto else " "
        lines.append(
            f"{f'{s.mps_nodes}{mark}':>9} {s.mps_gpus:>4} {format_share(s.bound_share):>11} "
            f"{s.delivered:>15,.0f} "
            f"{format_share(s.work_share):>15} {format_share(s.busy_share):>15} {s.lost:>10,.0f} "
            + " ".join(f"{format_duration(s.waits.get(k)):>20}" for k in kinds)
            + f" {worst_cell:>28} {s.never_placed:>12} {s.refused:>7}  "
            + ("; ".join(failed) or "none")
        )
    recommended = recommend(splits, baseline)
    lines.append(
        "(split bound: the most any scheduler could deliver with the pools split so, services "
        "only within their windows, as a share of the work ceiling)"
    )
    if baseline is None:
        lines.append("(no no-governance replay beside it: the tenant bar is not judged)")
    if recommended is not None:
        lines.append(f"recommended: {recommended.reason}")
    return "\n".join(lines)


def sweep_json(
    strategy: str,
    auto: int,
    splits: Sequence[SplitFigures],
    baseline: Mapping[str, float] | None,
) -> dict[str, Any]:
    recommended = recommend(splits, baseline)
    return {
        "strategy": strategy,
        "autoMpsNodes": auto,
        "splits": [
            {
                "mpsNodes": s.mps_nodes,
                "mpsGpus": s.mps_gpus,
                "splitBoundGpuHours": s.bound,
                "splitBoundShare": s.bound_share,
                "deliveredGpuHours": s.delivered,
                "workCeilingShare": s.work_share,
                "busyCeilingShare": s.busy_share,
                "lostGpuHours": s.lost,
                "p95WaitSecondsByKind": dict(s.waits),
                "tenantShares": dict(s.tenants),
                "neverPlaced": s.never_placed,
                "refused": s.refused,
                "barsMissed": failed_bars(s, baseline),
            }
            for s in sorted(splits, key=lambda s: s.mps_nodes)
        ],
        "recommendedMpsNodes": None if recommended is None else recommended.mps_nodes,
        "reason": None if recommended is None else recommended.reason,
    }


def _window_bound(spans: Sequence[tuple[float, float, float, int]], capacity: int) -> float:
    """GPU-seconds services deliver at most on ``capacity`` devices, each span (start, end, GPUs
    asked, devices held) delivering only within its window: at each moment the most GPUs asked
    that the devices hold (the most GPUs per device first)."""
    events = sorted(
        (t, index, starts)
        for index, (start, end, _, _) in enumerate(spans)
        for t, starts in ((start, True), (end, False))
    )
    alive: set[int] = set()
    total, last = 0.0, 0.0
    for at, index, starts in events:
        if at > last and alive:
            total += _held_rate(spans, alive, capacity) * (at - last)
        last = at
        if starts:
            alive.add(index)
        else:
            alive.discard(index)
    return total


def _held_rate(
    spans: Sequence[tuple[float, float, float, int]], alive: set[int], capacity: int
) -> float:
    """GPUs asked that ``capacity`` devices hold of the alive spans, the most per device first."""
    ranked = sorted((spans[i][2], spans[i][3]) for i in alive if spans[i][3])
    ranked.sort(key=lambda gd: -gd[0] / gd[1])
    left, rate = float(capacity), 0.0
    for gpus, devices in ranked:
        take = min(1.0, left / devices)
        rate, left = rate + gpus * take, left - devices * take
        if left <= 0:
            break
    return rate


def split_bound(
    rows: Sequence[TraceRow],
    decisions: Mapping[int, Admission],
    *,
    gpus: int,
    mps_gpus: int,
    replicas: int,
    horizon: float,
) -> float:
    """GPU-hours: the most work any scheduler could deliver with ``mps_gpus`` of the ``gpus``
    shared ``replicas`` ways and the rest whole, each pool on its own. A service (a notebook, a
    predictor) delivers only from its arrival to its end (a notebook's idle tail excluded), so in each pool services deliver at
    most what its devices hold of them at each moment; batch work, which can wait, at most the
    pool's fluid bound (:func:`fluid_ceiling`, a slice counted as its share of a GPU for as long
    as its thread cap makes the work take)."""
    services: dict[bool, list[tuple[float, float, float, int]]] = {True: [], False: []}
    batch: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    for row in rows:
        decision = decisions.get(row.row)
        if row.at >= horizon or decision is None or not decision.allowed:
            continue
        whole, slices = pod_devices(decision.pod)
        if not (whole or slices):
            continue
        # A notebook's idle tail delivers no work (and an idle rule may give its GPU back).
        within = min(row.work_duration, horizon - row.at)
        if not row.batch:
            services[bool(slices)].append((row.at, row.at + within, row.gpus, slices or whole))
            continue
        held = slices / replicas / slice_speed(row, decision.pod) if slices else whole
        batch[bool(slices)].append((row.at, row.gpus * within, held * within))
    bound = _window_bound(services[True], mps_gpus * replicas) + _window_bound(
        services[False], gpus - mps_gpus
    )
    for shared, pool in ((True, mps_gpus), (False, gpus - mps_gpus)):
        bound += fluid_ceiling(batch[shared], gpus=pool, horizon=horizon)
    return bound / 3600
