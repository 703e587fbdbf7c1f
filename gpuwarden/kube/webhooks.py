"""Publish the CA bundle into gpuwarden's webhook configurations through the API server."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
_ATTEMPTS = 5


class InjectError(Exception):
    """The bundle could not be published; the message names the object."""


@dataclass(frozen=True)
class Injected:
    kind: str
    name: str
    webhooks: int
    changed: bool


def _patch_one(read: Any, replace: Any, kind: str, name: str, bundle_b64: str) -> Injected | None:
    for _ in range(_ATTEMPTS):
        try:
            config = read(name)
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            raise InjectError(f"{kind} {name}: cannot read: {exc.status} {exc.reason}") from exc
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
            replace(name, config)
        except ApiException as exc:
            if exc.status == HTTP_CONFLICT:
                continue
            raise InjectError(f"{kind} {name}: cannot update: {exc.status} {exc.reason}") from exc
        return Injected(kind, name, len(hooks), changed=True)
    raise InjectError(f"{kind} {name}: kept conflicting with other writers; try again")


def inject_ca_bundle(api: k8s_client.ApiClient, name: str, bundle_pem: bytes) -> list[Injected]:
    """Set ``caBundle`` on every webhook of the Mutating and Validating configurations ``name``.

    Raises InjectError when neither exists.
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
        result = _patch_one(read, replace, kind, name, bundle_b64)
        if result is not None:
            done.append(result)
    if not done:
        raise InjectError(
            f"no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named {name!r}"
        )
    return done
