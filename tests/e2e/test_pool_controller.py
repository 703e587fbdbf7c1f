"""`gpuwarden pool-controller` against a real kube-apiserver (issue 33, item 4).

Three GPU nodes are created with their status (no kubelet runs): a full MPS node, an empty
whole-GPU node and a whole-GPU node with a GPU pod bound to it. No scheduler runs either, so the
test writes a waiting pod's PodScheduled condition through the status subresource, as
kube-scheduler does. The controller runs as the real command, with the chart's arguments and as
a user bound to the chart's ClusterRole and nothing else; the test reads the stored nodes.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from gpuwarden.lab.cluster.gpuwardenserver import wait_for
from gpuwarden.lab.cluster.webhookstack import RELEASE_NAME, render_chart

from .controlplane import ControlPlane, Tools

USER = "e2e-pool-controller"
CONFIG = "nvidia.com/device-plugin.config"
TARGET, MOVED_AT = "gpuwarden.io/pool-target", "gpuwarden.io/pool-moved-at"
SHARED = "nvidia.com/gpu.shared"
# Only this module's nodes carry it, so nodes other suites leave behind are never moved.
SELECTOR = "e2e.gpuwarden.io/pools"
RUN = uuid.uuid4().hex[:8]
POLICY = {
    "apiVersion": "gpuwarden.io/v1alpha1",
    "kind": "GPUPolicy",
    "metadata": {"name": "e2e-pools"},
    "spec": {
        "backend": {
            "type": "nvidia",
            "sharedResourceName": SHARED,
            "mpsReplicas": 4,
            "pools": {
                "wholeConfig": "whole",
                "sharedConfig": "mps",
                "nodeSelector": {SELECTOR: RUN},
                "holdSeconds": 0,
            },
        }
    },
}


@pytest.fixture(scope="module")
def controller(
    control_plane: ControlPlane, e2e_tools: Tools, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """`gpuwarden pool-controller` with the chart's arguments and RBAC; yields its log file."""
    workdir = tmp_path_factory.mktemp("pool-controller")
    policies = workdir / "policies"
    policies.mkdir()
    (policies / "pools.yaml").write_text(yaml.safe_dump(POLICY))
    chart = render_chart(
        e2e_tools.helm,
        values={
            "poolController": {"enabled": True, "interval": 0.5},
            "policies": {"pools.yaml": POLICY},
        },
        workdir=workdir,
    )
    name = f"{RELEASE_NAME}-pool-controller"
    (deployment,) = [
        d for d in chart if d["kind"] == "Deployment" and d["metadata"]["name"] == name
    ]
    (role,) = [d for d in chart if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [
        f"--policies={policies}" if arg.startswith("--policies=") else arg
        for arg in container["args"]
    ]
    assert args[0] == "pool-controller" and "--interval=0.5" in args
    log = workdir / "controller.log"
    with control_plane.client_as(USER, role["rules"]), log.open("w") as out:
        kubeconfig = control_plane.write_kubeconfig_for(workdir / "kubeconfig", USER)
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", *args, f"--kubeconfig={kubeconfig}"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield log
        finally:
            process.terminate()
            process.wait(timeout=20)
            print(log.read_text())
    # SIGTERM is a clean stop.
    assert process.returncode == 0


def _node(api: k8s_client.ApiClient, name: str, config: str, gpus: int) -> None:
    core: Any = k8s_client.CoreV1Api(api)
    labels = {CONFIG: config, "nvidia.com/gpu.count": str(gpus), SELECTOR: RUN}
    core.create_node({"metadata": {"name": name, "labels": labels}})
    _advertise(api, name, config, gpus)


def _advertise(api: k8s_client.ApiClient, name: str, config: str, gpus: int) -> None:
    """The node's status as the kubelet writes it once the device plugin runs ``config``."""
    whole = gpus if config == "whole" else 0
    resources = {"nvidia.com/gpu": str(whole), SHARED: str(gpus * 4 - whole * 4)}
    body = {"status": {"capacity": resources, "allocatable": resources}}
    k8s_client.CoreV1Api(api).patch_node_status(name, body)


def _pod(
    api: k8s_client.ApiClient, namespace: str, resource: str, count: int, node: str | None = None
) -> str:
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"limits": {resource: str(count)}}}
        ]
    }
    if node is not None:
        spec["nodeName"] = node
    core: Any = k8s_client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": spec})
    if node is None:  # what kube-scheduler writes when no node fits
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available",
        }
        core.patch_namespaced_pod_status(
            name, namespace, {"status": {"phase": "Pending", "conditions": [condition]}}
        )
    return name


