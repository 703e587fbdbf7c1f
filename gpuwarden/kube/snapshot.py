"""One read of what `gpuwarden audit --cluster` judges: every pod, with the Namespaces and
PriorityClasses a decision reads, listed page by page through the kubernetes client."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.errors import api_error_text, transport_error_text

Obj = Mapping[str, Any]
# Objects per list call: a cluster of thousands of pods is read in pages, not one answer.
PAGE = 500


class SnapshotError(Exception):
    """A list the API server refused or could not answer; the message names the resource."""


@dataclass(frozen=True)
class Snapshot:
    pods: tuple[Obj, ...]
    # Namespaces, PriorityClasses: manifests as `kubectl get -o yaml` writes them.
    manifests: tuple[Obj, ...]


def _list_all(what: str, list_func: Callable[..., Any], kind: str) -> list[Obj]:
    """Every object of one list call, as parsed JSON (no client models), with its kind set
    (a list's items carry none)."""
    items: list[Obj] = []
    token: str | None = None
    while True:
        try:
            response = list_func(limit=PAGE, _continue=token, _preload_content=False)
            page = json.loads(response.data)
        except ApiException as exc:
            raise SnapshotError(f"cannot list {what}: {api_error_text(exc)}") from None
        except urllib3.exceptions.HTTPError as exc:
            raise SnapshotError(f"cannot list {what}: {transport_error_text(exc)}") from None
        items += [{"kind": kind, **item} for item in page.get("items") or ()]
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


def read_snapshot(api: k8s_client.ApiClient) -> Snapshot:
    core = k8s_client.CoreV1Api(api)
    scheduling = k8s_client.SchedulingV1Api(api)
    pods = _list_all("pods in all namespaces", core.list_pod_for_all_namespaces, "Pod")
    namespaces = _list_all("namespaces", core.list_namespace, "Namespace")
    classes = _list_all("priorityclasses", scheduling.list_priority_class, "PriorityClass")
    return Snapshot(tuple(pods), (*namespaces, *classes))
