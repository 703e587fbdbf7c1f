"""What the engine may know of a cluster, read from its manifests (as ``kubectl get -o yaml``
writes them): Namespaces, PriorityClasses, and the key names of ConfigMaps.

The dry-run CLI (``--namespaces FILE``) and ``gpuwarden serve --namespaces FILE`` both build
their :class:`ClusterView` here, so they decide alike; the webhook's watch caches read live
objects through the same functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gpuwarden.policy.admission.decision import ClusterView, PriorityClassInfo
from gpuwarden.policy.pod.environment import SourceKeys
from gpuwarden.policy.spec.precedence import NAMESPACE_NAME_LABEL

KINDS = ("Namespace", "PriorityClass", "ConfigMap")


class ManifestError(ValueError):
    """A manifest that cannot describe the cluster; the message names the file and document."""


def namespace_labels(obj: Mapping[str, Any]) -> Mapping[str, str] | None:
    """A Namespace's labels (values as strings), or None when they are not a map."""
    meta = obj.get("metadata")
    labels = (meta.get("labels") if isinstance(meta, Mapping) else None) or {}
    if not isinstance(labels, Mapping):
        return None
    return {str(k): str(v) for k, v in labels.items()}


def priority_class(obj: Mapping[str, Any]) -> PriorityClassInfo | None:
    """A PriorityClass's value and preemption policy, or None without an integer value."""
    value = obj.get("value")
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    policy = obj.get("preemptionPolicy") or "PreemptLowerPriority"
    return PriorityClassInfo(value=value, preemption_policy=str(policy))


def config_map_keys(obj: Mapping[str, Any]) -> SourceKeys:
    """What the environment check needs of a ConfigMap's ``data`` keys, the variables
    ``envFrom`` makes (SourceKeys: the few keys that make denied variables, by prefix, and
    counts); never values, nor the other keys.

    ``binaryData`` is left out: the kubelet makes variables from ``data`` only.
    """
    data = obj.get("data")
    return SourceKeys.of(data if isinstance(data, Mapping) else ())


def _objects(docs: Iterable[Any]) -> Iterator[tuple[int, Any]]:
    """(document number, object), with ``List`` kinds unpacked."""
    for index, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if isinstance(doc, Mapping) and str(doc.get("kind", "")).endswith("List"):
            items = doc.get("items")
            for item in items if isinstance(items, list) else ():
                yield index, item
        else:
            yield index, doc


def cluster_view(docs: Iterable[Any], source: str) -> ClusterView:
    """The cluster these manifests describe; raises ManifestError naming ``source``."""
    labels: dict[str, Mapping[str, str]] = {}
    classes: dict[str, PriorityClassInfo] = {}
    keys: dict[tuple[str, str, str], SourceKeys | frozenset[str]] = {}
    for index, obj in _objects(docs):
        where = f"{source}: document {index}"
        if not isinstance(obj, Mapping):
            raise ManifestError(f"{where}: expected a Kubernetes object (a mapping)")
        kind = obj.get("kind")
        if kind not in KINDS:
            raise ManifestError(
                f"{where}: kind {kind!r} is not read here; give {', '.join(KINDS)} manifests "
                "(kubectl get namespaces,priorityclasses,configmaps -A -o yaml)"
            )
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{where}: {kind} without metadata.name")
        if kind == "Namespace":
            found = namespace_labels(obj)
            if found is None:
                raise ManifestError(f"{where}: Namespace {name}: metadata.labels must be a map")
            labels[name] = {**found, NAMESPACE_NAME_LABEL: name}
        elif kind == "PriorityClass":
            info = priority_class(obj)
            if info is None:
                raise ManifestError(f"{where}: PriorityClass {name}: value must be an integer")
            classes[name] = info
        else:
            assert isinstance(meta, Mapping)
            namespace = meta.get("namespace") or "default"
            keys[("ConfigMap", str(namespace), name)] = config_map_keys(obj)
    return ClusterView(namespace_labels=labels, priority_classes=classes, env_source_keys=keys)


def merged(views: Iterable[ClusterView]) -> ClusterView:
    """One view of several files' manifests (later files win for the same object)."""
    labels: dict[str, Mapping[str, str]] = {}
    classes: dict[str, PriorityClassInfo] = {}
    keys: dict[tuple[str, str, str], SourceKeys | frozenset[str]] = {}
    for view in views:
        labels.update(view.namespace_labels)
        classes.update(view.priority_classes)
        keys.update(view.env_source_keys)
    return ClusterView(namespace_labels=labels, priority_classes=classes, env_source_keys=keys)
