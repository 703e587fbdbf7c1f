"""`gpuwarden pool-controller`: the errors a user meets before it starts, and what the controller
does when a node changes or goes away between its plan and its patch (no cluster: a stand-in
API). The command against a real kube-apiserver is tests/e2e/test_pool_controller.py."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.cli import main
from gpuwarden.kube.pools import PoolController, node_view, pod_view
from gpuwarden.policy.render.pools import PoolSettings
from gpuwarden.policy.spec.model import NvidiaPools

POLICY = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: p}
spec:
  backend: {type: nvidia, mpsReplicas: 4%s}
"""
POOLS = ", pools: {wholeConfig: whole, sharedConfig: mps}"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["pool-controller", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (POLICY % "", "error: no nvidia backend with pools in "),
        (
            POLICY % ", pools: {wholeConfig: whole, sharedConfig: whole}",
            "spec.backend.pools: wholeConfig and sharedConfig must name two configs",
        ),
        ("spec: [", "error: "),
    ],
)
def test_bad_policies_exit_2_with_a_message(
    text: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    code, err = run(capsys, "--policies", str(path))
    assert code == 2
    assert expected in err and "Traceback" not in err


def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY % POOLS)
    assert run(capsys, "-p", str(path), "--interval", "0") == (
        2,
        "error: --interval must be a number of seconds above 0\n",
    )
    code, err = run(capsys, "-p", str(path), "--kubeconfig", str(tmp_path / "none"))
    assert code == 2 and err == f"error: {tmp_path / 'none'}: no such kubeconfig file\n"


SETTINGS = PoolSettings(
    NvidiaPools(whole_config="whole", shared_config="mps"), 4, "nvidia.com/gpu.shared"
)
NOW = datetime.datetime(2026, 12, 5, 3, 0, tzinfo=datetime.UTC)


class StandIn:
    """CoreV1Api's patch_node: answers from a list, records each call."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def patch_node(self, name: str, body: dict[str, Any], **_: Any) -> Any:
        self.calls.append((name, body))
        status = self.answers.pop(0)
        if status != 200:
            raise ApiException(status=status, reason="stand-in")
        node = {"metadata": {"name": name, "resourceVersion": "2", "labels": {}}}
        return type("Response", (), {"data": json.dumps(node).encode()})()


def controller(monkeypatch: pytest.MonkeyPatch, core: StandIn) -> PoolController:
    found = PoolController(
        k8s_client.ApiClient(), lambda: SETTINGS, interval=1.0, clock=lambda: NOW
    )
    monkeypatch.setattr(found, "_core", core)
    empty = {
        "metadata": {
            "name": "a",
            "resourceVersion": "1",
            "labels": {"nvidia.com/device-plugin.config": "whole", "nvidia.com/gpu.count": "8"},
        }
    }
    waiting = {
        "metadata": {"name": "p", "namespace": "t"},
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]},
        "status": {
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
        },
    }
    found.nodes.replace({"a": node_view(empty)})
    view = pod_view(waiting)
    assert view is not None
    found.pods.replace({"t/p": view})
    return found


def test_a_node_changed_meanwhile_is_planned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    core = StandIn(409, 200)
    pools = controller(monkeypatch, core)
    assert pools.reconcile() == []
    [change] = pools.reconcile()
    assert change.node == "a" and change.event == "started"
    # Each patch is conditional on the node the plan read.
    assert [body["metadata"]["resourceVersion"] for _, body in core.calls] == ["1", "1"]
    assert (pools.applied, pools.failed) == (1, 1)


@pytest.mark.parametrize("status", [404, 403, 500])
def test_a_refused_patch_is_logged_not_raised(status: int, monkeypatch: pytest.MonkeyPatch) -> None:
    pools = controller(monkeypatch, StandIn(status))
    assert pools.reconcile() == []
    assert pools.failed == 1
