"""`gpuwarden simulate` end to end: a small trace replayed on real labs, and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.lab.cluster.controlplane import REPO_ROOT, Tools
from gpuwarden.lab.cluster.gpuwardenserver import (
    wait_for,
)

from .conftest import LAB_POLICIES, simulate_json

pytestmark = pytest.mark.e2e

# One node of 2 GPUs. Two Katib trials (no checkpoints) take both for longer than the replay; an
# hour later a KServe predictor arrives, wanted for two hours. Under the lab policy (inference
# 300, batch-hpo 10) the scheduler preempts a trial for it; Katib recreates the trial, which waits
# until the predictor's lifetime ends and starts again from zero. With no governance the
# predictor never gets a GPU.
TRACE = """\
rows:
  - {at: 0, namespace: algo-team, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 30Gi}
  - {at: 0, namespace: algo-team, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 30Gi}
  - {at: 1h, namespace: serving, kind: kserve-predictor, name: chat, gpus: 1, duration: 2h, memory: 12Gi}
"""
LAYOUT = ["--nodes=1", "--gpus-per-node=2", "--mps-nodes=0", "--horizon=4h"]


def _simulate(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuwarden", "simulate", *args]


def test_replay_measures_preemption_and_unplaced_pods(e2e_tools: Tools, tmp_path: Path) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text(TRACE)
    body = simulate_json(
        f"--trace={trace}",
        f"--policies=lab={LAB_POLICIES}",
        "--only=no-governance,lab",
        "--real-time=20",
        *LAYOUT,
    )
    # 2 trials x 10 h + the predictor's 2 h; 5 GPUs asked at once on 2.
    assert (body["offeredGpuHours"], body["peakDemand"]) == (22, 1.5)
    reports = {s["strategy"]: s for s in body["strategies"]}
    free, governed = reports["no-governance"], reports["lab"]
    assert (free["preemptions"], free["neverPlaced"]) == (0, 1)
    # The recreated trial was placed again once the predictor ended.
    assert (governed["preemptions"], governed["neverPlaced"]) == (1, 0)
    (victim,) = governed["preemptedPods"]
    assert (victim["kind"], victim["attempt"], victim["evictedBy"]) == (
        "katib-trial",
        1,
        "scheduler",
    )
    assert victim["lostGpuHours"] == pytest.approx(governed["lostGpuHours"])
    assert free["preemptedPods"] == []
    # The predictor waited well under an hour of the trace's time for its GPU; with no
    # governance it waited its whole two-hour lifetime.
    assert governed["waitSeconds"]["serving"]["p95"] < 3600
    assert free["waitSeconds"]["serving"]["p95"] == pytest.approx(7200, abs=60)
    # No governance: both trials ran all 4 hours (8 GPU-hours of work), no service.
    assert free["deliveredGpuHours"] == pytest.approx(8, abs=0.1)
    assert free["tenants"]["serving"]["deliveredGpuHours"] == 0
    # Governed: the victim's first hour is lost, it runs again from 3 h to 4 h; one trial runs
    # 4 h; the predictor serves about 2 h: 7 GPU-hours, 1 lost.
    assert governed["lostGpuHours"] == pytest.approx(1, abs=0.15)
    assert governed["deliveredGpuHours"] == pytest.approx(7, abs=0.2)
    assert governed["tenants"]["serving"]["deliveredGpuHours"] == pytest.approx(2, abs=0.2)
    # Both GPUs held nearly all the time either way; trials keep them busy 0.8, the predictor
    # 0.3.
    assert free["averageAllocation"] == pytest.approx(1.0, abs=0.05)
    assert governed["averageAllocation"] == pytest.approx(1.0, abs=0.05)
    assert free["gpuBusyAverage"] == pytest.approx(0.8, abs=0.02)
    assert governed["gpuBusyAverage"] == pytest.approx((0.8 * 2 * 4 - 0.5 * 2) / 8, abs=0.05)
    assert governed["waitResolutionSeconds"] < 15 * 60


def _beside_no_governance(
    tmp_path: Path, rows: str, *, gpus_per_node: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """No governance's and the default policy's reports of the trace, replayed in one run on two
    nodes (MPS nodes sized by the default policy's shared demand) for 4 hours."""
    trace = tmp_path / "trace.yaml"
    trace.write_text(rows)
    body = simulate_json(
        f"--trace={trace}",
        "--only=no-governance,default-policy",
        "--real-time=20",
        "--nodes=2",
        f"--gpus-per-node={gpus_per_node}",
        "--mps-nodes=auto",
        "--horizon=4h",
    )
    reports = {s["strategy"]: s for s in body["strategies"]}
    return reports["no-governance"], reports["default-policy"]


# Two nodes of 2 GPUs; the default policy's sizing gets 1 MPS node (4 replicas per GPU). Four
# one-GPU Katib trials and a one-GPU predictor arrive at once, a 2-GPU PyTorchJob an hour later.
# The default policy shares the light ones (trials under a 25% SM cap, the predictor under 50%):
# five slices of one node, so the job finds the other node whole. Without governance the five
# take four whole GPUs: one waits, and the job never starts.
LIGHT_WORK_TRACE = """\
rows:
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 20Gi}
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 20Gi}
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 20Gi}
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 20Gi}
  - {at: 0, namespace: serving, kind: kserve-predictor, name: chat, gpus: 1, duration: 4h, memory: 12Gi}
  - {at: 1h, namespace: algo-team, kind: training-job, name: experiment, gpus: 2, duration: 2h, memory: 40Gi}
"""


def test_default_policy_shares_light_work_and_keeps_a_node_whole(
    e2e_tools: Tools, tmp_path: Path
) -> None:
    free, default = _beside_no_governance(tmp_path, LIGHT_WORK_TRACE, gpus_per_node=2)
    assert any("MPS nodes sized to its shared demand: 1" in note for note in default["notes"])
    # The one service, the predictor: a quarter slice under the policy, a whole GPU without it.
    services = "services (notebooks, predictors) at its shares, each from its arrival: at most "
    assert services + "0.25 GPUs at once (6% of the 4); its MPS nodes have 2" in default["notes"]
    assert services + "1 GPU at once (25% of the 4)" in free["notes"]
    assert (default["neverPlaced"], default["preemptions"], default["refused"]) == (0, 0, 0)
    assert default["waitSecondsByKind"]["training-job"]["p95"] < 30 * 60
    assert default["waitSecondsByKind"]["kserve-predictor"]["p95"] < 30 * 60
    assert default["tenants"]["algo-team"]["deliveredGpuHours"] == pytest.approx(4, abs=0.2)
    # Four whole GPUs for five one-GPU pods: one of them and the job never get in.
    assert (free["neverPlaced"], free["preemptions"]) == (2, 0)
    assert free["tenants"]["algo-team"]["deliveredGpuHours"] == 0


# Two nodes of 8 GPUs, each held by two 4-GPU PyTorchJobs (checkpoints every 30 minutes) for
# longer than the replay; an hour in, an 8-GPU job arrives for two hours. The default policy ranks
# training of more than 4 GPUs above smaller training: the scheduler preempts the two jobs of one
# node for it, and they are recreated and wait. Without governance it waits for a node that never
# comes free.
WHOLE_NODE_TRACE = """\
rows:
  - {at: 0, namespace: algo-team, kind: training-job, name: small, gpus: 4, duration: 10h, memory: 40Gi, checkpoint: 30m}
  - {at: 0, namespace: algo-team, kind: training-job, name: small, gpus: 4, duration: 10h, memory: 40Gi, checkpoint: 30m}
  - {at: 0, namespace: algo-team, kind: training-job, name: small, gpus: 4, duration: 10h, memory: 40Gi, checkpoint: 30m}
  - {at: 0, namespace: algo-team, kind: training-job, name: small, gpus: 4, duration: 10h, memory: 40Gi, checkpoint: 30m}
  - {at: 1h, namespace: data-team, kind: training-job, name: large, gpus: 8, duration: 2h, memory: 60Gi, checkpoint: 1h}
"""


def test_default_policy_lets_a_whole_node_job_preempt_smaller_training(
    e2e_tools: Tools, tmp_path: Path
) -> None:
    free, default = _beside_no_governance(tmp_path, WHOLE_NODE_TRACE, gpus_per_node=8)
    # One node's two 4-GPU jobs make room; they come back once the 8-GPU job is done.
    assert (default["preemptions"], default["neverPlaced"], default["refused"]) == (2, 0, 0)
    assert default["waitSeconds"]["data-team"]["p95"] < 30 * 60
    assert default["tenants"]["data-team"]["deliveredGpuHours"] == pytest.approx(16, abs=0.5)
    # The victims lose at most the half hour since their last checkpoint.
    assert 0 < default["lostGpuHours"] <= 2 * 4 * 0.5 + 0.1
    # The busy time spent on that lost work (the jobs keep their GPUs 0.9 busy) is redone, not
    # useful: 16 GPUs for 4 hours.
    redone = default["gpuBusyRedoneAverage"] * 16 * 4
    assert redone == pytest.approx(0.9 * default["lostGpuHours"], rel=0.05)
    assert default["gpuBusyUsefulAverage"] == pytest.approx(
        default["gpuBusyAverage"] - default["gpuBusyRedoneAverage"]
    )
    assert (free["preemptions"], free["neverPlaced"]) == (0, 1)
    assert free["tenants"]["data-team"]["deliveredGpuHours"] == 0


def _descendants(pid: int) -> set[int]:
    """Processes whose parent chain reaches ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "Z" not in (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:1])
    )


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_ctrl_c_stops_every_process_it_started(e2e_tools: Tools, tmp_path: Path) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text(TRACE)
    process = subprocess.Popen(
        _simulate(f"--trace={trace}", "--only=no-governance", "--real-time=120", *LAYOUT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    try:
        names = {"etcd", "kube-apiserver", "kube-scheduler", "kwok"}

        def lab_started() -> set[int] | None:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            children = _descendants(process.pid)
            running = {_comm(pid) for pid in children if _alive(pid)}
            return children if names <= running else None

        children = wait_for("the lab's processes to start", lab_started, 90)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
        assert process.stderr is not None
        assert "Traceback" not in process.stderr.read().decode()
        assert not [pid for pid in children if _alive(pid)], "every lab process was stopped"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
