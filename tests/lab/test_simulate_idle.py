"""`gpuwarden simulate` replays idle notebooks on real labs (issue 31, item 6): the idle rule
stops a notebook whose tail outlasts it, and the scheduler gives its GPU to a waiting pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.lab.cluster.controlplane import Tools
from gpuwarden.lab.replay.ledger import DETECTION_INTERVAL

from .conftest import simulate_json

pytestmark = pytest.mark.e2e

# Notebooks keep whole GPUs; their profile stops them after an hour below 5% busy.
POLICY = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: idle-lab}
spec:
  backend: {type: nvidia}
  profiles:
    - {name: notebook, gpuShare: false, maxMemory: 80Gi, idle: {after: 1h, below: 5%, action: stop}}
    - {name: whole, gpuShare: false, maxMemory: 80Gi}
  workloads:
    - {name: notebooks, match: {kind: notebook}, profile: notebook, requireGpuRequest: true}
  defaultProfile: whole
  tenants:
    - name: kubeflow-profiles
      namespaceSelector:
        matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}
"""

# Two nodes of one GPU. Both notebooks work for an hour and are left open for three; the first
# sits at busy 0, the second keeps 10% of its GPU busy (not idle by the rule). A one-hour
# training job arrives at 30m and waits for a GPU.
TRACE = """\
rows:
  - {at: 0, namespace: algo-team, kind: notebook, name: idle, gpus: 1, duration: 4h, memory: 4Gi, idle: 3h}
  - {at: 0, namespace: algo-team, kind: notebook, name: busy, gpus: 1, duration: 4h, memory: 4Gi, busy: 0.2, idle: 3h, idle_busy: 0.1}
  - {at: 30m, namespace: data-team, kind: training-job, name: job, gpus: 1, duration: 1h, memory: 40Gi}
"""


def test_an_idle_notebook_is_stopped_and_its_gpu_goes_to_the_waiting_job(
    e2e_tools: Tools, tmp_path: Path
) -> None:
    trace, policy = tmp_path / "trace.yaml", tmp_path / "idle.yaml"
    trace.write_text(TRACE)
    policy.write_text(POLICY)
    body = simulate_json(
        f"--trace={trace}",
        f"--policies=idle={policy}",
        "--only=no-governance,idle,idle-no-idle",
        "--real-time=30",
        "--nodes=2",
        "--gpus-per-node=1",
        "--mps-nodes=0",
        "--horizon=4h",
    )
    # The idle tails are not offered work: 1h of each notebook and the job's hour.
    assert body["offeredGpuHours"] == pytest.approx(3)
    reports = {s["strategy"]: s for s in body["strategies"]}
    stopping, kept, free = reports["idle"], reports["idle-no-idle"], reports["no-governance"]
    # The idle notebook is stopped 1h into its tail (plus the agent's pass), at 2h: the
    # scheduler binds the job on its GPU, an hour and a half after it arrived.
    stop = 2 * 3600 + DETECTION_INTERVAL
    assert stopping["idleStopped"] == 1
    assert stopping["waitSecondsByKind"]["training-job"]["p50"] == pytest.approx(
        stop - 1800, abs=300
    )
    assert stopping["jobsCompleted"] == 1
    # Held idle: the idle one's hour (and the pass), the busy one's three hours; given back:
    # the idle one's last two hours.
    assert stopping["idleGpuHoursHeld"] == pytest.approx(4, abs=0.1)
    assert stopping["idleGpuHoursReturned"] == pytest.approx(2, abs=0.1)
    # Without the rule (or without governance) both hold their GPUs to the end, and the job
    # never runs.
    for other in (kept, free):
        assert (other["idleStopped"], other["idleGpuHoursReturned"]) == (0, 0)
        assert other["idleGpuHoursHeld"] == pytest.approx(6, abs=0.1)
        assert (other["jobsCompleted"], other["neverPlaced"]) == (0, 1)
