"""Pods created through the real API server come back mutated, denied or untouched."""

from __future__ import annotations

from .webhook import WebhookStack, create_pod, example_pod, place_pod


def test_smoke(gpuwarden: WebhookStack) -> None:
    ns = gpuwarden.tenant_namespace()
    created = create_pod(gpuwarden.api, place_pod(example_pod("notebook"), ns))
    print(created.pod["metadata"]["annotations"], created.warnings)
    print(gpuwarden.server.admissions(namespace=ns))
