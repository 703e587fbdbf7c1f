"""Notebooks' idle tails in the lab (issue 31, item 6), without a cluster: the ledger plays the
node agent's idle rule and the notebook controller, the tests play the scheduler's part by
binding pods where a scheduler might have; figures are computed by hand."""

from __future__ import annotations

import argparse
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from gpuwarden.commands import node_agent
from gpuwarden.lab.inputs.defaulttrace import default_namespaces
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.lab.planning.plan import decide_rows, idle_stop_rules, plan_strategy
from gpuwarden.lab.planning.strategies import Layout, builtin_strategies, without_idle_rules
from gpuwarden.lab.replay.ledger import (
    DETECTION_INTERVAL,
    Complete,
    Create,
    IdleStop,
    Ledger,
)
from gpuwarden.lab.replay.work import NodeGpus, WorkModel
from gpuwarden.lab.reporting.report import StrategyReport, summarize, table
from gpuwarden.policy.pod.record import IdleRecord

from .test_work import _record, _row

HOUR = 3600.0
REPO = Path(__file__).resolve().parents[2]
STOP = IdleRecord(action="stop", after=3600, below=Decimal(5))


def _notebook(
    row: int = 1, *, at: float = 0.0, hours: float = 4, idle: float = 3, idle_busy: float = 0.0
) -> TraceRow:
    notebook = _row(row, "notebook", at=at, hours=hours, busy=0.1, namespace="algo-team")
    return replace(notebook, name="nb", idle=idle * HOUR, idle_busy=idle_busy)


def _job(row: int, *, at: float) -> TraceRow:
    return _row(row, "training-job", at=at, busy=0.9, namespace="algo-team")


def _created(ledger: Ledger, action: Create, now: float, *, gpus: float = 1.0) -> str:
    """The pod of ``action`` created with ``gpus`` physical GPUs (a slice: a share of one)."""
    whole = 1 if gpus >= 1 else 0
    record = _record(action, now, whole=whole, slices=1 - whole)
    record.gpus = gpus
    ledger.created(record)
    return action.name


def _report(ledger: Ledger, model: WorkModel, horizon: float) -> StrategyReport:
    return summarize(
        "s",
        ledger.records.values(),
        ledger.finish(),
        physical_gpus=1,
        horizon=horizon,
        allocated=[(s.at, s.allocated) for s in model.samples],
        busy=[(s.at, s.busy) for s in model.samples],
        pending=ledger.backlog,
    )


def test_the_agents_interval_is_the_node_agents_default() -> None:
    parser = argparse.ArgumentParser()
    node_agent.register(parser)
    assert parser.get_default("interval") == DETECTION_INTERVAL == 10.0


def test_an_idle_notebook_is_stopped_after_plus_the_interval_and_its_gpu_goes_to_a_waiting_job() -> (
    None
):
    # One GPU. The notebook works for 1h, then sits idle for 3h; a job arrives at 30m and waits.
    model = WorkModel({"gpu-0": NodeGpus(1)})
    ledger = Ledger([_notebook(), _job(2, at=0.5 * HOUR)], model, 6 * HOUR, idle_rules={1: STOP})
    (nb,) = ledger.due(0.0)
    assert isinstance(nb, Create)
    notebook = _created(ledger, nb, 0.0)
    ledger.bound(notebook, 0.0, "gpu-0")
    (job,) = ledger.due(0.5 * HOUR)
    assert isinstance(job, Create)
    waiting = _created(ledger, job, 0.5 * HOUR)
    # Busy until its tail starts at 1h; idle 1h later, the agent's next pass stops it.
    stop = 2 * HOUR + DETECTION_INTERVAL
    assert ledger.due(stop - 1) == []
    assert ledger.due(stop) == [IdleStop(notebook, "algo-team")]
    # The scheduler gives the freed GPU to the job, which runs its hour.
    ledger.bound(waiting, stop, "gpu-0")
    assert ledger.due(stop + HOUR) == [Complete(waiting, "algo-team")]
    assert ledger.due(4 * HOUR) == [], "the session's end finds its pod already gone"
    report = _report(ledger, model, 6 * HOUR)
    assert report.idle is not None
    # Held idle from 1h to the stop; given back from the stop to 4h, when its user closed it.
    assert report.idle.held_gpu_hours == pytest.approx((HOUR + DETECTION_INTERVAL) / HOUR)
    assert report.idle.returned_gpu_hours == pytest.approx((2 * HOUR - DETECTION_INTERVAL) / HOUR)
    assert report.idle.stopped == 1
    # The idle tail is neither offered nor delivered: 1h of notebook, 1h of job.
    assert report.offered_gpu_hours == pytest.approx(2.0)
    assert report.delivered_gpu_hours == pytest.approx(2.0)
    # Busy 0.1 for the notebook's working hour, 0 in its tail, 0.9 for the job's hour.
    assert report.gpu_busy_average == pytest.approx((0.1 * HOUR + 0.9 * HOUR) / (6 * HOUR))
    assert report.as_json()["idleGpuHoursReturned"] == report.idle.returned_gpu_hours
    assert "notebooks' idle tails" in table([report])
    # A long strategy name widens the strategy column instead of shifting its row.
    lines = table([report, replace(report, strategy="default-policy-no-idle")]).splitlines()
    header, short, long = lines[0], lines[1], lines[2]
    assert len(header) == len(short) == len(long) and short.startswith("s" + " " * 22)


