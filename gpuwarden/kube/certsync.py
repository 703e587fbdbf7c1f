"""The API side of ``gpuwarden certs sync``: the TLS Secret the replicas share, and caBundle.

Only what the chart's RBAC grants is used: ``get`` and ``update`` of the one Secret (which the
chart creates empty; there is no ``create``), and ``get`` and ``update`` of the two webhook
configurations by name.

Replicas start together, so the Secret is written with the resourceVersion that was read: the
second writer gets 409 Conflict, reads again, and finds (and keeps) what the first one wrote.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.errors import (
    HTTP_CONFLICT,
    HTTP_NOT_FOUND,
    api_error_text,
    transport_error_text,
)
from gpuwarden.kube.webhooks import Injected, InjectError, inject_ca_bundle

DEFAULT_TIMEOUT = 10.0
_ATTEMPTS = 5

# Given what the Secret holds: what it should hold, and why that differs (empty: it doesn't).
Planner = Callable[[Mapping[str, bytes]], tuple[Mapping[str, bytes], tuple[str, ...]]]


class SyncError(Exception):
    """An API call failed; the message is one line naming the object."""


@dataclass(frozen=True)
class StoredSecret:
    namespace: str
    name: str
    data: Mapping[str, bytes]
    resource_version: str
    body: Any  # the V1Secret as read, written back with new data

    @property
    def what(self) -> str:
        return f"secret {self.namespace}/{self.name}"


def _decode(data: Mapping[str, bytes | str] | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for key, value in (data or {}).items():
        try:
            out[key] = base64.b64decode(value or "", validate=True)
        except (binascii.Error, ValueError):
            continue  # unreadable: as if absent, so the planner replaces it
    return out


def read_secret(
    api: k8s_client.ApiClient, namespace: str, name: str, *, timeout: float = DEFAULT_TIMEOUT
) -> StoredSecret:
    what = f"secret {namespace}/{name}"
    try:
        body = k8s_client.CoreV1Api(api).read_namespaced_secret(
            name, namespace, _request_timeout=timeout
        )
    except ApiException as exc:
        hint = ""
        if exc.status == HTTP_NOT_FOUND:
            hint = " (the chart creates it empty; check --secret and --namespace)"
        raise SyncError(f"{what}: cannot get: {api_error_text(exc)}{hint}") from exc
    except urllib3.exceptions.HTTPError as exc:
        raise SyncError(f"{what}: {transport_error_text(exc)}") from exc
    version = body.metadata.resource_version if body.metadata is not None else None
    return StoredSecret(namespace, name, _decode(body.data), str(version or ""), body)


class _Conflict(Exception):
    pass


def replace_secret_data(
    api: k8s_client.ApiClient,
    stored: StoredSecret,
    data: Mapping[str, bytes],
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> str:
    """Update the Secret's ``data`` keys (others kept) if it is still the version read.

    Returns the new resourceVersion; raises _Conflict when another writer came first.
    """
    body = stored.body
    body.data = {
        **(body.data or {}),
        **{key: base64.b64encode(value).decode() for key, value in data.items()},
    }
    try:
        written = k8s_client.CoreV1Api(api).replace_namespaced_secret(
            stored.name, stored.namespace, body, _request_timeout=timeout
        )
    except ApiException as exc:
        if exc.status == HTTP_CONFLICT:
            raise _Conflict from exc
        raise SyncError(f"{stored.what}: cannot update: {api_error_text(exc)}") from exc
    except urllib3.exceptions.HTTPError as exc:
        raise SyncError(f"{stored.what}: {transport_error_text(exc)}") from exc
    meta = written.metadata
    return str(meta.resource_version or "") if meta is not None else ""


@dataclass(frozen=True)
class SecretSync:
    """How a sync ended: the data the Secret holds now, and what this run changed in it."""

    data: Mapping[str, bytes]
    changes: tuple[str, ...]
    conflicts: int
    resource_version: str


def sync_secret(
    api: k8s_client.ApiClient,
    namespace: str,
    name: str,
    plan: Planner,
    *,
    attempts: int = _ATTEMPTS,
    timeout: float = DEFAULT_TIMEOUT,
) -> SecretSync:
    """Read the Secret, and write what ``plan`` says it should hold unless it holds it already.

    On 409 Conflict (another replica wrote it since the read) read it again and plan again:
    what the other wrote is normally complete, and then it is kept as it is.
    """
    conflicts = 0
    for _ in range(attempts):
        stored = read_secret(api, namespace, name, timeout=timeout)
        data, changes = plan(stored.data)
        if not changes:
            return SecretSync(data, (), conflicts, stored.resource_version)
        try:
            version = replace_secret_data(api, stored, data, timeout=timeout)
        except _Conflict:
            conflicts += 1
            continue
        return SecretSync(data, changes, conflicts, version)
    raise SyncError(
        f"secret {namespace}/{name}: still conflicting with other writers after "
        f"{attempts} attempts; try again"
    )


def publish_ca_bundle(api: k8s_client.ApiClient, name: str, bundle: bytes) -> list[Injected]:
    """caBundle of the Mutating and Validating configurations ``name`` (as ``certs inject``)."""
    try:
        return inject_ca_bundle(api, name, bundle)
    except InjectError as exc:
        raise SyncError(str(exc)) from exc
