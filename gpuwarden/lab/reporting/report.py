"""What a replay measured, from the pods' recorded lifetimes (pure functions, simulated seconds).

* **GPU busy**: the share of the GPUs' time their SMs were busy (DCGM_FI_DEV_GPU_UTIL), split
  into **useful** busy and **redone**: the busy time preempted pods spent on work past their
  last checkpoint, thrown away and done again by their next attempt;
* **ceilings** (of the trace, on the cluster): the **work ceiling** is the most GPU work any
  scheduler could deliver by the horizon, and the **busy ceiling** the most useful GPU busy
  time (see :func:`fluid_ceiling`); each strategy's delivered work and useful busy time are
  given as shares of them;
* **allocation**: GPUs held by bound pods over time, as a share of the cluster's physical GPUs
  (an MPS slice holds 1/replicas of a GPU);
* **memory used**: GPU memory the trace says pods used, over the GPU memory their allocation
  set aside (a whole GPU's memory per whole GPU, a 1/replicas share per slice), time-weighted;
* **wait**: from creation to binding, per tenant namespace, for pods that were placed;
* **preempted**: pods deleted by the scheduler to make room; **never placed**: still unbound
  when the replay ended; **refused**: denied by gpuwarden's admission;
* **idle tails**: GPU-hours notebooks held while sitting idle after their work (the trace's
  ``idle``), and those an idle rule gave back by stopping them before their users closed them;
* **tenant queues** (strategies with Kueue): per tenant its entitled share (nominal quota over
  the cluster's GPUs), the share of the GPUs it held over time, the GPU-hours it held above its
  quota as Kueue counts it (borrowed) and the work lost when Kueue took GPUs back (reclaim).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.lab.replay.records import PodRecord, RowOutcome


@dataclass(frozen=True)
class TraceLoad:
    """What a trace asks of a cluster, before any scheduling."""

    offered_gpu_hours: float
    capacity_gpu_hours: float
    peak_gpus: float  # most GPUs asked at once, every row running from its arrival
    physical_gpus: int
    work_ceiling_gpu_hours: float | None = None  # None: not computed (no busy given)
    busy_ceiling_gpu_hours: float | None = None

    @property
    def busy_ceiling(self) -> float | None:
        """The busy ceiling as a share of the GPUs' time."""
        if self.busy_ceiling_gpu_hours is None or not self.capacity_gpu_hours:
            return None
        return self.busy_ceiling_gpu_hours / self.capacity_gpu_hours

    def ceiling_shares(self, report: StrategyReport) -> tuple[float | None, float | None]:
        """The strategy's delivered work over the work ceiling, its useful busy GPU-hours
        over the busy ceiling's."""
        work = self.work_ceiling_gpu_hours
        busy = self.busy_ceiling_gpu_hours
        useful = report.gpu_busy_useful * report.physical_gpus * report.horizon / 3600
        return (
            report.delivered_gpu_hours / work if work else None,
            useful / busy if busy else None,
        )

    @property
    def offered_load(self) -> float:
        return self.offered_gpu_hours / self.capacity_gpu_hours if self.capacity_gpu_hours else 0.0

    @property
    def peak_demand(self) -> float:
        return self.peak_gpus / self.physical_gpus if self.physical_gpus else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "offeredGpuHours": self.offered_gpu_hours,
            "capacityGpuHours": self.capacity_gpu_hours,
            "offeredLoad": self.offered_load,
            "peakDemand": self.peak_demand,
            "peakGpusAsked": self.peak_gpus,
            "workCeilingGpuHours": self.work_ceiling_gpu_hours,
            "busyCeilingGpuHours": self.busy_ceiling_gpu_hours,
            "busyCeiling": self.busy_ceiling,
        }


#: The most moments :func:`fluid_ceiling` cuts at (evenly spread over the arrivals): any
#: subset of cuts still bounds from above; more only tighten the bound.
CEILING_CUTS = 128


