"""The pool controller: moves drained GPU nodes between the device plugin's whole-GPU config and
its MPS config as demand changes (docs/pools.md).

What to do comes from :func:`gpuwarden.policy.render.pools.plan`; this module watches nodes and
GPU pods, asks it on every change and every interval, and patches the nodes (their config label,
the two ``gpuwarden.io/pool-*`` annotations and ``spec.unschedulable``). Each patch carries the
node's resourceVersion, so one planned from a node that changed meanwhile is refused (409) and
planned again from the new node; a node deleted meanwhile (404) is skipped.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.informer import Informer, MappingSink
from gpuwarden.policy.pod.keys import ANNOTATION_GPU_SHARED
from gpuwarden.policy.pod.resources import requests_gpu
from gpuwarden.policy.render.pools import (
    ANNOTATION_MOVED_AT,
    ANNOTATION_TARGET,
    NodeChange,
    PoolSettings,
    gpu_use,
    plan,
    pool_nodes,
)

MERGE_PATCH = "application/merge-patch+json"
HTTP_NOT_FOUND, HTTP_CONFLICT = 404, 409
# The least time between two plans, so that a burst of pod events is planned once.
MIN_GAP = 1.0

log = logging.getLogger("gpuwarden.pools")
Obj = Mapping[str, Any]


def _pick(obj: Obj, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)  # type: ignore[assignment]
    return obj


def node_view(node: Obj) -> dict[str, Any]:
    """What the planner reads of a node (the cache keeps only this)."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    status = node.get("status") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": {
                key: annotations[key]
                for key in (ANNOTATION_TARGET, ANNOTATION_MOVED_AT)
                if key in annotations
            },
        },
        "spec": {"unschedulable": bool(_pick(node, "spec", "unschedulable"))},
        "status": {
            name: {key: value for key, value in (status.get(name) or {}).items() if "gpu" in key}
            for name in ("capacity", "allocatable")
        },
    }


def _resources_only(bodies: Any) -> list[dict[str, Any]]:
    if not isinstance(bodies, list):
        return []
    return [{"resources": body.get("resources")} for body in bodies if isinstance(body, Mapping)]


def pod_view(pod: Obj) -> dict[str, Any] | None:
    """What the planner reads of a GPU pod; None for a pod that asks no GPU."""
    if not requests_gpu(pod):
        return None
    annotations = _pick(pod, "metadata", "annotations") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    shared = annotations.get(ANNOTATION_GPU_SHARED)
    return {
        "metadata": {"annotations": {} if shared is None else {ANNOTATION_GPU_SHARED: shared}},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": _resources_only(spec.get("containers")),
            "initContainers": _resources_only(spec.get("initContainers")),
        },
        "status": {
            "phase": status.get("phase"),
            "nominatedNodeName": status.get("nominatedNodeName"),
            "conditions": [
                condition
                for condition in status.get("conditions") or ()
                if isinstance(condition, Mapping) and condition.get("type") == "PodScheduled"
            ],
        },
    }


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class PoolController:
    """Watches nodes and GPU pods; plans on every change (at most once per MIN_GAP) and every
    ``interval`` seconds, and patches the nodes the plan changes.

    ``settings`` returns the pools to follow (None: none valid now, so nothing is planned).
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        settings: Callable[[], PoolSettings | None],
        *,
        interval: float,
        watch_timeout: int = 300,
        clock: Callable[[], datetime.datetime] = _now,
    ) -> None:
        self._core = k8s_client.CoreV1Api(api)
        self._settings = settings
        self._interval = interval
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.nodes: MappingSink[dict[str, Any]] = MappingSink(self._wake.set)
        self.pods: MappingSink[dict[str, Any]] = MappingSink(self._wake.set)
        self.informers = (
            Informer(
                "pool-nodes",
                self._core.list_node,
                node_view,
                self.nodes,
                watch_timeout=watch_timeout,
            ),
            Informer(
                "pool-pods",
                self._core.list_pod_for_all_namespaces,
                pod_view,
                self.pods,
                watch_timeout=watch_timeout,
            ),
        )
        self.applied = 0
        self.failed = 0

    def run(self) -> None:
        """Plan and apply until :meth:`stop`."""
        for informer in self.informers:
            informer.start()
        while not self._stop.is_set():
            if all(informer.synced for informer in self.informers):
                try:
                    self.reconcile()
                except Exception:  # a bug in one plan must not stop the controller
                    log.exception("pool controller: planning failed; trying again")
            gap = min(self._interval, MIN_GAP)
            self._stop.wait(gap)
            self._wake.wait(self._interval - gap)
            self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for informer in self.informers:
            informer.stop()

    def reconcile(self) -> list[NodeChange]:
        """One plan from the caches, applied; the changes that were applied."""
        settings = self._settings()
        if settings is None:
            return []
        node_objects = self.nodes.snapshot
        uses = (gpu_use(pod, settings) for pod in self.pods.snapshot.values())
        nodes, pending = pool_nodes(
            node_objects.values(), (use for use in uses if use is not None), settings
        )
        applied: list[NodeChange] = []
        for change in plan(settings, nodes, pending, self._clock()):
            version = _pick(node_objects.get(change.node) or {}, "metadata", "resourceVersion")
            if self._patch(change, version):
                applied.append(change)
        return applied

    def _patch(self, change: NodeChange, version: str | None) -> bool:
        body = change.merge_patch()
        if version:
            body["metadata"]["resourceVersion"] = version
        try:
            response: Any = self._core.patch_node(
                change.node, body, _content_type=MERGE_PATCH, _preload_content=False
            )
            updated = json.loads(response.data)
        except ApiException as exc:
            self.failed += 1
            if exc.status == HTTP_NOT_FOUND:
                log.info("pool controller: node %s is gone; nothing to move", change.node)
            elif exc.status == HTTP_CONFLICT:
                log.info("pool controller: node %s changed meanwhile; planning again", change.node)
                self._wake.set()
            else:
                log.warning(
                    "pool controller: cannot patch node %s: %s",
                    change.node,
                    exc.reason or exc.status,
                )
            return False
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            self.failed += 1
            log.warning("pool controller: cannot patch node %s: %s", change.node, exc)
            return False
        self.applied += 1
        # The watch brings this change too; holding it now keeps the next plan from repeating it.
        self.nodes.upsert(change.node, node_view(updated))
        log.info(
            change.message,
            extra={
                "fields": {
                    "node": change.node,
                    "from": change.source,
                    "to": change.target,
                    "reason": change.reason,
                }
            },
        )
        return True
