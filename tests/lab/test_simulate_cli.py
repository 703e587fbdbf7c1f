"""`gpuwarden simulate` (issue 21, item 9): Ctrl-C stops it even where SIGINT was ignored at
start, the plot's waits are in the table's unit, and its notes are whole sentences."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from gpuwarden.lab.planning.strategies import DRA_APPROXIMATION, builtin_strategies
from gpuwarden.lab.reporting.plot import wait_minutes
from gpuwarden.lab.reporting.report import StrategyReport, table

ROOT = Path(__file__).resolve().parents[2]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what nohup, `&` and some CI runners do


def test_ctrl_c_stops_simulate_started_with_sigint_ignored(tmp_path: Path) -> None:
    trace = tmp_path / "trace.yaml"
    os.mkfifo(trace)  # simulate blocks reading it: a replay that has not finished
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "simulate", "--trace", str(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    opened: list[int] = []
    try:
        # Opening the write end waits for simulate to open the read end: it is running.
        opener = threading.Thread(target=lambda: opened.append(os.open(trace, os.O_WRONLY)))
        opener.start()
        opener.join(timeout=60)
        assert opened, "simulate never opened its trace"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        for fd in opened:
            os.close(fd)
    assert process.returncode == 130, err
    assert "Traceback" not in err


def _report(
    waits: dict[str, dict[str, float | int | None]], notes: tuple[str, ...] = ()
) -> StrategyReport:
    return StrategyReport(
        strategy="s",
        physical_gpus=8,
        horizon=7200.0,
        bucket=3600.0,
        allocation=(0.5, 0.5),
        average_allocation=0.5,
        busy=(0.25, 0.25),
        gpu_busy_average=0.25,
        pending=(0.0, 0.0),
        memory_used_share=None,
        waits=waits,
        wait_resolution=None,
        kind_waits={},
        offered_gpu_hours=8.0,
        delivered_gpu_hours=8.0,
        lost_gpu_hours=0.0,
        jobs_completed=1,
        jobs=1,
        degraded_service_share=None,
        tenants={},
        kinds={},
        preemptions=0,
        never_placed=0,
        refused=0,
        pods=1,
        notes=notes,
    )


def test_plot_waits_are_in_minutes_like_the_table() -> None:
    report = _report({"team-a": {"p50": 90, "p95": 1800, "p99": None}})
    assert wait_minutes(report, ["team-a", "team-b"], "p95") == [30.0, 0.0]
    assert wait_minutes(report, ["team-a"], "p50") == [1.5]
    assert "30m" in table([report])


def test_lab_backend_note_is_a_whole_sentence_and_printed_whole() -> None:
    strategies = {s.name: s for s in builtin_strategies(ROOT / "policies")}
    (note,) = [n for n in strategies["default-policy"].notes if "backend volcano" in n]
    assert note.endswith("; the volcano scheduler itself is not run")
    assert table([_report({}, (note,))]).splitlines()[-1] == f"note: s: {note}"


def test_dra_notes_say_what_is_replayed_and_are_printed_whole() -> None:
    strategies = {s.name: s for s in builtin_strategies(ROOT / "policies", "dra")}
    notes = strategies["default-policy"].notes
    assert [n for n in notes if "backend volcano replayed as dra" in n]
    assert DRA_APPROXIMATION in notes
    assert table([_report({}, notes)]).splitlines()[-1] == f"note: s: {DRA_APPROXIMATION}"
