"""What the pool controller sets on a node: pools of whole and MPS-shared GPUs that follow demand.

NVIDIA's device plugin takes a per-node config: its config-manager sidecar watches the node label
``nvidia.com/device-plugin.config`` (flag ``--node-label``, NVIDIA/k8s-device-plugin
cmd/config-manager/main.go), writes the named config of the plugin's ConfigMap and restarts the
plugin, which then advertises that config's resources. A container already running keeps the
devices it was given, so a node changes config only once no GPU pod runs on it: it is cordoned,
drained by its pods finishing (nothing is evicted) and relabelled. It stays cordoned until the
plugin advertises the new config, so that no pod is bound to it against the old one meanwhile.

This module is the pure planner (:func:`plan`, ``now`` an argument) and the readers of the nodes
and pods it plans from; :mod:`gpuwarden.kube.pools` watches the cluster and applies its changes.
The sizing rule (docs/pools.md): the shared pool is sized to the replicas its pods hold and wait
for, plus ``sharedHeadroom``; the whole pool gets every other node. A shared node that still
holds pods idles the replicas it frees until its drain ends, so at most ``maxDrainingNodes``
such nodes drain toward the whole pool at once; empty nodes always move at once.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import QuantityError, parse_count
from gpuwarden.policy.pod.record import PodRecord
from gpuwarden.policy.pod.resources import (
    FINISHED_PHASES,
    annotations_of,
    containers,
    metadata_of,
    spec_of,
    string_map,
)
from gpuwarden.policy.spec.model import NvidiaBackend, NvidiaPools
from gpuwarden.policy.spec.policyset import PolicySet

#: The config a cordoned node drains toward; present only while it drains.
ANNOTATION_TARGET = f"{keys.API_GROUP}/pool-target"
#: When the node's config label last changed (RFC 3339, UTC, fractional seconds).
ANNOTATION_MOVED_AT = f"{keys.API_GROUP}/pool-moved-at"
WHOLE_RESOURCE = "nvidia.com/gpu"
# GPU Feature Discovery's count of the node's GPUs (NVIDIA/k8s-device-plugin internal/lm/
# resource.go), the same whatever config the plugin runs.
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
# A relabelled node is uncordoned once the plugin advertises its new config, or after this long
# whatever it advertises: by then the kubelet has dropped the old config's resource
# (endpointStopGracePeriod, 5 minutes: kubernetes pkg/kubelet/cm/devicemanager/types.go).
SETTLE_SECONDS = 300.0

Event = Literal["started", "finished", "cancelled", "ready"]
_MESSAGES: dict[Event, str] = {
    "started": "pool move started",
    "finished": "pool move finished",
    "cancelled": "pool move cancelled",
    "ready": "pool node ready",
}


class PoolSettings(NamedTuple):
    """An nvidia backend's pools with what sizing them needs from the backend."""

    pools: NvidiaPools
    replicas: int
    shared_resource: str

    @classmethod
    def of(cls, backend: NvidiaBackend) -> PoolSettings | None:
        if backend.pools is None or backend.mps_replicas is None:
            return None
        return cls(backend.pools, backend.mps_replicas, backend.shared_resource_name)


def pool_settings(policies: PolicySet) -> PoolSettings | None:
    """The first nvidia backend with pools, in load order: each policy's own, then its profiles'."""
    for policy in policies.policies:
        spec = policy.spec
        for backend in (spec.backend, *(profile.backend for profile in spec.profiles)):
            if isinstance(backend, NvidiaBackend):
                found = PoolSettings.of(backend)
                if found is not None:
                    return found
    return None


# --- Reading the cluster ---------------------------------------------------------------------


class GpuUse(NamedTuple):
    """What a live GPU pod holds (on ``node``) or waits for (``pending``)."""

    node: str
    whole: int
    replicas: int
    pending: bool


class Ask(NamedTuple):
    """A pending pod's ask: whole GPUs, or shared replicas."""

    whole: int
    replicas: int