def fluid_ceiling(
    items: Iterable[tuple[float, float, float]], *, gpus: float, horizon: float
) -> float:
    """The most of the items' work any scheduler could deliver by ``horizon`` on ``gpus``
    GPUs, each item (arrival, work, busy): GPU-seconds of work it offers and GPU-seconds of
    busy SM time that work needs (the caller caps both at what the item can do from its
    arrival to the horizon at full speed).

    The fluid bound: GPUs are busy at most ``gpus`` GPU-seconds per second, and an item's work
    can be done only after it arrives. For every moment ``s``, whatever is delivered is at
    most the work of the items that arrived before ``s``, in full, plus the most work of the
    later ones whose busy time fits in ``gpus * (horizon - s)`` (the most work per busy
    second first, a share of the last one). The ceiling is the least of these over ``s`` at
    the arrivals (at most :data:`CEILING_CUTS` of them) and ``s`` = the horizon (all that is
    offered). With busy as the work, it is the busy ceiling."""
    rows = sorted((max(at, 0.0), work, busy) for at, work, busy in items if at < horizon)
    if not rows:
        return 0.0
    before = [0.0]
    for _, work, _ in rows:
        before.append(before[-1] + work)
    starts = [i for i in range(len(rows)) if i == 0 or rows[i][0] > rows[i - 1][0]]
    step = max(1, math.ceil(len(starts) / CEILING_CUTS))
    lightest = sorted(
        range(len(rows)),
        key=lambda i: -rows[i][1] / rows[i][2] if rows[i][2] > 0 else -math.inf,
    )
    best = before[-1]
    for first in starts[::step]:
        budget = gpus * (horizon - rows[first][0])
        got = 0.0
        for i in lightest:
            if i < first:
                continue
            _, work, busy = rows[i]
            if busy <= budget:
                got, budget = got + work, budget - busy
            else:
                got += work * budget / busy
                break
        best = min(best, before[first] + got)
    return best


def trace_load(
    spans: Iterable[Sequence[float]], *, physical_gpus: int, horizon: float
) -> TraceLoad:
    """From (arrival, duration, GPUs[, busy]) of each row: the work offered within the horizon,
    the peak demand if every row ran from its arrival, and, where each row gives its busy, the
    work and busy ceilings (:func:`fluid_ceiling`).

    A row does at most the time it has left by the horizon at full speed, ``min(duration,
    horizon - at)``: its GPUs times that of work, and ``busy`` times its devices times that
    of busy time (a pod asking a share of a GPU keeps one device ``busy`` busy)."""
    events: list[tuple[float, float]] = []
    offered = 0.0
    items: list[tuple[float, float, float]] | None = []
    for span in spans:
        at, duration, gpus = span[0], span[1], span[2]
        if at >= horizon:
            continue
        offered += gpus * duration
        events += [(at, gpus), (at + duration, -gpus)]
        within = min(duration, horizon - at)
        if items is not None and len(span) > 3:
            items.append((at, gpus * within, span[3] * max(1.0, gpus) * within))
        else:
            items = None
    level = peak = 0.0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):
        level += change
        peak = max(peak, level)
    capacity = physical_gpus * horizon / 3600
    if items is None:
        return TraceLoad(offered / 3600, capacity, peak, physical_gpus)
    busy = [(at, b, b) for at, _, b in items]
    return TraceLoad(
        offered / 3600,
        capacity,
        peak,
        physical_gpus,
        work_ceiling_gpu_hours=fluid_ceiling(items, gpus=physical_gpus, horizon=horizon) / 3600,
        busy_ceiling_gpu_hours=fluid_ceiling(busy, gpus=physical_gpus, horizon=horizon) / 3600,
    )


#: Kueue's preemption reasons that take back GPUs a tenant borrowed: reclaiming a lender's
#: quota, and fair sharing among borrowers (InClusterQueue is priority within one tenant).
RECLAIM_REASONS = frozenset(
    {"InCohortReclamation", "InCohortReclaimWhileBorrowing", "InCohortFairSharing"}
)


