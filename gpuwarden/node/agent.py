"""The node agent's imperative shell: one enforcement pass per ``tick()``, a loop around it.

Each tick reads NVML, asks the MPS control daemon for its servers and clients, maps every GPU
process to a pod through ``/proc/<pid>/cgroup``, then:

* sets the MPS daemon defaults to the ceilings and each running server to the limits of its pods
  (only what changed since the last tick; everything again after a daemon restart);
* reports containers above their GPU-memory cap, and GPU processes in containers that were
  granted no GPU (an Event, a log line, a metric, and ``terminate_client`` or an eviction as
  ``--on-violation`` says), GPUs whose caps oversubscribe them, and GPU processes of no known pod.

Kubernetes calls are not made here: a tick returns them as actions, and :func:`run_once` hands
them to a :class:`Cluster` (``gpuwarden.kube.node_pods.NodeCluster`` in production).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from gpuwarden.node import limits, mps
from gpuwarden.node.idle import IdleAct, IdleEpisode, IdlePod, track_idle
from gpuwarden.node.limits import MpsServer, ObservedProcess
from gpuwarden.node.nvml import GpuDevice, Nvml, NvmlError
from gpuwarden.node.pods import OwnerRef, PodInfo, PodRef, pod_info
from gpuwarden.node.procfs import ProcFs, find_pod_cgroups
from gpuwarden.node.usage import (
    ContainerUse,
    DeviceReading,
    GpuUse,
    allocations,
    container_processes,
    container_uses,
    gpu_uses,
)
from gpuwarden.policy.pod.quantity import format_bytes

OnViolation = Literal["event", "terminate", "evict"]
ON_VIOLATION: tuple[OnViolation, ...] = ("event", "terminate", "evict")
# comm is truncated to 15 characters: "nvidia-cuda-mps-server" reads as "nvidia-cuda-mps".
_MPS_SERVER_COMM = "nvidia-cuda-mps"

REASON_CAP_EXCEEDED = "GPUMemoryCapExceeded"
REASON_OVERSUBSCRIBED = "GPUMemoryOversubscribed"
REASON_UNKNOWN_PROCESS = "UnknownGPUProcess"
REASON_UNGRANTED = "GPUWithoutGrant"
REASON_BAD_ANNOTATION = "InvalidGPUAnnotation"
REASON_MPS_REFUSED = "MPSRefusedOnMIG"
REASON_IDLE = "GPUIdle"
REASON_IDLE_STOPPED = "GPUIdleNotebookStopped"


def _gib(amount: int) -> str:
    return f"{amount / 2**30:.2f} GiB"


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    on_violation: OnViolation = "event"
    # Never let the MPS daemon default exceed this (bytes); None: the largest cap on the GPU.
    memory_ceiling: int | None = None
    # Hard limits through NVML cgroup memory limits (driver r615+), when detected at start.
    hard_limits: bool = False
    cgroup_root: Path = Path("/sys/fs/cgroup")
    # Start the control daemon when none answers (else wait for whoever runs it).
    manage_daemon: bool = True
    # The replicas NVIDIA's device plugin makes of each GPU for MPS (its sharing config), which
    # sizes an MPS slice as 1/replicas of a GPU; None: sized by its thread percentage or cap.
    mps_replicas: int | None = None


@dataclass(frozen=True)
class PodEvent:
    pod: PodRef
    reason: str
    message: str
    type: str = "Warning"


@dataclass(frozen=True)
class NodeEvent:
    reason: str
    message: str
    type: str = "Warning"


@dataclass(frozen=True)
class Eviction:
    pod: PodRef
    message: str


@dataclass(frozen=True)
class OwnerEvent:
    """An Event on a pod's controller (a Job, a StatefulSet...), in the pod's namespace."""

    namespace: str
    owner: OwnerRef
    reason: str
    message: str
    type: str = "Warning"


@dataclass(frozen=True)
class NotebookStop:
    """Stop a Kubeflow Notebook: its controller scales it to zero and keeps its volumes
    (``NodeCluster.stop_notebook`` cites the annotation)."""

    pod: PodRef
    notebook: str
    stopped_at: str  # RFC 3339


KubeAction = PodEvent | NodeEvent | Eviction | OwnerEvent | NotebookStop


@dataclass(frozen=True)
class _Offence:
    """What the agent acts on as ``--on-violation`` says: a container over its cap, or one using
    a GPU it was not granted."""

    pod: PodRef
    key: tuple[str, str, str, int]  # reason, pod UID, container, GPU
    reason: str
    message: str
    pids: tuple[int, ...]
    servers: Mapping[int, int]  # client PID -> its MPS server


_STILL = {
    REASON_CAP_EXCEEDED: "still above its GPU-memory cap",
    REASON_UNGRANTED: "still using a GPU it was not granted",
}


class Cluster(Protocol):
    """The Kubernetes side of the agent. Methods raise on API failure; the loop logs it."""

    def pods(self) -> Sequence[Mapping[str, Any]]: ...

    def pod_event(
        self, namespace: str, name: str, uid: str, reason: str, message: str, type_: str
    ) -> None: ...

    def node_event(self, reason: str, message: str, type_: str) -> None: ...

    def evict(self, namespace: str, name: str, uid: str) -> str:
        """The outcome in words; one starting with "refused" is asked again next tick."""
        ...

    def owner_event(
        self, namespace: str, owner: OwnerRef, reason: str, message: str, type_: str
    ) -> None: ...

    def stop_notebook(self, namespace: str, name: str, stopped_at: str) -> str:
        """The outcome in words."""
        ...


@dataclass(frozen=True)
class GpuStatus:
    device: GpuDevice
    managed: bool  # MPS limits are applied on it
    ceiling: int | None = None
    memory_used: int | None = None
    note: str | None = None


@dataclass(frozen=True)
class PodUsage:
    pod: PodRef
    container: str
    gpu: int
    used: int
    cap: int | None
    thread_percentage: int | None


@dataclass(frozen=True)
class TickReport:
    gpus: tuple[GpuStatus, ...] = ()
    mps_healthy: bool | None = None  # None: MPS is not in use on this node
    daemon_pid: int | None = None
    reapplied: bool = False
    default_threads: int | None = None
    servers: tuple[MpsServer, ...] = ()
    processes: tuple[ObservedProcess, ...] = ()
    usage: tuple[PodUsage, ...] = ()
    # Each container's share of each GPU's work, and each allocated container's totals.
    gpu_use: tuple[GpuUse, ...] = ()
    containers: tuple[ContainerUse, ...] = ()
    # Pods whose GPUs are idle by their profile's idle rule, and for how long.
    idle: tuple[IdlePod, ...] = ()
    violations: tuple[limits.Violation, ...] = ()
    ungranted: tuple[limits.UngrantedUse, ...] = ()
    oversubscribed: tuple[limits.Oversubscription, ...] = ()
    unknown: tuple[limits.UnknownProcess, ...] = ()
    commands: tuple[str, ...] = ()
    actions: tuple[KubeAction, ...] = ()
    errors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            if is_dataclass(value) and not isinstance(value, type):
                return {k: plain(v) for k, v in asdict(value).items()}
            if isinstance(value, Mapping):
                return {str(k): plain(v) for k, v in value.items()}
            if isinstance(value, tuple | list | frozenset | set):
                return [plain(v) for v in value]
            if isinstance(value, Path):
                return str(value)
            return value

        out: dict[str, Any] = plain(self)
        out["actions"] = [
            {"kind": type(action).__name__, **plain(action)} for action in self.actions
        ]
        return out


@dataclass
class _State:
    """What the agent remembers between ticks (per instance, never module-level)."""

    applied: dict[str, int] = field(default_factory=dict)
    needs_reapply: bool = False
    daemon_pid: int | None = None
    # (reason, pod UID, container, GPU) of the offences already reported
    violations: set[tuple[str, str, str, int]] = field(default_factory=set)
    terminated: set[tuple[int, int]] = field(default_factory=set)
    evicted: set[str] = field(default_factory=set)
    evict_again: set[str] = field(default_factory=set)
    oversubscribed: set[tuple[int, frozenset[str]]] = field(default_factory=set)
    unknown: set[tuple[int, int]] = field(default_factory=set)
    problems: set[str] = field(default_factory=set)
    hard_limited: set[str] = field(default_factory=set)
    # GPU index -> the newest per-process utilization sample read (NVML's CPU timestamp, us).
    samples_seen: dict[int, int] = field(default_factory=dict)
    # Pod UID -> its idle episode (gpuwarden.node.idle).
    idle: Mapping[str, IdleEpisode] = field(default_factory=dict)


class NodeAgent:
    def __init__(
        self,
        config: AgentConfig,
        nvml: Nvml,
        mps_control: mps.MpsControl | None,
        procfs: ProcFs,
        *,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.clock = clock
        self.nvml = nvml
        self.mps = mps_control
        self.procfs = procfs
        self.log = log or logging.getLogger("gpuwarden.node")
        self.devices: tuple[GpuDevice, ...] = ()
        self.managed: tuple[GpuDevice, ...] = ()
        self.notes: dict[int, str] = {}
        self.started_daemon = False
        self.last_report: TickReport | None = None
        self.last_pods: Sequence[Mapping[str, Any]] = ()
        self._state = _State()
        self._lock = threading.Lock()
        self._violation_counts: dict[tuple[str, str, str], int] = {}
        self._ungranted_counts: dict[tuple[str, str, str], int] = {}
        # (namespace, tenant, profile, action) -> idle rules acted
        self._idle_counts: dict[tuple[str, str, str, str], int] = {}
        self._daemon_restarts = 0

    # -- start ----------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Discover the GPUs, refuse MPS on MIG GPUs, start the control daemon if none answers.

        Returns the messages worth showing the operator (also logged).
        """
        messages: list[str] = []
        self.devices = self.nvml.devices()
        managed = []
        for device in self.devices:
            if device.mig_enabled:
                note = (
                    f"GPU {device.index} ({device.uuid}, {device.name}) has MIG enabled: the agent "
                    "does not run MPS limits on it; share it through MIG instances instead"
                )
                self.notes[device.index] = note
                messages.append(note)
                continue
            if device.compute_mode != "exclusive-process":
                messages.append(
                    f"GPU {device.index} ({device.uuid}) is in compute mode {device.compute_mode}: "
                    "a process that does not connect to MPS gets a context of its own, outside "
                    "the MPS limits (EXCLUSIVE_PROCESS prevents that)"
                )
            managed.append(device)
        self.managed = tuple(managed)
        if self.mps is not None and not self.managed:
            messages.append("no GPU on this node can use MPS; monitoring only")
        if self.mps is not None and self.managed and self.config.manage_daemon:
            if not self._healthy()[0]:
                try:
                    self.mps.start_daemon()
                    self.started_daemon = True
                    messages.append("started the MPS control daemon")
                except mps.MpsError as exc:
                    messages.append(f"could not start the MPS control daemon: {exc}")
            self._state.daemon_pid = self.mps.daemon_pid()
        for message in messages:
            self.log.warning("%s", message)
        return messages

    @property
    def uses_mps(self) -> bool:
        return self.mps is not None and bool(self.managed)

    def eviction_refused(self, pod: PodRef) -> None:
        """The eviction did not happen (a disruption budget, or the request failed): ask
        again next tick, if the pod is still over its cap."""
        self._state.evict_again.add(pod.uid)

    # -- counters for metrics -------------------------------------------------------------

    def violation_counts(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._violation_counts)

    def ungranted_counts(self) -> dict[tuple[str, str, str], int]:
        """(namespace, pod, action) -> times a container of the pod was found using a GPU it
        was not granted."""
        with self._lock:
            return dict(self._ungranted_counts)

    def idle_counts(self) -> dict[tuple[str, str, str, str], int]:
        """(namespace, tenant, profile, action) -> times an idle rule acted."""
        with self._lock:
            return dict(self._idle_counts)

    @property
    def daemon_restarts(self) -> int:
        return self._daemon_restarts

    # -- one pass -------------------------------------------------------------------------

    def _healthy(self) -> tuple[bool, str]:
        assert self.mps is not None
        try:
            return True, self.mps.send(mps.GET_DEFAULT_THREADS)
        except mps.MpsError as exc:
            return False, str(exc)

    def _mps_status(self, errors: list[str]) -> tuple[bool, list[MpsServer] | None, bool]:
        """Health, the servers and their clients (None: the daemon did not list them), and
        whether limits must all be set again."""
        assert self.mps is not None
        state = self._state
        healthy, reply = self._healthy()
        if not healthy:
            # Whatever answers next is a new daemon: its defaults are gone.
            state.needs_reapply = True
        if not healthy and self.config.manage_daemon:
            errors.append(f"MPS control daemon does not answer: {reply}")
            try:
                self.mps.start_daemon()
                self.started_daemon = True
            except mps.MpsError as exc:
                errors.append(f"could not restart the MPS control daemon: {exc}")
            healthy, reply = self._healthy()
        if not healthy:
            return False, None, False
        pid = self.mps.daemon_pid()
        if pid is not None and state.daemon_pid is not None and pid != state.daemon_pid:
            state.needs_reapply = True
        state.daemon_pid = pid
        if "default_threads" in state.applied:
            reported = mps.parse_percentage(reply)
            if reported is not None and reported != float(state.applied["default_threads"]):
                state.needs_reapply = True  # someone (or a restart) reset the defaults
        reapplied = False
        if state.needs_reapply:
            if state.applied:
                self._daemon_restarts += 1
                reapplied = True
                self.log.warning("MPS control daemon restarted: setting every limit again")
            state.applied.clear()
            state.needs_reapply = False
        servers: list[MpsServer] = []
        try:
            server_pids = mps.parse_pids(self.mps.send(mps.GET_SERVER_LIST))
        except mps.MpsError as exc:
            errors.append(str(exc))
            return True, None, reapplied
        for server in server_pids:
            try:
                clients = mps.parse_pids(self.mps.send(mps.get_client_list(server)))
            except mps.MpsError as exc:
                errors.append(str(exc))
                clients = ()
            servers.append(MpsServer(pid=server, uid=self.procfs.uid(server), clients=clients))
        return True, servers, reapplied

    def _observe(
        self, pods: Mapping[str, PodInfo], servers: Sequence[MpsServer], errors: list[str]
    ) -> tuple[list[ObservedProcess], dict[int, int]]:
        server_pids = {s.pid for s in servers}
        client_server = {c: s.pid for s in servers for c in s.clients}
        procs: list[ObservedProcess] = []
        used: dict[int, int] = {}
        for device in self.devices:
            try:
                found = self.nvml.processes(device.index)
                used[device.index] = self.nvml.memory_used(device.index)
            except NvmlError as exc:
                errors.append(str(exc))
                continue
            for proc in found:
                owner = self.procfs.owner(proc.pid)
                pod = pods.get(owner.pod_uid) if owner is not None else None
                # By name only outside capped pods: a tenant cannot dodge its cap by renaming.
                is_server = proc.pid in server_pids or (
                    (pod is None or pod.cap is None)
                    and self.procfs.comm(proc.pid) == _MPS_SERVER_COMM
                )
                procs.append(
                    ObservedProcess(
                        gpu=device.index,
                        pid=proc.pid,
                        used_memory=proc.used_memory,
                        mps_client=proc.mps_client,
                        owner=owner,
                        pod=pod.ref if pod is not None else None,
                        server=client_server.get(proc.pid),
                        is_mps_server=is_server,
                    )
                )
        return procs, used

    def _readings(self, errors: list[str]) -> dict[int, DeviceReading]:
        """Each GPU's utilization, and its per-process samples since the last tick."""
        seen = self._state.samples_seen
        readings: dict[int, DeviceReading] = {}
        for device in self.devices:
            try:
                device_figure = self.nvml.utilization(device.index)
                samples = self.nvml.process_utilization(device.index, seen.get(device.index, 0))
            except NvmlError as exc:
                errors.append(str(exc))
                continue
            if samples is not None:
                seen[device.index] = samples.last_seen
            readings[device.index] = DeviceReading(device_figure, samples)
        return readings

    def _use(
        self,
        active: Sequence[PodInfo],
        procs: Sequence[ObservedProcess],
        errors: list[str],
    ) -> tuple[list[GpuUse], list[ContainerUse]]:
        memory = max((d.memory_total for d in self.devices), default=None)
        allocated = allocations(active, mps_replicas=self.config.mps_replicas, memory_total=memory)
        shares = {(a.pod.uid, a.container): a.share for a in allocated}
        known = {p.ref.uid: p for p in active}
        uses = gpu_uses(procs, known, self._readings(errors), shares)
        return uses, container_uses(allocated, uses)

    def _apply(
        self,
        plan: limits.MpsPlan,
        servers: Sequence[MpsServer],
        errors: list[str],
    ) -> list[str]:
        assert self.mps is not None
        state = self._state
        live = {s.pid for s in servers}
        for key in list(state.applied):
            if key.startswith("server_") and int(key.split("/")[1]) not in live:
                del state.applied[key]
        sent: list[str] = []
        for planned in limits.plan_commands(plan, state.applied):
            try:
                self.mps.send(planned.command)
            except mps.MpsUnavailable as exc:
                errors.append(str(exc))
                state.needs_reapply = True
                break
            except mps.MpsError as exc:
                errors.append(str(exc))
                continue
            state.applied[planned.key] = planned.value
            sent.append(planned.command)
        return sent

    def _terminate(self, offence: _Offence, errors: list[str], commands: list[str]) -> str:
        if self.mps is None:
            return "; MPS is not in use, so the agent cannot terminate its processes"
        done: list[str] = []
        notes: list[str] = []
        for pid in offence.pids:
            server = offence.servers.get(pid)
            if server is None:
                notes.append(f"PID {pid} is not an MPS client, so MPS cannot terminate it")
                continue
            if (server, pid) in self._state.terminated:
                continue
            command = mps.terminate_client(server, pid)
            try:
                self.mps.send(command)
            except mps.MpsError as exc:
                errors.append(str(exc))
                notes.append(f"terminating PID {pid} failed: {exc}")
                continue
            commands.append(command)
            self._state.terminated.add((server, pid))
            done.append(str(pid))
        text = ""
        if done:
            text += f"; the agent terminated its MPS client(s) {', '.join(done)}"
        if notes:
            text += "; " + "; ".join(notes)
        return text

    def _violations(self, found: Sequence[limits.Violation]) -> list[_Offence]:
        uuid = {d.index: d.uuid for d in self.devices}
        return [
            _Offence(
                pod=violation.pod,
                key=(REASON_CAP_EXCEEDED, *violation.key),
                reason=REASON_CAP_EXCEEDED,
                message=(
                    f"container {violation.container} uses {_gib(violation.used)} of GPU memory "
                    f"on GPU {violation.gpu} ({uuid.get(violation.gpu, '?')}), above its cap "
                    f"{format_bytes(violation.cap)} (PIDs {', '.join(map(str, violation.pids))})"
                ),
                pids=violation.pids,
                servers=violation.servers,
            )
            for violation in found
        ]

    def _ungranted(self, found: Sequence[limits.UngrantedUse]) -> list[_Offence]:
        uuid = {d.index: d.uuid for d in self.devices}
        out = []
        for use in found:
            used = "unknown" if use.used is None else _gib(use.used)
            pids = ", ".join(map(str, use.pids))
            out.append(
                _Offence(
                    pod=use.pod,
                    key=(REASON_UNGRANTED, *use.key),
                    reason=REASON_UNGRANTED,
                    message=(
                        f"container {use.container} of pod {use.pod} uses GPU {use.gpu} "
                        f"({uuid.get(use.gpu, '?')}) of node {self.config.node_name}, {used} of "
                        f"GPU memory (PIDs {pids}), but was granted no GPU: no GPU resource, no "
                        "DRA claim and no gpuwarden.io record of a GPU (an image's ENV "
                        "NVIDIA_VISIBLE_DEVICES does this where the NVIDIA runtime accepts the "
                        "variable from unprivileged containers)"
                    ),
                    pids=use.pids,
                    servers=use.servers,
                )
            )
        return out

    def _enforce(
        self, found: Sequence[_Offence], errors: list[str], commands: list[str]
    ) -> list[KubeAction]:
        """One Event per episode of each offence, and ``--on-violation``'s action."""
        state = self._state
        actions: list[KubeAction] = []
        action = self.config.on_violation
        for offence in found:
            if offence.key in state.violations:
                if offence.pod.uid in state.evict_again:
                    state.evict_again.discard(offence.pod.uid)
                    actions.append(Eviction(offence.pod, _STILL[offence.reason]))
                continue
            state.violations.add(offence.key)
            counts = (
                self._ungranted_counts
                if offence.reason == REASON_UNGRANTED
                else self._violation_counts
            )
            with self._lock:
                count_key = (offence.pod.namespace, offence.pod.name, action)
                counts[count_key] = counts.get(count_key, 0) + 1
            message = offence.message
            if action == "terminate":
                message += self._terminate(offence, errors, commands)
            if action == "evict" and offence.pod.uid not in state.evicted:
                state.evicted.add(offence.pod.uid)
                message += "; the agent evicts the pod"
                self._log_offence(offence, message)
                actions.append(PodEvent(offence.pod, offence.reason, message))
                actions.append(Eviction(offence.pod, message))
                continue
            self._log_offence(offence, message)
            actions.append(PodEvent(offence.pod, offence.reason, message))
        state.violations &= {o.key for o in found}
        state.evict_again &= {o.pod.uid for o in found}
        return actions

    def _log_offence(self, offence: _Offence, message: str) -> None:
        # Over-cap containers are told through their Events and metrics alone, as before.
        if offence.reason == REASON_UNGRANTED:
            self.log.warning("%s", message)

    def _oversubscription(self, found: Sequence[limits.Oversubscription]) -> list[KubeAction]:
        state = self._state
        actions: list[KubeAction] = []
        current = set()
        for over in found:
            key = (over.gpu, frozenset(p.uid for p in over.pods))
            current.add(key)
            if key in state.oversubscribed:
                continue
            state.oversubscribed.add(key)
            message = (
                f"GPU {over.gpu} on node {self.config.node_name}: the GPU-memory caps of its pods "
                f"({_gib(over.caps)}; {_gib(over.reserved)} after their overcommit ratios) exceed "
                f"its {_gib(over.total)}; pods: {', '.join(map(str, over.pods))}"
            )
            actions.append(NodeEvent(REASON_OVERSUBSCRIBED, message))
            actions.append(PodEvent(over.pods[-1], REASON_OVERSUBSCRIBED, message))
        state.oversubscribed &= current
        return actions

    def _unknown(self, found: Sequence[limits.UnknownProcess]) -> list[KubeAction]:
        state = self._state
        actions: list[KubeAction] = []
        current = set()
        for proc in found:
            key = (proc.gpu, proc.pid)
            current.add(key)
            if key in state.unknown:
                continue
            state.unknown.add(key)
            used = "unknown" if proc.used_memory is None else _gib(proc.used_memory)
            message = (
                f"PID {proc.pid} on GPU {proc.gpu} of node {self.config.node_name} uses "
                f"{used} of GPU memory and belongs to no known pod: {proc.reason}"
            )
            self.log.warning("%s", message)
            actions.append(NodeEvent(REASON_UNKNOWN_PROCESS, message))
        state.unknown &= current
        return actions

    def _idle(self, acts: Sequence[IdleAct]) -> list[KubeAction]:
        """Each idle rule that acts: the Notebook stopped, or the pod and its owner told."""
        actions: list[KubeAction] = []
        for act in acts:
            pod, rule = act.idle.pod, act.idle.pod.idle
            assert rule is not None
            with self._lock:
                key = (pod.ref.namespace, pod.tenant or "", pod.profile or "", act.action)
                self._idle_counts[key] = self._idle_counts.get(key, 0) + 1
            held = (
                f"pod {pod.ref} has kept {act.idle.busy:.2f} of its {act.idle.allocated:.2f} "
                f"GPUs busy, below {rule.below:f}%, for {_duration(act.idle.idle_for)} on node "
                f"{self.config.node_name} (profile {pod.profile or '?'}: idle after "
                f"{_duration(rule.after)})"
            )
            if act.action == "stop":
                assert pod.notebook is not None
                stopped_at = datetime.fromtimestamp(self.clock(), UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                )
                message = (
                    f"{held}: the agent stops Notebook {pod.notebook} (its volumes are kept; "
                    "start it again from the Kubeflow dashboard)"
                )
                self.log.warning("%s", message)
                actions.append(PodEvent(pod.ref, REASON_IDLE_STOPPED, message))
                actions.append(NotebookStop(pod.ref, pod.notebook, stopped_at))
                continue
            why = (
                "; idle.action stop stops only Kubeflow Notebooks, so the agent notifies"
                if act.asked == "stop"
                else ""
            )
            message = f"{held}: give the GPUs back if the work is done{why}"
            actions.append(PodEvent(pod.ref, REASON_IDLE, message))
            if pod.owner is not None:
                actions.append(OwnerEvent(pod.ref.namespace, pod.owner, REASON_IDLE, message))
        return actions

    def _problems(self, pods: Sequence[PodInfo]) -> list[KubeAction]:
        state = self._state
        actions: list[KubeAction] = []
        for pod in pods:
            if pod.problems and pod.ref.uid not in state.problems:
                state.problems.add(pod.ref.uid)
                message = "the node agent cannot read " + "; ".join(pod.problems)
                actions.append(PodEvent(pod.ref, REASON_BAD_ANNOTATION, message))
        state.problems &= {p.ref.uid for p in pods}
        return actions

    def _hard_limits(self, pods: Mapping[str, PodInfo], errors: list[str]) -> None:
        state = self._state
        wanted = {uid for uid, pod in pods.items() if pod.cap is not None}
        state.hard_limited &= wanted
        missing = wanted - state.hard_limited
        if not missing or not self.managed:
            return
        for uid, path in find_pod_cgroups(self.config.cgroup_root, missing).items():
            pod = pods[uid]
            assert pod.cap is not None
            limit = pod.cap * pod.gpu_containers
            try:
                for device in self.managed:
                    self.nvml.set_cgroup_memory_limit(device.index, str(path), limit)
            except NvmlError as exc:
                errors.append(f"hard GPU-memory limit for pod {pod.ref}: {exc}")
                continue
            state.hard_limited.add(uid)

    def _forget_gone(self, infos: Sequence[PodInfo]) -> None:
        """Drop what the agent remembers of pods that left the node (memory and metric series
        would otherwise grow with every pod the node ever ran)."""
        uids = {info.ref.uid for info in infos}
        names = {(info.ref.namespace, info.ref.name) for info in infos}
        # (evict_again is pruned to the pods still over their caps in _enforce.)
        self._state.evicted &= uids
        with self._lock:
            self._violation_counts = {
                key: count for key, count in self._violation_counts.items() if key[:2] in names
            }
            self._ungranted_counts = {
                key: count for key, count in self._ungranted_counts.items() if key[:2] in names
            }

    def tick(self, raw_pods: Sequence[Mapping[str, Any]]) -> TickReport:
        """One enforcement pass over the pods of this node (Kubernetes JSON objects)."""
        self.last_pods = raw_pods
        errors: list[str] = []
        infos = [info for info in (pod_info(p) for p in raw_pods) if info is not None]
        active = [p for p in infos if p.active]
        pods = limits.gpu_pods(active)
        known = {p.ref.uid: p for p in active}
        self._forget_gone(infos)

        healthy: bool | None = None
        listed: list[MpsServer] | None = None  # None: no server list to hold names to
        reapplied = False
        if self.uses_mps:
            healthy, listed, reapplied = self._mps_status(errors)
            live = {server.pid for server in listed or []}
            self._state.terminated = {t for t in self._state.terminated if t[0] in live}
        servers = listed or []
        measuring: list[str] = []  # NVML's failures this tick: idleness is not judged on them
        procs, used = self._observe(known, servers, measuring)

        commands: list[str] = []
        plan: limits.MpsPlan | None = None
        if self.uses_mps:
            plan = limits.plan_mps(self.managed, pods, procs, servers, self.config.memory_ceiling)
            if healthy:
                commands = self._apply(plan, servers, errors)
        if self.config.hard_limits:
            self._hard_limits(pods, errors)

        found = limits.violations(procs, known)
        server_pids = None if listed is None else frozenset(s.pid for s in listed)
        ungranted = limits.ungranted_uses(procs, known, server_pids)
        placement = limits.place_pods([d.index for d in self.managed], pods, procs)
        over = limits.oversubscriptions(self.managed, pods, placement)
        unknown = limits.unknown_processes(procs)
        gpu_use, containers = self._use(active, procs, measuring)
        errors += measuring
        idle = track_idle(self._state.idle, known, containers, self.clock(), complete=not measuring)
        self._state.idle = idle.episodes
        actions: list[KubeAction] = []
        actions += self._problems(infos)
        offences = self._violations(found) + self._ungranted(ungranted)
        actions += self._enforce(offences, errors, commands)
        actions += self._oversubscription(over)
        actions += self._unknown(unknown)
        actions += self._idle(idle.acts)

        gpus = tuple(
            GpuStatus(
                device=device,
                managed=device in self.managed,
                ceiling=None
                if plan is None or device.index not in plan.default_mem_mib
                else plan.default_mem_mib[device.index] * 2**20,
                memory_used=used.get(device.index),
                note=self.notes.get(device.index),
            )
            for device in self.devices
        )
        report = TickReport(
            gpus=gpus,
            mps_healthy=healthy,
            daemon_pid=self._state.daemon_pid if self.uses_mps else None,
            reapplied=reapplied,
            default_threads=plan.default_threads if plan is not None else None,
            servers=tuple(servers),
            processes=tuple(procs),
            usage=tuple(_usage(procs, known)),
            gpu_use=tuple(gpu_use),
            containers=tuple(containers),
            idle=idle.idle,
            violations=tuple(found),
            ungranted=tuple(ungranted),
            oversubscribed=tuple(over),
            unknown=tuple(unknown),
            commands=tuple(commands),
            actions=tuple(actions),
            errors=tuple(errors),
        )
        for error in errors:
            self.log.warning("%s", error)
        self.last_report = report
        return report


