"""Scheduler backends: how a resolved profile becomes one project's real resources and annotations.

Each backend answers four questions for a resolved profile: which schedulerName, which extended
resources per GPU container (request equals limit), which environment, which pod annotations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuwarden.policy import keys
from gpuwarden.policy.model import (
    HamiBackend,
    MpsSettings,
    NativeBackend,
    NvidiaBackend,
    VolcanoBackend,
)
from gpuwarden.policy.quantity import to_mebibytes
from gpuwarden.policy.resolved import ResolvedProfile

DEFAULT_SCHEDULER = "default-scheduler"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
VOLCANO_PREEMPTABLE_ANNOTATION = "volcano.sh/preemptable"


@dataclass(frozen=True)
class BackendPlan:
    """What a backend wants on a pod for one resolved profile."""

    scheduler_name: str | None
    resources: Mapping[str, str]
    env: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    shared: bool = True  # whether the pod really shares its GPUs on this backend


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


def _reserved_mib(profile: ResolvedProfile) -> str | None:
    reserved = profile.reserved_memory
    return str(to_mebibytes(reserved)) if reserved is not None else None


def _volcano(backend: VolcanoBackend, profile: ResolvedProfile, queue: str | None) -> BackendPlan:
    annotations: dict[str, str] = {}
    if queue or backend.queue:
        annotations[VOLCANO_QUEUE_ANNOTATION] = queue or backend.queue or ""
    if profile.preemptible:
        annotations[VOLCANO_PREEMPTABLE_ANNOTATION] = "true"
    if not profile.gpu_share:
        whole = (
            {
                "volcano.sh/vgpu-number": str(profile.gpus),
                "volcano.sh/vgpu-memory-percentage": "100",
                "volcano.sh/vgpu-cores": "100",
            }
            if backend.whole_gpus == "vgpu"
            else {"nvidia.com/gpu": str(profile.gpus)}
        )
        return BackendPlan(backend.scheduler_name, whole, {}, annotations, shared=False)
    resources = {"volcano.sh/vgpu-number": str(profile.gpus)}
    reserved = _reserved_mib(profile)
    if reserved is not None:
        resources["volcano.sh/vgpu-memory"] = reserved
    if profile.thread_percentage is not None:
        resources["volcano.sh/vgpu-cores"] = str(profile.thread_percentage)
    return BackendPlan(backend.scheduler_name, resources, {}, annotations)


def _hami(backend: HamiBackend, profile: ResolvedProfile) -> BackendPlan:
    if not profile.gpu_share:
        resources = {
            "nvidia.com/gpu": str(profile.gpus),
            "nvidia.com/gpumem-percentage": "100",
            "nvidia.com/gpucores": "100",
        }
        return BackendPlan(backend.scheduler_name, resources, shared=False)
    resources = {"nvidia.com/gpu": str(profile.gpus)}
    reserved = _reserved_mib(profile)
    if reserved is not None:
        resources["nvidia.com/gpumem"] = reserved
    if profile.thread_percentage is not None:
        resources["nvidia.com/gpucores"] = str(profile.thread_percentage)
    return BackendPlan(backend.scheduler_name, resources)


def _own_scheduler(name: str) -> str | None:
    """The schedulerName to set: none for the default scheduler, so a pod keeps its own."""
    return None if name == DEFAULT_SCHEDULER else name


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


def shared_slices_per_container(profile: ResolvedProfile) -> int | None:
    """How many shared slices one container may hold on the profile's backend; None: any number
    (Volcano's and HAMi's device plugins give each slice its own GPU)."""
    # NVIDIA's device plugin gives an MPS client one replica and refuses requests for more.
    return 1 if isinstance(profile.backend, NvidiaBackend) else None


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
    return _native(backend, profile)
