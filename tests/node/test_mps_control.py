"""ProcessMpsControl spawning a real executable that speaks nvidia-cuda-mps-control's protocol."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuwarden.node import mps
from gpuwarden.node.mps import MpsError, MpsUnavailable, ProcessMpsControl

from .mps_fake import SOURCE, FakeMps


def test_the_device_plugins_daemon_is_found_under_its_root_by_resource() -> None:
    """NVIDIA/k8s-device-plugin cmd/mps-control-daemon/mps/root.go: <root>/<resource>/pipe."""
    root = Path("/run/nvidia/mps")
    assert mps.device_plugin_directories(root, "nvidia.com/gpu.shared") == mps.MpsDirectories(
        pipe=Path("/run/nvidia/mps/nvidia.com/gpu.shared/pipe"),
        log=Path("/run/nvidia/mps/nvidia.com/gpu.shared/log"),
    )
    default = ProcessMpsControl("nvidia-cuda-mps-control")
    assert (default.pipe_dir, default.log_dir) == (
        Path("/run/nvidia/mps/nvidia.com/gpu/pipe"),
        Path("/run/nvidia/mps/nvidia.com/gpu/log"),
    )
    for bad in ("gpu", "/nvidia.com/gpu", "nvidia.com/../../etc", "nvidia.com/gpu/pipe"):
        with pytest.raises(ValueError, match="not an extended resource name"):
            mps.device_plugin_directories(root, bad)


def test_commands_fail_clearly_before_the_daemon_runs(control: ProcessMpsControl) -> None:
    control.pipe_dir.mkdir(parents=True)
    with pytest.raises(MpsUnavailable, match=r"no MPS control daemon answers on .*pipe"):
        control.send(mps.GET_SERVER_LIST)


def test_start_daemon_creates_the_shared_directories_and_answers(
    control: ProcessMpsControl, fake_mps: FakeMps
) -> None:
    control.start_daemon()
    assert control.pipe_dir.is_dir() and control.log_dir.is_dir()
    assert "Starting control daemon" in (control.log_dir / "control.log").read_text()
    assert control.daemon_pid() == fake_mps.state()["daemon_pid"]
    assert mps.parse_percentage(control.send(mps.GET_DEFAULT_THREADS)) == 100.0
    control.send(mps.set_default_mem(0, 2048))
    control.send(mps.set_default_threads(40))
    assert fake_mps.state()["default_mem"] == {"0": "2048M"}
    assert mps.parse_percentage(control.send(mps.GET_DEFAULT_THREADS)) == 40.0
    # each command was one run of the tool, reading it on stdin
    assert fake_mps.log() == [
        "-d",
        "get_default_active_thread_percentage",
        "set_default_device_pinned_mem_limit 0 2048M",
        "set_default_active_thread_percentage 40",
        "get_default_active_thread_percentage",
    ]


def test_server_and_client_lists_parse(control: ProcessMpsControl, fake_mps: FakeMps) -> None:
    control.start_daemon()
    assert mps.parse_pids(control.send(mps.GET_SERVER_LIST)) == ()
    fake_mps.add_server(700, uid=1000)
    fake_mps.add_server(650, uid=0)
    fake_mps.add_client(700, 9001)
    assert mps.parse_pids(control.send(mps.GET_SERVER_LIST)) == (650, 700)
    assert mps.parse_pids(control.send(mps.get_client_list(700))) == (9001,)


def test_a_failing_command_names_itself_and_the_reply(
    control: ProcessMpsControl, fake_mps: FakeMps
) -> None:
    control.start_daemon()
    with pytest.raises(
        MpsError,
        match=r"'set_device_pinned_mem_limit 123 0 10M' exited with status 1: Server with PID 123 not found",
    ):
        control.send(mps.set_server_mem(123, 0, 10))


def test_starting_twice_reports_the_tools_answer(control: ProcessMpsControl) -> None:
    control.start_daemon()
    with pytest.raises(MpsError, match="already running"):
        control.start_daemon()


def test_quit_loses_the_defaults(control: ProcessMpsControl) -> None:
    control.start_daemon()
    control.send(mps.set_default_threads(30))
    control.send(mps.QUIT)
    assert control.daemon_pid() is None
    control.start_daemon()
    assert mps.parse_percentage(control.send(mps.GET_DEFAULT_THREADS)) == 100.0


def test_timeouts_and_missing_binaries_are_errors_not_hangs(
    mps_bin: Path, mps_dirs: tuple[Path, Path], fake_mps: FakeMps
) -> None:
    pipe, log = mps_dirs
    quick = ProcessMpsControl(binary=str(mps_bin), pipe_dir=pipe, log_dir=log, timeout=0.5)
    quick.start_daemon()
    fake_mps.hang()
    with pytest.raises(MpsError, match="timed out"):
        quick.send(mps.GET_SERVER_LIST)
    missing = ProcessMpsControl(binary=str(pipe / "nope"), pipe_dir=pipe, log_dir=log)
    with pytest.raises(MpsError, match="not found"):
        missing.start_daemon()


def test_malformed_commands_are_never_sent(control: ProcessMpsControl) -> None:
    with pytest.raises(MpsError, match="malformed"):
        control.send("get_server_list\nquit")
    with pytest.raises(ValueError, match="1-100"):
        mps.set_default_threads(0)
    with pytest.raises(ValueError, match="at least 1 MiB"):
        mps.set_default_mem(0, 0)


def test_the_script_in_the_repository_runs_by_its_own_shebang(tmp_path: Path) -> None:
    assert os.access(SOURCE, os.X_OK), "tests/node/fake_mps_control.py must be executable"
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path),
    }
    started = subprocess.run(
        [str(SOURCE), "-d"], env=env, capture_output=True, text=True, timeout=30
    )
    assert started.returncode == 0, started.stderr
    reply = subprocess.run(
        [str(SOURCE)],
        input="get_default_active_thread_percentage\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert reply.stdout == "100.0\n"
