"""What a replay records: each pod's lifetime and what became of each trace row (simulated
seconds from the start; the reports are computed from these)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PodRecord:
    """One replayed pod (one attempt of a row); times are simulated seconds from the start
    (None: did not happen)."""

    name: str
    namespace: str
    row: int
    created: float
    kind: str = ""  # the row's workload kind
    asked: float = 0.0  # GPUs the row asks for
    whole: int = 0  # whole GPUs the decided pod asks for
    slices: int = 0  # MPS slices it asks for
    sm_share: float | None = None  # MPS active thread percentage / 100 (None: no cap)
    gpus: float = 0.0  # physical GPUs held while bound
    memory_allocated: float = 0.0  # bytes set aside while bound
    memory_used: float = 0.0  # bytes the trace says it uses while running
    bound: float | None = None
    ended: float | None = None
    preempted: bool = False
    refused: str | None = None
    first_try: bool = True  # bound without the scheduler ever calling it unschedulable
    attempt: int = 1
    evicted_by: str | None = None  # Kueue's preemption reason, when Kueue preempted it
    lost: float = 0.0  # GPU-seconds of full-speed work lost when it was preempted
    redone: float = 0.0  # GPU-seconds of busy spent on that lost work (redone after restart)
    # A notebook's idle tail while this pod held its GPUs: from when (its row's tail start, or
    # its binding if later) until its user would have closed it; when an idle rule stopped it.
    idle_from: float | None = None
    idle_until: float | None = None
    idle_stopped: float | None = None


@dataclass
class RowOutcome:
    """What became of one trace row over all its pods (seconds are simulated)."""

    row: int
    namespace: str
    kind: str
    offered: float  # GPU-seconds of work (batch) or of service (services) the row asks
    asked: float = 0.0  # GPUs asked
    batch: bool = True
    progress: float = 0.0  # full-speed seconds done and kept (services: served)
    lost_seconds: float = 0.0  # full-speed seconds lost to preemptions
    completed: bool = False
    refused: bool = False
    preemptions: int = 0
    service_seconds: float = 0.0  # services: seconds on GPUs
    degraded_seconds: float = 0.0  # services: of those, on an oversubscribed GPU

    @property
    def delivered(self) -> float:
        """GPU-seconds of full-speed work (or service) delivered."""
        return self.asked * self.progress

    @property
    def lost(self) -> float:
        return self.asked * self.lost_seconds
