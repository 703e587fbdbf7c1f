"""What a replay has to do, and what it did, as the cluster reports it (pure: simulated seconds
in, actions and records out; :mod:`gpuwarden.lab.replay.replay` does the I/O).

The ledger plays the parts of Kubeflow's controllers and of the work itself, never of the
scheduler: it says when a row's pod is created (at the row's arrival, after the step before it
in its ``run``, or again after a preemption, as a Job, PyTorchJob, Katib or KServe controller
would recreate it), and when a pod's work is done (a batch pod once the
:class:`~gpuwarden.lab.replay.work.WorkModel` says it has done its work, a service at the end of its
lifetime, or a notebook the node agent stopped once its idle tail outlasted its profile's idle
rule). Where a pod runs is what the scheduler bound it to.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.lab.inputs.workloads import dns_label
from gpuwarden.lab.replay.records import PodRecord, RowOutcome
from gpuwarden.lab.replay.work import Stopped, WorkModel
from gpuwarden.policy.pod.record import IdleRecord

#: Simulated seconds before a controller recreates a preempted pod: the Job controller's first
#: backoff (10 s) for batch kinds; a ReplicaSet or StatefulSet replaces a server at once.
BATCH_BACKOFF = 10.0
SERVICE_BACKOFF = 1.0
#: Seconds between the node agent's passes (``gpuwarden node-agent --interval``, default 10): it
#: starts a pod's idle episode at its first pass that finds it idle, and acts at the first pass
#: ``after`` past that, so at most this long after the idle time a rule names.
DETECTION_INTERVAL = 10.0


@dataclass(frozen=True)
class Create:
    """Create this pod for ``row`` (its ``attempt``-th, from 1)."""

    name: str
    row: TraceRow
    attempt: int


@dataclass(frozen=True)
class Complete:
    """The pod's work is done: end it (the kubelet reports it Succeeded)."""

    name: str
    namespace: str


@dataclass(frozen=True)
class Withdraw:
    """A service's lifetime ended while its pod still waited: delete the pod."""

    name: str
    namespace: str


@dataclass(frozen=True)
class IdleStop:
    """The node agent stopped the idle notebook (``kubeflow-resource-stopped``) and its
    controller scaled it to zero: delete the pod."""

    name: str
    namespace: str


Action = Create | Complete | Withdraw | IdleStop


@dataclass
class _Row:
    row: TraceRow
    outcome: RowOutcome
    kept: float = 0.0  # full-speed seconds that survive a restart (checkpointed)
    pod: str | None = None  # the live attempt
    attempts: int = 0
    over: bool = False  # completed, withdrawn, refused or its lifetime ended


def _outcome(row: TraceRow, horizon: float) -> RowOutcome:
    # A service is offered for its lifetime within the horizon; batch work in full.
    # A notebook's idle tail is no service: its user's work was done.
    span = row.duration if row.batch else max(0.0, min(row.work_duration, horizon - row.at))
    return RowOutcome(
        row.row, row.namespace, row.kind, row.gpus * span, asked=row.gpus, batch=row.batch
    )