@dataclass(frozen=True)
class PoolNode:
    """A node as the planner reads it: its labels, our two annotations, whether it is cordoned,
    its GPUs, the GPU resources it advertises (allocatable), and the whole GPUs and shared
    replicas its live GPU pods hold."""

    name: str
    labels: Mapping[str, str]
    gpus: int
    unschedulable: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    held_gpus: int = 0
    held_replicas: int = 0
    allocatable: Mapping[str, int] = field(default_factory=dict)

    @property
    def target(self) -> str | None:
        return self.annotations.get(ANNOTATION_TARGET)

    @property
    def empty(self) -> bool:
        return self.held_gpus == 0 and self.held_replicas == 0


def _count(value: Any) -> int:
    try:
        return parse_count(value)
    except QuantityError:
        return 0


def _effective(pod: Mapping[str, Any], resource: str) -> int:
    """The pod's ask of ``resource`` as the scheduler counts it: its containers' sum, or its
    largest init container's when that is more (limits win over requests)."""
    asks = {"containers": 0, "initContainers": 0}
    for ref in containers(pod, "containers", "initContainers"):
        value = ref.gpu_resources().get(resource)
        if value is None:
            continue
        amount = _count(value)
        if ref.field == "containers":
            asks["containers"] += amount
        else:
            asks["initContainers"] = max(asks["initContainers"], amount)
    return max(asks.values())


