"""`gpuwarden node-agent` on a machine without a GPU: every mistake is a clear message."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuwarden.cli import main
from gpuwarden.commands import node_agent
from gpuwarden.node.agent import AgentConfig
from gpuwarden.node.hardlimits import detect_memory_limits

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def nvml_present() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--node-name is required (or set NODE_NAME"),
        (["--node-name", "n", "--interval", "0"], "--interval must be a positive number"),
        (
            ["--node-name", "n", "--memory-ceiling", "lots"],
            "--memory-ceiling: 'lots' is not a Kubernetes quantity",
        ),
        (["--node-name", "n", "--memory-ceiling", "10"], "--memory-ceiling 10 is below 1Mi"),
        (["--node-name", "n", "--metrics-port", "70000"], "--metrics-port must be 0-65535"),
        (["--node-name", "n", "--mps-replicas", "0"], "--mps-replicas must be at least 1, not 0"),
        (
            ["--node-name", "n", "--mps-resource", "../gpu"],
            "--mps-resource: '../gpu' is not an extended resource name such as "
            "nvidia.com/gpu.shared",
        ),
        (
            ["--node-name", "n", "--kubeconfig", "/nonexistent/kubeconfig"],
            "/nonexistent/kubeconfig: no such kubeconfig file",
        ),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["node-agent", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuwarden node-agent: ")
    assert message in err
    assert "Traceback" not in err


def test_bad_choice_is_argparses_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["node-agent", "--node-name", "n", "--on-violation", "shoot"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'shoot'" in capsys.readouterr().err


@pytest.mark.skipif(nvml_present(), reason="this machine has an NVIDIA driver")
def test_without_a_driver_the_agent_says_so(
    kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["node-agent", "--node-name", "gpu-node-1", "--kubeconfig", str(kubeconfig), "--once"]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "gpuwarden node-agent: NVML is not available" in err
    assert "libnvidia-ml.so.1" in err


def fake_smi(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_hard_limits_are_detected_from_the_memory_limits_help(tmp_path: Path) -> None:
    smi = fake_smi(
        tmp_path,
        '[ "$1" = memory-limits ] && [ "$2" = --help ] || exit 9\n'
        'echo "nvidia-smi memory-limits -- manage cgroup GPU memory limits"\n',
    )
    support = detect_memory_limits(smi)
    assert support.available, support.detail


def test_older_drivers_without_memory_limits_are_off(tmp_path: Path) -> None:
    smi = fake_smi(
        tmp_path,
        "echo \"Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\"\nexit 2\n",
    )
    support = detect_memory_limits(smi)
    assert not support.available
    assert "exited with status 2: Invalid combination" in support.detail
    assert not detect_memory_limits(str(tmp_path / "missing")).available
    assert not detect_memory_limits(fake_smi(tmp_path, "echo usage: nvidia-smi\n")).available


def test_help_lists_the_agents_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["node-agent", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--node-name",
        "--kubeconfig",
        "--interval",
        "--on-violation",
        "--mps-root",
        "--mps-resource",
        "--mps-pipe-dir",
        "--mps-log-dir",
        "--metrics-port",
        "--mps-control-bin",
        "--mps-daemon",
        "--hard-limits",
    ):
        assert flag in out


@pytest.mark.parametrize(
    ("value", "manages"), [("manage", True), ("external", False), ("off", False)]
)
def test_mps_daemon_says_who_runs_the_control_daemon(value: str, manages: bool) -> None:
    """external: NVIDIA's device plugin (MPS mode) runs it; the agent must not start another."""
    parser = argparse.ArgumentParser()
    node_agent.register(parser)
    config = node_agent._config(parser.parse_args(["--node-name", "n", "--mps-daemon", value]))
    assert isinstance(config, AgentConfig) and config.manage_daemon is manages
    default = node_agent._config(parser.parse_args(["--node-name", "n"]))
    assert isinstance(default, AgentConfig) and default.manage_daemon is True


def test_mps_replicas_size_an_mps_slice() -> None:
    parser = argparse.ArgumentParser()
    node_agent.register(parser)
    config = node_agent._config(parser.parse_args(["--node-name", "n", "--mps-replicas", "4"]))
    assert isinstance(config, AgentConfig) and config.mps_replicas == 4
    default = node_agent._config(parser.parse_args(["--node-name", "n"]))
    assert isinstance(default, AgentConfig) and default.mps_replicas is None
