"""How many MPS nodes a strategy's shared pods need: a platform team sizes its MPS pool to the
shared demand it expects instead of carving out a fixed share of the cluster (pure: from each
trace row's pod as the policy core decided it offline, no cluster involved)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.lab.cluster.nodes import mps_sm_share, pod_devices
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.policy import Admission


def _decided_rows(
    rows: Sequence[TraceRow], decisions: Mapping[int, Admission]
) -> Iterator[tuple[TraceRow, int, int]]:
    """Each row whose pod the strategy admits, with the whole GPUs and MPS slices it asks."""
    for row in rows:
        decision = decisions.get(row.row)
        if decision is None or not decision.allowed:
            continue
        whole, slices = pod_devices(decision.pod)
        yield row, whole, slices


def _shared_rows(
    rows: Sequence[TraceRow], decisions: Mapping[int, Admission]
) -> Iterator[tuple[TraceRow, int]]:
    """Each row whose pod the strategy admits with MPS slices, and how many."""
    for row, _, slices in _decided_rows(rows, decisions):
        if slices:
            yield row, slices


def _levels(spans: Iterable[tuple[float, float, float]]) -> Iterator[tuple[float, float]]:
    """(moment, the summed amount alive from it on) at each start and end of the spans, each
    (start, duration, amount)."""
    events: list[tuple[float, float]] = []
    for at, duration, amount in spans:
        events += [(at, amount), (at + duration, -amount)]
    level = 0.0
    for at, change in sorted(events):  # an end before a start at the same moment
        level += change
        yield at, level


def _peak(spans: Iterable[tuple[float, float, int]]) -> int:
    """The most of the (whole) amounts alive at once, each (start, duration, amount)."""
    return int(max((level for _, level in _levels(spans)), default=0))


def shared_demand(rows: Sequence[TraceRow], decisions: Mapping[int, Admission]) -> int:
    """The most MPS slices the strategy's pods ask for at once, each pod alive from its arrival
    for its duration (0 when it shares nothing)."""
    return _peak((row.at, row.duration, slices) for row, slices in _shared_rows(rows, decisions))


@dataclass(frozen=True)
class WholeDemand:
    """What the strategy's whole-GPU pods ask: the most GPUs at once, the most one pod asks,
    and GPU-hours in all."""

    peak: int
    largest: int
    gpu_hours: float


def whole_demand(rows: Sequence[TraceRow], decisions: Mapping[int, Admission]) -> WholeDemand:
    """The whole GPUs the strategy's pods ask for at their peak (each pod alive from its
    arrival for its duration), the most one pod asks, and their GPU-hours."""
    spans = [(r.at, r.duration, w) for r, w, _ in _decided_rows(rows, decisions) if w]
    return WholeDemand(
        _peak(spans),
        max((s[2] for s in spans), default=0),
        sum(d * w for _, d, w in spans) / 3600,
    )


def slice_speed(row: TraceRow, pod: Mapping[str, Any]) -> float:
    """The speed a batch row's pod works at on its MPS slice, under its thread percentage (1: a
    service, or a cap above its busy share)."""
    cap = mps_sm_share(pod)
    speed = 1.0 if cap is None or not row.batch or row.busy <= cap else cap / row.busy
    return max(speed, 1e-3)


def shared_gpu_hours(
    rows: Sequence[TraceRow], decisions: Mapping[int, Admission], replicas: int
) -> float:
    """Physical GPU-hours the strategy's shared pods hold their slices (a slice is 1/replicas
    of a GPU): a service for its lifetime, a batch pod for its work at the speed its MPS
    thread percentage allows (a trial at busy 0.8 capped at 25% of the SMs holds its slice
    3.2 times its duration)."""
    held = 0.0
    for row in rows:
        decision = decisions.get(row.row)
        if decision is None or not decision.allowed:
            continue
        _, slices = pod_devices(decision.pod)
        if not slices:
            continue
        held += slices * row.duration / slice_speed(row, decision.pod)
    return held / 3600 / replicas


def size_shares_nodes(
    node_gpus: Sequence[int],
    spans: Sequence[tuple[float, float, float]],
    whole: WholeDemand,
) -> MpsSizing:
    """The DRA nodes a strategy's shares prefer, sized as MPS nodes are (:func:`size_mps_nodes`,
    a GPU as one slice): ``spans`` are its shared pods, each (arrival, seconds it holds its
    share, the share of a GPU it reserves)."""
    peak = max((level for _, level in _levels(spans)), default=0.0)
    if peak <= 0:
        return MpsSizing(0, "")
    hours = sum(held * share for _, held, share in spans) / 3600
    most = f"{peak:,.2f}".rstrip("0").rstrip(".")
    return size_mps_nodes(
        node_gpus,
        math.ceil(peak - 1e-9),
        whole,
        1,
        hours,
        pool="nodes its shares prefer",
        asked=f"shares of at most {most} GPUs at once",
    )


@dataclass(frozen=True)
class ServicesPeak:
    """What the services (notebooks, predictors: wanted for their lifetime, not for work to
    finish) hold at once at the shares a strategy gives them, each alive from its arrival for
    its duration: the most GPUs, and the seconds of the horizon that is more than the cluster's."""

    gpus: float
    seconds_over: float


