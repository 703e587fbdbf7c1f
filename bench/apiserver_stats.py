"""Statistics of bench/apiserver.py's runs: percentiles, pooled runs, the latency a webhook adds,
the offline CLIs' rates (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ``values`` by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class RunStats:
    """One (peer, clients) run: completed creations within the measured window."""

    peer: str
    clients: int
    seconds: float
    latencies_ms: tuple[float, ...]
    errors: int
    #: CPU milliseconds each group of processes spent in the measured window.
    cpu_ms: Mapping[str, float] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.latencies_ms)

    def cpu_per_pod(self, group: str) -> float:
        if group not in self.cpu_ms or not self.count:
            return math.nan
        return self.cpu_ms[group] / self.count

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 50) if self.latencies_ms else math.nan

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 99) if self.latencies_ms else math.nan


@dataclass(frozen=True)
class Added:
    """The latency a webhook adds to the no-webhook run at the same concurrency."""

    peer: str
    clients: int
    p50_ms: float
    p99_ms: float
    throughput_ratio: float


def added_latency(run: RunStats, baseline: RunStats) -> Added:
    if run.clients != baseline.clients:
        raise ValueError(f"{run.clients} clients against a baseline of {baseline.clients}")
    ratio = run.rate / baseline.rate if baseline.rate > 0 else math.nan
    return Added(run.peer, run.clients, run.p50 - baseline.p50, run.p99 - baseline.p99, ratio)


def ratio(numerator: float, denominator: float) -> float:
    """numerator/denominator, NaN where that means nothing (a webhook that adds nothing)."""
    if denominator <= 0 or math.isnan(denominator) or math.isnan(numerator):
        return math.nan
    return numerator / denominator


def verdict(value: float, target: float, *, at_most: bool) -> str:
    if math.isnan(value):
        return "not measured"
    met = value <= target if at_most else value >= target
    return "met" if met else "not met"


def control_name(peer: str) -> str:
    """The name of the no-webhook control runs interleaved with ``peer``'s runs."""
    return f"ctl-{peer}"


def pooled(runs: Sequence[RunStats], peer: str | None = None) -> RunStats:
    """Several runs of one peer and concurrency as one: all their latencies, their total time."""
    if not runs:
        raise ValueError("no runs to pool")
    if len({r.clients for r in runs}) != 1:
        raise ValueError("pooling runs of different concurrency")
    return RunStats(
        peer or runs[0].peer,
        runs[0].clients,
        sum(r.seconds for r in runs),
        tuple(ms for r in runs for ms in r.latencies_ms),
        sum(r.errors for r in runs),
        {g: sum(r.cpu_ms.get(g, 0.0) for r in runs) for g in {g for r in runs for g in r.cpu_ms}},
    )


@dataclass(frozen=True)
class CliTiming:
    """An offline CLI on ``pods`` pods and on one pod (its start-up), wall-clock seconds."""

    name: str
    pods: int
    seconds: float
    startup_seconds: float

    @property
    def rate(self) -> float:
        """Pods per second of the whole run, start-up included."""
        return self.pods / self.seconds if self.seconds > 0 else math.nan

    @property
    def marginal_rate(self) -> float:
        """Decisions per second once started: the extra pods over the extra time."""
        extra = self.seconds - self.startup_seconds
        return (self.pods - 1) / extra if extra > 0 else math.nan
