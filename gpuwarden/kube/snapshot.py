"""One read of what `gpuwarden audit --cluster` judges: every pod and Training Operator job, with
the Namespaces and PriorityClasses a decision reads, listed page by page through the kubernetes
client. A job kind whose CRD is not installed is left out."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.errors import api_error_text, transport_error_text
from gpuwarden.policy.pod.jobs import ALL_KINDS, BATCH_JOB, JobKind

Obj = Mapping[str, Any]
# Objects per list call: a cluster of thousands of pods is read in pages, not one answer.
PAGE = 500


class SnapshotError(Exception):
    """A list the API server refused or could not answer; the message names the resource."""


@dataclass(frozen=True)
class Snapshot:
    pods: tuple[Obj, ...]
    jobs: tuple[Obj, ...]
    # Namespaces, PriorityClasses: manifests as `kubectl get -o yaml` writes them.
    manifests: tuple[Obj, ...]
    # Job kinds that could not be listed (not allowed to, say), each a sentence.
    left_out: tuple[str, ...] = ()


def _list_all(
    what: str, list_func: Callable[..., Any], kind: str, *, absent_ok: bool = False
) -> list[Obj]:
    """Every object of one list call, as parsed JSON (no client models), with its kind set
    (a list's items carry none); with ``absent_ok``, none where the resource does not exist."""
    items: list[Obj] = []
    token: str | None = None
    while True:
        try:
            response = list_func(limit=PAGE, _continue=token, _preload_content=False)
            page = json.loads(response.data)
        except ApiException as exc:
            if absent_ok and exc.status == 404:
                return []
            raise SnapshotError(f"cannot list {what}: {api_error_text(exc)}") from None
        except urllib3.exceptions.HTTPError as exc:
            raise SnapshotError(f"cannot list {what}: {transport_error_text(exc)}") from None
        items += [{"kind": kind, **item} for item in page.get("items") or ()]
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


def _listed_kinds() -> list[JobKind]:
    """The job kinds an audit lists from the cluster: every custom resource gpuwarden admits
    (each at its first version), not batch Jobs, whose pods are audited once they exist."""
    kinds: dict[tuple[str, str], JobKind] = {}
    for kind in ALL_KINDS:
        if kind is not BATCH_JOB:
            kinds.setdefault((kind.group, kind.kind), kind)
    return list(kinds.values())


def read_snapshot(api: k8s_client.ApiClient) -> Snapshot:
    core = k8s_client.CoreV1Api(api)
    scheduling = k8s_client.SchedulingV1Api(api)
    pods = _list_all("pods in all namespaces", core.list_pod_for_all_namespaces, "Pod")
    namespaces = _list_all("namespaces", core.list_namespace, "Namespace")
    classes = _list_all("priorityclasses", scheduling.list_priority_class, "PriorityClass")
    custom = k8s_client.CustomObjectsApi(api)
    jobs: list[Obj] = []
    left_out: list[str] = []
    for kind in _listed_kinds():

        def list_jobs(kind: JobKind = kind, **kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(
                kind.group, kind.version, kind.plural, **kwargs
            )

        what = f"{kind.plural}.{kind.group} in all namespaces"
        try:
            listed = _list_all(what, list_jobs, kind.kind, absent_ok=True)
        except SnapshotError as exc:
            left_out.append(f"{exc}; {kind.kind}s are left out of the audit")
            continue
        jobs += [{"apiVersion": kind.api_version, **job} for job in listed]
    return Snapshot(tuple(pods), tuple(jobs), (*namespaces, *classes), tuple(left_out))