def services_peak(
    rows: Sequence[TraceRow],
    held: Callable[[TraceRow], float | None],
    physical_gpus: int,
    horizon: float,
) -> ServicesPeak:
    """The services' peak (``held``: the GPUs a row's pod holds, None where it is refused).
    Where it is more than the GPUs, some service waits whatever the scheduler does."""
    spans = [
        (row.at, min(row.duration, horizon - row.at), gpus)
        for row in rows
        if not row.batch and row.at < horizon and (gpus := held(row))
    ]
    peak = over = since = before = 0.0
    for at, level in _levels(spans):
        if before > physical_gpus + 1e-9:
            over += at - since
        since, before = at, level
        peak = max(peak, level)
    return ServicesPeak(peak, over)


@dataclass(frozen=True)
class MpsSizing:
    """How many of the nodes (in the order they become MPS nodes) share their GPUs, and why."""

    nodes: int
    note: str


def size_mps_nodes(
    node_gpus: Sequence[int],
    slices: int,
    whole: WholeDemand,
    replicas: int,
    shared_hours: float = 0.0,
    *,
    pool: str = "MPS nodes",
    asked: str | None = None,
) -> MpsSizing:
    """The MPS nodes for ``slices`` MPS slices at once on nodes of ``node_gpus`` GPUs each, in
    the order the layout makes them MPS nodes (sizes may differ), each GPU ``replicas`` slices.

    * **Enough for the shared peak**: the fewest first nodes whose GPUs times ``replicas``
      hold ``slices`` (no headroom above the peak: the peak already has every shared pod
      running from its arrival, which a queue only lowers).
    * **Never starve whole GPUs**: where the shared peak's GPUs (``slices / replicas``) and the
      whole-GPU pods' peak fit in the cluster together, the nodes left whole hold that peak.
      Where they do not (a saturated trace), the pools split the GPUs in proportion to the
      GPU-hours each pool's pods hold (``shared_hours``, see :func:`shared_gpu_hours`, and
      ``whole.gpu_hours``: each pool then carries the same load for its size), the MPS pool rounded to the nearest node.
    * Either way the nodes left whole hold the largest whole-GPU pod and are never none while
      whole-GPU pods exist; and anything shared gets at least one node.
    * Where no pod asks whole GPUs, every node shares (a node left whole would serve no one).
    """
    if slices <= 0 or not node_gpus:
        return MpsSizing(0, "")
    total = sum(node_gpus)
    cumulative = [sum(node_gpus[: i + 1]) for i in range(len(node_gpus))]
    needed = next(
        (i + 1 for i, gpus in enumerate(cumulative) if gpus * replicas >= slices),
        len(node_gpus),
    )
    asked = asked or f"at most {slices} slices asked at once, {replicas} per GPU"
    if not whole.peak:
        # No pod asks whole GPUs: a node left whole would serve no one (issue 33: Alibaba's
        # gpushare100 list on 1,213 nodes queued its trials on 1 MPS node beside idle ones).
        return MpsSizing(
            len(node_gpus),
            f"{pool}: all {len(node_gpus):,}, {total:,} GPUs (no pod asks whole GPUs; {asked})",
        )
    # Node counts that leave the largest whole-GPU pod a node's worth of whole GPUs.
    allowed = whole_node_counts(node_gpus, whole.largest)
    fits = slices / replicas + whole.peak <= total
    if fits:
        target: float = total - whole.peak
        nodes = min(needed, max([n for n in allowed if cumulative[n - 1] <= target] or [1]))
        why = "" if nodes >= needed else f"; {needed} would leave them too few"
    else:
        work = shared_hours + whole.gpu_hours
        target = total * shared_hours / work if work else 0.0
        nodes = min(needed, min(allowed, key=lambda n: (abs(cumulative[n - 1] - target), n)))
        why = (
            f"; both peaks do not fit in {total} GPUs: split by the GPU-hours held, "
            f"{shared_hours:,.0f} shared to {whole.gpu_hours:,.0f} whole"
        )
    return MpsSizing(
        nodes,
        f"{pool} sized to its shared demand: {nodes} of {len(node_gpus)}, "
        f"{cumulative[nodes - 1]} GPUs ({asked}; whole-GPU pods ask at most {whole.peak} GPUs "
        f"at once{why})",
    )


