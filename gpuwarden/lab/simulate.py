"""`gpuwarden simulate`'s engine: every strategy's replay at once, each on a lab of its own,
with a progress bar, and the reports of what they measured."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import TextIO

from gpuwarden.lab.cluster.controlplane import Tools
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.lab.planning.plan import StrategyPlan
from gpuwarden.lab.planning.strategies import Layout
from gpuwarden.lab.replay.records import PodRecord
from gpuwarden.lab.replay.replay import Replay, Stopped
from gpuwarden.lab.reporting.pools import pool_moves
from gpuwarden.lab.reporting.report import StrategyReport, TraceLoad, summarize, trace_load

_BAR_WIDTH = 30
_REFRESH = 0.5


@dataclass(frozen=True)
class Plan:
    rows: Sequence[TraceRow]
    strategies: Sequence[StrategyPlan]  # each with its layout resolved and its rows decided
    layout: Layout  # as asked (MPS nodes None: sized per strategy)
    namespaces: Mapping[str, Mapping[str, str]]
    horizon: float  # simulated seconds
    real_seconds: float  # wall-clock seconds the horizon is replayed in

    @property
    def scale(self) -> float:
        return self.horizon / self.real_seconds


def progress_line(done: float, horizon: float, running: int, starting: int = 0) -> str:
    if starting:
        return f"\r[{'.' * _BAR_WIDTH}] starting {starting} labs (API server, scheduler, KWOK)"
    share = min(done / horizon, 1.0) if horizon > 0 else 1.0
    filled = round(share * _BAR_WIDTH)
    day, rest = divmod(done, 86400)
    return (
        f"\r[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {share:4.0%}  "
        f"day {int(day) + 1} {int(rest // 3600):02d}:{int(rest % 3600 // 60):02d}  "
        f"{running} strategies replaying"
    )


def run(plan: Plan, tools: Tools, *, progress: TextIO | None = None) -> list[StrategyReport]:
    """Replay every strategy (in parallel); Ctrl-C stops all of them, their processes too."""
    stop = threading.Event()
    replays = [
        Replay(
            planned,
            plan.rows,
            tools=tools,
            namespaces=plan.namespaces,
            horizon=plan.horizon,
            scale=plan.scale,
            stop=stop,
        )
        for planned in plan.strategies
    ]
    bar = progress if progress is not None and progress.isatty() else None
    with ThreadPoolExecutor(max_workers=len(replays), thread_name_prefix="replay") as pool:
        futures: list[Future[list[PodRecord]]] = [pool.submit(r.run) for r in replays]
        try:
            while not all(f.done() for f in futures):
                if bar is not None:
                    done = min(r.progress.done for r in replays)
                    running = sum(1 for f in futures if not f.done())
                    starting = sum(1 for r in replays if not r.progress.started)
                    bar.write(progress_line(done, plan.horizon, running, starting))
                    bar.flush()
                _, pending = wait(futures, timeout=_REFRESH, return_when=FIRST_EXCEPTION)
                if pending and any(f.done() and f.exception() is not None for f in futures):
                    stop.set()  # one lab failed: the others stop too, the error is raised below
        except BaseException:
            # Ctrl-C (or any error here): every replay stops and tears its lab down.
            stop.set()
            raise
        finally:
            if bar is not None:
                bar.write("\n")
                bar.flush()
        for future in futures:
            error = future.exception()
            if error is not None and not isinstance(error, Stopped):
                raise error
    return [report(replay, plan) for replay in replays]


def report(replay: Replay, plan: Plan) -> StrategyReport:
    samples = replay.model.samples
    summary = summarize(
        replay.strategy.name,
        replay.records.values(),
        replay.outcomes,
        physical_gpus=plan.layout.physical_gpus,
        horizon=plan.horizon,
        allocated=[(s.at, s.allocated) for s in samples],
        busy=[(s.at, s.busy) for s in samples],
        pending=replay.ledger.backlog,
        notes=(*replay.strategy.notes, *replay.plan.notes),
        quotas=replay.strategy.queues,
        shared_quotas=replay.strategy.shared_gpus,
    )
    following = replay.following
    if following is None:
        return summary
    moves = pool_moves(
        following.emulation.moves,
        following.emulation.cordons,
        following.log,
        start=replay.started_at,
        scale=plan.scale,
        horizon=plan.horizon,
        shared_at_start=sum(pool.count for pool in replay.pools if pool.shared),
        rejected=len(replay.rejected),
    )
    return replace(summary, notes=(*summary.notes, *moves.notes()), pool_moves=moves.as_json())


def plan_load(plan: Plan) -> TraceLoad:
    """The trace's offered load and peak demand on the plan's cluster (a notebook's idle tail
    is not offered work)."""
    return trace_load(
        ((r.at, r.work_duration, r.gpus, r.busy) for r in plan.rows),
        physical_gpus=plan.layout.physical_gpus,
        horizon=plan.horizon,
    )
