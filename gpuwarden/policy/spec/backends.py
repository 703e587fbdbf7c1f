"""Scheduler backends: how a resolved profile becomes one project's real resources and annotations.

Each backend answers four questions for a resolved profile: which schedulerName, which extended
resources per GPU container (request equals limit), which environment, which pod annotations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import to_mebibytes
from gpuwarden.policy.spec.model import (
    Backend,
    DraBackend,
    HamiBackend,
    MpsSettings,
    NativeBackend,
    NvidiaBackend,
    VolcanoBackend,
)
from gpuwarden.policy.spec.resolved import ResolvedProfile

DEFAULT_SCHEDULER = "default-scheduler"
#: The pod-level claim (spec.resourceClaims[].name) a shared profile on the dra backend gives the
#: GPU container, and the prefix of the ResourceClaimTemplates gpuwarden renders.
DRA_CLAIM_NAME = keys.DRA_CLAIM_NAME
DRA_TEMPLATE_PREFIX = "gpuwarden-"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
VOLCANO_PREEMPTABLE_ANNOTATION = "volcano.sh/preemptable"
# The GPU models a pod may use, read by Volcano's vGPU device (GPUInUse in volcano-sh/volcano
# pkg/scheduler/api/devices/nvidia/vgpu/type.go) and HAMi (Project-HAMi/HAMi
# pkg/device/nvidia/device.go): comma-separated, each a case-insensitive substring of the type.
USE_GPU_TYPE_ANNOTATION = "nvidia.com/use-gputype"
#: Every annotation a backend plan writes and its scheduler reads: gpuwarden's decision as much as
#: its own annotations, so none may change after admission (admission/checks/updates.py).
BACKEND_ANNOTATIONS = (
    VOLCANO_QUEUE_ANNOTATION,
    VOLCANO_PREEMPTABLE_ANNOTATION,
    USE_GPU_TYPE_ANNOTATION,
)

# The PodGroup a gang-scheduled pod belongs to (volcano-sh/volcano
# staging/src/volcano.sh/apis/pkg/apis/scheduling/v1beta1/labels.go, KubeGroupNameAnnotationKey).
VOLCANO_GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"

# GPU Feature Discovery's node labels (NVIDIA/k8s-device-plugin internal/lm/resource.go,
# baseLabeler and getProductName): the sharing strategy ("mps" or "time-slicing" where GPUs have
# more than one replica, api/config/v1/sharing.go; "none" otherwise), the replica count, and the
# product, which ends in -SHARED on a shared node whose resource is not renamed.
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
PRODUCT_LABEL = "nvidia.com/gpu.product"
SHARED_PRODUCT_SUFFIX = "-SHARED"
SHARING_STRATEGIES = ("mps", "time-slicing")


@dataclass(frozen=True)
class BackendPlan:
    """What a backend wants on a pod for one resolved profile."""

    scheduler_name: str | None
    resources: Mapping[str, str]
    env: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    shared: bool = True  # whether the pod really shares its GPUs on this backend
    # The ResourceClaimTemplate of the pod's DRA claim (DRA_CLAIM_NAME) that the GPU
    # container uses instead of GPU resources; None: the GPUs are resources.
    claim_template: str | None = None
    # Node labels the pod prefers (a preferred node affinity term gpuwarden writes); empty: none.
    preferred_nodes: Mapping[str, str] = field(default_factory=dict)


def _mps_env(profile: ResolvedProfile) -> dict[str, str]:
    """CUDA MPS client limits; a client can lower, never raise, the control daemon's limits."""
    env: dict[str, str] = {}
    if profile.thread_percentage is not None:
        env[keys.ENV_MPS_THREAD_PERCENTAGE] = str(profile.thread_percentage)
    if profile.max_memory is not None:
        # MPS reads M as MiB; one entry per device ordinal the container sees.
        limit = f"{to_mebibytes(profile.max_memory)}M"
        env[keys.ENV_MPS_PINNED_MEM_LIMIT] = ",".join(
            f"{device}={limit}" for device in range(max(profile.gpus, 1))
        )
    return env


