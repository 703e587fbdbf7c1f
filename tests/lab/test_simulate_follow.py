"""`gpuwarden simulate --mps-nodes follow` (issue 33, item 4): the MPS pool follows demand
through `gpuwarden pool-controller` and the lab's device plugin emulation; what it refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.lab.cluster.controlplane import REPO_ROOT, Tools
from gpuwarden.lab.cluster.deviceplugin import Cordon, Move
from gpuwarden.lab.cluster.gpuwardenserver import POLICIES_DIR
from gpuwarden.lab.planning.follow import FollowPools, pools_policy_texts
from gpuwarden.lab.planning.strategies import builtin_strategies
from gpuwarden.lab.reporting.pools import pool_moves
from gpuwarden.policy import load_texts
from gpuwarden.policy.render.pools import pool_settings

from .conftest import simulate_json


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "simulate", "--horizon=1h", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
        timeout=180,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--mps-nodes=follow", "--only=no-governance,default-policy+kueue"),
            "--mps-nodes follow: default-policy+kueue: Kueue's quotas are per resource and fixed",
        ),
        (("--shared-headroom=8",), "--shared-headroom: only with --mps-nodes follow"),
        (
            ("--mps-nodes=follow", "--shared-headroom=-1"),
            "--shared-headroom must be 0 or more",
        ),
        (("--mps-nodes=follow", "--fill=1.3"), "--mps-nodes follow: --fill compares"),
        (("--mps-nodes=later",), "is not a number of nodes, auto, sweep or follow"),
    ],
)
def test_what_follow_refuses_is_a_usage_error_naming_it(
    args: tuple[str, ...], message: str
) -> None:
    result = _simulate(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_the_controllers_policy_has_pools_on_its_nvidia_backend_at_the_replays_clock() -> None:
    """The default policy as the lab runs it (Volcano simulated as nvidia), with pools whose
    holdSeconds are wall-clock seconds at the replay's time scale."""
    (strategy,) = [s for s in builtin_strategies(POLICIES_DIR) if s.name == "default-policy"]
    texts = pools_policy_texts(strategy.sources, 4, FollowPools(16), scale=1000.0)
    settings = pool_settings(load_texts(texts))
    assert settings is not None
    assert (settings.replicas, settings.shared_resource) == (4, "nvidia.com/gpu.shared")
    pools = settings.pools
    assert (pools.whole_config, pools.shared_config) == ("whole", "mps")
    assert pools.config_label == "nvidia.com/device-plugin.config"
    assert (pools.shared_headroom, pools.hold_seconds) == (16, 0.6)


# Two nodes of 2 GPUs: two 2-GPU jobs, then sixteen one-GPU predictors (16 MPS slices, both
# nodes' worth), then two 2-GPU jobs again. Auto makes one node an MPS node: 8 slices, so half
# the predictors would wait out their lifetime (at most 16 GPU-hours served); pools that follow
# demand move both nodes to MPS while the predictors run and back for the jobs.
FOLLOW_TRACE = "rows:\n" + "".join(
    [
        "  - {at: 0, namespace: algo-team, kind: training-job, name: first, gpus: 2, "
        "duration: 2h, memory: 40Gi}\n"
    ]
    * 2
    + [
        "  - {at: 3h, namespace: serving, kind: kserve-predictor, name: chat, gpus: 1, "
        "duration: 2h, memory: 12Gi}\n"
    ]
    * 16
    + [
        "  - {at: 6h, namespace: data-team, kind: training-job, name: second, gpus: 2, "
        "duration: 2h, memory: 40Gi}\n"
    ]
    * 2
)


@pytest.mark.e2e
def test_pools_follow_the_predictors_and_the_jobs(e2e_tools: Tools, tmp_path: Path) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text(FOLLOW_TRACE)
    body = simulate_json(
        f"--trace={trace}",
        "--only=default-policy",
        "--nodes=2",
        "--gpus-per-node=2",
        "--mps-nodes=follow",
        "--shared-headroom=0",
        "--real-time=30",
        "--horizon=9h",
        timeout=300,
    )
    assert body["layout"]["mpsNodes"] == "follow"
    (report,) = body["strategies"]
    moves = report["poolMoves"]
    assert moves["toShared"] >= 1 and moves["toWhole"] >= 1
    assert moves["sharedNodes"]["start"] == 1 and moves["sharedNodes"]["most"] == 2
    assert moves["sharedNodes"]["least"] == 0
    assert report["neverPlaced"] == 0
    # More served than the 8 slices of a fixed MPS node could (16 GPU-hours).
    assert report["tenants"]["serving"]["deliveredGpuHours"] > 20
    assert report["tenants"]["data-team"]["deliveredGpuHours"] == pytest.approx(8, rel=0.05)
    assert any("the pools followed demand" in note for note in report["notes"])


def test_what_the_pools_did_is_read_from_the_plugins_moves_and_the_cordons() -> None:
    """Two nodes moved to MPS an hour in (one at once, one drained for two hours) and one back
    at three hours; a drain that was cancelled. Clock: 100 simulated seconds per second."""
    hour = 3600.0
    at = [10.0 + t * hour / 100 for t in (1, 3, 4)]
    moves = [
        Move("a", "whole", "mps", at[0]),
        Move("b", "whole", "mps", at[1]),
        Move("a", "mps", "whole", at[2]),
    ]
    cordons = [
        Cordon("b", at[0], at[1], at[1]),
        Cordon("c", at[0], at[1], None),
    ]
    log = [{"msg": "pool move started"}, {"msg": "pool move finished"}, {"msg": "other"}]
    moved = pool_moves(
        moves, cordons, log, start=10.0, scale=100.0, horizon=6 * hour, shared_at_start=1
    )
    assert moved.nodes == {"a": 2, "b": 1}
    assert (moved.to_shared, moved.to_whole, moved.cancelled) == (2, 1, 1)
    assert moved.drains == pytest.approx((2 * hour,))
    # 1 node for an hour, 2 for two, 3 for one, 2 for two: 12 node-hours over 6.
    assert moved.shared_nodes == (1, pytest.approx(2.0), 1, 3)
    body = moved.as_json()
    assert body["controllerLog"] == {"started": 1, "finished": 1, "cancelled": 0}
    assert body["drainSeconds"]["p50"] == pytest.approx(2 * hour)
    assert moved.notes()[0] == (
        "the pools followed demand: MPS nodes 1 at the start, 2.0 on average, 1 to 3; 2 moves "
        "to the MPS pool, 1 to the whole-GPU pool, 1 cancelled"
    )
