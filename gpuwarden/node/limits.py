"""Pure decisions of the node agent: which MPS limits to set and what counts as a violation.

Nothing here does I/O. The agent gathers the inputs (pods, NVML processes, the MPS server list,
``/proc`` owners) and acts on the values these functions return.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal

from gpuwarden.node import mps
from gpuwarden.node.nvml import GpuDevice
from gpuwarden.node.pods import PodInfo, PodRef
from gpuwarden.node.procfs import CgroupOwner
from gpuwarden.policy.pod.quantity import to_mebibytes

FULL_THREADS = 100


@dataclass(frozen=True)
class MpsServer:
    pid: int
    uid: int | None
    clients: tuple[int, ...] = ()


@dataclass(frozen=True)
class ObservedProcess:
    """One NVML process on one GPU, with what the agent learned about it."""

    gpu: int
    pid: int
    used_memory: int | None
    mps_client: bool = False
    owner: CgroupOwner | None = None
    pod: PodRef | None = None  # set when the owner is a pod on this node's pod list
    server: int | None = None  # the MPS server whose client list has this PID
    is_mps_server: bool = False


@dataclass(frozen=True)
class Placement:
    """Which pods use which GPU: observed from their processes, or the node's only GPU."""

    on_gpu: Mapping[int, frozenset[str]]
    unplaced: frozenset[str]  # GPU pods whose GPU is not known yet


def gpu_pods(pods: Iterable[PodInfo]) -> dict[str, PodInfo]:
    return {p.ref.uid: p for p in pods if p.active and p.uses_gpu}


def place_pods(
    gpus: Sequence[int], pods: Mapping[str, PodInfo], procs: Iterable[ObservedProcess]
) -> Placement:
    on_gpu: dict[int, set[str]] = {gpu: set() for gpu in gpus}
    for proc in procs:
        if proc.pod is not None and proc.pod.uid in pods and proc.gpu in on_gpu:
            on_gpu[proc.gpu].add(proc.pod.uid)
    placed = set().union(*on_gpu.values()) if on_gpu else set()
    unplaced = set(pods) - placed
    if len(gpus) == 1:
        on_gpu[gpus[0]] |= unplaced
        unplaced = set()
    return Placement(
        on_gpu={gpu: frozenset(uids) for gpu, uids in on_gpu.items()}, unplaced=frozenset(unplaced)
    )


def memory_ceilings(
    devices: Sequence[GpuDevice],
    pods: Mapping[str, PodInfo],
    placement: Placement,
    configured: int | None = None,
) -> dict[int, int]:
    """Bytes per GPU: the largest cap among the pods that (may) use it.

    A pod whose GPU is not known yet counts on every GPU. With no capped pod the ceiling is the
    configured one, else the whole GPU. A configured ceiling is never exceeded.
    """
    out: dict[int, int] = {}
    for device in devices:
        uids = placement.on_gpu.get(device.index, frozenset()) | placement.unplaced
        caps = [pods[uid].cap for uid in uids if uid in pods and pods[uid].cap is not None]
        ceiling = max((c for c in caps if c is not None), default=None)
        if ceiling is None:
            ceiling = configured if configured is not None else device.memory_total
        elif configured is not None:
            ceiling = min(ceiling, configured)
        out[device.index] = min(ceiling, device.memory_total)
    return out


def thread_ceiling(pods: Iterable[PodInfo]) -> int:
    """The largest thread percentage among governed pods (a governed pod without one gets 100)."""
    governed = [p for p in pods if p.governed]
    if not governed:
        return FULL_THREADS
    return max(p.thread_percentage or FULL_THREADS for p in governed)


@dataclass(frozen=True)
class ServerPlan:
    threads: int
    mem_mib: Mapping[int, int]
    pods: tuple[PodRef, ...] = ()


@dataclass(frozen=True)
class MpsPlan:
    default_threads: int
    default_mem_mib: Mapping[int, int]
    servers: Mapping[int, ServerPlan] = field(default_factory=dict)


def server_pods(
    server: MpsServer, pods: Mapping[str, PodInfo], procs: Iterable[ObservedProcess]
) -> list[PodInfo]:
    """Pods served by one MPS server: those with a client on it, and those that will be.

    MPS gives each user ID its own server, so a pod that declares ``runAsUser`` equal to the
    server's UID gets its clients from this server even before its first client starts.
    """
    uids: set[str] = set()
    clients = set(server.clients)
    for proc in procs:
        if proc.pod is not None and (proc.server == server.pid or proc.pid in clients):
            uids.add(proc.pod.uid)
    if server.uid is not None:
        uids |= {uid for uid, pod in pods.items() if server.uid in pod.run_as_users}
    return [pods[uid] for uid in sorted(uids) if uid in pods]


