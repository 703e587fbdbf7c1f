"""Simulated GPU nodes: the Node objects a kubelet with NVIDIA's device plugin and GPU Feature
Discovery would register, for KWOK to manage.

Capacity is what the device plugin advertises: ``nvidia.com/gpu`` per physical GPU, or, when it
shares GPUs through MPS with ``replicas: N``, N per GPU (under ``nvidia.com/gpu.shared`` when its
sharing config sets ``renameByDefault``). Labels are GPU Feature Discovery's
(``nvidia.com/gpu.product``, ``.count``, ``.memory``, ``.replicas``, ``.sharing-strategy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpuwarden.lab.cluster.stages import NODE_ANNOTATION, NODE_ANNOTATION_VALUE
from gpuwarden.policy.pod.keys import ENV_MPS_THREAD_PERCENTAGE
from gpuwarden.policy.pod.quantity import parse_quantity

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
#: What GFD appends to nvidia.com/gpu.product on a shared node whose replicas keep the name
#: nvidia.com/gpu (NVIDIA/k8s-device-plugin internal/lm/resource.go, getProductName: only when
#: the resource is shared and not renamed).
SHARED_PRODUCT_SUFFIX = "-SHARED"
#: The label every lab node carries, with its pool's name (so a run can list its nodes).
POOL_LABEL = "lab.gpuwarden.io/pool"
#: On DRA nodes, the label of those the shares prefer (the dra backend's sharedNodeLabels), its
#: value "true".
SHARES_LABEL = "lab.gpuwarden.io/shares"
#: The node label NVIDIA's device plugin takes its per-node config from: its config-manager
#: sidecar watches it (NVIDIA/k8s-device-plugin cmd/config-manager/main.go, flag --node-label)
#: and the value names one config of the plugin's ConfigMap (the Helm chart's config.map).
CONFIG_LABEL = "nvidia.com/device-plugin.config"
#: The lab's two configs: whole GPUs, and each GPU shared through MPS (renameByDefault).
WHOLE_CONFIG, SHARED_CONFIG = "whole", "mps"


def mps_sm_share(pod: Mapping[str, Any]) -> float | None:
    """The share of SMs MPS lets the pod's GPU container use (its active thread percentage)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == ENV_MPS_THREAD_PERCENTAGE:
                try:
                    return min(1.0, max(0.0, float(env.get("value", "")) / 100))
                except ValueError:
                    return None
    return None


def pod_devices(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(whole GPUs, MPS slices) the pod's containers ask for."""
    whole = slices = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        requests = (container.get("resources") or {}).get("requests") or {}
        count = limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE))
        shared = limits.get(SHARED_GPU_RESOURCE, requests.get(SHARED_GPU_RESOURCE))
        if count is not None:
            whole += int(parse_quantity(count))
        if shared is not None:
            slices += int(parse_quantity(shared))
    return whole, slices


TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"

    def manifest(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class GpuNodePool:
    """``count`` identical GPU nodes named ``<name>-<i>``.

    ``mps_replicas`` above 1 is the device plugin sharing each GPU through MPS among that many
    pods; ``rename_shared`` advertises those replicas as nvidia.com/gpu.shared. ``dra``: no
    device plugin, the lab's DRA driver publishes the GPUs (:mod:`gpuwarden.lab.cluster.dradriver`)
    and the node advertises no GPU resource of its own.
    """

    name: str
    count: int
    gpus_per_node: int
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    mps_replicas: int = 1
    rename_shared: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    dra: bool = False

    def __post_init__(self) -> None:
        if self.count < 0 or self.gpus_per_node < 0 or self.mps_replicas < 1:
            raise ValueError(f"pool {self.name}: counts must be positive")
        if self.dra and self.shared:
            raise ValueError(f"pool {self.name}: a DRA pool shares GPUs through claims, not MPS")

    @property
    def shared(self) -> bool:
        return self.mps_replicas > 1

    @property
    def config(self) -> str:
        """The device plugin config its nodes are labelled with (:data:`CONFIG_LABEL`)."""
        return SHARED_CONFIG if self.shared else WHOLE_CONFIG

    def configured(self, replicas: int) -> GpuNodePool:
        """The same nodes under a device plugin config of ``replicas`` MPS replicas per GPU (1:
        whole GPUs), shared replicas renamed as the lab's MPS config does."""
        return replace(self, mps_replicas=replicas, rename_shared=replicas > 1)

    @property
    def gpu_resource(self) -> str:
        """The resource name pods of this pool ask for."""
        return SHARED_GPU_RESOURCE if self.shared and self.rename_shared else GPU_RESOURCE

    @property
    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.count)]

    @property
    def physical_gpus(self) -> int:
        return self.count * self.gpus_per_node

    @property
    def product_label(self) -> str:
        """GFD's nvidia.com/gpu.product: -SHARED only where replicas are not renamed."""
        if self.shared and not self.rename_shared:
            return self.gpu_product + SHARED_PRODUCT_SUFFIX
        return self.gpu_product

    def gfd_labels(self) -> dict[str, str]:
        return {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": self.product_label,
            "nvidia.com/gpu.count": str(self.gpus_per_node),
            "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
            "nvidia.com/gpu.replicas": str(self.mps_replicas),
            "nvidia.com/gpu.sharing-strategy": "mps" if self.shared else "none",
            "nvidia.com/mps.capable": "true" if self.shared else "false",
        }

    def advertised(self) -> dict[str, str]:
        """The GPU resource its device plugin advertises, at its count (none on a DRA node)."""
        if self.dra:
            return {}
        return {self.gpu_resource: str(self.gpus_per_node * self.mps_replicas)}

    def node_manifest(self, name: str) -> dict[str, Any]:
        resources = {"cpu": "128", "memory": "1Ti", "pods": "110", **self.advertised()}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    POOL_LABEL: self.name,
                    CONFIG_LABEL: self.config,
                    **self.gfd_labels(),
                    **dict(self.labels),
                },
                "annotations": {NODE_ANNOTATION: NODE_ANNOTATION_VALUE},
            },
            "spec": {"taints": [taint.manifest() for taint in self.taints]},
            # Nodes may be created with their status; KWOK's node stage keeps these numbers.
            "status": {"capacity": resources, "allocatable": dict(resources)},
        }

    def manifests(self) -> list[dict[str, Any]]:
        return [self.node_manifest(name) for name in self.node_names]
