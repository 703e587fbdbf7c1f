"""The device plugin's emulation (issue 33, item 4): a lab node whose config label changes
advertises what the new config gives, and the real kube-scheduler places pods by it.

NVIDIA's config-manager watches ``nvidia.com/device-plugin.config`` and restarts the plugin and
GFD under the named config; the kubelet keeps the old resource at allocatable 0 for
endpointStopGracePeriod, then drops it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s_client

from gpuwarden.lab.cluster.controlplane import ControlPlane
from gpuwarden.lab.cluster.deviceplugin import (
    DevicePluginEmulation,
    expired_patch,
    status_patch,
)
from gpuwarden.lab.cluster.gpuwardenserver import wait_for
from gpuwarden.lab.cluster.nodes import (
    CONFIG_LABEL,
    GPU_RESOURCE,
    SHARED_GPU_RESOURCE,
    GpuNodePool,
)
from gpuwarden.lab.cluster.schedulinglab import (
    SchedulingLab,
    ensure_namespaces,
    pod_scheduled_condition,
)

WHOLE = GpuNodePool("flex", count=1, gpus_per_node=2)
CONFIGS = {"whole": 1, "mps": 4}


def test_a_move_to_mps_advertises_the_replicas_and_keeps_the_old_resource_at_zero() -> None:
    after = WHOLE.configured(4)
    assert status_patch(WHOLE, after) == {
        "status": {
            "capacity": {SHARED_GPU_RESOURCE: "8", GPU_RESOURCE: "2"},
            "allocatable": {SHARED_GPU_RESOURCE: "8", GPU_RESOURCE: "0"},
        }
    }
    assert after.gfd_labels()["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert after.config == "mps"
    back = status_patch(after, WHOLE.configured(1))
    assert back["status"]["allocatable"] == {GPU_RESOURCE: "2", SHARED_GPU_RESOURCE: "0"}
    assert expired_patch(GPU_RESOURCE)["status"]["capacity"] == {GPU_RESOURCE: None}


def test_lab_nodes_carry_their_config_label() -> None:
    (whole,) = WHOLE.manifests()
    (shared,) = WHOLE.configured(4).manifests()
    assert whole["metadata"]["labels"][CONFIG_LABEL] == "whole"
    assert shared["metadata"]["labels"][CONFIG_LABEL] == "mps"


# -- on the lab's API server, scheduler and KWOK --------------------------------------------


def _pod(namespace: str, resource: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"limits": {resource: "1"}}}
            ]
        },
    }


@dataclass
class PluginLab:
    api: k8s_client.ApiClient
    core: Any
    emulation: DevicePluginEmulation
    told: list[tuple[str, GpuNodePool]]

    def node(self) -> Any:
        return self.core.read_node("flex-0")

    def create(self, resource: str) -> dict[str, Any]:
        pod = _pod("plugin", resource)
        self.core.create_namespaced_pod("plugin", pod)
        return pod


def _unschedulable(lab: PluginLab, pod: dict[str, Any]) -> str:
    def probe() -> str | None:
        found = lab.core.read_namespaced_pod(pod["metadata"]["name"], "plugin")
        condition = pod_scheduled_condition(lab.api.sanitize_for_serialization(found))
        if condition and condition.get("status") == "False":
            return str(condition.get("message"))
        return None

    return wait_for(f"pod {pod['metadata']['name']} to be unschedulable", probe, 30)


def _bound(lab: PluginLab, pod: dict[str, Any]) -> str:
    def probe() -> str | None:
        found = lab.core.read_namespaced_pod(pod["metadata"]["name"], "plugin")
        return found.spec.node_name or None

    return wait_for(f"pod {pod['metadata']['name']} to be bound", probe, 30)


@pytest.fixture
def plugin_lab(scheduling_lab: SchedulingLab, lab_plane: ControlPlane) -> Iterator[PluginLab]:
    """One 2-GPU whole node with the emulation running (grace 1 s), and what it told."""
    api = lab_plane.api_client()
    told: list[tuple[str, GpuNodePool]] = []
    scheduling_lab.add_pools(api, [WHOLE])
    ensure_namespaces(api, ["plugin"], {})
    emulation = DevicePluginEmulation(
        api,
        {"flex-0": WHOLE},
        CONFIGS,
        "whole",
        grace=1.0,
        on_change=lambda node, pool: told.append((node, pool)),
    )
    emulation.start()
    try:
        yield PluginLab(api, k8s_client.CoreV1Api(api), emulation, told)
    finally:
        emulation.stop()
        scheduling_lab.remove_nodes(api)
        api.close()  # type: ignore[no-untyped-call]


@pytest.mark.e2e
def test_a_relabelled_node_is_scheduled_by_its_new_config(plugin_lab: PluginLab) -> None:
    lab = plugin_lab
    shared = lab.create(SHARED_GPU_RESOURCE)
    assert "Insufficient nvidia.com/gpu.shared" in _unschedulable(lab, shared)

    lab.core.patch_node("flex-0", {"metadata": {"labels": {CONFIG_LABEL: "mps"}}})

    # The scheduler places the waiting shared pod by the numbers the plugin now advertises.
    assert _bound(lab, shared) == "flex-0"
    node = lab.node()
    assert node.status.allocatable[SHARED_GPU_RESOURCE] == "8"
    assert node.status.allocatable[GPU_RESOURCE] == "0"
    assert node.metadata.labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert node.metadata.labels["nvidia.com/gpu.replicas"] == "4"
    assert lab.told == [("flex-0", WHOLE.configured(4))]
    whole = lab.create(GPU_RESOURCE)
    assert "Insufficient nvidia.com/gpu" in _unschedulable(lab, whole)

    # After the kubelet's grace period the old resource is gone; KWOK kept the status the
    # plugin's kubelet reported (the node is still Ready with the new numbers).
    def dropped() -> Any:
        found = lab.node()
        return found if GPU_RESOURCE not in found.status.capacity else None

    node = wait_for("nvidia.com/gpu to be dropped", dropped, 30)
    assert node.status.capacity[SHARED_GPU_RESOURCE] == "8"
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    assert [(m.node, m.before, m.after) for m in lab.emulation.moves] == [
        ("flex-0", "whole", "mps")
    ]


@pytest.mark.e2e
def test_a_label_naming_no_config_keeps_the_plugin_as_it_was(plugin_lab: PluginLab) -> None:
    lab = plugin_lab
    lab.core.patch_node("flex-0", {"metadata": {"labels": {CONFIG_LABEL: "nosuch"}}})
    wait_for("the config-manager's error", lambda: lab.emulation.rejected or None, 30)
    assert lab.emulation.rejected == {"flex-0": "nosuch"}
    whole = lab.create(GPU_RESOURCE)
    assert _bound(lab, whole) == "flex-0"
    assert lab.node().status.allocatable[GPU_RESOURCE] == "2"
    assert lab.told == []
