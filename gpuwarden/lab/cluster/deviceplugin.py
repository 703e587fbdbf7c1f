"""NVIDIA's device plugin, its config-manager sidecar and GPU Feature Discovery, as the lab's
KWOK nodes need them when a node moves between the whole-GPU and the MPS pool.

On a real node the config-manager (NVIDIA/k8s-device-plugin ``cmd/config-manager/main.go``,
``--node-label``, default ``nvidia.com/device-plugin.config``) watches the node's label; when
its value names another config of the plugin's ConfigMap, it rewrites the plugin's config file
and SIGHUPs the plugin and GFD. The plugin re-registers with the kubelet and advertises the new
config's resource (``nvidia.com/gpu`` per GPU, or ``replicas`` x GPUs of
``nvidia.com/gpu.shared`` for an MPS config with ``renameByDefault``); GFD relabels the node
(``nvidia.com/gpu.sharing-strategy``, ``.replicas``, ``.product``). The kubelet keeps a resource
whose plugin endpoint stopped for ``endpointStopGracePeriod`` (5 minutes,
``pkg/kubelet/cm/devicemanager/types.go``) with no healthy device, allocatable 0, then drops it.
A label naming no config is the config-manager's error ("specified config X does not exist"):
the plugin keeps the config it runs.

Here one thread does all of that through the API server: it patches the node's status
(capacity and allocatable; KWOK's node stage keeps a status it did not write) and GFD's labels.
The lab's pod informers then see the scheduler place pods by the new numbers.
"""

from __future__ import annotations

import functools
import heapq
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.informer import Informer, Obj
from gpuwarden.lab.cluster.nodes import CONFIG_LABEL, POOL_LABEL, GpuNodePool

#: The kubelet's endpointStopGracePeriod (pkg/kubelet/cm/devicemanager/types.go), in seconds.
ENDPOINT_STOP_GRACE = 300.0
_WATCH_SECONDS = 30
_RETRY_SECONDS = 0.2
_HTTP_NOT_FOUND = 404

log = logging.getLogger("gpuwarden.lab")


@dataclass(frozen=True)
class NodeConfig:
    """A node's device plugin config label as the API server shows it, and whether it is
    cordoned (how long a pool controller drained it before it moved)."""

    name: str
    config: str | None
    unschedulable: bool = False


def node_config(node: Obj) -> NodeConfig:
    meta = node.get("metadata") or {}
    return NodeConfig(
        str(meta.get("name", "")),
        (meta.get("labels") or {}).get(CONFIG_LABEL),
        bool((node.get("spec") or {}).get("unschedulable")),
    )


def status_patch(before: GpuNodePool, after: GpuNodePool) -> dict[str, Any]:
    """The node status the kubelet reports once the plugin re-registered under ``after``'s
    config: its resource at its count and, where ``before``'s resource had another name, that
    one kept with no healthy device (allocatable 0) for the grace period."""
    capacity = after.advertised()
    allocatable = dict(capacity)
    old = before.gpu_resource
    if old not in capacity:
        capacity[old] = str(before.gpus_per_node * before.mps_replicas)
        allocatable[old] = "0"
    return {"status": {"capacity": capacity, "allocatable": allocatable}}


def expired_patch(resource: str) -> dict[str, Any]:
    """The status once the kubelet dropped a resource whose endpoint stopped (merge-patch
    null removes the key)."""
    return {"status": {"capacity": {resource: None}, "allocatable": {resource: None}}}


@dataclass(frozen=True)
class Cordon:
    """A node cordoned from ``start`` to ``end`` (the lab's monotonic clock); ``relabelled``:
    when its config label changed meanwhile (None: uncordoned as it was, a cancelled move)."""

    node: str
    start: float
    end: float
    relabelled: float | None


@dataclass(frozen=True)
class Move:
    """A config change the plugin applied: on ``node``, from one config to another, at
    ``at`` (the lab's monotonic clock)."""

    node: str
    before: str
    after: str
    at: float


class _Changes:
    """The informer's sink: hands each node's label value to ``seen`` when it changes."""

    def __init__(self, seen: Callable[[NodeConfig], None]) -> None:
        self._last: dict[str, NodeConfig] = {}
        self._seen = seen

    def replace(self, items: Mapping[str, NodeConfig]) -> None:
        self._last = dict(items)
        for item in items.values():
            self._seen(item)

    def upsert(self, key: str, item: NodeConfig) -> None:
        if self._last.get(key) != item:
            self._last[key] = item
            self._seen(item)

    def delete(self, key: str) -> None:
        self._last.pop(key, None)


