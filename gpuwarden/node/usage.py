"""Who uses how much of which GPU: each container's allocation and its share of the GPUs' work.

Pure functions over one tick's observations; the agent feeds them and the metrics read the result.

**Allocation.** The GPUs a container holds, in whole-GPU units: its GPU count times the share of
each GPU its profile gives it. The share is 1 for a whole GPU; for an MPS slice (the nvidia
backend's shared profiles) 1/replicas where the agent is told the device plugin's replicas
(``--mps-replicas``), else the recorded thread percentage, else the memory cap over the GPU's
memory; for a Volcano or HAMi vGPU, or a share claimed through the ``dra`` backend, the larger
of its core share (``vgpu-cores`` / ``gpucores`` / the claim's cores, recorded as the thread
percentage) and its memory share (the cap over the GPU's memory), as that is the part of the GPU
no other pod can be given. ``basis`` names which rule gave the figure.

**Busy.** NVML's per-process samples (``nvmlDeviceGetProcessUtilization``) give each process's
SM and memory-bandwidth utilization; a process absent from them did not use the GPU in the period
(NVML returns samples only for processes with non-zero utilization). MPS clients are the
exception: the server "creates the shared GPU context, manages its clients, and issues work to the
GPU on behalf of its clients" (NVIDIA's ``nvidia-cuda-mps-control(1)``), and NVML's reference does
not say whose PID such work is sampled under, so a client without a sample of its own is not taken
to be idle. A container whose processes are MPS clients with no sample of their own, and every
container on a GPU whose driver offers no per-process samples, is *estimated*: the device's
utilization (``nvmlDeviceGetUtilizationRates``) less what measured processes (MPS servers left
out) account for is split among them in proportion to their allocated share of that GPU (equally
where no share is known).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuwarden.node.limits import ObservedProcess
from gpuwarden.node.nvml import ProcessSamples, Utilization
from gpuwarden.node.pods import PodInfo, PodRef

Basis = Literal[
    "whole", "mps-replicas", "mps-threads", "vgpu-cores", "vgpu-memory", "memory-cap", "unknown"
]
# Backends whose scheduler reserves a shared pod's cores and memory on its GPU.
_VGPU_BACKENDS = frozenset({"volcano", "hami", "dra"})


@dataclass(frozen=True)
class Allocation:
    """One container's GPUs: ``gpus`` devices, ``share`` of each."""

    pod: PodRef
    tenant: str
    profile: str
    container: str
    gpus: int
    share: float
    basis: Basis

    @property
    def allocated(self) -> float:
        """GPUs held, in whole-GPU units."""
        return self.gpus * self.share


@dataclass(frozen=True)
class GpuUse:
    """One container's use of one GPU: fractions (0-1) of the device's SM and memory-bandwidth
    time, and its GPU memory in bytes."""

    pod: PodRef
    tenant: str
    profile: str
    container: str
    gpu: int
    sm: float
    memory_bandwidth: float
    memory_used: int
    estimated: bool


@dataclass(frozen=True)
class ContainerUse:
    """An allocated container's totals over its GPUs: ``busy`` in whole-GPU units (the sum of its
    SM fractions), GPU memory in bytes; ``estimated`` where any part of ``busy`` is."""

    allocation: Allocation
    busy: float
    memory_used: int
    estimated: bool


def container_name(proc: ObservedProcess, pod: PodInfo) -> str:
    """The name of the process's container, its ID's first 12 digits where the pod's status
    does not list it yet, or "(pod)" where its cgroup names no container."""
    container_id = proc.owner.container_id if proc.owner is not None else None
    return pod.container_name(container_id) or (container_id[:12] if container_id else "(pod)")


def container_processes(
    procs: Iterable[ObservedProcess], pods: Mapping[str, PodInfo]
) -> Iterator[tuple[tuple[str, str, int], ObservedProcess]]:
    """Each process of a known pod (MPS servers left out), keyed (pod UID, container, GPU)."""
    for proc in procs:
        if proc.pod is None or proc.is_mps_server:
            continue
        pod = pods.get(proc.pod.uid)
        if pod is not None:
            yield (pod.ref.uid, container_name(proc, pod), proc.gpu), proc


def _share(pod: PodInfo, mps_replicas: int | None, memory_total: int | None) -> tuple[float, Basis]:
    if pod.gpu_shared is not True:
        return 1.0, "whole"
    memory = (
        min(1.0, pod.cap / memory_total)
        if pod.cap is not None and memory_total is not None and memory_total > 0
        else None
    )
    threads = pod.thread_percentage / 100 if pod.thread_percentage is not None else None
    if pod.backend in _VGPU_BACKENDS:
        if threads is not None and (memory is None or threads >= memory):
            return threads, "vgpu-cores"
        if memory is not None:
            return memory, "vgpu-memory"
        return 1.0, "whole"
    if mps_replicas is not None and mps_replicas > 0:
        return 1.0 / mps_replicas, "mps-replicas"
    if threads is not None:
        return threads, "mps-threads"
    if memory is not None:
        return memory, "memory-cap"
    return 1.0, "unknown"