def _unschedulable(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "PodScheduled":
            return condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
    return False


def gpu_use(pod: Mapping[str, Any], settings: PoolSettings) -> GpuUse | None:
    """What the pod holds or waits for; None for a pod that asks no GPU, has finished, or neither
    runs nor waits (not yet tried by the scheduler, or nominated to a node by a preemption)."""
    status = pod.get("status")
    status = status if isinstance(status, Mapping) else {}
    if status.get("phase") in FINISHED_PHASES:
        return None
    whole = _effective(pod, WHOLE_RESOURCE)
    replicas = 0
    if settings.shared_resource != WHOLE_RESOURCE:
        replicas = _effective(pod, settings.shared_resource)
    elif PodRecord.from_annotations(annotations_of(pod), ("gpu_shared",)).gpu_shared:
        whole, replicas = 0, whole
    if whole == 0 and replicas == 0:
        return None
    node = spec_of(pod).get("nodeName")
    if isinstance(node, str) and node:
        return GpuUse(node, whole, replicas, pending=False)
    if status.get("nominatedNodeName") or not _unschedulable(status):
        return None
    return GpuUse("", whole, replicas, pending=True)


def _gpu_resources(node: Mapping[str, Any], field_name: str) -> dict[str, int]:
    """The node's status.capacity or status.allocatable, GPU resources only."""
    status = node.get("status")
    found = status.get(field_name) if isinstance(status, Mapping) else None
    if not isinstance(found, Mapping):
        return {}
    return {str(key): _count(value) for key, value in found.items() if "gpu" in str(key)}


def _gpu_count(node: Mapping[str, Any], labels: Mapping[str, str], settings: PoolSettings) -> int:
    """GFD's GPU count label; without it, what the node's capacity advertises."""
    counted = _count(labels.get(GPU_COUNT_LABEL, "0"))
    if counted:
        return counted
    capacity = _gpu_resources(node, "capacity")
    whole = _count(capacity.get(WHOLE_RESOURCE, "0"))
    if settings.shared_resource == WHOLE_RESOURCE:
        config = labels.get(settings.pools.config_label)
        return whole // settings.replicas if config == settings.pools.shared_config else whole
    return whole or _count(capacity.get(settings.shared_resource, "0")) // settings.replicas


def pool_nodes(
    nodes: Iterable[Mapping[str, Any]], uses: Iterable[GpuUse], settings: PoolSettings
) -> tuple[list[PoolNode], list[Ask]]:
    """The nodes with what their pods hold, and the pending pods' asks."""
    held: dict[str, list[int]] = {}
    pending: list[Ask] = []
    for use in uses:
        if use.pending:
            pending.append(Ask(use.whole, use.replicas))
        else:
            sums = held.setdefault(use.node, [0, 0])
            sums[0] += use.whole
            sums[1] += use.replicas
    out: list[PoolNode] = []
    for node in nodes:
        meta = metadata_of(node)
        labels = string_map(meta.get("labels"))
        annotations = string_map(meta.get("annotations"))
        name = str(meta.get("name", ""))
        gpus_held, replicas_held = held.get(name, (0, 0))
        out.append(
            PoolNode(
                name=name,
                labels=labels,
                gpus=_gpu_count(node, labels, settings),
                unschedulable=bool(spec_of(node).get("unschedulable")),
                annotations={
                    key: annotations[key]
                    for key in (ANNOTATION_TARGET, ANNOTATION_MOVED_AT)
                    if key in annotations
                },
                held_gpus=gpus_held,
                held_replicas=replicas_held,
                allocatable=_gpu_resources(node, "allocatable"),
            )
        )
    return out, pending


# --- The plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeChange:
    """One action on one node: what to set (None: remove) and why."""

    node: str
    event: Event
    source: str
    target: str
    reason: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    # True: cordon; False: uncordon; None: leave as it is.
    unschedulable: bool | None = None

    @property
    def message(self) -> str:
        return _MESSAGES[self.event]

    def merge_patch(self) -> dict[str, Any]:
        """The node's JSON merge patch (RFC 7386)."""
        meta: dict[str, Any] = {}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        body: dict[str, Any] = {"metadata": meta}
        if self.unschedulable is not None:
            # kubectl uncordon leaves the field unset; null removes it.
            body["spec"] = {"unschedulable": True if self.unschedulable else None}
        return body


def timestamp(now: datetime.datetime) -> str:
    """RFC 3339 in UTC with microseconds, as the moved-at annotation holds it."""
    utc = now.astimezone(datetime.UTC).replace(tzinfo=None)
    return f"{utc.isoformat(timespec='microseconds')}Z"


def _moved_at(node: PoolNode) -> datetime.datetime | None:
    raw = node.annotations.get(ANNOTATION_MOVED_AT)
    if raw is None:
        return None
    try:
        moved = datetime.datetime.fromisoformat(raw)
    except ValueError:
        return None  # not ours to read: the node may move as if it never had
    return moved if moved.tzinfo is not None else moved.replace(tzinfo=datetime.UTC)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


@dataclass
class _Pools:
    """The planner's working state: each node's destination pool and the shared pool's sums."""

    settings: PoolSettings
    shared: list[PoolNode]
    whole: list[PoolNode]
    demand: int  # replicas held on shared nodes, waiting, and kept as headroom

    def capacity(self) -> int:
        return sum(self.cap(node) for node in self.shared)

    def target(self) -> int:
        return self.demand + sum(node.held_replicas for node in self.shared)

    def cap(self, node: PoolNode) -> int:
        return node.gpus * self.settings.replicas


def _first_to_move(
    candidates: Iterable[PoolNode],
    held: Callable[[PoolNode], int],
    size: Callable[[PoolNode], int],
    missing: int,
) -> PoolNode:
    """Empty nodes first (they move within a plan or two), then those already draining, then the
    one that holds least; among equals the smallest whose ``size`` covers what is missing, else the
    largest."""
    return min(
        candidates,
        key=lambda n: (
            not n.empty,
            n.target is None,
            held(n),
            (0, n.gpus) if size(n) >= missing else (1, -n.gpus),
            n.name,
        ),
    )


def plan(
    settings: PoolSettings,
    nodes: Sequence[PoolNode],
    pending: Sequence[Ask],
    now: datetime.datetime,
) -> list[NodeChange]:
    """The changes that bring the pools toward demand (see the module docstring)."""
    pools = settings.pools
    configs = (pools.whole_config, pools.shared_config)
    changes: list[NodeChange] = []
    managed: list[PoolNode] = []
    for node in nodes:
        config = node.labels.get(pools.config_label)
        if config not in configs:
            continue
        target = node.target
        if target is not None and target not in configs:
            changes.append(_cancel(node, config, f"its target {target!r} is neither pool"))
            continue
        if node.unschedulable and target is None:
            continue  # cordoned by someone else: never touched, and no part of either pool
        if target == config:  # relabelled: in its new pool, cordoned until the plugin follows
            changes.extend(_settled(settings, node, config, now))
        managed.append(node)

    def movable(node: PoolNode) -> bool:
        if node.target is not None:
            # A move started may finish or be cancelled; a node relabelled waits for the plugin.
            return node.target != node.labels[pools.config_label]
        if node.unschedulable or node.gpus <= 0:
            return False
        if any(node.labels.get(key) != value for key, value in pools.node_selector.items()):
            return False
        moved = _moved_at(node)
        return moved is None or (now - moved).total_seconds() >= pools.hold_seconds

    # A pod that no node could hold whatever its pool (more GPUs, or more replicas, than the
    # largest node has) waits for no move: counting it would drain nodes for nothing.
    largest = max((node.gpus for node in managed), default=0)
    pending = [
        ask
        for ask in pending
        if ask.whole <= largest and ask.replicas <= largest * settings.replicas
    ]
    state = _Pools(
        settings,
        shared=[n for n in managed if n.labels[pools.config_label] == pools.shared_config],
        whole=[n for n in managed if n.labels[pools.config_label] == pools.whole_config],
        demand=sum(ask.replicas for ask in pending) + pools.shared_headroom,
    )
    to_shared = _grow(state, [n for n in state.whole if movable(n)])
    to_whole: list[tuple[PoolNode, str]] = []
    if not to_shared:
        to_whole = _shrink(state, [n for n in state.shared if movable(n)], pending)
    chosen = {node.name for node, _ in (*to_shared, *to_whole)}
    for node, reason in to_shared:
        changes.extend(_move(node, pools.config_label, configs, reason, now))
    for node, reason in to_whole:
        changes.extend(_move(node, pools.config_label, configs[::-1], reason, now))
    for node in managed:
        source = node.labels[pools.config_label]
        if node.target not in (None, source) and node.name not in chosen:
            changes.append(_cancel(node, source, _why_cancelled(state, node, pending)))
    return changes


def _advertises(settings: PoolSettings, node: PoolNode, config: str) -> bool:
    """Whether the node's allocatable shows the device plugin running ``config``."""
    shared = config == settings.pools.shared_config
    resource = settings.shared_resource if shared else WHOLE_RESOURCE
    count = node.allocatable.get(resource, 0)
    if settings.shared_resource != WHOLE_RESOURCE:
        return count > 0
    # Both configs advertise nvidia.com/gpu: only the count tells them apart.
    return count > 0 and count == node.gpus * (settings.replicas if shared else 1)


def _settled(
    settings: PoolSettings, node: PoolNode, config: str, now: datetime.datetime
) -> list[NodeChange]:
    """Uncordon a relabelled node once the plugin advertises its config (or after
    SETTLE_SECONDS whatever it advertises)."""
    if _advertises(settings, node, config):
        reason = "the device plugin advertises its new config"
    else:
        moved = _moved_at(node)
        if moved is not None and (now - moved).total_seconds() < SETTLE_SECONDS:
            return []
        reason = (
            f"the device plugin does not advertise its new config {SETTLE_SECONDS:g}s after "
            "it was relabelled; uncordoned anyway (check the plugin's config-manager log)"
        )
    return [
        NodeChange(
            node.name,
            "ready",
            config,
            config,
            reason,
            annotations={ANNOTATION_TARGET: None},
            unschedulable=False,
        )
    ]


def _grow(state: _Pools, candidates: list[PoolNode]) -> list[tuple[PoolNode, str]]:
    """Whole nodes that join the shared pool while it does not cover its demand or its floor."""
    pools = state.settings.pools
    chosen: list[tuple[PoolNode, str]] = []
    while candidates and len(state.whole) > pools.min_whole_nodes:
        capacity, target = state.capacity(), state.target()
        if capacity < target:
            reason = (
                f"the shared pool offers {capacity} replicas for the {target} its pods hold and "
                f"wait for (sharedHeadroom {pools.shared_headroom})"
            )
        elif len(state.shared) < pools.min_shared_nodes:
            reason = (
                f"the shared pool has {_plural(len(state.shared), 'node')}, fewer than "
                f"minSharedNodes {pools.min_shared_nodes}"
            )
        else:
            break
        missing = target - capacity
        node = _first_to_move(candidates, lambda n: n.held_gpus, state.cap, missing)
        candidates.remove(node)
        state.whole.remove(node)
        state.shared.append(node)
        chosen.append((node, reason))
    return chosen


def _shrink(
    state: _Pools, candidates: list[PoolNode], pending: Sequence[Ask]
) -> list[tuple[PoolNode, str]]:
    """Shared nodes that join the whole pool while whole-GPU pods wait (or the whole pool is
    under its floor), each only if the shared pool still covers its demand without it."""
    pools = state.settings.pools
    asks = [ask.whole for ask in pending if ask.whole]
    waiting, smallest = sum(asks), min(asks, default=0)
    incoming = busy = 0
    chosen: list[tuple[PoolNode, str]] = []
    while candidates and len(state.shared) > pools.min_shared_nodes:
        floor = len(state.whole) < pools.min_whole_nodes
        if incoming >= waiting and not floor:
            break
        capacity, target = state.capacity(), state.target()
        # Each must fit a waiting pod and leave the shared pool covering the rest of its demand.
        eligible = [
            n
            for n in candidates
            # A drain idles what its node frees for hours: one busy node at a time (or
            # maxDrainingNodes), those already draining kept, empty ones always.
            if (n.empty or n.target == pools.whole_config or busy < pools.max_draining_nodes)
            and (
                floor
                or (n.gpus >= smallest and capacity - state.cap(n) >= target - n.held_replicas)
            )
        ]
        if not eligible:
            break
        missing = waiting - incoming
        node = _first_to_move(eligible, lambda n: n.held_replicas, lambda n: n.gpus, missing)
        if floor:
            reason = (
                f"the whole pool has {_plural(len(state.whole), 'node')}, fewer than "
                f"minWholeNodes {pools.min_whole_nodes}"
            )
        else:
            rest = capacity - state.cap(node)
            reason = (
                f"{_plural(len(asks), 'whole-GPU pod')} {'waits' if len(asks) == 1 else 'wait'} "
                f"for {_plural(waiting, 'GPU')}, and "
                f"the shared pool covers its {target - node.held_replicas} replicas with "
                f"{rest} without this node"
            )
        candidates.remove(node)
        state.shared.remove(node)
        state.whole.append(node)
        incoming += node.gpus
        busy += not node.empty
        chosen.append((node, reason))
    return chosen


def _move(
    node: PoolNode, label: str, moves: tuple[str, str], reason: str, now: datetime.datetime
) -> list[NodeChange]:
    """Cordon the node toward ``moves`` (from, to); relabel it once it is cordoned and holds no
    GPU pod. An empty node is cordoned first too, and relabelled by the next plan if it still
    holds none: a pod bound to it just before the cordon then keeps it draining."""
    source, target = moves
    draining = node.target == target and node.unschedulable
    if node.empty and draining:
        return [
            NodeChange(
                node.name,
                "finished",
                source,
                target,
                f"{reason}; no GPU pod runs on it, so it is relabelled, and cordoned until the "
                "device plugin advertises its new config",
                labels={label: target},
                annotations={ANNOTATION_MOVED_AT: timestamp(now), ANNOTATION_TARGET: target},
                unschedulable=True,
            )
        ]
    if draining:
        return []
    if node.empty:
        until = "it holds no GPU pod, so it is relabelled at the next plan if it still holds none"
    elif node.held_gpus:
        until = f"the pods holding its {_plural(node.held_gpus, 'whole GPU')} finish"
    else:
        until = f"the pods holding its {_plural(node.held_replicas, 'shared replica')} finish"
    return [
        NodeChange(
            node.name,
            "started",
            source,
            target,
            f"{reason}; cordoned until {until}",
            annotations={ANNOTATION_TARGET: target},
            unschedulable=True,
        )
    ]


def _cancel(node: PoolNode, source: str, reason: str) -> NodeChange:
    return NodeChange(
        node.name,
        "cancelled",
        source,
        node.target or source,
        reason,
        annotations={ANNOTATION_TARGET: None},
        unschedulable=False,
    )


def _why_cancelled(state: _Pools, node: PoolNode, pending: Sequence[Ask]) -> str:
    if node.target == state.settings.pools.shared_config:
        return (
            f"the shared pool covers the {state.target()} replicas its pods hold and wait for "
            f"with {state.capacity()} without it"
        )
    if not any(ask.whole for ask in pending):
        return "no whole-GPU pod waits any more"
    return (
        f"the shared pool needs it: its pods hold and wait for {state.target()} replicas, "
        f"and {state.capacity() - state.cap(node)} would stay without it"
    )