def _cap_mib(profile: ResolvedProfile) -> str | None:
    """The GPU-memory cap as Volcano's and HAMi's memory resource (MiB per GPU).

    Both device plugins set HAMi-core's ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` from the memory the
    scheduler assigned, which is the request (Project-HAMi/volcano-vgpu-device-plugin
    ``pkg/plugin/server.go``, Project-HAMi/HAMi
    ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go``): the request *is* the
    enforced cap, so it is ``maxMemory``. Overcommit on these backends is the node's
    ``deviceMemoryScaling``, which advertises ``scaling x`` each GPU's memory.
    """
    cap = profile.max_memory
    return str(to_mebibytes(cap)) if cap is not None else None


def _core_notes(profile: ResolvedProfile, resource: str) -> tuple[str, ...]:
    """What a core share does to packing on Volcano and HAMi (MPS percentages may sum past 100)."""
    share = profile.thread_percentage
    if share is None or share >= 100:
        return ()
    # The schedulers sum core requests per GPU to at most 100 (Volcano
    # pkg/scheduler/api/devices/nvidia/vgpu/utils.go, HAMi pkg/device/nvidia/device.go), and
    # HAMi-core holds the pod to them through CUDA_DEVICE_SM_LIMIT.
    return (
        f"{resource} {share}: at most {100 // share} such pods share a GPU (a core reservation)",
    )


def _volcano(backend: VolcanoBackend, profile: ResolvedProfile, queue: str | None) -> BackendPlan:
    annotations: dict[str, str] = {}
    if queue or backend.queue:
        annotations[VOLCANO_QUEUE_ANNOTATION] = queue or backend.queue or ""
    # Volcano reads a pod without the annotation as preemptable (GetPodPreemptable in
    # volcano-sh/volcano pkg/scheduler/api/pod_info.go), so "false" must be written.
    annotations[VOLCANO_PREEMPTABLE_ANNOTATION] = "true" if profile.preemptible else "false"
    vgpu = profile.gpu_share or backend.whole_gpus == "vgpu"
    if profile.gpu_types and vgpu:
        annotations[USE_GPU_TYPE_ANNOTATION] = ",".join(profile.gpu_types)
    if not profile.gpu_share:
        # A vGPU that names no memory gets 100% of the device's memory (ExtractResourceRequest
        # in volcano-sh/volcano pkg/scheduler/api/devices/util.go), and the device plugin
        # advertises no memory-percentage resource that a request for one could fit.
        whole = (
            {"volcano.sh/vgpu-number": str(profile.gpus), "volcano.sh/vgpu-cores": "100"}
            if backend.whole_gpus == "vgpu"
            else {"nvidia.com/gpu": str(profile.gpus)}
        )
        return BackendPlan(backend.scheduler_name, whole, {}, annotations, shared=False)
    resources = {"volcano.sh/vgpu-number": str(profile.gpus)}
    cap = _cap_mib(profile)
    if cap is not None:
        resources["volcano.sh/vgpu-memory"] = cap
    if profile.thread_percentage is not None:
        resources["volcano.sh/vgpu-cores"] = str(profile.thread_percentage)
    notes = _core_notes(profile, "volcano.sh/vgpu-cores")
    return BackendPlan(backend.scheduler_name, resources, {}, annotations, notes)


def _hami(backend: HamiBackend, profile: ResolvedProfile) -> BackendPlan:
    annotations: dict[str, str] = {}
    if profile.gpu_types:
        annotations[USE_GPU_TYPE_ANNOTATION] = ",".join(profile.gpu_types)
    if not profile.gpu_share:
        resources = {
            "nvidia.com/gpu": str(profile.gpus),
            "nvidia.com/gpumem-percentage": "100",
            "nvidia.com/gpucores": "100",
        }
        return BackendPlan(backend.scheduler_name, resources, annotations=annotations, shared=False)
    resources = {"nvidia.com/gpu": str(profile.gpus)}
    cap = _cap_mib(profile)
    if cap is not None:
        resources["nvidia.com/gpumem"] = cap
    if profile.thread_percentage is not None:
        resources["nvidia.com/gpucores"] = str(profile.thread_percentage)
    notes = _core_notes(profile, "nvidia.com/gpucores")
    return BackendPlan(backend.scheduler_name, resources, annotations=annotations, notes=notes)


