"""Publish the CA bundle into gpuwarden's webhook configurations through the API server."""

from __future__ import annotations

import base64
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

DEFAULT_TIMEOUT = 10.0
_ATTEMPTS = 5


class InjectError(Exception):
    """The bundle could not be published; the message names the object."""


@dataclass(frozen=True)
class Injected:
    kind: str
    name: str
    webhooks: int
    changed: bool


def _error(
    kind: str, name: str, doing: str, exc: ApiException | urllib3.exceptions.HTTPError
) -> InjectError:
    """The one-line errors of ``certs sync``: the API server's message, or why it is unreachable."""
    if isinstance(exc, ApiException):
        return InjectError(f"{kind} {name}: cannot {doing}: {api_error_text(exc)}")
    return InjectError(f"{kind} {name}: {transport_error_text(exc)}")


def _patch_one(
    read: Any, replace: Any, kind: str, name: str, bundle_b64: str, timeout: float
) -> Injected | None:
    for _ in range(_ATTEMPTS):
        try:
            config = read(name, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            raise _error(kind, name, "read", exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise _error(kind, name, "read", exc) from exc
        hooks = config.webhooks or []
        changed = False
        for hook in hooks:
            if hook.client_config is None:
                continue
            if hook.client_config.ca_bundle != bundle_b64:
                hook.client_config.ca_bundle = bundle_b64
                changed = True
        if not changed:
            return Injected(kind, name, len(hooks), changed=False)
        try:
            # A replace carries the resourceVersion read above: a concurrent writer makes it
            # fail with 409 and we read again rather than overwrite their change.
            replace(name, config, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status == HTTP_CONFLICT:
                continue
            raise _error(kind, name, "update", exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise _error(kind, name, "update", exc) from exc
        return Injected(kind, name, len(hooks), changed=True)
    raise InjectError(f"{kind} {name}: kept conflicting with other writers; try again")


def inject_ca_bundle(
    api: k8s_client.ApiClient, name: str, bundle_pem: bytes, *, timeout: float = DEFAULT_TIMEOUT
) -> list[Injected]:
    """Set ``caBundle`` on every webhook of the Mutating and Validating configurations ``name``.

    Each API call gives up after ``timeout`` seconds. Raises InjectError (one line) when neither
    configuration exists, or when the API server refuses or cannot be reached.
    """
    bundle_b64 = base64.b64encode(bundle_pem).decode()
    admission = k8s_client.AdmissionregistrationV1Api(api)
    done = []
    for kind, read, replace in (
        (
            "MutatingWebhookConfiguration",
            admission.read_mutating_webhook_configuration,
            admission.replace_mutating_webhook_configuration,
        ),
        (
            "ValidatingWebhookConfiguration",
            admission.read_validating_webhook_configuration,
            admission.replace_validating_webhook_configuration,
        ),
    ):
        result = _patch_one(read, replace, kind, name, bundle_b64, timeout)
        if result is not None:
            done.append(result)
    if not done:
        raise InjectError(
            f"no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named {name!r}"
        )
    return done
