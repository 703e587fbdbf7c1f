"""Traces, reports and strategies of `gpuwarden simulate`, without a cluster."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from gpuwarden.cli import main
from gpuwarden.lab.inputs.defaulttrace import (
    NAMESPACES,
    WEEK,
    busy_week,
    default_trace,
    interactive_week,
    oversubscribed_week,
    training_week,
)
from gpuwarden.lab.inputs.trace import (
    DEFAULT_BUSY,
    TraceError,
    TraceRow,
    parse_seconds,
    parse_trace,
    trace_csv,
)
from gpuwarden.lab.inputs.workloads import workload_pod
from gpuwarden.lab.planning.strategies import LAB_BACKEND, Layout, builtin_strategies
from gpuwarden.lab.replay.records import PodRecord, RowOutcome
from gpuwarden.lab.replay.replay import pod_allocation
from gpuwarden.lab.reporting.report import percentile, summarize, table, trace_load
from gpuwarden.policy import AdmissionRequest, ClusterView, admit

REPO = Path(__file__).resolve().parents[2]
KNOWN = ("data-team", "algo-team")
HEADER = "at,namespace,kind,name,gpus,duration,memory,labels\n"
FULL_HEADER = "at,namespace,kind,name,gpus,duration,memory,labels,busy,checkpoint,run,products,idle,idle_busy\n"


def _csv(*rows: str) -> str:
    return HEADER + "".join(f"{row}\n" for row in rows)


def test_csv_rows_come_back_by_arrival_with_their_units() -> None:
    rows = parse_trace(
        _csv(
            "1h,algo-team,notebook,alice,1,2h30m,6Gi,team=vision;tier=dev",
            "0,data-team,kfp-step,train,8,90m,40Gi,",
        ),
        "week.csv",
        KNOWN,
    )
    assert [(r.row, r.at, r.duration) for r in rows] == [(2, 0.0, 5400.0), (1, 3600.0, 9000.0)]
    assert rows[1].labels == {"team": "vision", "tier": "dev"}
    assert rows[1].memory_used == Decimal(6 * 2**30)
    assert (rows[0].kind, rows[0].name, rows[0].gpus) == ("kfp-step", "train", 8)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("0,web-team,notebook,a,1,1h,1Gi,", "row 2: unknown tenant namespace 'web-team'"),
        ("0,algo-team,notebook,a,1,-1h,1Gi,", "row 2: duration '-1h' must be above 0"),
        ("-5,algo-team,notebook,a,1,1h,1Gi,", "row 2: at '-5' is before the start"),
        ("0,algo-team,spark-job,a,1,1h,1Gi,", "row 2: unknown kind 'spark-job'"),
        ("0,algo-team,notebook,a,0,1h,1Gi,", "row 2: gpus '0' must be a whole number"),
        ("0,algo-team,notebook,a,1.5,1h,1Gi,", "row 2: gpus '1.5' must be a whole number"),
        ("0,algo-team,notebook,a,1,soon,1Gi,", "row 2: 'soon' is not a duration"),
        ("0,algo-team,notebook,a,1,1h,lots,", "row 2: memory 'lots'"),
        ("0,algo-team,notebook,a,1,1h,1Gi,x", "row 2: labels 'x': write key=value"),
        ("0,algo-team,notebook,a,1,1h,1Gi,,extra", "row 2: more values than columns"),
        (",algo-team,notebook,a,1,1h,1Gi,", "row 2: missing at"),
    ],
)
def test_a_bad_row_is_named_with_what_is_wrong(row: str, message: str) -> None:
    good = "0,algo-team,notebook,a,1,1h,1Gi,"
    with pytest.raises(TraceError) as raised:
        parse_trace(_csv(good, row), "t.csv", KNOWN)
    assert str(raised.value).startswith("t.csv: ")
    assert message in str(raised.value)


def test_yaml_traces_and_malformed_files() -> None:
    text = "rows:\n  - {at: 2h, namespace: algo-team, kind: notebook, gpus: 1, duration: 1h, memory: 2Gi}\n"
    (row,) = parse_trace(text, "t.yaml", KNOWN)
    assert (row.row, row.at, row.name) == (1, 7200.0, "notebook")
    with pytest.raises(TraceError, match=r"t.yaml: not valid YAML"):
        parse_trace("rows: [a: {", "t.yaml", KNOWN)
    with pytest.raises(TraceError, match=r"t.yaml: expected a list of rows"):
        parse_trace("just text", "t.yaml", KNOWN)
    with pytest.raises(TraceError, match=r"t.yaml: row 1: expected a mapping"):
        parse_trace("- 3", "t.yaml", KNOWN)
    with pytest.raises(TraceError, match=r"row 1: unknown column when"):
        parse_trace("- {when: 1}", "t.yaml", KNOWN)
    with pytest.raises(TraceError, match=r"has no rows"):
        parse_trace(HEADER, "t.csv", KNOWN)


def test_durations() -> None:
    assert parse_seconds("1d6h30m") == 86400 + 6 * 3600 + 1800
    assert parse_seconds("1.5h") == 5400
    assert parse_seconds(90) == 90
    with pytest.raises(ValueError):
        parse_seconds("6 hours")


def test_the_default_trace_is_the_seed_tenant_table_shape_and_round_trips_as_csv() -> None:
    rows = default_trace()
    assert rows == default_trace(), "generated from a fixed seed"
    assert {r.namespace for r in rows} == set(NAMESPACES)
    by_ns = {ns: [r for r in rows if r.namespace == ns] for ns in NAMESPACES}
    assert {r.gpus for r in by_ns["data-team"]} <= {2, 4, 8}
    assert {r.gpus for r in by_ns["algo-team"]} <= {1, 2, 4}
    assert {r.gpus for r in by_ns["serving"]} <= {1, 2}
    assert {r.kind for r in by_ns["batch"]} == {"katib-trial"}
    hours = {int(r.at % 86400 // 3600) for r in by_ns["algo-team"]}
    assert hours <= set(range(9, 18)), "the algorithm team works office hours"
    night = {int(r.at % 86400 // 3600) for r in by_ns["data-team"] if r.name == "data-loading"}
    assert night <= {22, 23, 0, 1, 2, 3}, "pipelines start at night"
    again = parse_trace(trace_csv(rows), "default.csv", NAMESPACES)
    assert [(r.at, r.namespace, r.kind, r.gpus, r.duration, r.memory_used) for r in again] == [
        (r.at, r.namespace, r.kind, r.gpus, r.duration, r.memory_used) for r in rows
    ]
    assert again == rows, "every column, the notebooks' idle tails too"


def test_simulate_refuses_a_bad_trace_with_the_row_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "week.csv"
    trace.write_text(_csv("0,algo-team,notebook,a,1,1h,1Gi,", "0,nobody,notebook,a,1,1h,1Gi,"))
    assert main(["simulate", "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert f"error: {trace}: row 2: unknown tenant namespace 'nobody'" in err
    assert "Traceback" not in err
    assert main(["simulate", "--trace", str(tmp_path / "missing.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_dump_trace_prints_what_would_be_replayed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--dump-trace", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(FULL_HEADER)
    assert len(out.splitlines()) == len(default_trace()) + 1


def test_summary_measures_allocation_memory_waits_and_outcomes() -> None:
    hour = 3600.0
    gib = float(2**30)
    records = [
        # 8 GPUs for the first hour, using half their memory.
        PodRecord(
            "a",
            "t1",
            1,
            created=0,
            gpus=8,
            memory_allocated=8 * 80 * gib,
            memory_used=8 * 40 * gib,
            bound=0,
            ended=hour,
        ),
        # waited one hour, then 1 GPU to the end (never ended).
        PodRecord(
            "b",
            "t2",
            2,
            created=0,
            gpus=1,
            memory_allocated=80 * gib,
            memory_used=20 * gib,
            bound=hour,
            first_try=False,
        ),
        PodRecord(
            "c",
            "t2",
            3,
            created=hour,
            gpus=1,
            memory_allocated=80 * gib,
            bound=1.5 * hour,
            ended=1.75 * hour,
            preempted=True,
            first_try=False,
        ),
        # never placed: it waited the whole 2 hours
        PodRecord("d", "t1", 4, created=0),
        PodRecord("e", "t1", 5, created=0, refused="denied"),
    ]
    outcomes = [
        RowOutcome(1, "t1", "training-job", 8 * hour, asked=8, progress=hour, completed=True),
        RowOutcome(2, "t2", "notebook", 2 * hour, asked=1, batch=False, progress=hour),
        RowOutcome(3, "t2", "katib-trial", hour, asked=1, lost_seconds=0.25 * hour),
        RowOutcome(4, "t1", "katib-trial", hour, asked=1),
        RowOutcome(5, "t1", "katib-trial", hour, asked=1, refused=True),
    ]
    allocated = [(0.0, 8.0), (hour, 1.0), (1.5 * hour, 2.0), (1.75 * hour, 1.0)]
    busy = [(0.0, 4.0), (hour, 0.5)]
    report = summarize(
        "s",
        records,
        outcomes,
        physical_gpus=16,
        horizon=2 * hour,
        allocated=allocated,
        busy=busy,
        pending=[(0.0, 2.0), (hour, 1.0)],
    )
    assert report.allocation == pytest.approx((8 / 16, (1 + 0.25) / 16))
    assert report.average_allocation == pytest.approx((8 + 1 + 0.25) / (16 * 2))
    assert report.busy == pytest.approx((4 / 16, 0.5 / 16))
    assert report.gpu_busy_average == pytest.approx(4.5 / 32)
    assert report.pending == pytest.approx((2.0, 1.0))
    assert report.memory_used_share == pytest.approx((320 + 20) / (640 + 80 + 20))
    assert report.waits["t2"] == {
        "placed": 2,
        "p50": hour * 0.5,
        "p95": hour,
        "p99": hour,
        "preempted": 1,
    }
    # d never placed waited the 2 hours; the refused pod has no wait.
    assert report.waits["t1"]["p95"] == 2 * hour
    assert (report.preemptions, report.never_placed, report.refused) == (1, 1, 1)
    assert report.offered_gpu_hours == pytest.approx(13)
    assert report.delivered_gpu_hours == pytest.approx(9)
    assert report.lost_gpu_hours == pytest.approx(0.25)
    assert (report.jobs_completed, report.jobs) == (1, 4)
    assert report.tenants["t2"] == {"offeredGpuHours": 3.0, "deliveredGpuHours": 1.0}
    assert report.wait_resolution == 0, "only a was bound at its first try, at once"
    assert percentile([], 0.5) is None


def test_the_trace_load_counts_offered_work_and_the_peak_of_demand() -> None:
    hour = 3600.0
    load = trace_load(
        [(0, 2 * hour, 8), (hour, 2 * hour, 4), (5 * hour, hour, 2)],
        physical_gpus=8,
        horizon=8 * hour,
    )
    assert load.offered_gpu_hours == 16 + 8 + 2
    assert load.offered_load == pytest.approx(26 / 64)
    assert (load.peak_gpus, load.peak_demand) == (12, 1.5)


def test_lab_strategies_schedule_volcano_policies_on_the_nvidia_backend() -> None:
    strategies = {s.name: s for s in builtin_strategies(REPO / "policies")}
    assert list(strategies) == ["no-governance", "sharing-only", "default-policy"]
    default = strategies["default-policy"]
    assert default.policies is not None and default.shares
    assert any("backend volcano simulated as nvidia" in note for note in default.notes)
    assert not strategies["no-governance"].shares
    pod = workload_pod("notebook", name="nb-1", namespace="algo-team", workload="nb", gpus=1)
    view = ClusterView(
        namespace_labels={"algo-team": {"app.kubernetes.io/part-of": "kubeflow-profile"}}
    )
    result = admit(AdmissionRequest("CREATE", "algo-team", pod), default.policies, view)
    limits = result.pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {LAB_BACKEND["sharedResourceName"]: "1"}
    assert pod_allocation(result.pod, replicas=4, gpu_memory=80.0) == (0.25, 20.0)


def test_layout_keeps_the_physical_gpus_whether_or_not_it_shares() -> None:
    layout = Layout(nodes=8, gpus_per_node=8, mps_nodes=2, mps_replicas=4)
    assert sum(p.physical_gpus for p in layout.pools(shares=False)) == 64
    pools = layout.pools(shares=True)
    assert sum(p.physical_gpus for p in pools) == 64
    assert [(p.name, p.count, p.gpu_resource) for p in pools] == [
        ("gpu", 6, "nvidia.com/gpu"),
        ("mps", 2, "nvidia.com/gpu.shared"),
    ]


def test_the_terminal_table_shows_each_strategy_and_tenant_waits() -> None:
    hour = 3600.0
    records = [
        PodRecord("a", "algo-team", 1, created=0, gpus=2, bound=600, ended=hour),
        PodRecord(
            "b", "batch", 2, created=0, gpus=1, bound=3 * hour, ended=4 * hour, first_try=False
        ),
    ]
    outcomes = [
        RowOutcome(1, "algo-team", "training-job", 2 * hour, asked=2, progress=hour),
        RowOutcome(2, "batch", "katib-trial", hour, asked=1, progress=hour, completed=True),
    ]
    report = summarize(
        "mine",
        records,
        outcomes,
        physical_gpus=4,
        horizon=4 * hour,
        allocated=[(0, 0), (600, 2), (hour, 0), (3 * hour, 1), (4 * hour, 0)],
        busy=[(0, 0), (600, 1.8), (hour, 0), (3 * hour, 0.8)],
    )
    load = trace_load([(0, hour, 2), (0, hour, 1)], physical_gpus=4, horizon=4 * hour)
    lines = table([report], load).splitlines()
    assert lines[0] == (
        "trace: 3 GPU-hours offered = 19% of 4 GPUs' 16; peak demand 0.75x the GPUs "
        "(3 asked at once)"
    )
    assert lines[2].split()[:3] == ["strategy", "delivered", "GPU-h"]
    # 3 of 3 GPU-hours; 1 of 2 jobs; busy 1.8 x 50 min + 0.8 x 1 h of 16 GPU-hours.
    busy = (1.8 * 50 / 60 + 0.8) / 16
    alloc = (2 * 50 / 60 + 1) / 16
    assert lines[3].split() == [
        "mine", "3", "(100%)", "1/2", f"{busy:.0%}", f"{busy:.0%}", "0.0%", "-", "-",
        f"{alloc:.0%}", "42%", "-", "0", "0", "-", "0", "0",
    ]  # fmt: skip
    waits = lines.index("strategy                      algo-team                batch")
    assert lines[waits + 1].split() == ["mine", "10m", "/", "10m", "/", "10m", "3.0h", "/",
                                        "3.0h", "/", "3.0h"]  # fmt: skip
    assert "note: mine: waits are resolved to about 10m in this run" in "\n".join(lines)


def test_trace_rows_take_shares_busy_checkpoints_and_runs() -> None:
    rows = parse_trace(
        FULL_HEADER
        + "0,algo-team,notebook,nb,0.25,1h,1Gi,,,,,\n"
        + "0,data-team,kfp-step,data-loading,2,1h,1Gi,,0.2,,r1,\n"
        + "0,data-team,kfp-step,train,8,5h,1Gi,,,1h,r1,Tesla-T4;NVIDIA-A10\n",
        "t.csv",
        KNOWN,
    )
    nb, load, train = sorted(rows, key=lambda r: r.row)
    # A share asks one device; busy defaults to the kind's unless the share is lower.
    assert (nb.gpus, nb.devices, nb.busy, nb.batch) == (0.25, 1, 0.1, False)
    assert (load.busy, load.run, load.checkpoint) == (0.2, "r1", None)
    assert (train.busy, train.checkpoint, train.gpu_products) == (
        DEFAULT_BUSY["kfp-step"],
        3600.0,
        ("Tesla-T4", "NVIDIA-A10"),
    )
    assert parse_trace(trace_csv(rows), "again.csv", KNOWN) == rows


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["0,algo-team,notebook,a,1,1h,1Gi,,1.5,,,"], "row 1: busy '1.5' must be a number from 0"),
        (["0,algo-team,notebook,a,1,1h,1Gi,,x,,,"], "row 1: busy 'x' must be a number"),
        (["0,algo-team,training-job,a,1,1h,1Gi,,,0,,"], "row 1: checkpoint '0' must be above 0"),
        (
            ["2h,data-team,kfp-step,a,1,1h,1Gi,,,,r,", "1h,data-team,kfp-step,b,1,1h,1Gi,,,,r,"],
            "row 2: run 'r': at 3600s is before the step in row 1 (7200s)",
        ),
        (
            ["0,data-team,kfp-step,a,1,1h,1Gi,,,,r,", "1h,algo-team,kfp-step,b,1,1h,1Gi,,,,r,"],
            "row 2: run 'r': namespace 'algo-team' is not row 1's 'data-team'",
        ),
    ],
)
def test_bad_new_columns_are_named(rows: list[str], message: str) -> None:
    with pytest.raises(TraceError) as raised:
        parse_trace(FULL_HEADER + "".join(f"{r}\n" for r in rows), "t.csv", KNOWN)
    assert str(raised.value).startswith("t.csv: ")
    assert message in str(raised.value)


@pytest.mark.parametrize("generate", [busy_week, training_week, interactive_week])
def test_builtin_saturated_weeks_saturate_the_cluster(
    generate: Callable[[], list[TraceRow]],
) -> None:
    rows = generate()
    assert rows == generate(), "generated from a fixed seed"
    assert {r.namespace for r in rows} == set(NAMESPACES)
    load = trace_load(((r.at, r.duration, r.gpus) for r in rows), physical_gpus=64, horizon=WEEK)
    assert load.offered_load >= 0.9
    assert load.peak_demand >= 2
    hours_above = 0
    for hour in range(168):
        t = hour * 3600 + 1800
        asked = sum(r.gpus for r in rows if r.at <= t < r.at + r.duration)
        hours_above += asked >= 1.5 * 64
    assert hours_above >= 24, "demand at or above 1.5x for long stretches"
    # Every pipeline's training step follows its data-loading step in one run.
    runs = {r.run for r in rows if r.namespace == "data-team"}
    assert None not in runs and len(runs) * 2 == sum(r.namespace == "data-team" for r in rows)


def test_the_saturated_weeks_differ_in_their_mix() -> None:
    def share(rows: list[TraceRow], keep: Callable[[TraceRow], bool]) -> float:
        return sum(r.gpus * r.duration for r in rows if keep(r)) / sum(
            r.gpus * r.duration for r in rows
        )

    def large(r: TraceRow) -> bool:
        return r.gpus >= 4

    def interactive(r: TraceRow) -> bool:
        return r.kind in ("notebook", "kserve-predictor")

    busy, training, mixed = busy_week(), training_week(), interactive_week()
    assert share(training, large) > 0.7 > share(busy, large)
    assert share(mixed, interactive) > 0.3 > share(busy, interactive)
    assert sum(r.kind == "notebook" for r in mixed) == 5 * 60


def test_simulate_names_an_unknown_builtin_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", "builtin:month"]) == 2
    err = capsys.readouterr().err
    assert "--trace builtin:month: no such built-in trace (have builtin:week" in err
    assert main(["simulate", "--trace", "builtin:week", "--sample", "3"]) == 2
    assert "--sample: only for an Alibaba pod list" in capsys.readouterr().err


def test_a_notebook_row_ends_in_an_idle_tail_in_yaml_and_csv() -> None:
    text = (
        "rows:\n"
        "  - {at: 0, namespace: algo-team, kind: notebook, gpus: 1, duration: 6h, memory: 2Gi,"
        " idle: 2h, idle_busy: 0.01}\n"
        "  - {at: 1h, namespace: algo-team, kind: notebook, gpus: 1, duration: 3h, memory: 2Gi,"
        " idle: 0}\n"
    )
    tail, none = parse_trace(text, "t.yaml", KNOWN)
    assert (tail.idle, tail.idle_busy, tail.idle_from, tail.work_duration) == (
        7200.0,
        0.01,
        4 * 3600.0,
        4 * 3600.0,
    )
    assert (none.idle, none.idle_from, none.work_duration) == (0.0, None, 3 * 3600.0)
    csv_rows = parse_trace(
        FULL_HEADER + "0,algo-team,notebook,nb,1,6h,2Gi,,,,,,7200,\n", "t.csv", KNOWN
    )
    assert (csv_rows[0].idle, csv_rows[0].idle_busy) == (7200.0, 0.0)
    assert parse_trace(trace_csv([tail, none]), "again.csv", KNOWN) == [tail, none]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "0,algo-team,training-job,a,1,2h,1Gi,,,,,,1h,",
            "row 1: idle '1h': only notebook rows have an idle tail (this row is a training-job)",
        ),
        (
            "0,algo-team,notebook,a,1,2h,1Gi,,,,,,3h,",
            "row 1: idle '3h' must be from 0 to the row's",
        ),
        ("0,algo-team,notebook,a,1,2h,1Gi,,,,,,-1h,", "row 1: idle '-1h' must be from 0 to"),
        ("0,algo-team,notebook,a,1,2h,1Gi,,,,,,soon,", "row 1: 'soon' is not a duration"),
        ("0,algo-team,notebook,a,1,2h,1Gi,,,,,,,0.01", "row 1: idle_busy is the busy share of an"),
        ("0,algo-team,notebook,a,1,2h,1Gi,,,,,,1h,2", "row 1: idle_busy '2' must be a number from"),
        (
            "0,algo-team,notebook,a,1,2h,1Gi,,0.1,,,,1h,0.5",
            "row 1: idle_busy '0.5' is above the row's busy (0.1): idle keeps less busy",
        ),
    ],
)
def test_a_bad_idle_tail_is_named(row: str, message: str) -> None:
    with pytest.raises(TraceError) as raised:
        parse_trace(FULL_HEADER + row + "\n", "t.csv", KNOWN)
    assert str(raised.value).startswith("t.csv: ")
    assert message in str(raised.value)


@pytest.mark.parametrize("generate", [default_trace, busy_week, oversubscribed_week])
def test_builtin_weeks_leave_some_notebooks_open_after_their_work(
    generate: Callable[[], list[TraceRow]],
) -> None:
    rows = generate()
    notebooks = [r for r in rows if r.kind == "notebook"]
    tails = [r for r in notebooks if r.idle]
    assert all(r.idle == 0 for r in rows if r.kind != "notebook")
    # About half are closed when their work is done; the rest sit idle, some overnight.
    assert 0.35 <= len(tails) / len(notebooks) <= 0.65
    assert any(r.idle > 12 * 3600 for r in tails) and any(r.idle < 4 * 3600 for r in tails)
    assert all(r.idle_busy == 0 and r.work_duration > 0 for r in tails)
