"""The work-conserving model of `gpuwarden simulate`: how fast each running pod progresses on
the GPUs the scheduler gave it, and how busy those GPUs are (pure: simulated seconds in,
figures out; the replay calls it at every bind, completion and preemption).

* A pod asks ``asked`` GPUs (a share of one below 1) and runs on ``granted`` devices: whole GPUs
  of its own, or MPS slices of GPUs it shares. It keeps ``busy`` of each of its GPUs' SMs busy
  at full speed.
* **Linear scaling**: on fewer devices than it asked it runs ``granted / asked`` as fast (4 of
  8 GPUs: half speed; none: no progress); on more, no faster.
* **Processor sharing**: a GPU whose pods' ``busy`` adds up to ``B > 1`` runs each of them
  ``1 / B`` as fast; a pod on several GPUs runs at the pace of its slowest.
* Which GPU of a node a slice lands on is the device plugin's choice, not the scheduler's: NVIDIA's
  device plugin hands out replicas spread over the node's GPUs, fewest replicas in use first
  (its distributed allocation); whole GPUs are the lowest free ones.
* On DRA nodes (``simulate --stand-in dra``) the scheduler's allocator chose the devices: a pod
  runs on the GPUs its claims were allocated, holding the share of each it reserved (its cores
  out of 100, or its GPU memory where it names no cores; a whole GPU: all of it).
* A GPU's **busy** at a moment is ``min(1, B)``: what DCGM_FI_DEV_GPU_UTIL would report. Each
  pod on it is credited ``min(1, B) * busy / B`` of it, so that the busy time a preempted pod
  spent on work it then lost can be told apart from useful busy time.
* **MPS active thread percentage**: a pod whose SMs are capped at ``sm_share`` (its
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / 100) keeps at most that share busy and runs
  ``sm_share / busy`` as fast when it would use more; the cap is what it adds to ``B``.

Progress is in seconds of full-speed running: a pod whose row says ``duration`` is done when
its progress reaches it; ``asked * progress`` is the GPU work it delivered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: A physical GPU: (node name, index on the node).
Gpu = tuple[str, int]


@dataclass(frozen=True)
class NodeGpus:
    """What a node's device plugin advertises: ``gpus`` physical GPUs, each shared among
    ``replicas`` pods (1: whole GPUs only). A node may change config between pods (see
    :meth:`WorkModel.configure`); a pod keeps what it was given at its bind."""

    gpus: int
    replicas: int = 1


@dataclass(frozen=True)
class Sample:
    """The cluster between two events: from ``at`` on, until the next sample."""

    at: float
    allocated: float  # physical GPUs held (a slice holds 1/replicas)
    busy: float  # sum over GPUs of min(1, busy of their pods)


@dataclass
class _Running:
    asked: float
    busy: float  # SMs kept busy at its own speed: the trace's busy, under its MPS cap
    capped: float  # speed its MPS cap allows (1: none)
    service: bool
    gpus: tuple[Gpu, ...]
    shares: tuple[float, ...]  # the share of each GPU it holds (1, or 1/replicas)
    held: tuple[int, ...]  # the slots of each GPU it holds (whole: all of its replicas)
    started: float
    progress: float  # full-speed seconds done, at ``updated``
    target: float | None  # progress at which it completes (None: a service)
    checkpoint: float | None
    speed: float = 0.0
    serving: bool = True  # a service doing its work (False: sitting idle, serving nothing)
    updated: float = 0.0
    degraded: float = 0.0  # seconds on a GPU whose busy sum exceeded 1
    busy_seconds: float = 0.0  # GPU-seconds of busy credited to it
    # (time, progress, speed from then on) at each change of speed, to find checkpoints.
    history: list[tuple[float, float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Stopped:
    """What a pod had done when it stopped (completed, ended or preempted)."""

    progress: float  # full-speed seconds done at the stop
    kept: float  # what survives a restart: the progress at its last checkpoint
    degraded: float  # seconds it ran on an oversubscribed GPU
    ran: float  # seconds it held its GPUs
    begun: float = 0.0  # progress it started from
    busy: float = 0.0  # GPU-seconds of busy credited to it while it ran


class WorkModel:
    """The running pods of one replay and the GPUs they hold."""

    def __init__(self, nodes: Mapping[str, NodeGpus]) -> None:
        self._nodes = dict(nodes)
        self._slots: dict[Gpu, int] = {}  # pods (whole: replicas) holding each GPU's slots
        self._on: dict[Gpu, set[str]] = {}
        self._running: dict[str, _Running] = {}
        self._loads: dict[Gpu, float] = {}  # busy sum per GPU since the last event
        self._now = 0.0
        self.samples: list[Sample] = [Sample(0.0, 0.0, 0.0)]
        self.physical_gpus = sum(n.gpus for n in self._nodes.values())

    # -- placing --------------------------------------------------------------------------

    def configure(self, node: str, gpus: NodeGpus, at: float) -> None:
        """From ``at`` on, ``node``'s device plugin advertises ``gpus`` (its config changed: a
        node moves between pools only once no GPU pod runs on it, so pods bound from now on get
        the new shape, and any still running keep what they hold)."""
        self.advance(at)
        self._nodes[node] = gpus

    def replicas(self, node: str) -> int:
        """The replicas per GPU the node's device plugin advertises now (1: whole GPUs)."""
        return self._nodes.get(node, NodeGpus(0)).replicas

    def _take(
        self, node: str, whole: int, slices: int
    ) -> tuple[tuple[Gpu, ...], tuple[float, ...], tuple[int, ...]]:
        spec = self._nodes.get(node, NodeGpus(0))
        gpus: list[Gpu] = []
        shares: list[float] = []
        held: list[int] = []
        free = [g for g in range(spec.gpus) if self._slots.get((node, g), 0) == 0]
        for index in free[:whole]:
            gpus.append((node, index))
            shares.append(1.0)
            held.append(spec.replicas)
            self._slots[(node, index)] = spec.replicas
        for _ in range(slices):
            # Fewest replicas in use first, then the lowest index; never two on one GPU while
            # another has room (the device plugin spreads a pod's replicas).
            candidates = [g for g in range(spec.gpus) if (node, g) not in gpus]
            if not candidates:
                break
            index = min(candidates, key=lambda g: (self._slots.get((node, g), 0), g))
            gpus.append((node, index))
            shares.append(1.0 / spec.replicas)
            held.append(1)
            self._slots[(node, index)] = self._slots.get((node, index), 0) + 1
        return tuple(gpus), tuple(shares), tuple(held)

    def start(
        self,
        key: str,
        at: float,
        *,
        node: str,
        whole: int,
        slices: int,
        asked: float,
        busy: float,
        sm_share: float | None = None,
        progress: float = 0.0,
        target: float | None = None,
        checkpoint: float | None = None,
        devices: Sequence[tuple[int, float]] | None = None,
    ) -> None:
        """Pod ``key`` starts at ``at`` on ``node`` with ``whole`` GPUs and ``slices`` MPS slices,
        from ``progress``; it completes at ``target`` (None: a service, runs until stopped).
        ``sm_share`` caps the SMs it may use (MPS active thread percentage / 100). ``devices``
        (GPU index, share held), where the scheduler chose them (DRA), replace whole and slices.
        A time before the model's clock is taken as the clock (events are never undone)."""
        self.advance(at)
        at = self._now
        if key in self._running:
            return
        if devices is None:
            gpus, shares, held = self._take(node, whole, slices)
        else:
            gpus = tuple((node, index) for index, _ in devices)
            shares = tuple(share for _, share in devices)
            held = tuple(0 for _ in devices)  # no device plugin slots: the allocator counts
        used = busy if sm_share is None else min(busy, sm_share)
        pod = _Running(
            asked=asked,
            busy=used,
            capped=used / busy if busy > 0 else 1.0,
            service=target is None,
            gpus=gpus,
            shares=shares,
            held=held,
            started=at,
            progress=progress,
            target=target,
            checkpoint=checkpoint,
            updated=at,
        )
        self._running[key] = pod
        for gpu in gpus:
            self._on.setdefault(gpu, set()).add(key)
        self._respeed(at)

    def stop(self, key: str, at: float) -> Stopped | None:
        """Pod ``key`` stops at ``at`` (or the model's clock, if later); what it had done (None
        if it was not running)."""
        self.advance(at)
        at = self._now
        pod = self._running.pop(key, None)
        if pod is None:
            return None
        for gpu, held in zip(pod.gpus, pod.held, strict=True):
            self._on[gpu].discard(key)
            self._slots[gpu] = max(0, self._slots.get(gpu, 0) - held)
        self._respeed(at)
        return Stopped(
            progress=pod.progress,
            kept=self._checkpointed(pod, at),
            degraded=pod.degraded,
            ran=at - pod.started,
            begun=pod.history[0][1] if pod.history else pod.progress,
            busy=pod.busy_seconds,
        )

    def idle(self, key: str, at: float, busy: float) -> None:
        """Service ``key`` sits idle from ``at`` on: it keeps ``busy`` of its GPUs' SMs busy
        (at most what it kept busy at work) and serves nothing more (a notebook's idle tail)."""
        self.advance(at)
        pod = self._running.get(key)
        if pod is None or not pod.service or not pod.serving:
            return
        pod.busy = min(busy, pod.busy)
        pod.serving = False
        self._respeed(self._now)

    # -- time -----------------------------------------------------------------------------

    def advance(self, at: float) -> None:
        """Move the clock to ``at``, accruing every running pod's progress."""
        if at <= self._now:
            return
        for pod in self._running.values():
            span = at - pod.updated
            pod.progress += pod.speed * span
            if pod.target is not None:
                pod.progress = min(pod.progress, pod.target)
            loads = [self._loads.get(gpu, 0.0) for gpu in pod.gpus]
            if any(load > 1.0 + 1e-9 for load in loads):
                pod.degraded += span
            pod.busy_seconds += span * sum(
                min(1.0, load) * pod.busy / load for load in loads if load > 0
            )
            pod.updated = at
        self._now = at

    def _respeed(self, at: float) -> None:
        allocated = busy = 0.0
        loads = self._loads = {}
        for gpu, keys in self._on.items():
            if keys:
                loads[gpu] = sum(self._running[k].busy for k in keys)
                busy += min(1.0, loads[gpu])
        for pod in self._running.values():
            allocated += sum(pod.shares)
            scaling = min(1.0, len(pod.gpus) / pod.asked) if pod.asked > 0 else 1.0
            contention = min((1.0 / max(1.0, loads[g]) for g in pod.gpus), default=0.0)
            speed = scaling * pod.capped * contention if pod.serving else 0.0
            if speed != pod.speed or not pod.history:
                pod.history.append((at, pod.progress, speed))
                pod.speed = speed
        sample = Sample(at, allocated, busy)
        if self.samples[-1].at == at:
            self.samples[-1] = sample
        else:
            self.samples.append(sample)

    def _checkpointed(self, pod: _Running, at: float) -> float:
        """Progress at the pod's last checkpoint before ``at`` (its start progress if none)."""
        if pod.checkpoint is None or not pod.history:
            return pod.history[0][1] if pod.history else pod.progress
        last = pod.started + math.floor((at - pod.started) / pod.checkpoint) * pod.checkpoint
        return progress_at(pod.history, last)

    def next_completion(self) -> tuple[float, str] | None:
        """(time, key) of the next batch pod to complete at today's speeds (None: none will)."""
        return min(
            (
                (pod.updated + max(0.0, pod.target - pod.progress) / pod.speed, key)
                for key, pod in self._running.items()
                if pod.target is not None and pod.speed > 0
            ),
            default=None,
        )

    def placement(self, key: str) -> Sequence[Gpu]:
        pod = self._running.get(key)
        return pod.gpus if pod is not None else ()

    def speed(self, key: str) -> float:
        pod = self._running.get(key)
        return pod.speed if pod is not None else 0.0

    def progress(self, key: str) -> float:
        pod = self._running.get(key)
        return pod.progress if pod is not None else 0.0


def progress_at(history: Sequence[tuple[float, float, float]], at: float) -> float:
    """Progress at ``at`` from (time, progress, speed from then on) change points."""
    done = history[0][1]
    for when, progress, speed in history:
        if when > at:
            break
        done = progress + speed * (at - when)
    return done