def _own_scheduler(name: str) -> str | None:
    """The schedulerName to set: none for the default scheduler, so a pod keeps its own."""
    return None if name == DEFAULT_SCHEDULER else name


def _nvidia_share_notes(profile: ResolvedProfile) -> tuple[str, ...]:
    """What NVIDIA's MPS sharing does to a shared profile's caps and reservation."""
    notes: list[str] = []
    # NVIDIA/k8s-device-plugin cmd/mps-control-daemon/mps/daemon.go (Start) sets the daemon's
    # defaults to total memory / replicas per device and 100 / replicas percent of threads; a
    # client's CUDA_MPS_* can only lower what the daemon allows.
    capped = [
        name
        for name, value in (
            ("maxMemory", profile.max_memory),
            ("threadPercentage", profile.thread_percentage),
        )
        if value is not None
    ]
    if capped:
        verb = "lowers" if len(capped) == 1 else "lower"
        notes.append(
            f"NVIDIA's MPS daemon gives a client 1/replicas of a GPU; {' and '.join(capped)} "
            f"only {verb} that"
        )
    # The scheduler counts replicas, one per container, whatever the pod's memory.
    if profile.overcommit_ratio > 1:
        notes.append(
            f"overcommitRatio {profile.overcommit_ratio:g} does not change scheduling on nvidia: "
            "a pod reserves one MPS replica"
        )
    return tuple(notes)


def exclusive_node_expression(profile: ResolvedProfile) -> dict[str, Any] | None:
    """The required node-affinity expression that keeps an exclusive profile off shared GPUs.

    With the device plugin's default renameByDefault: false, a node that shares its GPUs
    advertises the replicas as nvidia.com/gpu, so a request for whole GPUs would get replicas
    (and, with failRequestsGreaterThanOne, fail for more than one). GFD labels such a node with
    its sharing strategy; NotIn also matches nodes without the label (no GFD, no sharing).
    """
    if not isinstance(profile.backend, NvidiaBackend) or profile.gpu_share or not profile.gpus:
        return None
    return no_shared_gpus_expression()


def no_shared_gpus_expression() -> dict[str, Any]:
    """The node-selector requirement that excludes nodes whose GPUs are shared (a new copy)."""
    return {"key": SHARING_STRATEGY_LABEL, "operator": "NotIn", "values": list(SHARING_STRATEGIES)}


def _label_selects_shared_gpus(key: str, value: str) -> bool:
    """Whether a node label value belongs to nodes whose GPUs are shared (GFD's labels)."""
    if key == SHARING_STRATEGY_LABEL:
        return value in SHARING_STRATEGIES
    if key == REPLICAS_LABEL:
        return value.isdigit() and int(value) > 1
    if key == PRODUCT_LABEL:
        return value.endswith(SHARED_PRODUCT_SUFFIX)
    return False


def reads_gpu_types(backend: Backend, shared: bool) -> bool:
    """Whether the backend's scheduler reads nvidia.com/use-gputype for a shared (or whole) pod:
    HAMi always, Volcano for vGPUs (as :func:`_volcano` and :func:`_hami` write it)."""
    if isinstance(backend, HamiBackend):
        return True
    if isinstance(backend, VolcanoBackend):
        return shared or backend.whole_gpus == "vgpu"
    return False


def selects_shared_gpus(key: str, operator: str, values: Sequence[str]) -> bool:
    """Whether a nodeSelector entry (operator In) or node-affinity expression picks only nodes
    whose GPUs are shared (an In that also names an unshared value leaves whole GPUs to pick)."""
    if operator == "In":
        return bool(values) and all(_label_selects_shared_gpus(key, str(v)) for v in values)
    if operator == "Gt" and key == REPLICAS_LABEL and len(values) == 1:
        # More than N >= 1 replicas: only nodes that share (an unshared GPU has 0 or 1).
        return str(values[0]).isdigit() and int(values[0]) >= 1
    return False


