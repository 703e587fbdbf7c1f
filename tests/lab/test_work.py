"""The work-conserving model and the ledger, on cases computed by hand (no cluster: the tests
play the scheduler's part by binding and deleting pods where a scheduler might have)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.lab.replay.ledger import BATCH_BACKOFF, Complete, Create, Ledger, Withdraw
from gpuwarden.lab.replay.records import PodRecord
from gpuwarden.lab.replay.work import NodeGpus, WorkModel
from gpuwarden.lab.reporting.report import summarize, table

HOUR = 3600.0


def _row(
    row: int,
    kind: str = "training-job",
    *,
    at: float = 0.0,
    gpus: float = 1,
    hours: float = 1.0,
    busy: float = 1.0,
    checkpoint: float | None = None,
    run: str | None = None,
    namespace: str = "team",
    name: str = "job",
) -> TraceRow:
    return TraceRow(
        row=row,
        at=at,
        namespace=namespace,
        kind=kind,
        name=name,
        gpus=gpus,
        duration=hours * HOUR,
        memory_used=Decimal(0),
        busy=busy,
        checkpoint=checkpoint,
        run=run,
    )


# -- the model ------------------------------------------------------------------------------


def test_a_node_that_moved_to_mps_shares_its_gpus_among_the_pods_bound_after() -> None:
    """A whole-GPU node empties, its device plugin config changes to MPS (issue 33, item 4):
    the next pods hold a quarter of a GPU each, slowed by what they share."""
    model = WorkModel({"flex-0": NodeGpus(2)})
    model.start("job", 0.0, node="flex-0", whole=2, slices=0, asked=2, busy=1.0, target=HOUR)
    model.stop("job", HOUR)
    model.configure("flex-0", NodeGpus(2, replicas=4), HOUR)
    for key in ("a", "b", "c"):
        model.start(key, HOUR, node="flex-0", whole=0, slices=1, asked=1, busy=0.6, target=HOUR)
    # Spread over both GPUs (fewest replicas in use first): a and c share GPU 0.
    assert model.placement("a") == model.placement("c") == (("flex-0", 0),)
    assert model.samples[-1].allocated == pytest.approx(0.75)
    assert model.speed("a") == pytest.approx(1 / 1.2)
    assert model.speed("b") == pytest.approx(1.0)
    # Back to whole GPUs once they are done: a slice's stop frees one slot, not a whole GPU.
    for key in ("a", "b", "c"):
        model.stop(key, 3 * HOUR)
    model.configure("flex-0", NodeGpus(2), 3 * HOUR)
    model.start("next", 3 * HOUR, node="flex-0", whole=2, slices=0, asked=2, busy=1.0)
    assert model.placement("next") == (("flex-0", 0), ("flex-0", 1))
    assert model.samples[-1].allocated == pytest.approx(2.0)


def test_two_pods_at_busy_06_on_one_gpu_both_take_1_2_times_as_long() -> None:
    model = WorkModel({"mps-0": NodeGpus(1, replicas=4)})
    for key in ("a", "b"):
        model.start(key, 0.0, node="mps-0", whole=0, slices=1, asked=1, busy=0.6, target=HOUR)
    assert model.placement("a") == model.placement("b") == (("mps-0", 0),)
    assert model.speed("a") == pytest.approx(1 / 1.2)
    when, _ = model.next_completion() or (None, None)
    assert when == pytest.approx(1.2 * HOUR)
    # The GPU is busy 1.0 (min(1, 1.2)) while both run; half a slice's worth of allocation each.
    assert model.samples[-1].busy == pytest.approx(1.0)
    assert model.samples[-1].allocated == pytest.approx(0.5)


def test_mps_thread_percentage_caps_a_pods_sms_and_keeps_its_neighbours_at_full_speed() -> None:
    # Three trials (busy 0.8, capped at 25% of the SMs) and a notebook (0.1) on one GPU: the caps
    # add up to 0.85, so nobody is slowed by contention; each trial runs 0.25 / 0.8 as fast.
    model = WorkModel({"mps-0": NodeGpus(1, replicas=4)})
    for key in ("t1", "t2", "t3"):
        model.start(
            key, 0.0, node="mps-0", whole=0, slices=1, asked=1, busy=0.8, sm_share=0.25,
            target=HOUR,
        )  # fmt: skip
    model.start("nb", 0.0, node="mps-0", whole=0, slices=1, asked=1, busy=0.1, sm_share=0.5)
    assert model.speed("t1") == pytest.approx(0.25 / 0.8)
    assert model.speed("nb") == pytest.approx(1.0)
    assert model.samples[-1].busy == pytest.approx(0.85)
    when, _ = model.next_completion() or (None, None)
    assert when == pytest.approx(3.2 * HOUR)
    stopped = model.stop("nb", HOUR)
    assert stopped is not None and stopped.degraded == 0


def test_slices_spread_over_the_gpus_with_the_fewest_replicas_in_use() -> None:
    model = WorkModel({"mps-0": NodeGpus(2, replicas=4)})
    for key in ("a", "b", "c"):
        model.start(key, 0.0, node="mps-0", whole=0, slices=1, asked=1, busy=0.5, target=HOUR)
    assert [model.placement(k) for k in ("a", "b", "c")] == [
        (("mps-0", 0),),
        (("mps-0", 1),),
        (("mps-0", 0),),
    ]
    # GPU 0 carries a and c (1.0), GPU 1 b alone (0.5): nobody slows down; 1.5 GPUs busy.
    assert [model.speed(k) for k in ("a", "b", "c")] == [1.0, 1.0, 1.0]
    assert model.samples[-1].busy == pytest.approx(1.5)


def test_a_pod_granted_4_of_the_8_gpus_it_asked_takes_twice_as_long() -> None:
    model = WorkModel({"gpu-0": NodeGpus(8)})
    model.start("big", 0.0, node="gpu-0", whole=4, slices=0, asked=8, busy=0.9, target=HOUR)
    assert model.next_completion() == (pytest.approx(2 * HOUR), "big")
    # Four GPUs at 0.9 each; nothing else.
    assert model.samples[-1].busy == pytest.approx(3.6)
    assert model.samples[-1].allocated == 4


def test_a_pod_with_no_gpu_makes_no_progress() -> None:
    model = WorkModel({"gpu-0": NodeGpus(8)})
    model.start("etl", 0.0, node="gpu-0", whole=0, slices=0, asked=2, busy=0.2, target=HOUR)
    assert model.next_completion() is None
    stopped = model.stop("etl", 5 * HOUR)
    assert stopped is not None and stopped.progress == 0


def test_speeds_change_when_a_neighbour_leaves_and_progress_is_kept_at_checkpoints() -> None:
    model = WorkModel({"mps-0": NodeGpus(1, replicas=2)})
    model.start("a", 0.0, node="mps-0", whole=0, slices=1, asked=1, busy=1.0, target=4 * HOUR)
    model.start(
        "b", 0.0, node="mps-0", whole=0, slices=1, asked=1, busy=1.0, target=HOUR, checkpoint=None
    )
    # Both at half speed: b finishes its hour of work at 2h; a has done 1h of its 4 by then.
    assert model.next_completion() == (pytest.approx(2 * HOUR), "b")
    model.stop("b", 2 * HOUR)
    assert model.progress("a") == pytest.approx(HOUR)
    # Alone, a runs at full speed: 3h of work left, done at 5h.
    assert model.next_completion() == (pytest.approx(5 * HOUR), "a")


def test_a_checkpoint_keeps_the_progress_of_its_time() -> None:
    model = WorkModel({"gpu-0": NodeGpus(1)})
    model.start(
        "a",
        0.0,
        node="gpu-0",
        whole=1,
        slices=0,
        asked=1,
        busy=1.0,
        target=10 * HOUR,
        checkpoint=HOUR,
    )
    stopped = model.stop("a", 2.5 * HOUR)
    assert stopped is not None
    assert (stopped.progress, stopped.kept) == (2.5 * HOUR, 2 * HOUR)


# -- the ledger -----------------------------------------------------------------------------


def _record(action: Create, now: float, *, whole: int = 0, slices: int = 0) -> PodRecord:
    return PodRecord(
        action.name,
        action.row.namespace,
        action.row.row,
        created=now,
        kind=action.row.kind,
        asked=action.row.gpus,
        whole=whole if whole or slices else action.row.devices,
        slices=slices,
        attempt=action.attempt,
    )


def test_a_preempted_pod_is_recreated_after_its_backoff_and_its_lost_work_counted() -> None:
    row = _row(1, "training-job", gpus=2, hours=4, busy=1.0, checkpoint=HOUR)
    model = WorkModel({"gpu-0": NodeGpus(2)})
    ledger = Ledger([row], model, horizon=20 * HOUR)
    (create,) = ledger.due(0.0)
    assert isinstance(create, Create) and create.attempt == 1
    ledger.created(_record(create, 0.0))
    ledger.bound(create.name, 0.0, "gpu-0")
    # Preempted at 2.5h: 2h survive (the checkpoint at 2h), 0.5h of 2 GPUs is lost.
    assert ledger.gone(create.name, 2.5 * HOUR) == []
    assert ledger.due(2.5 * HOUR + BATCH_BACKOFF - 1) == []
    (again,) = ledger.due(2.5 * HOUR + BATCH_BACKOFF)
    assert isinstance(again, Create) and again.attempt == 2 and again.name != create.name
    ledger.created(_record(again, 3 * HOUR))
    ledger.bound(again.name, 3 * HOUR, "gpu-0")
    # It resumes from 2h of its 4: done at 5h.
    assert ledger.next_time() == pytest.approx(5 * HOUR)
    (done,) = ledger.due(5 * HOUR)
    assert done == Complete(again.name, "team")
    (outcome,) = ledger.finish()
    assert outcome.completed and outcome.preemptions == 1
    assert outcome.lost == pytest.approx(2 * 0.5 * HOUR)
    assert outcome.delivered == pytest.approx(2 * 4 * HOUR)


def test_a_pipelines_training_step_is_created_only_after_its_data_loading_step_ends() -> None:
    load = _row(1, "kfp-step", hours=1, run="r", name="data-loading")
    train = _row(2, "kfp-step", at=600, hours=2, run="r", name="train")
    model = WorkModel({"gpu-0": NodeGpus(8)})
    ledger = Ledger([load, train], model, horizon=10 * HOUR)
    (first,) = ledger.due(0.0)
    assert isinstance(first, Create) and first.row is load
    ledger.created(_record(first, 0.0))
    assert ledger.due(HOUR) == [], "the step waits: no GPU, no progress, no train step"
    ledger.bound(first.name, HOUR, "gpu-0")
    assert ledger.due(1.5 * HOUR) == []
    complete, second = ledger.due(2 * HOUR)
    assert complete == Complete(first.name, "team")
    assert isinstance(second, Create) and second.row is train


def test_a_service_is_wanted_for_its_lifetime_and_withdrawn_if_still_waiting() -> None:
    served = _row(1, "kserve-predictor", hours=2, busy=0.3, name="chat")
    starved = _row(2, "notebook", at=HOUR, hours=1, busy=0.1, name="nb")
    model = WorkModel({"gpu-0": NodeGpus(1)})
    ledger = Ledger([served, starved], model, horizon=4 * HOUR)
    (a,) = ledger.due(0.0)
    assert isinstance(a, Create)
    ledger.created(_record(a, 0.0))
    ledger.bound(a.name, 0.25 * HOUR, "gpu-0")
    (b,) = ledger.due(HOUR)
    assert isinstance(b, Create)
    ledger.created(_record(b, HOUR))
    # The notebook never gets the GPU: at the end of its hour its pod is deleted.
    end_a, end_b = ledger.due(2 * HOUR)
    assert end_b == Withdraw(b.name, "team")
    assert end_a == Complete(a.name, "team")
    outcomes = {o.row: o for o in ledger.finish()}
    assert outcomes[1].delivered == pytest.approx(1.75 * HOUR)
    assert outcomes[2].delivered == 0
    records = ledger.records
    report = summarize(
        "s",
        records.values(),
        outcomes.values(),
        physical_gpus=1,
        horizon=4 * HOUR,
        allocated=[(s.at, s.allocated) for s in model.samples],
        busy=[(s.at, s.busy) for s in model.samples],
        pending=ledger.backlog,
    )
    # The predictor waited 15 minutes, the notebook its whole hour (never placed).
    assert report.waits["team"]["p50"] == pytest.approx(0.25 * HOUR)
    assert report.waits["team"]["p95"] == pytest.approx(HOUR)
    assert report.kind_waits["kserve-predictor"]["p95"] == pytest.approx(0.25 * HOUR)
    assert report.kind_waits["notebook"]["p50"] == pytest.approx(HOUR)
    assert "interactive waits by kind" in table([report])
    assert report.never_placed == 1
    assert report.offered_gpu_hours == pytest.approx(3.0)
    assert report.delivered_gpu_hours == pytest.approx(1.75)
    # One GPU held 1.75h of 4h, busy 0.3 meanwhile.
    assert report.average_allocation == pytest.approx(1.75 / 4)
    assert report.gpu_busy_average == pytest.approx(0.3 * 1.75 / 4)
    # Pending GPUs: 1 for the first 15 min, 1 from 1h to 2h.
    assert report.pending[:3] == pytest.approx((0.25, 1.0, 0.0))
    assert report.degraded_service_share == 0


def test_a_service_that_ends_before_the_replay_created_it_is_never_created() -> None:
    # A one-second service, and a replay that looks only after it ended: no pod, no KeyError.
    brief = _row(1, "kserve-predictor", hours=1 / 3600, busy=0.3, name="blip")
    later = _row(2, "notebook", at=HOUR, hours=1, busy=0.1, name="nb")
    ledger = Ledger([brief, later], WorkModel({"gpu-0": NodeGpus(1)}), horizon=4 * HOUR)
    assert ledger.due(60.0) == []
    (create,) = ledger.due(HOUR)
    assert isinstance(create, Create) and create.row.row == 2
    outcomes = {o.row: o for o in ledger.finish()}
    assert outcomes[1].delivered == 0


def test_services_on_an_oversubscribed_gpu_count_as_degraded() -> None:
    rows = [_row(n, "kserve-predictor", hours=1, busy=0.6, name=f"p{n}") for n in (1, 2)]
    model = WorkModel({"mps-0": NodeGpus(1, replicas=2)})
    ledger = Ledger(rows, model, horizon=HOUR)
    for create in ledger.due(0.0):
        assert isinstance(create, Create)
        ledger.created(_record(create, 0.0, slices=1))
        ledger.bound(create.name, 0.0, "mps-0")
    ledger.due(HOUR)
    outcomes = ledger.finish()
    # Both served the whole hour at 1/1.2 speed: 2/1.2 GPU-hours of service, all degraded.
    assert sum(o.delivered for o in outcomes) == pytest.approx(2 / 1.2 * HOUR)
    assert all(o.degraded_seconds == pytest.approx(o.service_seconds) for o in outcomes)


def test_a_late_event_never_moves_the_clock_back() -> None:
    model = WorkModel({"gpu-0": NodeGpus(2)})
    model.start("a", 0.0, node="gpu-0", whole=1, slices=0, asked=1, busy=1.0, target=HOUR)
    model.start("b", 2 * HOUR, node="gpu-0", whole=1, slices=0, asked=1, busy=1.0, target=HOUR)
    # a's completion, noticed late, is booked at the clock (2h), not at 1h.
    model.stop("a", HOUR)
    times = [s.at for s in model.samples]
    assert times == sorted(times)
    assert model.samples[-1].allocated == 1


def test_dra_pods_run_on_the_devices_their_claims_got_holding_their_share() -> None:
    """Two pods of half a GPU by cores (SMs capped at 50%, busy 0.8) share device 0 and fill it;
    a whole pod holds device 1; the node's 2 GPUs are all allocated."""
    model = WorkModel({"n": NodeGpus(2)})
    for key in ("a", "b"):
        model.start(
            key,
            0.0,
            node="n",
            whole=0,
            slices=0,
            asked=1,
            busy=0.8,
            sm_share=0.5,
            target=HOUR,
            devices=[(0, 0.5)],
        )
    model.start(
        "w", 0.0, node="n", whole=1, slices=0, asked=1, busy=1.0, target=HOUR, devices=[(1, 1.0)]
    )
    assert model.placement("a") == model.placement("b") == (("n", 0),)
    assert model.placement("w") == (("n", 1),)
    assert model.speed("a") == pytest.approx(0.5 / 0.8)  # its cap, no contention: 0.5 + 0.5 = 1
    assert model.speed("w") == 1.0
    assert model.samples[-1].allocated == 2.0
    assert model.samples[-1].busy == 2.0
