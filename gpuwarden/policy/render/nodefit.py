"""Whether what a policy gives its pods fits the GPUs of a cluster's nodes (`lint --nodes`).

Two asks no scheduler can place, so the pod stays Pending with no word from gpuwarden:

- **GPU memory.** On Volcano vGPU and HAMi the memory a shared pod requests is its cap
  (``volcano.sh/vgpu-memory``, ``nvidia.com/gpumem``), and on the dra backend its claim asks
  ``maxMemory`` of a device's memory capacity: a reservation larger than every GPU the pod may
  land on never fits. NVIDIA's MPS cap is only a limit a process may never reach, so it is not
  checked.
- **GPU count.** A pod's GPUs all come from one node. A profile, or a tenant's override, that
  sets more GPUs than any node has never schedules; and a tenant's ``maxGpusPerPod`` above every
  node's count admits such pods instead of denying them with a message.

Nodes are read by GPU Feature Discovery's labels (NVIDIA/k8s-device-plugin
internal/lm/resource.go): ``nvidia.com/gpu.memory`` (each GPU's total memory, MiB),
``nvidia.com/gpu.count`` and ``nvidia.com/gpu.product`` (the GPU's name, spaces as dashes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

from gpuwarden.policy.pod.quantity import to_mebibytes
from gpuwarden.policy.pod.resources import metadata_of, string_map
from gpuwarden.policy.spec.backends import reads_gpu_types
from gpuwarden.policy.spec.model import DraBackend, HamiBackend, VolcanoBackend
from gpuwarden.policy.spec.policyset import PolicySet
from gpuwarden.policy.spec.resolved import ResolvedProfile

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


class GpuNode(NamedTuple):
    """A node's name and labels, and its GPUs as GFD labels them (0: not labelled)."""

    name: str
    labels: Mapping[str, str]
    memory_mib: int
    gpus: int
    product: str


def _positive(labels: Mapping[str, str], key: str) -> int:
    raw = labels.get(key, "")
    return int(raw) if raw.isdigit() else 0


def gpu_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[GpuNode]:
    """The nodes GFD labels with their GPUs' memory or count (others have no GPU, or no GFD)."""
    found: list[GpuNode] = []
    for node in nodes:
        meta = metadata_of(node)
        labels = string_map(meta.get("labels"))
        memory, gpus = _positive(labels, GPU_MEMORY_LABEL), _positive(labels, GPU_COUNT_LABEL)
        if memory or gpus:
            name = str(meta.get("name", ""))
            found.append(GpuNode(name, labels, memory, gpus, labels.get(GPU_PRODUCT_LABEL, "")))
    return found


def _reads_gpu_types(profile: ResolvedProfile) -> bool:
    """Whether the profile names gpuTypes that its backend's scheduler reads."""
    return bool(profile.gpu_types) and reads_gpu_types(profile.backend, profile.gpu_share)


def _may_land_on(profile: ResolvedProfile, node: GpuNode) -> bool:
    """The profile's nodeSelector holds on the node, and its gpuTypes (as Volcano and HAMi read
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


def _largest(nodes: Sequence[GpuNode], size: Callable[[GpuNode], int]) -> GpuNode | None:
    labelled = [node for node in nodes if size(node)]
    return max(labelled, key=lambda node: (size(node), node.name)) if labelled else None


def _larger(profile: ResolvedProfile) -> str:
    return "nodeSelector" if _reads_gpu_types(profile) else "nodeSelector or gpuTypes"


class _Problem(NamedTuple):
    """Why a profile's pods never schedule, and the setting to lower (None: no such setting)."""

    why: str
    setting: str | None = None
    instead: str = ""  # the other way out

    def told(self, place: str) -> str:
        """The problem with its fix, where ``place`` says where the setting is written."""
        if self.setting is None:
            return self.why
        return f"{self.why}; lower {self.setting}{place}, or {self.instead}"


def _count_problem(profile: ResolvedProfile, nodes: Sequence[GpuNode]) -> _Problem | None:
    """A GPU count the profile (or the override) sets that no node it may land on has."""
    if profile.gpus_set_by is None or profile.gpus <= 1:
        return None  # each pod keeps the count it asks for: the tenant's limit is checked
    if profile.gpu_share and not isinstance(profile.backend, VolcanoBackend | HamiBackend):
        return None  # a share of one device (MPS replicas, a dra claim): lint says so
    largest = _largest(nodes, lambda node: node.gpus)
    if largest is None or profile.gpus <= largest.gpus:
        return None
    return _Problem(
        f"its pods get {profile.gpus} GPUs each (set by {profile.gpus_set_by}), more than any "
        f"node they may land on has (largest {largest.gpus} GPUs: node {largest.name}), so they "
        "never schedule",
        "gpus",
        f"send the profile to nodes of {profile.gpus} GPUs (nodeSelector)",
    )