def test_without_a_stop_rule_an_idle_notebook_holds_its_gpu_until_it_is_closed() -> None:
    model = WorkModel({"gpu-0": NodeGpus(1)})
    ledger = Ledger([_notebook()], model, 6 * HOUR)
    (nb,) = ledger.due(0.0)
    assert isinstance(nb, Create)
    notebook = _created(ledger, nb, 0.0)
    ledger.bound(notebook, 0.0, "gpu-0")
    assert ledger.due(4 * HOUR - 1) == []
    assert ledger.due(4 * HOUR) == [Complete(notebook, "algo-team")]
    report = _report(ledger, model, 6 * HOUR)
    assert report.idle is not None
    assert (report.idle.held_gpu_hours, report.idle.returned_gpu_hours) == (3.0, 0.0)
    assert report.idle.stopped == 0
    assert report.average_allocation == pytest.approx(4 / 6)


@pytest.mark.parametrize(
    ("gpus", "idle_busy", "stopped"),
    [
        (1.0, 0.0, True),
        (1.0, 0.04, True),  # 4% of a whole GPU
        (1.0, 0.05, False),  # 5%: not below 5%
        (0.25, 0.01, True),  # 4% of a quarter-GPU slice
        (0.25, 0.02, False),  # 8% of the slice: the agent does not count it idle
    ],
)
def test_below_is_judged_on_the_gpus_the_notebook_is_allocated(
    gpus: float, idle_busy: float, stopped: bool
) -> None:
    model = WorkModel({"gpu-0": NodeGpus(1, replicas=1 if gpus >= 1 else 4)})
    ledger = Ledger([_notebook(idle_busy=idle_busy)], model, 6 * HOUR, idle_rules={1: STOP})
    (nb,) = ledger.due(0.0)
    assert isinstance(nb, Create)
    notebook = _created(ledger, nb, 0.0, gpus=gpus)
    ledger.bound(notebook, 0.0, "gpu-0")
    actions = ledger.due(2 * HOUR + DETECTION_INTERVAL)
    assert actions == ([IdleStop(notebook, "algo-team")] if stopped else [])


def test_a_busy_notebook_is_never_stopped_and_a_late_one_is_idle_from_its_binding() -> None:
    # Tail of 30 min: it ends before an hour's idle rule would act. The second notebook waited
    # until 2h for its GPU, past its tail's start at 1h: its idle time counts from 2h.
    short = _notebook(1, hours=2, idle=0.5)
    late = _notebook(2, hours=6, idle=5)
    model = WorkModel({"gpu-0": NodeGpus(2)})
    ledger = Ledger([short, late], model, 8 * HOUR, idle_rules={1: STOP, 2: STOP})
    first, second = ledger.due(0.0)
    assert isinstance(first, Create) and isinstance(second, Create)
    one, two = _created(ledger, first, 0.0), _created(ledger, second, 0.0)
    ledger.bound(one, 0.0, "gpu-0")
    ledger.bound(two, 2 * HOUR, "gpu-0")
    assert ledger.due(2 * HOUR) == [Complete(one, "algo-team")]
    assert ledger.due(3 * HOUR + DETECTION_INTERVAL - 1) == []
    assert ledger.due(3 * HOUR + DETECTION_INTERVAL) == [IdleStop(two, "algo-team")]


def test_a_preempted_notebooks_next_pod_starts_its_idle_time_afresh() -> None:
    model = WorkModel({"gpu-0": NodeGpus(1)})
    ledger = Ledger([_notebook()], model, 6 * HOUR, idle_rules={1: STOP})
    (nb,) = ledger.due(0.0)
    assert isinstance(nb, Create)
    first = _created(ledger, nb, 0.0)
    ledger.bound(first, 0.0, "gpu-0")
    ledger.gone(first, 1.5 * HOUR)  # preempted, half an hour into its tail
    (again,) = ledger.due(1.5 * HOUR + 1)
    assert isinstance(again, Create)
    second = _created(ledger, again, 1.5 * HOUR + 1)
    ledger.bound(second, 1.5 * HOUR + 1, "gpu-0")
    assert ledger.due(2 * HOUR + DETECTION_INTERVAL) == [], "the first pod's stop is void"
    stop = 2.5 * HOUR + 1 + DETECTION_INTERVAL
    assert ledger.due(stop) == [IdleStop(second, "algo-team")]


def test_the_default_policy_stops_idle_notebooks_and_its_no_idle_variant_does_not() -> None:
    rows = [_notebook(), _job(2, at=0.0)]
    namespaces = default_namespaces()
    default = {s.name: s for s in builtin_strategies(REPO / "policies")}["default-policy"]
    layout = Layout(nodes=2, gpus_per_node=8)
    plan = plan_strategy(default, layout, rows, namespaces)
    assert idle_stop_rules(plan, rows) == {1: STOP}
    bare = without_idle_rules(default)
    assert bare.name == "default-policy-no-idle"
    assert idle_stop_rules(plan_strategy(bare, layout, rows, namespaces), rows) == {}
    # Otherwise the same decisions: the pods differ only by the idle annotation.
    view = plan.view
    with_rule = decide_rows(default.policies, rows, view)  # type: ignore[arg-type]
    without = decide_rows(bare.policies, rows, view)  # type: ignore[arg-type]
    for row in rows:
        kept = dict(with_rule[row.row].pod["metadata"]["annotations"])
        kept.pop("gpuwarden.io/idle", None)
        assert kept == without[row.row].pod["metadata"]["annotations"]
        assert with_rule[row.row].pod["spec"] == without[row.row].pod["spec"]