@dataclass
class Ledger:
    rows: Sequence[TraceRow]
    model: WorkModel
    horizon: float
    records: dict[str, PodRecord] = field(default_factory=dict)
    backlog: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0)])
    # Notebook rows whose pod carries an idle rule with action stop (gpuwarden.io/idle), by row.
    idle_rules: Mapping[int, IdleRecord] = field(default_factory=dict)
    detection: float = DETECTION_INTERVAL

    def __post_init__(self) -> None:
        self._rows = {
            r.row: _Row(r, _outcome(r, self.horizon)) for r in self.rows if r.at < self.horizon
        }
        self._pods: dict[str, int] = {}  # pod name -> row
        self._unborn: set[str] = set()  # services that ended before they were created
        self._timers: list[tuple[float, int, str, int]] = []
        self._seq = itertools.count()
        self._next_step: dict[int, TraceRow] = {}
        self._pending = 0.0
        self._idle_stops: dict[str, float] = {}  # pod name -> when the idle rule stops it
        runs: dict[str, list[TraceRow]] = {}
        for r in sorted((s.row for s in self._rows.values()), key=lambda r: r.row):
            if r.run is None:
                self._at(r.at, "arrive", r.row)
            else:
                runs.setdefault(r.run, []).append(r)
        for steps in runs.values():
            self._at(steps[0].at, "arrive", steps[0].row)
            for before, after in itertools.pairwise(steps):
                self._next_step[before.row] = after

    def _at(self, when: float, what: str, row: int) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), what, row))

    # -- the clock --------------------------------------------------------------------------

    def next_time(self) -> float:
        """When something is next due (the horizon if nothing is)."""
        times = [self.horizon]
        if self._timers:
            times.append(self._timers[0][0])
        done = self.model.next_completion()
        if done is not None:
            times.append(done[0])
        return min(times)

    def due(self, now: float) -> list[Action]:
        """Everything due by ``now``, in time order."""
        actions: list[Action] = []
        while True:
            timer = self._timers[0][0] if self._timers else None
            done = self.model.next_completion()
            if done is not None and done[0] <= now and (timer is None or done[0] <= timer):
                actions.extend(self._complete(self._rows[self._pods[done[1]]], done[0]))
            elif timer is not None and timer <= now and timer < self.horizon:
                _, _, what, row = heapq.heappop(self._timers)
                actions.extend(self._timer(what, self._rows[row], timer))
            else:
                break
        if not self._unborn:
            return actions
        # A service that arrived and ended within one call is never created.
        unborn, self._unborn = self._unborn, set()
        for name in unborn:
            del self._pods[name]
        return [a for a in actions if not (isinstance(a, Create) and a.name in unborn)]

    def _timer(self, what: str, state: _Row, at: float) -> list[Action]:
        if what == "end":
            return self._end_service(state, at)
        if what in ("idle", "stop"):
            return self._idle_timer(what, state, at)
        if state.over or state.pod is not None:
            return []
        if not state.row.batch and at >= state.row.at + state.row.duration:
            state.over = True
            return []
        if what == "arrive" and not state.row.batch:
            self._at(state.row.at + state.row.duration, "end", state.row.row)
        state.attempts += 1
        name = f"{dns_label(state.row.name, 30)}-{state.row.row}-{state.attempts}"
        state.pod = name
        self._pods[name] = state.row.row
        return [Create(name, state.row, state.attempts)]

    def _complete(self, state: _Row, at: float) -> list[Action]:
        name = state.pod
        if name is None:
            return []
        self._stop(state, name, at)
        state.outcome.completed = True
        state.over = True
        state.pod = None
        self.records[name].ended = at
        following = self._next_step.get(state.row.row)
        if following is not None:
            self._at(max(following.at, at), "arrive", following.row)
        return [Complete(name, state.row.namespace)]

    def _end_service(self, state: _Row, at: float) -> list[Action]:
        state.over = True
        name = state.pod
        if name is None:
            return []
        state.pod = None
        record = self.records.get(name)
        if record is None:  # its Create is in the same call of due(): drop it there
            self._unborn.add(name)
            return []
        record.ended = at
        if record.bound is None:
            self._waiting(record, -1, at)
            return [Withdraw(name, state.row.namespace)]
        self._stop(state, name, at)
        return [Complete(name, state.row.namespace)]

    def _stop(self, state: _Row, name: str, at: float) -> Stopped | None:
        stopped = self.model.stop(name, max(at, self.records[name].bound or at))
        if stopped is None:
            return None
        outcome = state.outcome
        if state.row.batch:
            outcome.progress = stopped.progress
        else:
            outcome.progress += stopped.progress
            outcome.service_seconds += stopped.ran
            outcome.degraded_seconds += stopped.degraded
        state.kept = stopped.kept
        return stopped

    # -- idle tails -------------------------------------------------------------------------

    def _idle_tail(self, state: _Row, record: PodRecord) -> None:
        """The bound pod's idle tail, and when its idle rule stops it (never before the tail
        starts, only if its tail keeps less than ``below`` of its GPUs busy, as the node agent
        judges: busy over the GPUs allocated)."""
        row = state.row
        start = row.idle_from
        if start is None or record.bound is None:
            return
        record.idle_from = max(start, record.bound)
        record.idle_until = row.at + row.duration
        self._at(record.idle_from, "idle", row.row)
        rule = self.idle_rules.get(row.row)
        if rule is None or rule.action != "stop" or record.gpus <= 0:
            return
        if Decimal(row.idle_busy * 100 / record.gpus) >= rule.below:
            return
        stop = record.idle_from + rule.after + self.detection
        if stop < record.idle_until:
            self._idle_stops[record.name] = stop
            self._at(stop, "stop", row.row)

    def _idle_timer(self, what: str, state: _Row, at: float) -> list[Action]:
        name = state.pod
        if name is None or name not in self.records:
            return []
        record = self.records[name]
        if what == "idle":
            if record.idle_from == at and record.ended is None:
                self.model.idle(name, at, state.row.idle_busy)
            return []
        if self._idle_stops.get(name) != at or record.ended is not None:
            return []  # a timer of an attempt before this one
        del self._idle_stops[name]
        self._stop(state, name, at)
        record.ended = record.idle_stopped = at
        state.over = True
        state.pod = None
        return [IdleStop(name, state.row.namespace)]

    def _waiting(self, record: PodRecord, sign: int, at: float) -> None:
        """The GPUs asked by pods waiting to be placed change at ``at``."""
        self._pending += sign * record.asked
        self.backlog.append((at, self._pending))

    # -- what the cluster said --------------------------------------------------------------

    def created(self, record: PodRecord) -> None:
        """The pod of a Create was created (or refused: ``record.refused``)."""
        state = self._rows[self._pods[record.name]]
        self.records[record.name] = record
        if record.refused is not None:
            self._refused(state)
            return
        self._waiting(record, +1, record.created)

    @staticmethod
    def _refused(state: _Row) -> None:
        state.outcome.refused = True
        state.over = True
        state.pod = None

    def refuse(self, name: str, reason: str) -> None:
        """The API server refused the pod of a Create that :meth:`created` recorded."""
        record = self.records[name]
        if record.refused is None and record.bound is None:
            self._waiting(record, -1, record.created)
            record.refused = reason
            self._refused(self._rows[self._pods[name]])

    def unschedulable(self, name: str) -> None:
        record = self.records.get(name)
        if record is not None:
            record.first_try = False

    def bound(
        self,
        name: str,
        at: float,
        node: str,
        devices: Sequence[tuple[int, float]] | None = None,
    ) -> None:
        record = self.records.get(name)
        if record is None or record.bound is not None or record.ended is not None:
            return
        record.bound = at
        self._waiting(record, -1, at)
        state = self._rows[self._pods[name]]
        row = state.row
        self.model.start(
            name,
            at,
            node=node,
            whole=record.whole,
            slices=record.slices,
            asked=row.gpus,
            busy=row.busy,
            sm_share=record.sm_share,
            progress=state.kept if row.batch else 0.0,
            target=row.duration if row.batch else None,
            checkpoint=row.checkpoint if row.batch else None,
            devices=devices,
        )
        self._idle_tail(state, record)

    def evicted(self, name: str, reason: str | None) -> None:
        """Kueue marked the pod for deletion to preempt it, for ``reason`` (None: it did not)."""
        record = self.records.get(name)
        if record is not None and reason is not None and record.ended is None:
            record.evicted_by = reason

    def gone(self, name: str, at: float) -> list[Action]:
        """The pod was deleted before its work was done: the scheduler (or Kueue) preempted it."""
        record = self.records.get(name)
        if record is None or record.ended is not None:
            return []
        state = self._rows[self._pods[name]]
        record.ended = at
        record.preempted = True
        state.outcome.preemptions += 1
        if record.bound is None:
            self._waiting(record, -1, at)
        else:
            stopped = self._stop(state, name, at)
            if state.row.batch and stopped is not None:
                lost = state.outcome.progress - state.kept
                state.outcome.lost_seconds += lost
                state.outcome.progress = state.kept
                record.lost = state.row.gpus * lost
                # Its busy time accrued evenly with its progress in this attempt: the share of
                # it past the last checkpoint was spent on work the next attempt does again.
                done = stopped.progress - stopped.begun
                record.redone = stopped.busy * lost / done if done > 0 else 0.0
        state.pod = None
        backoff = BATCH_BACKOFF if state.row.batch else SERVICE_BACKOFF
        self._at(at + backoff, "again", state.row.row)
        return []

    def finish(self) -> list[RowOutcome]:
        """Stop what still runs at the horizon; every row's outcome."""
        for state in self._rows.values():
            if state.pod is not None and state.pod in self.records:
                record = self.records[state.pod]
                if record.bound is not None and record.ended is None:
                    self._stop(state, state.pod, self.horizon)
        return [state.outcome for state in self._rows.values()]
