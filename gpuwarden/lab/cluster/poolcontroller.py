"""``gpuwarden pool-controller`` as a subprocess against a lab control plane, as a cluster would
run it beside the device plugin (the lab runs no gpuwarden service in its own process,
``.importlinter``), and what its log says it did."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuwarden.lab.cluster.controlplane import ControlPlane, ControlPlaneError, Process

#: The controller's log lines for its moves (one JSON object per line on stderr).
MOVE_STARTED, MOVE_FINISHED, MOVE_CANCELLED = (
    "pool move started",
    "pool move finished",
    "pool move cancelled",
)


def pool_controller_argv(policies: Path, kubeconfig: Path, interval: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gpuwarden",
        "pool-controller",
        f"--policies={policies}",
        f"--kubeconfig={kubeconfig}",
        f"--interval={interval:g}",
    ]


def write_policies(directory: Path, texts: Sequence[tuple[str, str]]) -> Path:
    """The policy files in ``directory`` (one per source, in order), for ``--policies``."""
    directory.mkdir(parents=True, exist_ok=True)
    for index, (_, text) in enumerate(texts):
        (directory / f"{index:02d}.yaml").write_text(text)
    return directory


def start_pool_controller(plane: ControlPlane, policies: Path, interval: float) -> Process:
    """The controller against ``plane`` (the plane's stop() ends it, as its other processes)."""
    return plane.spawn(
        "pool-controller", pool_controller_argv(policies, plane.kubeconfig_path, interval)
    )


def check_running(process: Process) -> None:
    """ControlPlaneError, with its log's tail, when the controller exited."""
    code = process.popen.poll()
    if code is not None:
        raise ControlPlaneError(
            f"gpuwarden pool-controller exited with status {code}; log {process.log_path}:\n"
            f"{process.tail()}"
        )


def move_counts(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many moves the controller started, finished and cancelled."""
    return {
        word: sum(1 for r in records if r.get("msg") == msg)
        for word, msg in (
            ("started", MOVE_STARTED),
            ("finished", MOVE_FINISHED),
            ("cancelled", MOVE_CANCELLED),
        )
    }
