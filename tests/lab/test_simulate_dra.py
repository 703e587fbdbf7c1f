"""`gpuwarden simulate --stand-in dra` (issue 33): Volcano and HAMi policies replayed on DRA nodes,
where any GPU is shared or whole, allocated by the real kube-scheduler."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.lab.cluster.controlplane import REPO_ROOT, Tools
from gpuwarden.lab.planning.strategies import DRA_APPROXIMATION

from .conftest import simulate_json

# One node of 2 GPUs, for 4 hours: two notebooks and a one-GPU training job arrive at once. With
# no governance each takes a whole GPU, so the job (created last) waits all 4 hours. The default
# policy (backend volcano, replayed as dra) gives each notebook a fifth of a GPU by cores (its
# threadPercentage, 20): both share one device and the job runs on the other for its 2 hours.
TRACE = """\
rows:
  - {at: 0, namespace: algo-team, kind: notebook, name: nb, gpus: 1, duration: 4h, memory: 8Gi}
  - {at: 0, namespace: algo-team, kind: notebook, name: nb, gpus: 1, duration: 4h, memory: 8Gi}
  - {at: 60, namespace: algo-team, kind: training-job, name: train, gpus: 1, duration: 2h, memory: 30Gi}
"""
LAYOUT = ["--nodes=1", "--gpus-per-node=2", "--horizon=4h", "--stand-in=dra"]


def _refused(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "simulate", "--trace=builtin:busy-week", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def test_dra_refuses_mps_nodes_and_tenant_queues_saying_why() -> None:
    assert "there are no MPS nodes" in _refused("--stand-in=dra", "--mps-nodes=follow")
    assert "there are no MPS nodes" in _refused("--stand-in=dra", "--mps-nodes=2")
    assert "has no MPS nodes" in _refused("--stand-in=dra", "--fill=1.3")
    assert "do not count DRA claims" in _refused("--stand-in=dra", "--only=default-policy+kueue")


@pytest.mark.e2e
def test_dra_shares_notebooks_by_cores_and_leaves_a_whole_gpu_for_the_job(
    e2e_tools: Tools, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text(TRACE)
    body = simulate_json(
        f"--trace={trace}", "--only=no-governance,default-policy", "--real-time=20", *LAYOUT
    )
    assert body["layout"]["standIn"] == "dra"
    assert body["layout"]["mpsNodes"] == 0
    reports = {s["strategy"]: s for s in body["strategies"]}
    free, governed = reports["no-governance"], reports["default-policy"]
    # No governance: the notebooks hold both GPUs whole; the job never runs.
    assert free["neverPlaced"] == 1
    assert free["averageAllocation"] == pytest.approx(1.0, abs=0.05)
    assert free["deliveredGpuHours"] == pytest.approx(8, abs=0.2)
    # The default policy: both notebooks on one device (a fifth each), the job on the other.
    assert governed["neverPlaced"] == 0
    assert governed["deliveredGpuHours"] == pytest.approx(10, abs=0.3)
    assert governed["averageAllocation"] == pytest.approx((2 * 0.2 * 4 + 2) / 8, abs=0.05)
    assert governed["preemptions"] == 0
    assert DRA_APPROXIMATION in governed["notes"]


# Three nodes of 2 GPUs: six notebooks arrive at once, two 2-GPU training jobs a minute later. The
# stand-in's shares prefer the one node their peak needs (1.2 GPUs), labelled for them: the
# notebooks' pods carry the preferred node affinity (a malformed one is refused at creation),
# gather there, and each job gets a node whole. (kube-scheduler breaks ties between equal nodes
# in a fixed order, so on this small trace the notebooks gather without the preference too: the
# busy week measures what it changes, docs/simulate.md.)
SPREAD_TRACE = (
    "rows:\n"
    + "".join(
        f"  - {{at: 0, namespace: algo-team, kind: notebook, name: nb{i}, gpus: 1, duration: 4h, "
        "memory: 8Gi}\n"
        for i in range(6)
    )
    + "".join(
        f"  - {{at: 60, namespace: data-team, kind: training-job, name: train{i}, gpus: 2, "
        "duration: 2h, memory: 30Gi}\n"
        for i in range(2)
    )
)


@pytest.mark.e2e
def test_dra_shares_gather_on_the_nodes_sized_for_them_and_jobs_get_whole_nodes(
    e2e_tools: Tools, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text(SPREAD_TRACE)
    body = simulate_json(
        f"--trace={trace}",
        "--only=default-policy",
        "--real-time=20",
        "--nodes=3",
        "--gpus-per-node=2",
        "--horizon=4h",
        "--stand-in=dra",
    )
    (governed,) = body["strategies"]
    assert (
        "nodes its shares prefer sized to its shared demand: 1 of 3, 2 GPUs (shares of at most "
        "1.2 GPUs at once; whole-GPU pods ask at most 4 GPUs at once)"
    ) in governed["notes"]
    assert governed["neverPlaced"] == 0
    # Both jobs ran their 2 hours on 2 GPUs each as soon as they arrived.
    assert governed["tenants"]["data-team"]["deliveredGpuHours"] == pytest.approx(8, abs=0.3)
    assert governed["waitSeconds"]["data-team"]["p95"] < 15 * 60
