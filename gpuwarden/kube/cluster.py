"""What the webhook knows of the cluster: namespaces, PriorityClasses, tenants' GPU memory, and
the key names of ConfigMaps (for ``envFrom``).

Two sources give the same :class:`ClusterView`:

* :class:`WatchedCluster`: watch-backed caches through the kubernetes client (no API call per
  admission). Ready once every cache has finished its first list.
* :class:`StaticCluster`: Namespace and PriorityClass manifests from a file, for running
  without a cluster.

Consistency model of the tenant GPU-memory count: it is the sum over the live pods the watch
has delivered. A pod admitted a moment ago may not be in it yet (the watch lags the write by
the API server's fan-out delay, typically milliseconds), so two pods created at the same time
can both pass a quota check that only one of them should. The overshoot is bounded by what
the tenant can create within that lag; ``tests/webhook/test_kube_cache.py`` measures it.

A namespace the watch has not delivered yet (created a moment ago, or the cache not synced) is
not taken for a namespace without labels: :meth:`WatchedCluster.resolve_namespace` reads it
from the API server and adds it to the cache, and the webhook refuses GPU pods when even that
fails (``tests/webhook/test_namespace_lookup.py``).

ConfigMaps: only what the environment check needs of their ``data`` keys is kept (SourceKeys:
the few keys that an ``envFrom`` would make into denied variables, by prefix, and counts), never a
value nor the other keys, so the validating webhook can see an ``NVIDIA_VISIBLE_DEVICES`` or ``CUDA_MPS_*``
that a pod would get through a ConfigMap. The view's ``env_source_keys`` reads the cache live
(one dict lookup, no copy per change or per admission), so a view taken earlier sees ConfigMap
changes made since. Secrets are not read (a webhook should not hold that privilege): their keys
stay unknown to the engine. A ConfigMap the watch has not delivered yet (created a moment before
the pod), or one created or changed after the pod, is beyond what admission can know.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.informer import Informer, InformerStats, MappingSink, Obj, object_key
from gpuwarden.policy import ClusterView, PriorityClassInfo
from gpuwarden.policy.admission import manifests
from gpuwarden.policy.admission.manifests import (
    ManifestError,
    config_map_keys,
    namespace_labels,
    priority_class,
)
from gpuwarden.policy.pod.environment import SourceKeys
from gpuwarden.policy.pod.record import CHARGE_FIELDS, PodRecord
from gpuwarden.policy.pod.resources import (
    FINISHED_PHASES,
    annotations_of,
    containers,
    metadata_of,
)

log = logging.getLogger("gpuwarden.kube")


class ClusterSource(Protocol):
    def view(self) -> ClusterView: ...

    def missing(self) -> list[str]:
        """What is not synced yet (empty when ready)."""
        ...

    def stale(self) -> list[str]:
        """Synced caches the API server has not confirmed for a long time (still served)."""
        ...

    def age(self) -> float | None:
        """Seconds since the namespace data was last confirmed."""
        ...

    def stats(self) -> Mapping[str, InformerStats]: ...

    def needs_lookup(self, namespace: str) -> bool:
        """True when the view lacks ``namespace`` and resolve_namespace could add it (cheap)."""
        ...

    def resolve_namespace(self, namespace: str, timeout: float) -> str | None:
        """Read ``namespace`` live into the view (blocking); None when done, else why not."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


def pod_charge(obj: Obj) -> tuple[str, Decimal] | None:
    """The namespace a live governed pod charges and how much GPU memory; None for pods that
    charge none. The namespace, not the pod's tenant annotation, says whom it charges: which
    tenant a namespace belongs to is the policies' answer (issue: a pod in one tenant's
    namespace must never charge another tenant)."""
    status = obj.get("status") or {}
    if isinstance(status, Mapping) and status.get("phase") in FINISHED_PHASES:
        return None
    record = PodRecord.from_annotations(annotations_of(obj), (*CHARGE_FIELDS, "tenant"))
    namespace = metadata_of(obj).get("namespace")
    if not record.tenant or not isinstance(namespace, str):
        return None
    amount = record.admitted_gpu_memory(containers(obj, "containers"))
    return (namespace, amount) if amount > 0 else None


