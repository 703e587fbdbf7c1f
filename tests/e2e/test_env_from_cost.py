"""Issue 29 item 2 through the real API server: the attack's pod, a GPU pod naming a 1 MiB
ConfigMap of 60,000 keys in 1,500 envFrom entries, is decided within the webhook's timeout
(before, gpuwarden sorted and matched every key for every entry, 28 s on the event loop, and the
API server refused the pod once the webhook timed out). The ConfigMap itself, past the keys the
conditions look into, reaches gpuwarden and is admitted."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s_client

from gpuwarden.lab.cluster.gpuwardenserver import wait_for
from gpuwarden.lab.cluster.webhookstack import (
    WebhookStack,
    create_pod,
    gpu_probe_pod,
    pod_annotations,
)

KEYS = 60_000
ENTRIES = 1_500


@pytest.fixture(scope="module")
def namespace(gpuwarden: WebhookStack) -> str:
    return gpuwarden.tenant_namespace("e2e-envfrom")


def with_env_from(namespace: str, name: str, entries: int) -> dict[str, Any]:
    pod = gpu_probe_pod(namespace)
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": name}}] * entries
    return pod


def test_the_worst_env_from_pod_is_decided_in_time(gpuwarden: WebhookStack, namespace: str) -> None:
    core: Any = k8s_client.CoreV1Api(gpuwarden.api)
    data = {f"KEY_{i:06d}": "1" for i in range(KEYS)}
    body = {"metadata": {"name": "big", "namespace": namespace}, "data": data}
    core.create_namespaced_config_map(namespace, body, _preload_content=False)
    # Until gpuwarden's ConfigMap cache has it (an unknown ConfigMap is denied).
    wait_for(
        "gpuwarden to know ConfigMap big",
        lambda: create_pod(gpuwarden.api, with_env_from(namespace, "big", 1), dry_run=True) or None,
        timeout=60.0,
    )
    created = create_pod(gpuwarden.api, with_env_from(namespace, "big", ENTRIES), dry_run=True)
    annotations = pod_annotations(created.pod)
    assert annotations.get("gpuwarden.io/tenant"), annotations
    assert len(created.pod["spec"]["containers"][0]["envFrom"]) == ENTRIES
