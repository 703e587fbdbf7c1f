"""The ceilings `gpuwarden simulate` measures strategies against, and GPU busy time split into
useful work and work redone after preemption, on cases computed by hand (no cluster: the tests
play the scheduler's part); and the shape of the built-in oversubscribed week."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuwarden.lab.inputs.defaulttrace import NAMESPACES, WEEK, oversubscribed_week
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.lab.replay.ledger import BATCH_BACKOFF, Create, Ledger
from gpuwarden.lab.replay.records import PodRecord
from gpuwarden.lab.replay.work import NodeGpus, WorkModel
from gpuwarden.lab.reporting.report import fluid_ceiling, summarize, table, trace_load

HOUR = 3600.0


def _row(row: int, *, at: float, hours: float, busy: float) -> TraceRow:
    return TraceRow(
        row=row,
        at=at,
        namespace="team",
        kind="training-job",
        name="job",
        gpus=1,
        duration=hours * HOUR,
        memory_used=Decimal(0),
        busy=busy,
    )


def _record(action: Create, at: float) -> PodRecord:
    return PodRecord(
        name=action.name,
        namespace=action.row.namespace,
        row=action.row.row,
        created=at,
        kind=action.row.kind,
        asked=1,
        whole=1,
        gpus=1,
        attempt=action.attempt,
    )


def test_one_gpu_two_pods_one_preempted_busy_is_split_into_useful_and_redone() -> None:
    # A 2-hour job at busy 0.5 (no checkpoints) starts at 0; at 1h a 1-hour job at busy 1.0
    # preempts it; it is recreated and runs again from zero, 2h to 4h.
    low = _row(1, at=0.0, hours=2, busy=0.5)
    high = _row(2, at=HOUR, hours=1, busy=1.0)
    model = WorkModel({"gpu-0": NodeGpus(1)})
    ledger = Ledger([low, high], model, horizon=4 * HOUR)
    (first,) = ledger.due(0.0)
    assert isinstance(first, Create)
    ledger.created(_record(first, 0.0))
    ledger.bound(first.name, 0.0, "gpu-0")
    (second,) = ledger.due(HOUR)
    assert isinstance(second, Create)
    ledger.created(_record(second, HOUR))
    ledger.gone(first.name, HOUR)
    ledger.bound(second.name, HOUR, "gpu-0")
    (again,) = ledger.due(HOUR + BATCH_BACKOFF)
    assert isinstance(again, Create) and again.attempt == 2
    ledger.created(_record(again, HOUR + BATCH_BACKOFF))
    ledger.due(2 * HOUR)  # the high job completes
    ledger.bound(again.name, 2 * HOUR, "gpu-0")
    ledger.due(4 * HOUR)
    outcomes = ledger.finish()
    report = summarize(
        "s",
        ledger.records.values(),
        outcomes,
        physical_gpus=1,
        horizon=4 * HOUR,
        allocated=[(s.at, s.allocated) for s in model.samples],
        busy=[(s.at, s.busy) for s in model.samples],
    )
    # Busy: 0.5 for 1h, 1.0 for 1h, 0.5 for 2h = 2.5 of 4 GPU-hours; the first hour's 0.5
    # GPU-hours were spent on work thrown away and done again.
    assert report.gpu_busy_average == pytest.approx(2.5 / 4)
    assert report.gpu_busy_redone == pytest.approx(0.5 / 4)
    assert report.gpu_busy_useful == pytest.approx(2.0 / 4)
    assert report.lost_gpu_hours == pytest.approx(1.0)
    assert report.delivered_gpu_hours == pytest.approx(3.0)
    # The JSON names the pod that went, when, and the work thrown away with it.
    assert report.as_json()["preemptedPods"] == [
        {
            "pod": first.name,
            "namespace": "team",
            "kind": "training-job",
            "row": 1,
            "attempt": 1,
            "gpus": 1,
            "boundSeconds": 0.0,
            "preemptedSeconds": HOUR,
            "lostGpuHours": pytest.approx(1.0),
            "redoneGpuHours": pytest.approx(0.5),
            "evictedBy": "scheduler",
        }
    ]
    load = trace_load(
        [(r.at, r.duration, r.gpus, r.busy) for r in (low, high)], physical_gpus=1, horizon=4 * HOUR
    )
    # Both jobs fit by the horizon: 3 GPU-hours of work, 0.5 * 2 + 1.0 * 1 = 2 of busy.
    assert load.work_ceiling_gpu_hours == pytest.approx(3.0)
    assert load.busy_ceiling_gpu_hours == pytest.approx(2.0)
    assert load.busy_ceiling == pytest.approx(0.5)
    # All the work, and all the useful busy time there was: the redone hour is no gain.
    assert load.ceiling_shares(report) == pytest.approx((1.0, 1.0))
    lines = table([report], load).splitlines()
    assert lines[1] == (
        "ceilings: work 3 GPU-hours (the most any scheduler could deliver by the horizon); "
        "busy 50% of the GPUs' time (the trace's busy-weighted work that fits)"
    )
    assert lines[4].split()[:9] == [
        "s",
        "3",
        "(100%)",
        "2/2",
        "62%",
        "50%",
        "12.5%",
        "100%",
        "100%",
    ]
    figures = report.as_json(load)
    assert figures["gpuBusyUsefulAverage"] == pytest.approx(0.5)
    assert figures["gpuBusyRedoneAverage"] == pytest.approx(0.125)
    assert (figures["workCeilingShare"], figures["busyCeilingShare"]) == pytest.approx((1, 1))


def test_the_work_ceiling_respects_arrivals_and_the_horizon() -> None:
    # One GPU for 2h: a 2-hour job at 0 and a 1-hour job at 1h, both busy 1. Either could run
    # whole, not both: 2 GPU-hours of the 3 offered.
    load = trace_load(
        [(0, 2 * HOUR, 1, 1.0), (HOUR, HOUR, 1, 1.0)], physical_gpus=1, horizon=2 * HOUR
    )
    assert load.offered_gpu_hours == pytest.approx(3.0)
    assert load.work_ceiling_gpu_hours == pytest.approx(2.0)
    assert load.busy_ceiling == pytest.approx(1.0)
    # Work arriving late cannot be done before it arrives: 2 GPUs, a job of 2 GPUs for 1h
    # arriving at 1.5h of a 2h horizon does half an hour of its hour.
    late = trace_load([(1.5 * HOUR, HOUR, 2, 1.0)], physical_gpus=2, horizon=2 * HOUR)
    assert late.work_ceiling_gpu_hours == pytest.approx(1.0)
    assert late.busy_ceiling == pytest.approx(0.25)
    # Nothing before 1h, then 3 one-GPU jobs of 1h on 2 GPUs: 2 of 3 fit in the last hour.
    crowded = [(HOUR, HOUR, 1, 1.0)] * 3
    assert trace_load(crowded, physical_gpus=2, horizon=2 * HOUR).work_ceiling_gpu_hours == (
        pytest.approx(2.0)
    )


def test_light_work_fits_several_to_a_gpu_under_the_work_ceiling() -> None:
    # One GPU for an hour: four notebooks of a GPU each at busy 0.1 and a job at busy 1.
    # Physically the notebooks need 0.4 of the GPU-hour, the job's work fills the other 0.6:
    # 4.6 GPU-hours of the 5 asked, while the GPU is busy all the hour at most.
    items = [(0.0, HOUR, 0.1 * HOUR)] * 4 + [(0.0, HOUR, HOUR)]
    assert fluid_ceiling(items, gpus=1, horizon=HOUR) == pytest.approx(4.6 * HOUR)
    load = trace_load([(0, HOUR, 1, 0.1)] * 4 + [(0, HOUR, 1, 1.0)], physical_gpus=1, horizon=HOUR)
    assert load.busy_ceiling == pytest.approx(1.0)
    # Rows without busy: offered and peak only, as before.
    assert trace_load([(0, HOUR, 1)], physical_gpus=1, horizon=HOUR).work_ceiling_gpu_hours is None


def test_the_oversubscribed_week_asks_half_again_the_cluster_in_light_work() -> None:
    rows = oversubscribed_week()
    assert rows == oversubscribed_week(), "generated from a fixed seed"
    assert {r.namespace for r in rows} == set(NAMESPACES)
    capacity = 64 * WEEK
    # The work asked: notebooks' idle tails (the trace's idle) are held, not work.
    light = sum(r.gpus * min(r.work_duration, WEEK - r.at) for r in rows if r.busy <= 0.3)
    assert 1.4 <= light / capacity <= 1.6
    load = trace_load(
        ((r.at, r.work_duration, r.gpus, r.busy) for r in rows), physical_gpus=64, horizon=WEEK
    )
    assert load.offered_load > 1.5
    assert load.peak_demand > 3
    # The busy-weighted work fits in the GPUs' time with room to spare.
    assert load.busy_ceiling is not None and 0.45 <= load.busy_ceiling <= 0.65
    # ... so the work ceiling is above the cluster's GPU-hours: only sharing reaches it.
    assert load.work_ceiling_gpu_hours is not None
    assert load.work_ceiling_gpu_hours > 1.5 * load.capacity_gpu_hours
    # Large pipeline training is still there, for the pool split to serve.
    assert any(r.kind == "kfp-step" and r.gpus >= 4 for r in rows)


def test_a_pod_deleted_while_it_waited_is_listed_unbound() -> None:
    record = PodRecord(name="p-1", namespace="team", row=3, created=HOUR, kind="katib-trial")
    record.preempted, record.ended = True, 2 * HOUR
    (listed,) = summarize(
        "s", [record], [], physical_gpus=1, horizon=4 * HOUR, allocated=[], busy=[]
    ).as_json()["preemptedPods"]
    assert (listed["boundSeconds"], listed["preemptedSeconds"]) == (None, 2 * HOUR)
    assert listed["lostGpuHours"] == 0
