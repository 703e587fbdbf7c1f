"""Whether a shared profile's GPU-memory reservation fits any GPU of a cluster's nodes.

On Volcano vGPU and HAMi the memory a shared pod requests is its cap (``volcano.sh/vgpu-memory``,
``nvidia.com/gpumem``), and on the dra backend its claim asks ``maxMemory`` of a device's memory
capacity. A reservation larger than every GPU the pod may land on never fits, and the pod stays
Pending with no word from gpuwarden. NVIDIA's MPS cap is only a limit a process may never
reach, so it is not checked. Nodes are read by GPU Feature Discovery's labels
(NVIDIA/k8s-device-plugin internal/lm/resource.go): ``nvidia.com/gpu.memory``, each GPU's total
memory in MiB, and ``nvidia.com/gpu.product``, its name with spaces as dashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

from gpuwarden.policy.pod.quantity import to_mebibytes
from gpuwarden.policy.pod.resources import metadata_of, string_map
from gpuwarden.policy.spec.model import DraBackend, HamiBackend, VolcanoBackend
from gpuwarden.policy.spec.policyset import PolicySet
from gpuwarden.policy.spec.resolved import ResolvedProfile

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


class GpuNode(NamedTuple):
    """A node's name, labels, and its GPUs' memory (MiB) and product as GFD labels them."""

    name: str
    labels: Mapping[str, str]
    memory_mib: int
    product: str


def gpu_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[GpuNode]:
    """The nodes whose GPUs' memory GFD labels (others have no GPU, or no GFD)."""
    found: list[GpuNode] = []
    for node in nodes:
        meta = metadata_of(node)
        labels = string_map(meta.get("labels"))
        raw = labels.get(GPU_MEMORY_LABEL, "")
        if raw.isdigit() and int(raw) > 0:
            name = str(meta.get("name", ""))
            found.append(GpuNode(name, labels, int(raw), labels.get(GPU_PRODUCT_LABEL, "")))
    return found


def _reserved_mib(profile: ResolvedProfile) -> tuple[int, Decimal] | None:
    """(MiB a shared pod reserves per GPU, the scaling its nodes must advertise) where the
    backend reserves memory; None where it does not."""
    if not profile.gpu_share or profile.max_memory is None or profile.gpus == 0:
        return None
    if isinstance(profile.backend, VolcanoBackend | HamiBackend):
        # The request is the cap; memory is overcommitted only by the device plugin's
        # deviceMemoryScaling, which lint asks to be the profile's overcommitRatio.
        return to_mebibytes(profile.max_memory), Decimal(str(profile.overcommit_ratio))
    if isinstance(profile.backend, DraBackend):
        return to_mebibytes(profile.max_memory), Decimal(1)
    return None


def _reads_gpu_types(profile: ResolvedProfile) -> bool:
    """Volcano and HAMi read a shared pod's use-gputype; the dra backend writes none."""
    return bool(profile.gpu_types) and isinstance(profile.backend, VolcanoBackend | HamiBackend)


def _may_land_on(profile: ResolvedProfile, node: GpuNode) -> bool:
    """The profile's nodeSelector holds on the node, and its gpuTypes (Volcano's and HAMi's
    use-gputype: a case-insensitive part of the device's name) name the node's product."""
    if any(node.labels.get(key) != value for key, value in profile.node_selector.items()):
        return False
    if not _reads_gpu_types(profile):
        return True
    # The schedulers read NVML's name ("NVIDIA A100-SXM4-80GB"); GFD writes it with dashes.
    product = node.product.upper().replace(" ", "-")
    return any(kind.upper().replace(" ", "-") in product for kind in profile.gpu_types)


def _where(profile: ResolvedProfile) -> str:
    parts = [f"{key}={value}" for key, value in sorted(profile.node_selector.items())]
    if _reads_gpu_types(profile):
        parts.append(f"gpuTypes {', '.join(profile.gpu_types)}")
    return " and ".join(parts)


def _unfit(profile: ResolvedProfile, nodes: Sequence[GpuNode], lower: str) -> str | None:
    """Why the profile's shared pods never schedule on ``nodes``; None when some GPU fits."""
    reserved = _reserved_mib(profile)
    if reserved is None:
        return None
    mib, scaling = reserved
    eligible = [node for node in nodes if _may_land_on(profile, node)]
    if not eligible:
        return (
            f"no node given with GPUs matches its {_where(profile)}: its shared pods never "
            "schedule there"
        )
    largest = max(eligible, key=lambda node: (node.memory_mib, node.name))
    if mib <= largest.memory_mib * scaling:
        return None
    scaled = f" x {scaling:g} (deviceMemoryScaling, as overcommitRatio asks)" if scaling > 1 else ""
    product = f"{largest.product} on " if largest.product else ""
    return (
        f"its shared pods reserve {profile.max_memory_text} ({mib:,} MiB) of GPU memory per GPU "
        f"on {profile.backend.type}, more than any GPU they may land on has (largest "
        f"{largest.memory_mib:,} MiB{scaled}: {product}node {largest.name}), so they never "
        f"schedule; {lower}, or send the profile to larger GPUs "
        f"({'nodeSelector' if _reads_gpu_types(profile) else 'nodeSelector or gpuTypes'})"
    )


def memory_fit_warnings(policies: PolicySet, nodes: Sequence[GpuNode]) -> list[str]:
    """A warning per profile, and per tenant whose overrides change the answer, whose shared
    pods reserve more GPU memory than any GPU of ``nodes`` they may land on."""
    warnings: list[str] = []
    for name in policies.profiles:
        own = _unfit(
            policies.resolve(name, None), nodes, "lower maxMemory (one team's: in its override)"
        )
        if own is not None:
            warnings.append(f"profile {name}: {own}")
        for tenant in policies.tenants:
            if name not in tenant.overrides:
                continue
            theirs = _unfit(
                policies.resolve(name, tenant), nodes, "lower maxMemory in the override"
            )
            if theirs is not None and theirs != own:
                warnings.append(f"tenant {tenant.name}: its override of profile {name}: {theirs}")
    return warnings