class NamespaceMemory:
    """Sink of pod charges that keeps per-namespace totals up to date incrementally."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._charges: dict[str, tuple[str, Decimal]] = {}
        self._totals: dict[str, Decimal] = {}
        self.snapshot: Mapping[str, Decimal] = {}
        self._on_change = on_change

    def _publish(self) -> None:
        self.snapshot = {t: v for t, v in self._totals.items() if v > 0}
        if self._on_change is not None:
            self._on_change()

    def _add(self, charge: tuple[str, Decimal], sign: int) -> None:
        namespace, amount = charge
        self._totals[namespace] = self._totals.get(namespace, Decimal(0)) + sign * amount

    def replace(self, items: Mapping[str, tuple[str, Decimal]]) -> None:
        self._charges = dict(items)
        self._totals = {}
        for charge in self._charges.values():
            self._add(charge, 1)
        self._publish()

    def upsert(self, key: str, item: tuple[str, Decimal]) -> None:
        old = self._charges.get(key)
        if old == item:
            return
        if old is not None:
            self._add(old, -1)
        self._charges[key] = item
        self._add(item, 1)
        self._publish()

    def delete(self, key: str) -> None:
        old = self._charges.pop(key, None)
        if old is not None:
            self._add(old, -1)
            self._publish()


EnvSourceKey = tuple[str, str, str]


class ConfigMapKeys:
    """Sink of what the environment check needs of each ConfigMap (its SourceKeys: a few keys and
    counts, never values nor the other keys), by ``namespace/name``, written by the informer's
    thread.

    Each entry remembers the ConfigMap's resourceVersion: :meth:`transform` (the informer's)
    reuses the entry of an unchanged ConfigMap instead of indexing its keys again, so a relist
    after a restart of the watch costs a lookup per unchanged ConfigMap. Each change is one dict
    operation (or one swap, for a relist); readers use :attr:`view`.
    """

    def __init__(self) -> None:
        self.items: dict[str, tuple[str, SourceKeys]] = {}
        self.view = EnvSourceKeys(self)

    def transform(self, obj: Obj) -> tuple[str, SourceKeys]:
        meta = obj.get("metadata")
        version = str((meta.get("resourceVersion") if isinstance(meta, Mapping) else "") or "")
        known = self.items.get(object_key(obj))
        if version and known is not None and known[0] == version:
            return known
        return version, config_map_keys(obj)

    def replace(self, items: Mapping[str, tuple[str, SourceKeys]]) -> None:
        # One reference swap: a reader sees the old dict or the new one.
        self.items = dict(items)

    def upsert(self, key: str, item: tuple[str, SourceKeys]) -> None:
        self.items[key] = item

    def delete(self, key: str) -> None:
        self.items.pop(key, None)


class EnvSourceKeys(Mapping[EnvSourceKey, SourceKeys]):
    """Read-only live ``(kind, namespace, name) -> SourceKeys`` over a :class:`ConfigMapKeys`.

    What :attr:`ClusterView.env_source_keys` is given: a lookup costs one dict read, whatever the
    number of ConfigMaps. Only ``ConfigMap`` entries exist (Secrets are never read).
    """

    def __init__(self, sink: ConfigMapKeys) -> None:
        self._sink = sink

    def __getitem__(self, key: EnvSourceKey) -> SourceKeys:
        kind, namespace, name = key
        if kind != "ConfigMap":
            raise KeyError(key)
        return self._sink.items[f"{namespace}/{name}"][1]

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 3 or key[0] != "ConfigMap":
            return False
        return f"{key[1]}/{key[2]}" in self._sink.items

    def __iter__(self) -> Iterator[EnvSourceKey]:
        for key in tuple(self._sink.items):  # a copy: the informer may change the dict meanwhile
            namespace, _, name = key.partition("/")
            yield ("ConfigMap", namespace, name)

    def __len__(self) -> int:
        return len(self._sink.items)


class WatchedCluster:
    """Watch-backed caches of Namespaces, PriorityClasses, live pods' GPU-memory charges and
    ConfigMaps' key names."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        watch_timeout: int = 300,
        track_pods: bool = True,
        track_config_maps: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        core = k8s_client.CoreV1Api(api)
        scheduling = k8s_client.SchedulingV1Api(api)
        self._core = core
        self._watch_timeout = watch_timeout
        self._lock = threading.Lock()
        self.namespaces: MappingSink[Mapping[str, str]] = MappingSink(self._rebuild)
        self.priority_classes: MappingSink[PriorityClassInfo] = MappingSink(self._rebuild)
        self.namespace_memory = NamespaceMemory(self._rebuild)
        # Live: a ConfigMap change needs no new ClusterView.
        self.config_maps = ConfigMapKeys()
        self._view = ClusterView(env_source_keys=self.config_maps.view)
        # name, list method, transform, sink, wanted
        kinds: tuple[tuple[str, Callable[..., Any], Callable[[Obj], Any], Any, bool], ...] = (
            ("namespaces", core.list_namespace, namespace_labels, self.namespaces, True),
            (
                "priorityclasses",
                scheduling.list_priority_class,
                priority_class,
                self.priority_classes,
                True,
            ),
            (
                "pods",
                core.list_pod_for_all_namespaces,
                pod_charge,
                self.namespace_memory,
                track_pods,
            ),
            (
                "configmaps",
                core.list_config_map_for_all_namespaces,
                self.config_maps.transform,
                self.config_maps,
                track_config_maps,
            ),
        )
        self.informers: dict[str, Informer[Any]] = {
            name: Informer(
                name, list_func, transform, sink, watch_timeout=watch_timeout, clock=clock
            )
            for name, list_func, transform, sink, wanted in kinds
            if wanted
        }

    def _rebuild(self) -> None:
        with self._lock:
            self._view = ClusterView(
                namespace_labels=self.namespaces.snapshot,
                priority_classes=self.priority_classes.snapshot,
                namespace_gpu_memory=self.namespace_memory.snapshot,
                env_source_keys=self.config_maps.view,
            )

    def view(self) -> ClusterView:
        return self._view

    def missing(self) -> list[str]:
        return [
            f"{name} cache not synced" for name, inf in self.informers.items() if not inf.synced
        ]

    def stale(self) -> list[str]:
        # A healthy watch ends (and the cache is confirmed) every watch_timeout seconds.
        limit = 3 * self._watch_timeout + 60
        out = []
        for name, informer in self.informers.items():
            age = informer.age()
            if informer.synced and age is not None and age > limit:
                error = informer.stats.last_error
                out.append(
                    f"{name} cache last confirmed by the API server {age:.0f}s ago"
                    + (f" (last error: {error})" if error else "")
                )
        return out

    def age(self) -> float | None:
        return self.informers["namespaces"].age()

    def stats(self) -> Mapping[str, InformerStats]:
        return {name: inf.stats for name, inf in self.informers.items()}

    def needs_lookup(self, namespace: str) -> bool:
        return bool(namespace) and namespace not in self._view.namespace_labels

    def resolve_namespace(self, namespace: str, timeout: float) -> str | None:
        """GET the namespace (a quorum read: it sees one created a moment ago) into the cache.

        Returns None once the view has it, or a one-line reason it could not be read.
        """
        if not self.needs_lookup(namespace):
            return None
        try:
            # Raw, as the informer reads it, so both go through namespace_labels().
            response: Any = self._core.read_namespace(
                namespace, _preload_content=False, _request_timeout=timeout
            )
            try:
                obj = json.loads(response.data)
            finally:
                response.release_conn()
        except ApiException as exc:
            problem = f"reading namespace {namespace} failed: {exc.status} {exc.reason}"
        except Exception as exc:  # network errors, timeouts, a body that is not JSON
            problem = f"reading namespace {namespace} failed: {type(exc).__name__}: {exc}"
        else:
            labels = namespace_labels(obj) if isinstance(obj, Mapping) else None
            if labels is not None:
                if self.namespaces.add_missing(namespace, labels):
                    log.info("namespace %s read live: the watch had not delivered it", namespace)
                return None
            problem = f"reading namespace {namespace} failed: the answer is not a Namespace"
        log.warning("%s", problem)
        return " ".join(problem.split())

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(
            inf.wait_synced(max(deadline - time.monotonic(), 0)) for inf in self.informers.values()
        )

    def start(self) -> None:
        for informer in self.informers.values():
            informer.start()

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.stop()


def load_manifests(path: Path) -> ClusterView:
    """Namespaces, PriorityClasses and ConfigMaps' key names from a file of manifests."""
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: invalid YAML: {exc}") from exc
    return manifests.cluster_view(docs, str(path))


class StaticCluster:
    """A fixed view loaded from a manifests file; always ready."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._view = load_manifests(path)
        self._clock = clock
        self._loaded = clock()

    def view(self) -> ClusterView:
        return self._view

    def missing(self) -> list[str]:
        return []

    def stale(self) -> list[str]:
        return []

    def age(self) -> float | None:
        return self._clock() - self._loaded

    def stats(self) -> Mapping[str, InformerStats]:
        return {}

    def needs_lookup(self, namespace: str) -> bool:
        # The file is the whole truth: a namespace not in it has no labels.
        return False

    def resolve_namespace(self, namespace: str, timeout: float) -> str | None:
        return None

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None
