"""What a replay measured, from the pods' recorded lifetimes (pure functions, simulated seconds).

* **allocation**: GPUs held by bound pods over time, as a share of the cluster's physical GPUs
  (an MPS slice holds 1/replicas of a GPU);
* **memory used**: GPU memory the trace says pods used, over the GPU memory their allocation
  set aside (a whole GPU's memory per whole GPU, a 1/replicas share per slice), time-weighted;
* **wait**: from creation to binding, per tenant namespace, for pods that were placed;
* **preempted**: pods deleted by the scheduler to make room; **never placed**: still unbound
  when the replay ended; **refused**: denied by gpuwarden's admission.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PodRecord:
    """One replayed pod; times are simulated seconds from the start (None: did not happen)."""

    name: str
    namespace: str
    row: int
    created: float
    gpus: float = 0.0  # physical GPUs held while bound
    memory_allocated: float = 0.0  # bytes set aside while bound
    memory_used: float = 0.0  # bytes the trace says it uses while running
    bound: float | None = None
    ended: float | None = None
    preempted: bool = False
    refused: str | None = None


@dataclass(frozen=True)
class StrategyReport:
    strategy: str
    physical_gpus: int
    horizon: float
    bucket: float
    allocation: tuple[float, ...]  # share of GPUs allocated, per bucket
    average_allocation: float
    memory_used_share: float | None
    waits: Mapping[str, Mapping[str, float | int | None]]
    preemptions: int
    never_placed: int
    refused: int
    pods: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    refusals: tuple[str, ...] = field(default_factory=tuple)

    def as_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "physicalGpus": self.physical_gpus,
            "horizonSeconds": self.horizon,
            "bucketSeconds": self.bucket,
            "allocation": list(self.allocation),
            "averageAllocation": self.average_allocation,
            "memoryUsedShare": self.memory_used_share,
            "waitSeconds": {ns: dict(values) for ns, values in self.waits.items()},
            "preemptions": self.preemptions,
            "neverPlaced": self.never_placed,
            "refused": self.refused,
            "refusals": list(self.refusals),
            "pods": self.pods,
            "notes": list(self.notes),
        }


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def _held(record: PodRecord, horizon: float) -> tuple[float, float] | None:
    if record.bound is None or record.bound >= horizon:
        return None
    end = min(record.ended if record.ended is not None else horizon, horizon)
    return (record.bound, end) if end > record.bound else None


def summarize(
    strategy: str,
    records: Iterable[PodRecord],
    *,
    physical_gpus: int,
    horizon: float,
    bucket: float = 3600.0,
    notes: Sequence[str] = (),
) -> StrategyReport:
    pods = list(records)
    buckets = max(1, math.ceil(horizon / bucket))
    held_gpu_seconds = [0.0] * buckets
    gpu_seconds = allocated_bytes = used_bytes = 0.0
    for record in pods:
        span = _held(record, horizon)
        if span is None:
            continue
        start, end = span
        gpu_seconds += record.gpus * (end - start)
        allocated_bytes += record.memory_allocated * (end - start)
        used_bytes += min(record.memory_used, record.memory_allocated) * (end - start)
        first, last = int(start // bucket), min(int(end // bucket), buckets - 1)
        for index in range(first, last + 1):
            overlap = min(end, (index + 1) * bucket) - max(start, index * bucket)
            if overlap > 0:
                held_gpu_seconds[index] += record.gpus * overlap
    capacity = max(physical_gpus, 1)
    allocation = tuple(
        held / (capacity * min(bucket, horizon - i * bucket))
        for i, held in enumerate(held_gpu_seconds)
    )
    waits: dict[str, dict[str, float | int | None]] = {}
    for namespace in sorted({r.namespace for r in pods}):
        placed = [
            r.bound - r.created for r in pods if r.namespace == namespace and r.bound is not None
        ]
        waits[namespace] = {
            "placed": len(placed),
            "p50": percentile(placed, 0.5),
            "p95": percentile(placed, 0.95),
            "preempted": sum(1 for r in pods if r.namespace == namespace and r.preempted),
        }
    refusals = sorted({r.refused for r in pods if r.refused})
    return StrategyReport(
        strategy=strategy,
        physical_gpus=physical_gpus,
        horizon=horizon,
        bucket=bucket,
        allocation=allocation,
        average_allocation=gpu_seconds / (capacity * horizon) if horizon > 0 else 0.0,
        memory_used_share=used_bytes / allocated_bytes if allocated_bytes else None,
        waits=waits,
        preemptions=sum(1 for r in pods if r.preempted),
        never_placed=sum(1 for r in pods if r.bound is None and r.refused is None),
        refused=sum(1 for r in pods if r.refused is not None),
        pods=len(pods),
        notes=tuple(notes),
        refusals=tuple(refusals),
    )


def _duration(seconds: float | int | None) -> str:
    """Minutes under an hour, hours above (simulated time)."""
    if seconds is None:
        return "-"
    if seconds < 3600:
        return f"{float(seconds) / 60:.0f}m"
    return f"{float(seconds) / 3600:.1f}h"


_NOTE_LIMIT = 200


def table(reports: Sequence[StrategyReport]) -> str:
    """The terminal table: one line per strategy, then waits per tenant."""
    lines = [
        f"{'strategy':<18} {'GPU alloc avg':>13} {'peak':>5} {'mem used':>9} "
        f"{'preempted':>9} {'never placed':>12} {'refused':>7} {'pods':>5}"
    ]
    for r in reports:
        memory = "-" if r.memory_used_share is None else f"{r.memory_used_share:.0%}"
        peak = max(r.allocation, default=0.0)
        lines.append(
            f"{r.strategy:<18} {r.average_allocation:>13.0%} {peak:>5.0%} {memory:>9} "
            f"{r.preemptions:>9} {r.never_placed:>12} {r.refused:>7} {r.pods:>5}"
        )
    namespaces = sorted({ns for r in reports for ns in r.waits})
    lines.append("")
    lines.append("wait from creation to binding, p50 / p95 (simulated time):")
    lines.append(f"{'strategy':<18} " + " ".join(f"{ns:>15}" for ns in namespaces))
    for r in reports:
        cells = []
        for ns in namespaces:
            w = r.waits.get(ns, {})
            cells.append(f"{_duration(w.get('p50')) + ' / ' + _duration(w.get('p95')):>15}")
        lines.append(f"{r.strategy:<18} " + " ".join(cells))
    for r in reports:
        for note in (*r.notes, *(f"refused: {text}" for text in r.refusals[:3])):
            short = note if len(note) <= _NOTE_LIMIT else note[: _NOTE_LIMIT - 3] + "..."
            lines.append(f"note: {r.strategy}: {short}")
    return "\n".join(lines)
