"""`gpuwarden simulate --mps-nodes sweep` (issue 33, item 4): a sharing strategy replayed once
per pool split, two labs at a time, and the split recommended from what they measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.lab.cluster.controlplane import REPO_ROOT, Tools

from .conftest import simulate_json

# Three nodes of 2 GPUs. Four one-GPU Katib trials and a predictor share one node's GPUs under
# the default policy (5 slices of 8); two 2-GPU PyTorchJobs arrive an hour in, each wanted for
# longer than the replay. One MPS node leaves both jobs a whole node; two leave one of them
# waiting to the end.
TRACE = """\
rows:
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 20Gi}
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 20Gi}
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 20Gi}
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 10h, memory: 20Gi}
  - {at: 0, namespace: serving, kind: kserve-predictor, name: chat, gpus: 1, duration: 4h, memory: 12Gi}
  - {at: 1h, namespace: algo-team, kind: training-job, name: one, gpus: 2, duration: 10h, memory: 40Gi}
  - {at: 1h, namespace: data-team, kind: training-job, name: two, gpus: 2, duration: 10h, memory: 40Gi}
"""


@pytest.mark.e2e
def test_sweep_replays_each_split_and_recommends_the_one_that_leaves_whole_nodes(
    e2e_tools: Tools, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text(TRACE)
    body = simulate_json(
        f"--trace={trace}",
        "--only=no-governance,default-policy",
        "--real-time=20",
        "--nodes=3",
        "--gpus-per-node=2",
        "--mps-nodes=sweep:1,2",
        "--horizon=4h",
        timeout=300,
    )
    reports = {s["strategy"]: s for s in body["strategies"]}
    assert sorted(reports) == ["default-policy@1", "default-policy@2", "no-governance"]
    assert any("a split of the sweep" in n for n in reports["default-policy@2"]["notes"])
    # Each split says what its one service, the predictor's quarter slice, has beside it.
    services = "services (notebooks, predictors) at its shares, each from its arrival: at most "
    assert (
        services + "0.25 GPUs at once (4% of the 6); its MPS nodes have 2"
        in (reports["default-policy@1"]["notes"])
    )
    assert (
        services + "0.25 GPUs at once (4% of the 6); its MPS nodes have 4"
        in (reports["default-policy@2"]["notes"])
    )
    (sweep,) = body["mpsSweep"]
    assert sweep["strategy"] == "default-policy"
    one, two = sweep["splits"]
    assert (one["mpsNodes"], one["mpsGpus"], two["mpsNodes"], two["mpsGpus"]) == (1, 2, 2, 4)
    # Two MPS nodes: one job never placed, its tenant gets none of its work.
    assert (one["neverPlaced"], two["neverPlaced"]) == (0, 1)
    assert two["deliveredGpuHours"] < one["deliveredGpuHours"] - 4
    assert sweep["recommendedMpsNodes"] == 1
    assert sweep["reason"].startswith("1 MPS nodes (2 GPUs): ")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("sweep:x", "write sweep:N,N,..."),
        ("sweep:0,2", "each count must be 1 or more"),
        ("sweep:2,9", "the lab has 8 nodes"),
    ],
)
def test_a_bad_sweep_is_a_usage_error_naming_it(value: str, message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "simulate", f"--mps-nodes={value}", "--horizon=1h"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