def _reserved_mib(profile: ResolvedProfile) -> tuple[int, Decimal] | None:
    """(MiB a shared pod reserves per GPU, the scaling its nodes must advertise) where the
    backend reserves memory; None where it does not."""
    if not profile.gpu_share or profile.max_memory is None:
        return None
    if isinstance(profile.backend, VolcanoBackend | HamiBackend):
        # The request is the cap; memory is overcommitted only by the device plugin's
        # deviceMemoryScaling, which lint asks to be the profile's overcommitRatio.
        return to_mebibytes(profile.max_memory), Decimal(str(profile.overcommit_ratio))
    if isinstance(profile.backend, DraBackend):
        return to_mebibytes(profile.max_memory), Decimal(1)
    return None


def _memory_problem(profile: ResolvedProfile, nodes: Sequence[GpuNode]) -> _Problem | None:
    """A shared pod's memory reservation that no GPU it may land on holds."""
    reserved = _reserved_mib(profile)
    largest = _largest(nodes, lambda node: node.memory_mib)
    if reserved is None or largest is None:
        return None
    mib, scaling = reserved
    if mib <= largest.memory_mib * scaling:
        return None
    scaled = f" x {scaling:g} (deviceMemoryScaling, as overcommitRatio asks)" if scaling > 1 else ""
    product = f"{largest.product} on " if largest.product else ""
    return _Problem(
        f"its shared pods reserve {profile.max_memory_text} ({mib:,} MiB) of GPU memory per GPU "
        f"on {profile.backend.type}, more than any GPU they may land on has (largest "
        f"{largest.memory_mib:,} MiB{scaled}: {product}node {largest.name}), so they never "
        "schedule",
        "maxMemory",
        f"send the profile to larger GPUs ({_larger(profile)})",
    )


def _problems(profile: ResolvedProfile, nodes: Sequence[GpuNode]) -> list[_Problem]:
    """Why the profile's pods never schedule on ``nodes``; empty when they may."""
    if profile.gpus == 0:
        return []
    eligible = [node for node in nodes if _may_land_on(profile, node)]
    if not eligible:
        return [
            _Problem(
                f"no node given with GPUs matches its {_where(profile)}: its pods never schedule"
            )
        ]
    found = (_count_problem(profile, eligible), _memory_problem(profile, eligible))
    return [problem for problem in found if problem is not None]


#: Where a profile's own setting is lowered for one team only.
_IN_PROFILE = " (one team's: in its override)"


def node_fit_warnings(policies: PolicySet, nodes: Sequence[GpuNode]) -> list[str]:
    """A warning per profile, and per tenant override that changes the answer, whose pods no
    node of ``nodes`` can hold; and per tenant whose maxGpusPerPod no node has."""
    warnings: list[str] = []
    for name in policies.profiles:
        own = _problems(policies.resolve(name, None), nodes)
        warnings += [f"profile {name}: {problem.told(_IN_PROFILE)}" for problem in own]
        for tenant in policies.tenants:
            if name not in tenant.overrides:
                continue
            # The same problem as the profile's is said once, for the profile.
            warnings += [
                f"tenant {tenant.name}: its override of profile {name}: "
                f"{problem.told(' in the override')}"
                for problem in _problems(policies.resolve(name, tenant), nodes)
                if problem not in own
            ]
    return warnings + _limit_warnings(policies, nodes)


def _limit_warnings(policies: PolicySet, nodes: Sequence[GpuNode]) -> list[str]:
    """Tenants whose maxGpusPerPod admits pods that no node has the GPUs for."""
    largest = _largest(nodes, lambda node: node.gpus)
    if largest is None:
        return []
    return [
        f"tenant {tenant.name}: maxGpusPerPod {limit} admits pods of more GPUs than any node has "
        f"(largest {largest.gpus} GPUs: node {largest.name}), which then stay Pending; set "
        f"maxGpusPerPod {largest.gpus}, so that they are denied with a message instead"
        for tenant in policies.tenants
        if (limit := tenant.limits.max_gpus_per_pod) is not None and limit > largest.gpus
    ]