def plan_mps(
    devices: Sequence[GpuDevice],
    pods: Mapping[str, PodInfo],
    procs: Sequence[ObservedProcess],
    servers: Sequence[MpsServer],
    configured_ceiling: int | None = None,
) -> MpsPlan:
    """Daemon defaults (the ceilings) and, for each running server, the limits of its pods."""
    placement = place_pods([d.index for d in devices], pods, procs)
    ceilings = memory_ceilings(devices, pods, placement, configured_ceiling)
    default_threads = thread_ceiling(pods.values())
    plans: dict[int, ServerPlan] = {}
    for server in servers:
        served = server_pods(server, pods, procs)
        caps = [p.cap for p in served if p.cap is not None]
        governed = [p for p in served if p.governed]
        mem = {}
        for device in devices:
            limit = ceilings[device.index]
            if caps and len(caps) == len(served):
                limit = min(limit, max(caps))
            mem[device.index] = to_mebibytes(limit)
        threads = default_threads
        if governed and len(governed) == len(served):
            threads = min(threads, thread_ceiling(governed))
        plans[server.pid] = ServerPlan(
            threads=threads, mem_mib=mem, pods=tuple(p.ref for p in served)
        )
    return MpsPlan(
        default_threads=default_threads,
        default_mem_mib={gpu: to_mebibytes(limit) for gpu, limit in ceilings.items()},
        servers=plans,
    )


@dataclass(frozen=True)
class PlannedCommand:
    key: str
    value: int
    command: str


def plan_commands(plan: MpsPlan, applied: Mapping[str, int]) -> list[PlannedCommand]:
    """The commands that bring the daemon from what was applied to the plan, defaults first."""
    wanted: list[PlannedCommand] = []
    for gpu, mib in sorted(plan.default_mem_mib.items()):
        wanted.append(PlannedCommand(f"default_mem/{gpu}", mib, mps.set_default_mem(gpu, mib)))
    wanted.append(
        PlannedCommand(
            "default_threads", plan.default_threads, mps.set_default_threads(plan.default_threads)
        )
    )
    for pid, server in sorted(plan.servers.items()):
        for gpu, mib in sorted(server.mem_mib.items()):
            wanted.append(
                PlannedCommand(f"server_mem/{pid}/{gpu}", mib, mps.set_server_mem(pid, gpu, mib))
            )
        wanted.append(
            PlannedCommand(
                f"server_threads/{pid}", server.threads, mps.set_server_threads(pid, server.threads)
            )
        )
    return [c for c in wanted if applied.get(c.key) != c.value]


# --- what the enforcement loop looks for --------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """A pod's container using more GPU memory on one GPU than its cap."""

    pod: PodRef
    container: str
    gpu: int
    used: int
    cap: int
    pids: tuple[int, ...]
    # client PID -> its MPS server, for the PIDs that are MPS clients
    servers: Mapping[int, int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.pod.uid, self.container, self.gpu)


def _container_key(pod: PodInfo, owner: CgroupOwner | None) -> str:
    container_id = owner.container_id if owner is not None else None
    name = pod.container_name(container_id)
    if name is not None:
        return name
    if container_id is not None:
        return container_id[:12]
    return "(pod)"


def violations(procs: Iterable[ObservedProcess], pods: Mapping[str, PodInfo]) -> list[Violation]:
    """The cap is per GPU container per GPU: the processes of one container on one GPU add up."""
    groups: dict[tuple[str, str, int], list[ObservedProcess]] = {}
    for proc in procs:
        if proc.pod is None or proc.is_mps_server or proc.used_memory is None:
            continue
        pod = pods.get(proc.pod.uid)
        if pod is None or pod.cap is None:
            continue
        groups.setdefault((pod.ref.uid, _container_key(pod, proc.owner), proc.gpu), []).append(proc)
    out = []
    for (uid, container, gpu), members in sorted(groups.items()):
        pod = pods[uid]
        assert pod.cap is not None
        used = sum(p.used_memory or 0 for p in members)
        if used > pod.cap:
            out.append(
                Violation(
                    pod=pod.ref,
                    container=container,
                    gpu=gpu,
                    used=used,
                    cap=pod.cap,
                    pids=tuple(sorted(p.pid for p in members)),
                    servers={p.pid: p.server for p in members if p.server is not None},
                )
            )
    return out