def _stored(api: k8s_client.ApiClient, name: str) -> dict[str, Any]:
    node = k8s_client.CoreV1Api(api).read_node(name)
    stored: dict[str, Any] = api.sanitize_for_serialization(node)  # type: ignore[no-untyped-call]
    return stored


def _ready_once_advertised(api: k8s_client.ApiClient, name: str, gpus: int) -> None:
    """Once the device plugin advertises the MPS config, the node is uncordoned, its target
    annotation dropped."""
    _advertise(api, name, "mps", gpus)
    wait_for(f"{name} uncordoned", lambda: not _stored(api, name)["spec"].get("unschedulable"))
    assert TARGET not in _stored(api, name)["metadata"]["annotations"]


def _actions(log: Path) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in log.read_text().splitlines() if line.startswith("{"))
    return [line for line in lines if str(line["msg"]).startswith("pool ")]


def test_nodes_follow_shared_demand(
    controller: Path, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    full, empty, busy = (f"e2e-pool-{kind}-{RUN}" for kind in ("mps", "empty", "busy"))
    _node(api_client, full, "mps", 1)
    _node(api_client, empty, "whole", 8)
    _node(api_client, busy, "whole", 2)
    _pod(api_client, namespace, SHARED, 4, node=full)
    whole_pod = _pod(api_client, namespace, "nvidia.com/gpu", 1, node=busy)

    # A shared pod waits and the MPS node is full: the empty whole node moves at once (cordoned,
    # then relabelled by the next plan since it still holds no GPU pod).
    _pod(api_client, namespace, SHARED, 1)
    moved = wait_for(
        f"{empty} relabelled to the MPS config",
        lambda: (
            (node := _stored(api_client, empty))["metadata"]["labels"][CONFIG] == "mps" and node
        ),
        timeout=30,
    )
    annotations = moved["metadata"]["annotations"]
    stamp = datetime.datetime.fromisoformat(annotations[MOVED_AT])
    assert abs(datetime.datetime.now(datetime.UTC) - stamp) < datetime.timedelta(minutes=5)
    # Cordoned until the device plugin advertises the MPS config: no pod is bound to it
    # against the old one meanwhile.
    assert moved["spec"]["unschedulable"] and annotations[TARGET] == "mps"
    assert _stored(api_client, busy)["metadata"]["labels"][CONFIG] == "whole"
    _ready_once_advertised(api_client, empty, 8)

    # More shared demand than both MPS nodes hold (4 + 32 replicas for 4 + 1 + 32): the busy
    # whole node is cordoned toward the MPS config and keeps its config while its GPU pod runs.
    _pod(api_client, namespace, SHARED, 32)
    draining = wait_for(
        f"{busy} cordoned",
        lambda: (node := _stored(api_client, busy))["spec"].get("unschedulable") and node,
        timeout=30,
    )
    assert draining["metadata"]["annotations"][TARGET] == "mps"
    assert draining["metadata"]["labels"][CONFIG] == "whole"

    # Its GPU pod gone, it moves and is uncordoned.
    k8s_client.CoreV1Api(api_client).delete_namespaced_pod(
        whole_pod, namespace, grace_period_seconds=0
    )
    done = wait_for(
        f"{busy} relabelled once drained",
        lambda: (node := _stored(api_client, busy))["metadata"]["labels"][CONFIG] == "mps" and node,
        timeout=30,
    )
    assert done["spec"]["unschedulable"] and MOVED_AT in done["metadata"]["annotations"]
    _ready_once_advertised(api_client, busy, 2)

    # One JSON line per action on stderr.
    assert [(a["msg"], a["node"], a["from"], a["to"]) for a in _actions(controller)] == [
        ("pool move started", empty, "whole", "mps"),
        ("pool move finished", empty, "whole", "mps"),
        ("pool node ready", empty, "mps", "mps"),
        ("pool move started", busy, "whole", "mps"),
        ("pool move finished", busy, "whole", "mps"),
        ("pool node ready", busy, "mps", "mps"),
    ]
