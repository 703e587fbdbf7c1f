#!/usr/bin/env python3
"""A stand-in for nvidia-cuda-mps-control that speaks its stdin protocol (standard library only).

``fake_mps_control.py -d`` "starts the daemon": it writes its state and the
``nvidia-cuda-mps-control.pid`` file into $CUDA_MPS_PIPE_DIRECTORY. Without arguments it reads
commands from stdin, one per line, answers them on stdout and exits, as the real tool does.
Every invocation is appended to ``fake-mps-commands.log`` in the pipe directory.

It follows MPS's documented semantics closely enough to test against: defaults apply to servers
started later (a new server copies them), per-server limits apply to clients created afterwards (a
new client copies its server's), ``quit`` loses everything, and with no daemon every command
prints "Cannot find MPS control daemon process" and fails.

Test hooks (files in the pipe directory): ``fake-mps-fail`` (one command prefix per line: those
fail with status 1), ``fake-mps-hang`` (every command sleeps, for timeout tests). Tests start
servers and clients by editing ``fake-mps-state.json`` (see tests/node/mps_fake.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

STATE = "fake-mps-state.json"
LOG = "fake-mps-commands.log"
PID_FILE = "nvidia-cuda-mps-control.pid"
MEM_VALUE = re.compile(r"^[0-9]+[MG]$")


def pipe_dir() -> Path:
    value = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not value:
        # The real tool would fall back to /tmp/nvidia-mps; the fake insists, to catch callers
        # that forget the environment.
        print("CUDA_MPS_PIPE_DIRECTORY must be set", file=sys.stderr)
        sys.exit(3)
    return Path(value)


def record(directory: Path, line: str) -> None:
    with (directory / LOG).open("a") as handle:
        handle.write(line + "\n")


def load(directory: Path) -> dict | None:  # type: ignore[type-arg]
    try:
        return json.loads((directory / STATE).read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


def save(directory: Path, state: dict) -> None:  # type: ignore[type-arg]
    tmp = directory / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(directory / STATE)


def start_daemon(directory: Path) -> int:
    if not os.environ.get("CUDA_MPS_LOG_DIRECTORY"):
        print("CUDA_MPS_LOG_DIRECTORY must be set", file=sys.stderr)
        return 3
    record(directory, "-d")
    if load(directory) is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    previous = 0
    with contextlib.suppress(OSError, ValueError):
        previous = int((directory / "fake-mps-last-pid").read_text())
    pid = max(previous + 1, 4000)
    (directory / "fake-mps-last-pid").write_text(str(pid))
    save(
        directory,
        {"daemon_pid": pid, "default_threads": 100.0, "default_mem": {}, "servers": {}},
    )
    (directory / PID_FILE).write_text(f"{pid}\n")
    log_dir = Path(os.environ["CUDA_MPS_LOG_DIRECTORY"])
    with (log_dir / "control.log").open("a") as handle:
        handle.write(f"[fake] Starting control daemon using socket {directory}/control\n")
    return 0


class Failure(Exception):
    pass


def percentage(text: str) -> float:
    value = float(text)
    if not 0 < value <= 100:
        raise Failure(f"Invalid active thread percentage {text}")
    return value


def server_of(state: dict, pid: str) -> dict:  # type: ignore[type-arg]
    server = state["servers"].get(pid)
    if server is None:
        raise Failure(f"Server with PID {pid} not found")
    return server  # type: ignore[no-any-return]


def mem(text: str) -> str:
    if not MEM_VALUE.match(text):
        raise Failure(f"Invalid memory limit {text}")
    return text


def answer(state: dict, words: list[str]) -> str:  # type: ignore[type-arg]
    command, args = words[0], words[1:]
    if command == "get_server_list" and not args:
        return "".join(f"{pid}\n" for pid in sorted(state["servers"], key=int))
    if command == "get_client_list" and len(args) == 1:
        clients = server_of(state, args[0])["clients"]
        return "".join(f"{pid}\n" for pid in sorted(clients, key=int))
    if command == "get_default_active_thread_percentage" and not args:
        return f"{state['default_threads']:.1f}\n"
    if command == "set_default_active_thread_percentage" and len(args) == 1:
        state["default_threads"] = percentage(args[0])
        return ""
    if command == "get_active_thread_percentage" and len(args) == 1:
        return f"{server_of(state, args[0])['threads']:.1f}\n"
    if command == "set_active_thread_percentage" and len(args) == 2:
        server_of(state, args[0])["threads"] = percentage(args[1])
        return ""
    if command == "get_default_device_pinned_mem_limit" and len(args) == 1:
        return state["default_mem"].get(args[0], "0M") + "\n"
    if command == "set_default_device_pinned_mem_limit" and len(args) == 2:
        int(args[0])
        state["default_mem"][args[0]] = mem(args[1])
        return ""
    if command == "get_device_pinned_mem_limit" and len(args) == 2:
        return server_of(state, args[0])["mem"].get(args[1], "0M") + "\n"
    if command == "set_device_pinned_mem_limit" and len(args) == 3:
        int(args[1])
        server_of(state, args[0])["mem"][args[1]] = mem(args[2])
        return ""
    if command == "start_server" and len(args) == 2 and args[0] == "-uid":
        pid = str(int(state["daemon_pid"]) + 100 + len(state["servers"]))
        state["servers"][pid] = new_server(state, int(args[1]))
        return ""
    if command == "terminate_client" and len(args) == 2:
        clients = server_of(state, args[0])["clients"]
        if args[1] not in clients:
            raise Failure(f"Client {args[1]} not found")
        del clients[args[1]]
        state.setdefault("terminated", []).append([int(args[0]), int(args[1])])
        return ""
    raise Failure(f"Unrecognized command: {' '.join(words)}")


def new_server(state: dict, uid: int) -> dict:  # type: ignore[type-arg]
    return {
        "uid": uid,
        "threads": state["default_threads"],
        "mem": dict(state["default_mem"]),
        "clients": {},
    }


def main() -> int:
    directory = pipe_dir()
    if sys.argv[1:] == ["-d"]:
        return start_daemon(directory)
    if sys.argv[1:]:
        print(f"usage: {sys.argv[0]} [-d]", file=sys.stderr)
        return 2
    lines = [line.strip() for line in sys.stdin.read().splitlines() if line.strip()]
    for line in lines:
        record(directory, line)
    if (directory / "fake-mps-hang").exists():
        time.sleep(30)
    try:
        failing = (directory / "fake-mps-fail").read_text().split("\n")
    except OSError:
        failing = []
    state = load(directory)
    if state is None:
        print("Cannot find MPS control daemon process")
        return 1
    for line in lines:
        if any(prefix and line.startswith(prefix) for prefix in failing):
            print(f"Failed: {line}")
            return 1
        if line == "quit":
            (directory / STATE).unlink()
            (directory / PID_FILE).unlink(missing_ok=True)
            return 0
        try:
            sys.stdout.write(answer(state, line.split()))
        except (Failure, ValueError) as exc:
            print(str(exc))
            return 1
    save(directory, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
