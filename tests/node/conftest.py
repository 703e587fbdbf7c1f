"""Fixtures of the node-agent tests: a fake /proc, the fake MPS control tool, pods.

The e2e fixtures (a real etcd + kube-apiserver) come from tests/conftest.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.node.agent import AgentConfig, NodeAgent, OnViolation
from gpuwarden.node.fake import FakeNvml
from gpuwarden.node.metrics import agent_registry
from gpuwarden.node.mps import ProcessMpsControl
from gpuwarden.node.procfs import ProcFs

from .mps_fake import FakeMps, install

GiB = 2**30


class FakeProc:
    """A /proc tree in a temporary directory: cgroup, status (Uid) and comm per PID."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, pid: int, cgroup: str, *, uid: int = 1000, comm: str = "python") -> None:
        directory = self.root / str(pid)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup").write_text(cgroup)
        (directory / "status").write_text(
            f"Name:\t{comm}\nPid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        )
        (directory / "comm").write_text(comm + "\n")

    def add_pod_process(
        self, pid: int, pod_uid: str, container_id: str, *, uid: int = 1000, qos: str = "burstable"
    ) -> None:
        """A process in a pod's container, with a systemd-driver cgroup v2 path."""
        slice_uid = pod_uid.replace("-", "_")
        path = (
            f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/"
            f"cri-containerd-{container_id}.scope"
        )
        self.add(pid, f"0::{path}\n", uid=uid)

    def add_mps_server(self, pid: int, uid: int) -> None:
        self.add(
            pid, "0::/system.slice/gpuwarden-node-agent.scope\n", uid=uid, comm="nvidia-cuda-mps"
        )


@pytest.fixture
def nvml() -> FakeNvml:
    """One 40 GiB GPU."""
    fake = FakeNvml()
    fake.add_gpu(40 * GiB)
    return fake


def agent_for(
    nvml: FakeNvml,
    control: ProcessMpsControl | None,
    proc: FakeProc,
    *,
    on_violation: OnViolation = "event",
    **config: Any,
) -> NodeAgent:
    agent = NodeAgent(
        AgentConfig(node_name="gpu-node-1", on_violation=on_violation, **config),
        nvml,
        control,
        ProcFs(proc.root),
    )
    agent.start()
    return agent


def sample(agent: NodeAgent, name: str, **labels: str) -> float | None:
    """The value of one series in the agent's exposition text, parsed as Prometheus would."""
    text = generate_latest(agent_registry(agent)).decode()
    for family in text_string_to_metric_families(text):
        for item in family.samples:
            if item.name == name and all(item.labels.get(k) == v for k, v in labels.items()):
                return float(item.value)
    return None


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    root = tmp_path / "proc"
    root.mkdir()
    return FakeProc(root)


@pytest.fixture
def mps_bin(tmp_path: Path) -> Path:
    return install(tmp_path / "bin", sys.executable)


@pytest.fixture
def mps_dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "mps" / "pipe", tmp_path / "mps" / "log"


@pytest.fixture
def control(mps_bin: Path, mps_dirs: tuple[Path, Path]) -> ProcessMpsControl:
    pipe, log = mps_dirs
    return ProcessMpsControl(binary=str(mps_bin), pipe_dir=pipe, log_dir=log, timeout=10.0)


@pytest.fixture
def fake_mps(mps_dirs: tuple[Path, Path]) -> FakeMps:
    return FakeMps(mps_dirs[0])


def container_id(n: int) -> str:
    return f"{n:064x}"


def make_pod(
    name: str,
    *,
    uid: str,
    pod_namespace: str = "team-a",
    cap: str | None = "4Gi",
    threads: int | None = 50,
    containers: tuple[str, ...] = ("main",),
    gpus: int = 1,
    ratio: str | None = None,
    run_as_user: int | None = None,
    container_ids: dict[str, str] | None = None,
    phase: str = "Running",
    created: str = "2025-01-01T00:00:00Z",
    extra_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as the webhook leaves it (annotations) and the API server returns it (JSON)."""
    annotations = {
        "gpuwarden.io/tenant": "team-a",
        "gpuwarden.io/profile": "shared-small",
        "gpuwarden.io/containers": ",".join(containers),
        "gpuwarden.io/gpu-count": str(gpus),
    }
    if cap is not None:
        annotations["gpuwarden.io/gpu-memory-limit"] = cap
    if threads is not None:
        annotations["gpuwarden.io/mps-thread-percentage"] = str(threads)
    if ratio is not None:
        annotations["gpuwarden.io/overcommit-ratio"] = ratio
    annotations |= extra_annotations or {}
    spec: dict[str, Any] = {
        "nodeName": "gpu-node-1",
        "containers": [{"name": c, "image": "registry.invalid/train:1"} for c in containers],
    }
    if run_as_user is not None:
        spec["securityContext"] = {"runAsUser": run_as_user}
    statuses = [
        {"name": cname, "containerID": f"containerd://{cid}"}
        for cid, cname in (container_ids or {}).items()
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": pod_namespace,
            "uid": uid,
            "annotations": annotations,
            "creationTimestamp": created,
        },
        "spec": spec,
        "status": {"phase": phase, "containerStatuses": statuses},
    }


PodFactory = Callable[..., dict[str, Any]]