def allocations(
    pods: Iterable[PodInfo], *, mps_replicas: int | None, memory_total: int | None
) -> list[Allocation]:
    """The GPU allocation of every container of the (active) pods that holds GPUs the agent can
    size: a GPU count resource (``nvidia.com/gpu`` and the like), or gpuwarden's record of GPUs
    for it. DRA claims and MIG instances are left out (the agent does not see which devices, or
    how much of them, a claim holds, and a MIG profile is no whole-GPU count)."""
    out: list[Allocation] = []
    for pod in pods:
        if not pod.active:
            continue
        named = set(pod.containers) if pod.uses_gpu else set()
        share, basis = _share(pod, mps_replicas, memory_total)
        for container in sorted(named | set(pod.container_gpus)):
            gpus = pod.container_gpus.get(container)
            if gpus is None:
                gpus = pod.gpu_count if pod.gpu_count is not None else 1
            if gpus <= 0:
                continue
            out.append(
                Allocation(
                    pod=pod.ref,
                    tenant=pod.tenant or "",
                    profile=pod.profile or "",
                    container=container,
                    gpus=gpus,
                    share=share,
                    basis=basis,
                )
            )
    return out


@dataclass(frozen=True)
class DeviceReading:
    """What NVML said of one GPU this tick; None where the call failed or is not supported."""

    device: Utilization | None
    samples: ProcessSamples | None


def _clamp(value: float) -> float:
    return max(0.0, min(1.0, value))


def gpu_uses(
    procs: Sequence[ObservedProcess],
    pods: Mapping[str, PodInfo],
    readings: Mapping[int, DeviceReading],
    shares: Mapping[tuple[str, str], float],
) -> list[GpuUse]:
    """Each container's use of each GPU it has processes on (see the module docstring)."""
    # (pod UID, container, gpu) -> pids, memory, any MPS client
    groups: dict[tuple[str, str, int], tuple[list[int], int, bool]] = {}
    for key, proc in container_processes(procs, pods):
        pids, memory, client = groups.get(key, ([], 0, False))
        pids.append(proc.pid)
        client = client or proc.mps_client or proc.server is not None
        groups[key] = (pids, memory + (proc.used_memory or 0), client)
    servers = {p.pid for p in procs if p.is_mps_server}

    out: list[GpuUse] = []
    for gpu in sorted({key[2] for key in groups}):
        reading = readings.get(gpu, DeviceReading(None, None))
        samples = reading.samples
        measured: dict[tuple[str, str, int], Utilization] = {}
        estimated: list[tuple[str, str, int]] = []
        for key, (pids, _memory, client) in groups.items():
            if key[2] != gpu:
                continue
            own = [samples.by_pid[pid] for pid in pids if pid in samples.by_pid] if samples else []
            if samples is None or (client and not own):
                estimated.append(key)
            else:
                measured[key] = Utilization(
                    sm=sum(u.sm for u in own), memory=sum(u.memory for u in own)
                )
        rest = None
        if estimated and reading.device is not None:
            accounted = (
                [u for pid, u in samples.by_pid.items() if pid not in servers]
                if samples is not None
                else []
            )
            rest = Utilization(
                sm=max(0.0, reading.device.sm - sum(u.sm for u in accounted)),
                memory=max(0.0, reading.device.memory - sum(u.memory for u in accounted)),
            )
        weights = {key: shares.get(key[:2], 0.0) for key in estimated}
        total = sum(weights.values())
        for key in sorted(groups):
            if key[2] != gpu:
                continue
            if key in measured:
                figure = measured[key]
            elif rest is not None:
                part = weights[key] / total if total > 0 else 1 / len(estimated)
                figure = Utilization(sm=rest.sm * part, memory=rest.memory * part)
            else:
                continue  # no device figure to apportion: no series rather than a made-up one
            pod = pods[key[0]]
            out.append(
                GpuUse(
                    pod=pod.ref,
                    tenant=pod.tenant or "",
                    profile=pod.profile or "",
                    container=key[1],
                    gpu=gpu,
                    sm=_clamp(figure.sm / 100),
                    memory_bandwidth=_clamp(figure.memory / 100),
                    memory_used=groups[key][1],
                    estimated=key not in measured,
                )
            )
    return out


def container_uses(allocated: Sequence[Allocation], uses: Sequence[GpuUse]) -> list[ContainerUse]:
    """Every allocated container's totals; one with no process on a GPU is busy 0."""
    totals: dict[tuple[str, str], tuple[float, int, bool]] = {}
    for use in uses:
        key = (use.pod.uid, use.container)
        busy, memory, estimated = totals.get(key, (0.0, 0, False))
        totals[key] = (busy + use.sm, memory + use.memory_used, estimated or use.estimated)
    out = []
    for allocation in allocated:
        busy, memory, estimated = totals.get(
            (allocation.pod.uid, allocation.container), (0.0, 0, False)
        )
        out.append(ContainerUse(allocation, busy, memory, estimated))
    return out