def _duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (
        "".join(
            f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if value
        )
        or "0s"
    )


def _usage(procs: Sequence[ObservedProcess], pods: Mapping[str, PodInfo]) -> list[PodUsage]:
    totals: dict[tuple[str, str, int], int] = {}
    for key, proc in container_processes(procs, pods):
        totals[key] = totals.get(key, 0) + (proc.used_memory or 0)
    return [
        PodUsage(
            pod=pods[uid].ref,
            container=container,
            gpu=gpu,
            used=amount,
            cap=pods[uid].cap,
            thread_percentage=pods[uid].thread_percentage,
        )
        for (uid, container, gpu), amount in sorted(totals.items())
    ]


def run_once(agent: NodeAgent, cluster: Cluster, log: logging.Logger | None = None) -> TickReport:
    """One pass: read the pods, tick, carry out the Kubernetes actions (errors are logged)."""
    log = log or agent.log
    try:
        pods = cluster.pods()
    except Exception as exc:  # the API may be down: enforce with the pods last seen
        log.warning("cannot read the pods of node %s: %s", agent.config.node_name, exc)
        pods = agent.last_pods
    report = agent.tick(pods)
    for action in report.actions:
        try:
            if isinstance(action, PodEvent):
                cluster.pod_event(
                    action.pod.namespace,
                    action.pod.name,
                    action.pod.uid,
                    action.reason,
                    action.message,
                    action.type,
                )
            elif isinstance(action, NodeEvent):
                cluster.node_event(action.reason, action.message, action.type)
            elif isinstance(action, OwnerEvent):
                cluster.owner_event(
                    action.namespace, action.owner, action.reason, action.message, action.type
                )
            elif isinstance(action, NotebookStop):
                outcome = cluster.stop_notebook(
                    action.pod.namespace, action.notebook, action.stopped_at
                )
                log.warning(
                    "stopping Notebook %s/%s: %s", action.pod.namespace, action.notebook, outcome
                )
            else:
                outcome = cluster.evict(action.pod.namespace, action.pod.name, action.pod.uid)
                log.warning("eviction of pod %s: %s", action.pod, outcome)
                if outcome.startswith("refused"):
                    agent.eviction_refused(action.pod)
        except Exception as exc:
            log.warning("%s for %s failed: %s", type(action).__name__, action, exc)
            if isinstance(action, Eviction):
                agent.eviction_refused(action.pod)  # a transient failure: try again next tick
    return report


def run_loop(
    agent: NodeAgent,
    cluster: Cluster,
    interval: float,
    stop: threading.Event,
    log: logging.Logger | None = None,
) -> None:
    """Tick every ``interval`` seconds until ``stop`` is set."""
    while not stop.is_set():
        run_once(agent, cluster, log)
        stop.wait(interval)