@dataclass
class DevicePluginEmulation:
    """The config-manager, device plugin and GFD of every lab node in ``shapes`` (node name ->
    its pool as created), with the ConfigMap's ``configs`` (config name -> MPS replicas per GPU,
    1: whole GPUs) and its ``default`` (what an unlabelled node runs). ``grace`` is the
    kubelet's grace period in wall-clock seconds (the replay's time scale applied);
    ``on_change(node, pool)`` is told a node's new shape before the API server shows it."""

    api: k8s_client.ApiClient
    shapes: Mapping[str, GpuNodePool]
    configs: Mapping[str, int]
    default: str
    grace: float = ENDPOINT_STOP_GRACE
    on_change: Callable[[str, GpuNodePool], None] | None = None
    clock: Callable[[], float] = time.monotonic
    moves: list[Move] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # node -> unknown config named
    cordons: list[Cordon] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._running = {name: pool.config for name, pool in self.shapes.items()}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._wanted: dict[str, str] = {}
        self._labels: dict[str, str | None] = {}
        self._cordoned: dict[str, tuple[float, float | None]] = {}  # start, relabelled
        self._expiring: list[tuple[float, str, str]] = []  # (when, node, resource)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        core: Any = k8s_client.CoreV1Api(self.api)
        self._core = core
        self._informer: Informer[NodeConfig] = Informer(
            "lab-device-plugin",
            functools.partial(core.list_node, label_selector=POOL_LABEL),
            node_config,
            _Changes(self._seen),
            watch_timeout=_WATCH_SECONDS,
            backoff=_RETRY_SECONDS,
            max_backoff=_RETRY_SECONDS,
        )

    def running(self, node: str) -> str:
        """The config the node's plugin runs now."""
        with self._lock:
            return self._running[node]

    def moved(self) -> dict[str, int]:
        """Config changes applied per node."""
        out: dict[str, int] = {}
        for move in self.moves:
            out[move.node] = out.get(move.node, 0) + 1
        return out

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lab-device-plugin", daemon=True)
        self._thread.start()
        self._informer.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._wake.notify_all()
        self._informer.stop(timeout=0)
        if self._thread is not None:
            self._thread.join(5)

    # -- the config-manager's watch -----------------------------------------------------------

    def _seen(self, node: NodeConfig) -> None:
        if node.name not in self.shapes:
            return
        wanted = node.config if node.config is not None else self.default
        now = self.clock()
        with self._lock:
            relabelled = node.name in self._labels and self._labels[node.name] != node.config
            self._labels[node.name] = node.config
            cordon = self._cordoned.get(node.name)
            if cordon is not None and relabelled:
                self._cordoned[node.name] = cordon = (cordon[0], now)
            if node.unschedulable and cordon is None:
                # Cordoned and relabelled at once: an empty node, moved without a drain.
                self._cordoned[node.name] = (now, now if relabelled else None)
            elif not node.unschedulable and cordon is not None:
                del self._cordoned[node.name]
                self.cordons.append(Cordon(node.name, cordon[0], now, cordon[1]))
            self._wanted[node.name] = wanted
            self._wake.notify_all()

    # -- the plugin, the kubelet and GFD ------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                changes = {n: c for n, c in self._wanted.items() if c != self._running[n]}
                self._wanted.clear()
                now = self.clock()
                expired: list[tuple[str, str]] = []
                while self._expiring and self._expiring[0][0] <= now:
                    _, node, resource = heapq.heappop(self._expiring)
                    expired.append((node, resource))
                if not changes and not expired:
                    ahead = self._expiring[0][0] - now if self._expiring else 1.0
                    self._wake.wait(min(max(ahead, 0.0), 1.0))
                    continue
            for node, config in changes.items():
                self._apply(node, config)
            for node, resource in expired:
                self._patch(node, expired_patch(resource), status=True)

    def _apply(self, node: str, config: str) -> None:
        replicas = self.configs.get(config)
        if replicas is None:
            # config-manager: "specified config X does not exist"; the plugin keeps its config.
            self.rejected[node] = config
            log.warning("node %s: device plugin config %s does not exist", node, config)
            return
        self.rejected.pop(node, None)
        with self._lock:
            before_config = self._running[node]
        base = self.shapes[node]
        before = base.configured(self.configs[before_config])
        after = base.configured(replicas)
        if self.on_change is not None:
            self.on_change(node, after)
        self._patch(node, status_patch(before, after), status=True)
        self._patch(node, {"metadata": {"labels": after.gfd_labels()}}, status=False)
        with self._lock:
            self._running[node] = config
            self.moves.append(Move(node, before_config, config, self.clock()))
            # A resource the node advertises again is no longer expiring.
            self._expiring = [
                e for e in self._expiring if not (e[1] == node and e[2] == after.gpu_resource)
            ]
            if before.gpu_resource != after.gpu_resource:
                self._expiring.append((self.clock() + self.grace, node, before.gpu_resource))
            heapq.heapify(self._expiring)

    def _patch(self, node: str, body: Mapping[str, Any], *, status: bool) -> None:
        try:
            if status:
                self._core.patch_node_status(node, body)
            else:
                self._core.patch_node(node, body)
        except ApiException as exc:
            if exc.status != _HTTP_NOT_FOUND:  # a node the lab removed meanwhile
                self.errors.append(f"node {node}: {exc.status} {exc.reason}")
