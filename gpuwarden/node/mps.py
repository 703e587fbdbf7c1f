"""The CUDA MPS control daemon behind a small interface.

``ProcessMpsControl`` drives the real ``nvidia-cuda-mps-control``: ``-d`` starts the control daemon
in the background; every command is one short-lived ``nvidia-cuda-mps-control`` process that reads
the command on its stdin, prints the reply and exits, which is how the tool is meant to be used
(``echo get_server_list | nvidia-cuda-mps-control``). Both need ``CUDA_MPS_PIPE_DIRECTORY`` (and
``CUDA_MPS_LOG_DIRECTORY``) to name the directories shared with the pods.

Semantics that the agent is built around (NVIDIA's MPS documentation):

* ``set_default_*`` values apply to MPS servers spawned later and are lost on ``quit`` (so after a
  daemon restart they must be set again);
* ``set_device_pinned_mem_limit <server-PID> <dev> <value>`` and
  ``set_active_thread_percentage <server-PID> <pct>`` change one running server and apply to the
  clients it creates afterwards; existing clients keep what they got;
* there is one MPS server per user ID at a time, and limits apply per client process;
* memory values are an integer with ``M`` or ``G`` (MiB, GiB); the agent always writes ``<MiB>M``.

NVIDIA's device plugin drives its daemon with the same commands: ``nvidia-cuda-mps-control -d``,
then ``set_default_device_pinned_mem_limit <index> <total/replicas>M`` per device and
``set_default_active_thread_percentage <100/replicas>``, and ``get_default_active_thread_percentage``
as its health check (NVIDIA/k8s-device-plugin ``cmd/mps-control-daemon/mps/daemon.go``). Its
daemon's directories are ``<root>/<resource>/pipe`` and ``<root>/<resource>/log``
(``cmd/mps-control-daemon/mps/root.go``), where the root is its chart's ``mps.root``
(``/run/nvidia/mps``) and the resource the one its replicas are advertised as
(``nvidia.com/gpu``, or ``nvidia.com/gpu.shared`` with ``renameByDefault``); its pods get that
pipe directory mounted and named in ``CUDA_MPS_PIPE_DIRECTORY`` (``internal/plugin/mps.go``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuwarden.policy.pod import keys

PID_FILE = "nvidia-cuda-mps-control.pid"
NO_DAEMON = "Cannot find MPS control daemon process"
_SAFE_COMMAND = re.compile(r"^[a-z_]+(?: [0-9A-Za-z_.-]+)*$")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


#: NVIDIA's device plugin chart's mps.root (deployments/helm/nvidia-device-plugin/values.yaml).
DEVICE_PLUGIN_ROOT = keys.DEFAULT_MPS_PIPE_DIRECTORY
#: The resource the device plugin advertises MPS replicas as unless renameByDefault is set.
DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"
_RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


@dataclass(frozen=True)
class MpsDirectories:
    pipe: Path
    log: Path


def device_plugin_directories(root: Path, resource: str) -> MpsDirectories:
    """Where the device plugin's control daemon for ``resource`` talks and logs:
    ``<root>/<resource>/pipe`` and ``<root>/<resource>/log``."""
    if not _RESOURCE_NAME.match(resource) or ".." in resource:
        raise ValueError(
            f"{resource!r} is not an extended resource name such as nvidia.com/gpu.shared"
        )
    return MpsDirectories(pipe=root / resource / "pipe", log=root / resource / "log")


_DEFAULTS = device_plugin_directories(Path(DEVICE_PLUGIN_ROOT), DEVICE_PLUGIN_RESOURCE)


class MpsError(Exception):
    """A control command failed; the message names the command and what the tool printed."""


class MpsUnavailable(MpsError):
    """No control daemon answers on the pipe directory."""


class MpsControl(Protocol):
    def start_daemon(self) -> None: ...

    def send(self, command: str) -> str: ...

    def daemon_pid(self) -> int | None: ...


# --- commands (pure) ----------------------------------------------------------------------


def mem_value(mib: int) -> str:
    if mib < 1:
        raise ValueError(f"an MPS pinned-memory limit must be at least 1 MiB, not {mib}")
    return f"{mib}M"


def set_default_mem(device: int, mib: int) -> str:
    return f"set_default_device_pinned_mem_limit {device} {mem_value(mib)}"


def set_server_mem(server: int, device: int, mib: int) -> str:
    return f"set_device_pinned_mem_limit {server} {device} {mem_value(mib)}"


def _percentage(value: int) -> int:
    if not 1 <= value <= 100:
        raise ValueError(f"an MPS active thread percentage must be 1-100, not {value}")
    return value


def set_default_threads(percentage: int) -> str:
    return f"set_default_active_thread_percentage {_percentage(percentage)}"


def set_server_threads(server: int, percentage: int) -> str:
    return f"set_active_thread_percentage {server} {_percentage(percentage)}"


def get_client_list(server: int) -> str:
    return f"get_client_list {server}"


def terminate_client(server: int, client: int) -> str:
    return f"terminate_client {server} {client}"


GET_SERVER_LIST = "get_server_list"
GET_DEFAULT_THREADS = "get_default_active_thread_percentage"
QUIT = "quit"


def parse_pids(reply: str) -> tuple[int, ...]:
    """PIDs, one per line, as get_server_list and get_client_list print them."""
    return tuple(int(line.strip()) for line in reply.splitlines() if line.strip().isdigit())


def parse_percentage(reply: str) -> float | None:
    """The number get_default_active_thread_percentage prints (e.g. "100.0")."""
    found = _NUMBER.findall(reply)
    return float(found[-1]) if found else None


# --- the real tool ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessMpsControl:
    """Spawns ``binary`` (nvidia-cuda-mps-control, or a stand-in speaking its protocol)."""

    binary: str
    pipe_dir: Path = _DEFAULTS.pipe
    log_dir: Path = _DEFAULTS.log
    timeout: float = 10.0
    base_env: Mapping[str, str] | None = field(default=None, repr=False)

    def env(self) -> dict[str, str]:
        env = dict(os.environ if self.base_env is None else self.base_env)
        env[keys.ENV_MPS_PIPE_DIRECTORY] = str(self.pipe_dir)
        env[keys.ENV_MPS_LOG_DIRECTORY] = str(self.log_dir)
        # MPS device ordinals then follow PCI bus order, which is NVML's index order.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env

    def _run(self, argv: list[str], what: str, stdin: str) -> tuple[int, str, str]:
        """Exit status, stdout and stderr of one run of the tool.

        Output goes to files, not pipes: ``-d`` forks the daemon into the background, which may
        keep the descriptors it inherited, and a pipe would then never reach end-of-file.
        """
        with (
            tempfile.TemporaryFile() as given,
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
        ):
            given.write(stdin.encode())
            given.seek(0)
            try:
                done = subprocess.run(
                    argv,
                    stdin=given,
                    stdout=out,
                    stderr=err,
                    env=self.env(),
                    timeout=self.timeout,
                    check=False,
                )
            except FileNotFoundError as exc:
                raise MpsError(f"{self.binary} not found: {exc}") from exc
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MpsError(f"{what} failed: {exc}") from exc
            out.seek(0)
            err.seek(0)
            return (
                done.returncode,
                out.read().decode(errors="replace"),
                err.read().decode(errors="replace"),
            )

    def start_daemon(self) -> None:
        for directory in (self.pipe_dir, self.log_dir):
            try:
                directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            except OSError as exc:
                raise MpsError(f"cannot create MPS directory {directory}: {exc}") from exc
        what = f"{self.binary} -d"
        status, out, err = self._run([self.binary, "-d"], what, "")
        if status != 0:
            printed = (out + err).strip() or "(no output)"
            raise MpsError(f"{what} exited with status {status}: {printed}")

    def send(self, command: str) -> str:
        if not _SAFE_COMMAND.match(command):
            raise MpsError(f"refusing to send a malformed MPS command: {command!r}")
        status, out, err = self._run([self.binary], f"MPS command {command!r}", command + "\n")
        printed = (out + err).strip()
        if NO_DAEMON in printed:
            raise MpsUnavailable(
                f"no MPS control daemon answers on {self.pipe_dir} ({command!r}: {printed})"
            )
        if status != 0:
            raise MpsError(
                f"MPS command {command!r} exited with status {status}: {printed or '(no output)'}"
            )
        return out

    def daemon_pid(self) -> int | None:
        """The control daemon's PID from the file it writes in the pipe directory."""
        try:
            text = (self.pipe_dir / PID_FILE).read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None