@dataclass(frozen=True)
class StrategyReport:
    strategy: str
    physical_gpus: int
    horizon: float
    bucket: float
    allocation: tuple[float, ...]  # share of GPUs allocated, per bucket
    average_allocation: float
    busy: tuple[float, ...]  # share of GPUs busy, per bucket
    gpu_busy_average: float
    pending: tuple[float, ...]  # GPUs asked by pods waiting to be placed, per bucket
    memory_used_share: float | None
    waits: Mapping[str, Mapping[str, float | int | None]]
    wait_resolution: float | None
    kind_waits: Mapping[str, Mapping[str, float | int | None]]
    offered_gpu_hours: float
    delivered_gpu_hours: float
    lost_gpu_hours: float
    jobs_completed: int
    jobs: int
    degraded_service_share: float | None
    tenants: Mapping[str, Mapping[str, float]]
    kinds: Mapping[str, Mapping[str, float]]
    preemptions: int
    never_placed: int
    refused: int
    pods: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    refusals: tuple[str, ...] = field(default_factory=tuple)
    queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # tenant -> figures
    # Of the GPU busy average: the share spent on work preemption threw away (done again).
    gpu_busy_redone: float = 0.0
    idle: IdleTails | None = None  # None: no pod had an idle tail
    # --mps-nodes follow: what the pools did (reporting.pools.PoolMoves as JSON); None: fixed.
    pool_moves: Mapping[str, Any] | None = None
    preempted: tuple[Preemption, ...] = ()  # each preempted pod, in the order it went

    @property
    def gpu_busy_useful(self) -> float:
        return max(0.0, self.gpu_busy_average - self.gpu_busy_redone)

    def as_json(self, load: TraceLoad | None = None) -> dict[str, Any]:
        work, busy = load.ceiling_shares(self) if load is not None else (None, None)
        return {
            "strategy": self.strategy,
            "physicalGpus": self.physical_gpus,
            "horizonSeconds": self.horizon,
            "bucketSeconds": self.bucket,
            "offeredGpuHours": self.offered_gpu_hours,
            "deliveredGpuHours": self.delivered_gpu_hours,
            "jobsCompleted": self.jobs_completed,
            "jobs": self.jobs,
            "gpuBusyAverage": self.gpu_busy_average,
            "gpuBusyUsefulAverage": self.gpu_busy_useful,
            "gpuBusyRedoneAverage": self.gpu_busy_redone,
            "workCeilingShare": work,
            "busyCeilingShare": busy,
            "averageAllocation": self.average_allocation,
            "busy": list(self.busy),
            "allocation": list(self.allocation),
            "pendingGpus": list(self.pending),
            "memoryUsedShare": self.memory_used_share,
            "waitSeconds": {ns: dict(values) for ns, values in self.waits.items()},
            "waitResolutionSeconds": self.wait_resolution,
            "waitSecondsByKind": {kind: dict(values) for kind, values in self.kind_waits.items()},
            "preemptions": self.preemptions,
            "lostGpuHours": self.lost_gpu_hours,
            "degradedServiceShare": self.degraded_service_share,
            "neverPlaced": self.never_placed,
            "refused": self.refused,
            "refusals": list(self.refusals),
            "tenants": {ns: dict(values) for ns, values in self.tenants.items()},
            "kinds": {kind: dict(values) for kind, values in self.kinds.items()},
            "tenantQueues": {tenant: dict(values) for tenant, values in self.queues.items()},
            **(self.idle.as_json() if self.idle is not None else {}),
            **({"poolMoves": dict(self.pool_moves)} if self.pool_moves is not None else {}),
            "preemptedPods": [p.as_json() for p in self.preempted],
            "pods": self.pods,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Preemption:
    """One preempted pod: what it held, for how long, and the work thrown away with it
    (simulated seconds from the start; GPU-hours at full speed)."""

    pod: str
    namespace: str
    kind: str
    row: int
    attempt: int
    gpus: float  # physical GPUs it held (a slice: 1/replicas)
    bound: float | None  # None: deleted before it was ever bound
    preempted: float
    lost_gpu_hours: float
    redone_gpu_hours: float
    evicted_by: str  # Kueue's reason where Kueue preempted it, else "scheduler"

    @classmethod
    def of(cls, record: PodRecord) -> Preemption:
        return cls(
            pod=record.name,
            namespace=record.namespace,
            kind=record.kind,
            row=record.row,
            attempt=record.attempt,
            gpus=record.gpus,
            bound=record.bound,
            preempted=record.ended if record.ended is not None else record.created,
            lost_gpu_hours=_hours(record.lost),
            redone_gpu_hours=_hours(record.redone),
            evicted_by=record.evicted_by or "scheduler",
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "namespace": self.namespace,
            "kind": self.kind,
            "row": self.row,
            "attempt": self.attempt,
            "gpus": self.gpus,
            "boundSeconds": self.bound,
            "preemptedSeconds": self.preempted,
            "lostGpuHours": self.lost_gpu_hours,
            "redoneGpuHours": self.redone_gpu_hours,
            "evictedBy": self.evicted_by,
        }


@dataclass(frozen=True)
class IdleTails:
    """Notebooks' idle tails in one replay (GPU-hours are physical GPUs held: a slice holds
    1/replicas)."""

    held_gpu_hours: float  # held by pods sitting idle, until they ended or the horizon
    returned_gpu_hours: float  # of the idle tails, given back by an idle rule's stop
    stopped: int  # notebooks an idle rule stopped

    def as_json(self) -> dict[str, Any]:
        return {
            "idleGpuHoursHeld": self.held_gpu_hours,
            "idleGpuHoursReturned": self.returned_gpu_hours,
            "idleStopped": self.stopped,
        }


def idle_tails(records: Iterable[PodRecord], horizon: float) -> IdleTails | None:
    """GPU-hours held idle and given back, by the horizon (None: no pod had an idle tail)."""
    held_seconds = returned = 0.0
    stopped = 0
    tails = False
    for record in records:
        if record.idle_from is None or record.bound is None:
            continue
        tails = True
        end = min(record.ended if record.ended is not None else horizon, horizon)
        held_seconds += record.gpus * max(0.0, end - record.idle_from)
        if record.idle_stopped is not None and record.idle_until is not None:
            stopped += 1
            returned += record.gpus * max(0.0, min(record.idle_until, horizon) - end)
    if not tails:
        return None
    return IdleTails(_hours(held_seconds), _hours(returned), stopped)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def _wait(record: PodRecord, horizon: float) -> float:
    """Creation to binding; a pod never placed waited until it went away or the horizon."""
    if record.bound is not None:
        return record.bound - record.created
    return min(record.ended if record.ended is not None else horizon, horizon) - record.created


def step_average(
    steps: Sequence[tuple[float, float]], horizon: float, bucket: float
) -> tuple[float, ...]:
    """Time average per bucket of the step function (from each time on, this value)."""
    buckets = max(1, math.ceil(horizon / bucket))
    sums = [0.0] * buckets
    for index, (at, value) in enumerate(steps):
        start = min(max(at, 0.0), horizon)
        end = min(steps[index + 1][0] if index + 1 < len(steps) else horizon, horizon)
        while start < end:
            slot = min(int(start // bucket), buckets - 1)
            stop = min(end, (slot + 1) * bucket)
            sums[slot] += value * (stop - start)
            start = stop
    return tuple(total / min(bucket, horizon - i * bucket) for i, total in enumerate(sums))


def _hours(seconds: float) -> float:
    return seconds / 3600


def held(
    records: Iterable[PodRecord], horizon: float, size: Callable[[PodRecord], float]
) -> list[tuple[float, float]]:
    """The step function of what the pods held while bound (to the horizon), each ``size``."""
    events: list[tuple[float, float]] = []
    for record in records:
        amount = size(record)
        if record.bound is None or record.bound >= horizon or not amount:
            continue
        end = min(record.ended if record.ended is not None else horizon, horizon)
        events += [(record.bound, amount), (end, -amount)]
    steps = [(0.0, 0.0)]
    level = 0.0
    for at, change in sorted(events):
        level += change
        steps.append((at, level))
    return steps


def _gpus(record: PodRecord) -> float:
    return record.gpus


def _whole(record: PodRecord) -> float:
    return float(record.whole)


def _slices(record: PodRecord) -> float:
    return float(record.slices)


def borrowed(
    records: Sequence[PodRecord], quota: int, horizon: float, shared: int | None = None
) -> list[tuple[float, float]]:
    """The step function of physical GPUs a tenant held above its quota as Kueue counts it
    (``gpuwarden render --kueue``'s nominal quotas): whole GPUs against ``quota - shared``, MPS
    slices against ``shared`` GPUs' worth of slices (its quota.sharedGpus; None: each pool
    against the whole ``quota``), a slice counting as its share of a GPU."""
    whole_quota = quota - shared if shared is not None else quota
    shared_quota = shared if shared is not None else quota
    sizes = [(r.gpus - r.whole) / r.slices for r in records if r.slices]
    slice_gpu = sizes[0] if sizes else 0.0
    whole, slices = held(records, horizon, _whole), held(records, horizon, _slices)
    times = sorted({at for at, _ in whole} | {at for at, _ in slices})
    out: list[tuple[float, float]] = []
    w = s = 0
    for at in times:
        while w + 1 < len(whole) and whole[w + 1][0] <= at:
            w += 1
        while s + 1 < len(slices) and slices[s + 1][0] <= at:
            s += 1
        over = max(0.0, whole[w][1] - whole_quota) + max(
            0.0, slices[s][1] * slice_gpu - shared_quota
        )
        out.append((at, over))
    return out


def tenant_queues(
    records: Iterable[PodRecord],
    quotas: Mapping[str, int],
    *,
    physical_gpus: int,
    horizon: float,
    bucket: float,
    shared: Mapping[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per queued tenant (namespace): its nominal quota (and of it the MPS nodes' GPUs, where
    ``shared`` gives its quota.sharedGpus) and entitled share of the GPUs, the
    share it held per bucket and on average, the GPU-hours it held, held above its quota
    (borrowed, as Kueue counts it) and lost when Kueue took borrowed GPUs back (reclaim), and
    Kueue's preemptions of its pods by reason."""
    pods = list(records)
    capacity = max(physical_gpus, 1)
    whole = max(horizon, 1e-9)
    out: dict[str, dict[str, Any]] = {}
    for namespace, quota in sorted(quotas.items()):
        mine = [r for r in pods if r.namespace == namespace]
        gpus = held(mine, horizon, _gpus)
        mps = shared.get(namespace, 0) if shared is not None else None
        above = borrowed(mine, quota, horizon, mps)
        reclaimed = [r for r in mine if r.evicted_by in RECLAIM_REASONS]
        reasons: dict[str, int] = {}
        for record in mine:
            if record.evicted_by is not None:
                reasons[record.evicted_by] = reasons.get(record.evicted_by, 0) + 1
        out[namespace] = {
            "nominalGpus": quota,
            **({"nominalSharedGpus": mps} if mps is not None else {}),
            "entitledShare": quota / capacity,
            "receivedShare": [g / capacity for g in step_average(gpus, horizon, bucket)],
            "receivedShareAverage": step_average(gpus, horizon, whole)[0] / capacity,
            "receivedGpuHours": _hours(step_average(gpus, horizon, whole)[0] * horizon),
            "borrowedGpuHours": _hours(step_average(above, horizon, whole)[0] * horizon),
            "reclaimedPods": len(reclaimed),
            "lostToReclaimGpuHours": _hours(sum(r.lost for r in reclaimed)),
            "kueuePreemptions": dict(sorted(reasons.items())),
        }
    return out


def _by(outcomes: Sequence[RowOutcome], key: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for o in outcomes:
        entry = out.setdefault(getattr(o, key), {"offeredGpuHours": 0.0, "deliveredGpuHours": 0.0})
        entry["offeredGpuHours"] += _hours(o.offered)
        entry["deliveredGpuHours"] += _hours(o.delivered)
    return dict(sorted(out.items()))


def summarize(
    strategy: str,
    records: Iterable[PodRecord],
    outcomes: Iterable[RowOutcome],
    *,
    physical_gpus: int,
    horizon: float,
    allocated: Sequence[tuple[float, float]],
    busy: Sequence[tuple[float, float]],
    pending: Sequence[tuple[float, float]] = ((0.0, 0.0),),
    bucket: float = 3600.0,
    notes: Sequence[str] = (),
    quotas: Mapping[str, int] | None = None,
    shared_quotas: Mapping[str, int] | None = None,
) -> StrategyReport:
    """A strategy's figures from its pods, its rows' outcomes and the step functions of GPUs
    allocated, GPUs busy and GPUs pending (simulated seconds)."""
    pods = list(records)
    rows = list(outcomes)
    capacity = max(physical_gpus, 1)
    allocation = tuple(a / capacity for a in step_average(allocated, horizon, bucket))
    busy_share = tuple(b / capacity for b in step_average(busy, horizon, bucket))
    whole = max(horizon, 1e-9)
    average_allocation = step_average(allocated, horizon, whole)[0] / capacity
    gpu_busy_average = step_average(busy, horizon, whole)[0] / capacity
    allocated_bytes = used_bytes = 0.0
    for record in pods:
        if record.bound is None or record.bound >= horizon:
            continue
        span = min(record.ended if record.ended is not None else horizon, horizon) - record.bound
        allocated_bytes += record.memory_allocated * span
        used_bytes += min(record.memory_used, record.memory_allocated) * span
    waits = _waits_by(pods, "namespace", horizon)
    first = [r.bound - r.created for r in pods if r.bound is not None and r.first_try]
    services = [o for o in rows if not o.batch]
    served = sum(o.service_seconds for o in services)
    refusals = sorted({r.refused for r in pods if r.refused})
    batch = [o for o in rows if o.batch]
    return StrategyReport(
        strategy=strategy,
        physical_gpus=physical_gpus,
        horizon=horizon,
        bucket=bucket,
        allocation=allocation,
        average_allocation=average_allocation,
        busy=busy_share,
        gpu_busy_average=gpu_busy_average,
        pending=step_average(pending, horizon, bucket),
        memory_used_share=used_bytes / allocated_bytes if allocated_bytes else None,
        waits=waits,
        wait_resolution=percentile(first, 0.95),
        kind_waits=_waits_by(pods, "kind", horizon),
        offered_gpu_hours=_hours(sum(o.offered for o in rows)),
        delivered_gpu_hours=_hours(sum(o.delivered for o in rows)),
        lost_gpu_hours=_hours(sum(o.lost for o in rows)),
        jobs_completed=sum(1 for o in batch if o.completed),
        jobs=len(batch),
        degraded_service_share=(
            sum(o.degraded_seconds for o in services) / served if served else None
        ),
        tenants=_by(rows, "namespace"),
        kinds=_by(rows, "kind"),
        preemptions=sum(1 for r in pods if r.preempted),
        never_placed=sum(1 for r in pods if r.bound is None and r.refused is None),
        refused=sum(1 for r in pods if r.refused is not None),
        pods=len(pods),
        notes=tuple(notes),
        refusals=tuple(refusals),
        gpu_busy_redone=sum(r.redone for r in pods) / (capacity * whole),
        idle=idle_tails(pods, horizon),
        preempted=tuple(
            sorted(
                (Preemption.of(r) for r in pods if r.preempted),
                key=lambda p: (p.preempted, p.pod),
            )
        ),
        queues=(
            {}
            if quotas is None
            else tenant_queues(
                pods,
                quotas,
                physical_gpus=physical_gpus,
                horizon=horizon,
                bucket=bucket,
                shared=shared_quotas,
            )
        ),
    )


def _waits_by(
    pods: Sequence[PodRecord], key: str, horizon: float
) -> dict[str, dict[str, float | int | None]]:
    """Wait percentiles of the pods gpuwarden let through, by tenant namespace or kind."""
    out: dict[str, dict[str, float | int | None]] = {}
    for value in sorted({getattr(r, key) for r in pods}):
        mine = [r for r in pods if getattr(r, key) == value and r.refused is None]
        waited = [_wait(r, horizon) for r in mine]
        out[value] = {
            "placed": sum(1 for r in mine if r.bound is not None),
            "p50": percentile(waited, 0.5),
            "p95": percentile(waited, 0.95),
            "p99": percentile(waited, 0.99),
            "preempted": sum(1 for r in mine if r.preempted),
        }
    return out


def format_duration(seconds: float | int | None) -> str:
    """Minutes under an hour, hours above (simulated time)."""
    if seconds is None:
        return "-"
    if seconds < 3600:
        return f"{float(seconds) / 60:.0f}m"
    return f"{float(seconds) / 3600:.1f}h"


_NOTE_LIMIT = 200
#: Kinds whose users wait at a screen: their waits get a line of their own.
INTERACTIVE_KINDS = ("notebook", "kserve-predictor")


def load_line(load: TraceLoad) -> str:
    line = (
        f"trace: {load.offered_gpu_hours:,.0f} GPU-hours offered = {load.offered_load:.0%} of "
        f"{load.physical_gpus} GPUs' {load.capacity_gpu_hours:,.0f}; peak demand "
        f"{load.peak_demand:.2f}x the GPUs ({load.peak_gpus:g} asked at once)"
    )
    work, busy = load.work_ceiling_gpu_hours, load.busy_ceiling
    if work is None or busy is None:
        return line
    return (
        f"{line}\nceilings: work {work:,.0f} GPU-hours (the most any scheduler could deliver by "
        f"the horizon); busy {busy:.0%} of the GPUs' time (the trace's busy-weighted work "
        f"that fits)"
    )


def format_share(value: float | None) -> str:
    """A share as a whole percentage, ``-`` where there is none."""
    return "-" if value is None else f"{value:.0%}"


def _percentiles(waits: Mapping[str, float | int | None]) -> str:
    return " / ".join(format_duration(waits.get(p)) for p in ("p50", "p95", "p99"))


def _wait_cell(report: StrategyReport, namespace: str) -> str:
    return _percentiles(report.waits.get(namespace, {}))


def _kind_wait_cell(report: StrategyReport, kind: str) -> str:
    return _percentiles(report.kind_waits.get(kind, {}))


def _delivered_cell(report: StrategyReport, namespace: str) -> str:
    t = report.tenants.get(namespace, {})
    offered, delivered = t.get("offeredGpuHours", 0.0), t.get("deliveredGpuHours", 0.0)
    share = f" ({delivered / offered:.0%})" if offered else ""
    return f"{delivered:,.0f}{share}"


def _queue_cell(report: StrategyReport, namespace: str) -> str:
    queue = report.queues.get(namespace)
    if queue is None:
        return "-"
    return (
        f"{queue['entitledShare']:.0%}/{queue['receivedShareAverage']:.0%} "
        f"{queue['borrowedGpuHours']:,.0f}/{queue['lostToReclaimGpuHours']:,.0f}"
    )


def _name_width(reports: Sequence[StrategyReport]) -> int:
    """The strategy column: 18 wide, or as wide as the longest name (default-policy-no-idle)."""
    return max([18, *(len(r.strategy) for r in reports)])


def _grid(
    reports: Sequence[StrategyReport],
    columns: Sequence[str],
    cell: Callable[[StrategyReport, str], str],
) -> list[str]:
    """A header of columns (tenant namespaces or kinds), then a line per strategy of ``cell``
    for each."""
    width = _name_width(reports)
    lines = [f"{'strategy':<{width}} " + " ".join(f"{c:>20}" for c in columns)]
    for r in reports:
        lines.append(f"{r.strategy:<{width}} " + " ".join(f"{cell(r, c):>20}" for c in columns))
    return lines


def _idle_lines(reports: Sequence[StrategyReport]) -> list[str]:
    """The idle tails' section (none when no strategy's pods had one)."""
    if all(r.idle is None for r in reports):
        return []
    width = _name_width(reports)
    lines = [
        "",
        "notebooks' idle tails (open after their work): GPU-hours held idle, given back by an",
        "idle rule, notebooks stopped:",
        f"{'strategy':<{width}} {'idle GPU-h held':>15} {'given back':>10} {'stopped':>7}",
    ]
    for r in reports:
        idle = r.idle or IdleTails(0.0, 0.0, 0)
        lines.append(
            f"{r.strategy:<{width}} {idle.held_gpu_hours:>15,.1f} {idle.returned_gpu_hours:>10,.1f} "
            f"{idle.stopped:>7}"
        )
    return lines


def table(reports: Sequence[StrategyReport], load: TraceLoad | None = None) -> str:
    """The terminal table: the trace's load, a line per strategy, then tenants' waits and
    delivered work."""
    lines = [load_line(load), ""] if load is not None else []
    width = _name_width(reports)
    lines.append(
        f"{'strategy':<{width}} {'delivered GPU-h':>15} {'jobs done':>10} {'GPU busy':>8} "
        f"{'busy (useful)':>13} {'redone':>6} {'of work ceiling':>15} {'of busy ceiling':>15} "
        f"{'alloc':>5} {'peak':>5} {'mem used':>8} {'preempted':>9} {'lost GPU-h':>10} "
        f"{'degraded':>8} {'never placed':>12} {'refused':>7}"
    )
    for r in reports:
        peak = max(r.allocation, default=0.0)
        delivered = r.delivered_gpu_hours / r.offered_gpu_hours if r.offered_gpu_hours else 0.0
        work, busy = load.ceiling_shares(r) if load is not None else (None, None)
        lines.append(
            f"{r.strategy:<{width}} {f'{r.delivered_gpu_hours:,.0f} ({delivered:.0%})':>15} "
            f"{f'{r.jobs_completed}/{r.jobs}':>10} {r.gpu_busy_average:>8.0%} "
            f"{r.gpu_busy_useful:>13.0%} {r.gpu_busy_redone:>6.1%} {format_share(work):>15} "
            f"{format_share(busy):>15} "
            f"{r.average_allocation:>5.0%} {peak:>5.0%} {format_share(r.memory_used_share):>8} "
            f"{r.preemptions:>9} {r.lost_gpu_hours:>10,.0f} "
            f"{format_share(r.degraded_service_share):>8} {r.never_placed:>12} {r.refused:>7}"
        )
    namespaces = sorted({ns for r in reports for ns in (*r.waits, *r.tenants)})
    lines.append("")
    lines.append("wait from creation to binding, p50 / p95 / p99 (simulated time; never placed:")
    lines.append("until it went away or the horizon):")
    lines += _grid(reports, namespaces, _wait_cell)
    interactive = [k for k in INTERACTIVE_KINDS if any(k in r.kind_waits for r in reports)]
    if interactive:
        lines.append("")
        lines.append("interactive waits by kind, p50 / p95 / p99:")
        lines += _grid(reports, interactive, _kind_wait_cell)
    lines.append("")
    lines.append("GPU work delivered per tenant, GPU-hours (share of what it asked):")
    lines += _grid(reports, namespaces, _delivered_cell)
    lines += _idle_lines(reports)
    queued = [r for r in reports if r.queues]
    if queued:
        lines.append("")
        lines.append("tenant queues (Kueue): entitled/received share of the GPUs, GPU-hours")
        lines.append("borrowed (held above its quota)/lost to reclaim:")
        lines += _grid(queued, namespaces, _queue_cell)
    lines.append("")
    for r in reports:
        lines.append(
            f"note: {r.strategy}: waits are resolved to about "
            f"{format_duration(r.wait_resolution)} in this run (p95 of pods bound at their first try)"
        )
    for r in reports:
        for note in (*r.notes, *(f"refused: {text}" for text in r.refusals[:3])):
            short = note if len(note) <= _NOTE_LIMIT else note[: _NOTE_LIMIT - 3] + "..."
            lines.append(f"note: {r.strategy}: {short}")
    return "\n".join(lines)
