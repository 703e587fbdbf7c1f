"""Driving tests/node/fake_mps_control.py from a test: its state, its record, its failure hooks.

Servers and clients appear here the way MPS makes them appear: a server copies the daemon's
defaults when it starts, a client copies its server's limits when it connects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("fake_mps_control.py")
QUERIES = (
    "get_server_list",
    "get_client_list",
    "get_default_active_thread_percentage",
    "get_active_thread_percentage",
    "get_default_device_pinned_mem_limit",
    "get_device_pinned_mem_limit",
)


def install(directory: Path, interpreter: str) -> Path:
    """Copy the fake as an executable named like the real tool, run by ``interpreter``.

    ``-S`` (no site import) keeps each spawn to a few milliseconds; the fake needs only the
    standard library.
    """
    body = SOURCE.read_text().split("\n", 1)[1]
    target = directory / "nvidia-cuda-mps-control"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"#!{interpreter} -S\n{body}")
    target.chmod(0o755)
    return target


class FakeMps:
    def __init__(self, pipe_dir: Path) -> None:
        self.pipe_dir = pipe_dir

    @property
    def state_path(self) -> Path:
        return self.pipe_dir / "fake-mps-state.json"

    def running(self) -> bool:
        return self.state_path.exists()

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.state_path.read_text())
        return data

    def _save(self, state: dict[str, Any]) -> None:
        self.state_path.write_text(json.dumps(state))

    def log(self) -> list[str]:
        path = self.pipe_dir / "fake-mps-commands.log"
        return path.read_text().splitlines() if path.exists() else []

    def changes(self) -> list[str]:
        """Recorded commands, queries left out."""
        return [line for line in self.log() if not line.startswith(QUERIES)]

    def clear_log(self) -> None:
        (self.pipe_dir / "fake-mps-commands.log").unlink(missing_ok=True)

    def add_server(self, pid: int, uid: int) -> None:
        state = self.state()
        state["servers"][str(pid)] = {
            "uid": uid,
            "threads": state["default_threads"],
            "mem": dict(state["default_mem"]),
            "clients": {},
        }
        self._save(state)

    def add_client(self, server: int, pid: int) -> dict[str, Any]:
        state = self.state()
        entry = state["servers"][str(server)]
        client = {"threads": entry["threads"], "mem": dict(entry["mem"])}
        entry["clients"][str(pid)] = client
        self._save(state)
        return client

    def server(self, pid: int) -> dict[str, Any]:
        entry: dict[str, Any] = self.state()["servers"][str(pid)]
        return entry

    def crash(self) -> None:
        """The daemon dies: its state and pid file go, as after a quit."""
        self.state_path.unlink()
        (self.pipe_dir / "nvidia-cuda-mps-control.pid").unlink(missing_ok=True)

    def fail(self, *prefixes: str) -> None:
        (self.pipe_dir / "fake-mps-fail").write_text("\n".join(prefixes))

    def hang(self) -> None:
        (self.pipe_dir / "fake-mps-hang").write_text("")