def _nvidia(backend: NvidiaBackend, profile: ResolvedProfile) -> BackendPlan:
    if not profile.gpu_share:
        return BackendPlan(
            _own_scheduler(backend.scheduler_name),
            {"nvidia.com/gpu": str(profile.gpus)},
            shared=False,
        )
    return BackendPlan(
        _own_scheduler(backend.scheduler_name),
        {backend.shared_resource_name: str(profile.gpus)},
        env=_mps_env(profile),
        notes=_nvidia_share_notes(profile),
    )


def _native(backend: NativeBackend, profile: ResolvedProfile) -> BackendPlan:
    notes: tuple[str, ...] = ()
    if profile.gpu_share:
        notes = ("the native backend cannot share GPUs, so the pod gets whole GPUs",)
    return BackendPlan(
        _own_scheduler(backend.scheduler_name),
        {"nvidia.com/gpu": str(profile.gpus)},
        notes=notes,
        shared=False,
    )


def claim_template_name(profile_name: str) -> str:
    """The ResourceClaimTemplate gpuwarden renders for a shared profile on the dra backend."""
    return f"{DRA_TEMPLATE_PREFIX}{profile_name}"


def _dra(backend: DraBackend, profile: ResolvedProfile) -> BackendPlan:
    scheduler = _own_scheduler(backend.scheduler_name)
    if not profile.gpu_share:
        # As native: the DeviceClass's extendedResourceName maps the request onto whole devices
        # (a request naming no capacity consumes each whole: fillEmptyRequest in
        # k8s.io/dynamic-resource-allocation structured/internal/incubating/consumable_capacity.go).
        return BackendPlan(
            scheduler, {backend.whole_resource_name: str(profile.gpus)}, shared=False
        )
    template = claim_template_name(profile.name)
    return BackendPlan(
        scheduler,
        {},
        claim_template=template,
        preferred_nodes=backend.shared_node_labels,
        notes=(
            f"DRA claim {DRA_CLAIM_NAME} from template {template}, a share of a "
            f"{backend.device_class_name} device",
        ),
    )


#: The weight of the preferred node affinity term a plan's ``preferred_nodes`` becomes: the
#: most a term may have (1-100), so it outweighs kube-scheduler's other scores for a claim.
PREFERRED_NODES_WEIGHT = 100


def preferred_nodes_term(labels: Mapping[str, str]) -> dict[str, Any] | None:
    """The preferredDuringSchedulingIgnoredDuringExecution term for ``labels`` (None: none)."""
    if not labels:
        return None
    return {
        "weight": PREFERRED_NODES_WEIGHT,
        "preference": {
            "matchExpressions": [
                {"key": key, "operator": "In", "values": [value]}
                for key, value in sorted(labels.items())
            ]
        },
    }


def shared_slices_per_container(profile: ResolvedProfile) -> int | None:
    """How many shared slices one container may hold on the profile's backend; None: any number
    (Volcano's and HAMi's device plugins give each slice its own GPU)."""
    # NVIDIA's device plugin refuses a container more than one replica unless its config sets
    # failRequestsGreaterThanOne: false (internal/rm/rm.go ValidateRequest).
    backend = profile.backend
    if isinstance(backend, NvidiaBackend) and backend.fail_requests_greater_than_one:
        return 1
    return None


def plan_for(
    profile: ResolvedProfile, *, queue: str | None = None, mps: MpsSettings | None = None
) -> BackendPlan:
    """The backend's plan for a profile with at least one GPU."""
    del mps  # the pipe directory is the node's business; pods must not set it
    backend = profile.backend
    if isinstance(backend, VolcanoBackend):
        return _volcano(backend, profile, queue)
    if isinstance(backend, HamiBackend):
        return _hami(backend, profile)
    if isinstance(backend, NvidiaBackend):
        return _nvidia(backend, profile)
    if isinstance(backend, DraBackend):
        return _dra(backend, profile)
    return _native(backend, profile)