def shared_slice_hours(
    rows: Sequence[TraceRow], decisions: Mapping[int, Admission], horizon: float
) -> dict[str, float]:
    """MPS slice-hours each namespace's pods ask for under the strategy, of the rows that
    arrive within the horizon (what its share of the MPS nodes is sized to)."""
    out: dict[str, float] = {}
    for row, slices in _shared_rows(rows, decisions):
        if row.at < horizon:
            out[row.namespace] = out.get(row.namespace, 0.0) + slices * row.duration / 3600
    return out


def whole_node_counts(node_gpus: Sequence[int], largest_whole: int) -> list[int]:
    """The MPS node counts (the first nodes in ``node_gpus``' order) that leave at least one
    node whole and, of the nodes left whole, GPUs enough for the largest whole-GPU pod; with
    no whole-GPU pod (``largest_whole`` 0), every count from 1 to all of them."""
    if not node_gpus:
        return []
    if not largest_whole:
        return list(range(1, len(node_gpus) + 1))
    total = sum(node_gpus)
    counts = [n for n in range(1, len(node_gpus)) if total - sum(node_gpus[:n]) >= largest_whole]
    return counts or [1]


def sweep_candidates(
    auto: int, counts: Sequence[int], size: int, reachable: Mapping[int, float] | None = None
) -> list[int]:
    """``size`` MPS node counts of ``counts`` to replay, in increasing order: the auto estimate
    and, where ``reachable`` gives each count's split bound (the most work any scheduler could
    deliver with the pools split so), the counts that leave the most work reachable; else its
    neighbours on both sides (on one side at an end). Nearer ``auto`` first, then fewer nodes,
    where two are as good."""
    pool = set(counts)
    chosen = [auto] if auto in pool else []
    left = sorted(
        pool - {auto},
        key=lambda n: (-reachable.get(n, 0.0) if reachable else 0.0, abs(n - auto), n),
    )
    return sorted(chosen + left[: max(size, 1) - len(chosen)])


def probe_counts(counts: Sequence[int], auto: int, most: int = 16) -> list[int]:
    """The counts whose split bound is worth computing: all of them, or on a long node list
    ``most`` spread evenly over them with the auto estimate and its neighbours."""
    if len(counts) <= most:
        return list(counts)
    step = (len(counts) - 1) / (most - 1)
    spread = {counts[round(i * step)] for i in range(most)}
    return sorted(spread | {n for n in counts if abs(n - auto) <= 1})