@dataclass(frozen=True)
class Oversubscription:
    """The caps of the pods on one GPU exceed its memory times their overcommit ratio."""

    gpu: int
    caps: int  # sum of the caps (per GPU container) of the pods on the GPU
    reserved: int  # sum of cap / overcommit ratio
    total: int
    pods: tuple[PodRef, ...]


def oversubscriptions(
    devices: Sequence[GpuDevice], pods: Mapping[str, PodInfo], placement: Placement
) -> list[Oversubscription]:
    """sum(cap_i / ratio_i) > total memory; with one ratio r, that is sum(cap) > total x r."""
    out = []
    for device in devices:
        on = [pods[uid] for uid in sorted(placement.on_gpu.get(device.index, ())) if uid in pods]
        capped = [p for p in on if p.cap is not None]
        if not capped:
            continue
        reserved = sum((p.reserved_per_gpu() for p in capped), Decimal(0))
        if reserved > device.memory_total:
            ordered = sorted(capped, key=lambda p: (p.created, p.ref.name))
            out.append(
                Oversubscription(
                    gpu=device.index,
                    caps=sum((p.cap or 0) * p.gpu_containers for p in capped),
                    reserved=int(reserved.to_integral_value(rounding=ROUND_CEILING)),
                    total=device.memory_total,
                    pods=tuple(p.ref for p in ordered),
                )
            )
    return out


@dataclass(frozen=True)
class UnknownProcess:
    gpu: int
    pid: int
    used_memory: int | None
    reason: str


def unknown_processes(procs: Iterable[ObservedProcess]) -> list[UnknownProcess]:
    """GPU processes that belong to no pod on this node (MPS servers excepted)."""
    out = []
    for proc in procs:
        if proc.pod is not None or proc.is_mps_server:
            continue
        if proc.owner is None:
            reason = "it is in no pod's cgroup (a host process, or its /proc entry is unreadable)"
        else:
            reason = (
                f"its cgroup names pod UID {proc.owner.pod_uid}, which is not on this node's "
                "pod list"
            )
        out.append(UnknownProcess(proc.gpu, proc.pid, proc.used_memory, reason))
    return out


@dataclass(frozen=True)
class UngrantedUse:
    """GPU processes of a container that was granted no GPU, on one GPU: its image or its
    environment asked the NVIDIA runtime for devices (``NVIDIA_VISIBLE_DEVICES``) outside
    admission."""

    pod: PodRef
    container: str
    gpu: int
    used: int | None  # None when NVML reports no memory for any of them
    pids: tuple[int, ...]
    # client PID -> its MPS server, for the PIDs that are MPS clients
    servers: Mapping[int, int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.pod.uid, self.container, self.gpu)


def ungranted_uses(
    procs: Iterable[ObservedProcess],
    pods: Mapping[str, PodInfo],
    server_pids: frozenset[int] | None,
) -> list[UngrantedUse]:
    """GPU processes in containers of this node's pods that nothing granted a GPU.

    ``server_pids`` are the MPS servers the control daemon lists; a process of such a pod counts
    as an MPS server only if it is one of them (its name would be a tenant's choice). None: no
    list to hold it to (MPS not in use, or its daemon not answering), so names are trusted.
    """
    groups: dict[tuple[str, str, int], list[ObservedProcess]] = {}
    for proc in procs:
        if proc.pod is None:
            continue
        if proc.is_mps_server and (server_pids is None or proc.pid in server_pids):
            continue
        pod = pods.get(proc.pod.uid)
        if pod is None:
            continue
        container_id = proc.owner.container_id if proc.owner is not None else None
        if pod.granted_gpu(pod.container_name(container_id)):
            continue
        groups.setdefault((pod.ref.uid, _container_key(pod, proc.owner), proc.gpu), []).append(proc)
    out = []
    for (uid, container, gpu), members in sorted(groups.items()):
        known = [p.used_memory for p in members if p.used_memory is not None]
        out.append(
            UngrantedUse(
                pod=pods[uid].ref,
                container=container,
                gpu=gpu,
                used=sum(known) if known else None,
                pids=tuple(sorted(p.pid for p in members)),
                servers={p.pid: p.server for p in members if p.server is not None},
            )
        )
    return out
