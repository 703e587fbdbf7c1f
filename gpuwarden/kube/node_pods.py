"""The node agent's Kubernetes side: its node's pods, Events, and evictions.

* The pods come from a list+watch with the field selector ``spec.nodeName=<node>`` (the shared
  :class:`~gpuwarden.kube.informer.Informer`), kept as raw JSON objects.
* Events are core/v1 Events on the pod (or on the Node), as kubelet writes them, so
  ``kubectl describe pod`` shows them.
* Evictions go through the pod's ``eviction`` subresource (policy/v1), so PodDisruptionBudgets
  are honoured; the API server refuses with 429 when a budget does not allow it.

The class satisfies the agent's ``Cluster`` protocol structurally; it imports nothing of the node
room.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.informer import Informer, MappingSink, Obj
from gpuwarden.policy.pod.jobs import notebooks

# (connect, read) seconds for Events and evictions: a hung API server must not stall the
# single-threaded enforcement loop; a failed eviction is asked again next tick.
_WRITE_TIMEOUT = (5, 15)
COMPONENT = "gpuwarden-node-agent"
REPORTING_CONTROLLER = "gpuwarden.io/node-agent"
# core/v1 Event messages are cut here (events.k8s.io allows 1 KiB notes); the start matters most.
_MESSAGE_LIMIT = 1024


def _keep(obj: Obj) -> Obj:
    return obj


def _status_message(exc: ApiException) -> str:
    """The API server's Status message and its causes, e.g. which disruption budget refused."""
    try:
        status = json.loads(exc.body or "")
    except ValueError:
        return str(exc.reason)
    if not isinstance(status, dict):
        return str(exc.reason)
    text = str(status.get("message") or exc.reason)
    causes = (status.get("details") or {}).get("causes") or []
    notes = [str(c.get("message")) for c in causes if isinstance(c, dict) and c.get("message")]
    return f"{text} ({'; '.join(notes)})" if notes else text


class ObjectRef(Protocol):
    """A reference to an object of the pod's namespace (the node agent's OwnerRef)."""

    @property
    def api_version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...


class NodeCluster:
    """Pods of one node (watched), plus Events and evictions, through the kubernetes client."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        node_name: str,
        *,
        watch_timeout: int = 300,
        component: str = COMPONENT,
    ) -> None:
        self.node_name = node_name
        self.component = component
        self.core = k8s_client.CoreV1Api(api)
        self.custom = k8s_client.CustomObjectsApi(api)
        self._sink: MappingSink[Obj] = MappingSink()
        self.informer: Informer[Obj] = Informer(
            f"pods-on-{node_name}",
            functools.partial(
                self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node_name}"
            ),
            _keep,
            self._sink,
            watch_timeout=watch_timeout,
        )

    def start(self, timeout: float = 30.0) -> bool:
        """Start the watch; True once the first list arrived within ``timeout`` seconds."""
        self.informer.start()
        return self.informer.wait_synced(timeout)

    def stop(self) -> None:
        self.informer.stop()

    def pods(self) -> list[Mapping[str, Any]]:
        return list(self._sink.snapshot.values())

    def _event(
        self,
        namespace: str,
        involved: k8s_client.V1ObjectReference,
        reason: str,
        message: str,
        type_: str,
    ) -> None:
        now = datetime.now(UTC)
        body = k8s_client.CoreV1Event(
            metadata=k8s_client.V1ObjectMeta(
                generate_name=f"{involved.name}.", namespace=namespace
            ),
            involved_object=involved,
            reason=reason,
            message=message[:_MESSAGE_LIMIT],
            type=type_,
            source=k8s_client.V1EventSource(component=self.component, host=self.node_name),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            reporting_component=REPORTING_CONTROLLER,
            reporting_instance=self.node_name,
        )
        _finish(
            self.core.create_namespaced_event(
                namespace, body, _preload_content=False, _request_timeout=_WRITE_TIMEOUT
            )
        )

    def pod_event(
        self, namespace: str, name: str, uid: str, reason: str, message: str, type_: str
    ) -> None:
        involved = k8s_client.V1ObjectReference(
            api_version="v1", kind="Pod", namespace=namespace, name=name, uid=uid
        )
        self._event(namespace, involved, reason, message, type_)

    def owner_event(
        self, namespace: str, owner: ObjectRef, reason: str, message: str, type_: str
    ) -> None:
        """An Event on the pod's controller (``owner``: api_version, kind, name, uid)."""
        involved = k8s_client.V1ObjectReference(
            api_version=owner.api_version,
            kind=owner.kind,
            namespace=namespace,
            name=owner.name,
            uid=owner.uid,
        )
        self._event(namespace, involved, reason, message, type_)

    def stop_notebook(self, namespace: str, name: str, stopped_at: str) -> str:
        """Set the Notebook's stop annotation (a JSON merge patch: needs only ``patch`` on
        notebooks.kubeflow.org); returns what the API server decided, in words."""
        # The notebook controller scales the Notebook to zero while the annotation is present
        # (its culler sets it to an RFC 3339 time); the volumes stay, and the dashboard's start
        # removes it: gpuwarden/policy/pod/jobs/notebooks.py cites the source.
        body = {"metadata": {"annotations": {notebooks.STOP_ANNOTATION: stopped_at}}}
        try:
            response: Any = self.custom.patch_namespaced_custom_object(
                notebooks.NOTEBOOK.group,
                notebooks.NOTEBOOK.version,
                namespace,
                notebooks.NOTEBOOK.plural,
                name,
                body,
                _preload_content=False,
                _request_timeout=_WRITE_TIMEOUT,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return "the Notebook is gone (or its CRD is not installed)"
            raise
        _finish(response)
        return f"stopped at {stopped_at} (HTTP {response.status})"

    def node_event(self, reason: str, message: str, type_: str) -> None:
        # kubelet's convention: node events live in "default" and use the node name as UID.
        involved = k8s_client.V1ObjectReference(
            api_version="v1", kind="Node", name=self.node_name, uid=self.node_name
        )
        self._event("default", involved, reason, message, type_)

    def evict(self, namespace: str, name: str, uid: str) -> str:
        """Ask for an eviction; returns what the API server decided, in words."""
        body = k8s_client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s_client.V1ObjectMeta(name=name, namespace=namespace),
            # Never evict a newer pod that took the same name.
            delete_options=k8s_client.V1DeleteOptions(
                preconditions=k8s_client.V1Preconditions(uid=uid)
            ),
        )
        try:
            response: Any = self.core.create_namespaced_pod_eviction(
                name, namespace, body, _preload_content=False, _request_timeout=_WRITE_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 429:
                return f"refused for now (429): {_status_message(exc)}"
            if exc.status == 404:
                return "the pod is already gone"
            if exc.status == 409:
                return "the pod was replaced by another with the same name; not evicted"
            raise
        _finish(response)
        return f"evicted (HTTP {response.status})"


def _finish(response: Any) -> None:
    """Read and drop the body of an unparsed (``_preload_content=False``) response, then give
    its connection back: a connection returned with its body unread would hand that body to
    the next request on it as its status line."""
    response.drain_conn()
    response.release_conn()
