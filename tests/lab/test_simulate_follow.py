"""`gpuwarden simulate --mps-nodes follow` (issue 33, item 4): the MPS pool follows demand
through `gpuwarden pool-controller` and the lab's device plugin emulation; what it refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuwarden.lab.cluster.controlplane import REPO_ROOT


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
