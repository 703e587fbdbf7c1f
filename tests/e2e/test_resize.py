"""In-place resize through the real API server: the chart registers pods/resize with the validating
webhook, so a profile's host memory cannot be raised after admission (issue 19, item 8)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.webhookstack import WebhookStack, create_pod

from .webhook import api_error, example_pod, place_pod, read_pod


@pytest.fixture(scope="module")
def kubeflow_ns(gpuwarden: WebhookStack) -> str:
    return gpuwarden.tenant_namespace("e2e-resize")


def governed(pod: dict[str, Any]) -> dict[str, Any]:
    """The container gpuwarden gave the profile (its gpuwarden.io/containers annotation)."""
    name = pod["metadata"]["annotations"]["gpuwarden.io/containers"]
    found: dict[str, Any] = next(c for c in pod["spec"]["containers"] if c["name"] == name)
    return found


def resize(stack: WebhookStack, pod: dict[str, Any], resources: dict[str, Any]) -> Any:
    """PATCH the pod's pods/resize subresource, as `kubectl patch --subresource resize` does."""
    body = {"spec": {"containers": [{"name": governed(pod)["name"], "resources": resources}]}}
    return k8s_client.CoreV1Api(stack.api).patch_namespaced_pod_resize(
        pod["metadata"]["name"], pod["metadata"]["namespace"], body
    )


def test_a_resize_of_the_profiles_host_memory_is_refused(
    gpuwarden: WebhookStack, kubeflow_ns: str
) -> None:
    created = create_pod(gpuwarden.api, place_pod(example_pod("kfp-train-step"), kubeflow_ns))
    stored = read_pod(gpuwarden.api, kubeflow_ns, created.pod["metadata"]["name"])
    resources = governed(stored)["resources"]
    memory = resources["limits"]["memory"]
    assert resources["requests"]["memory"] == memory  # the profile's hostMemory

    with pytest.raises(ApiException) as refused:
        resize(gpuwarden, stored, {"limits": {"memory": "200Gi"}, "requests": {"memory": "200Gi"}})
    status, message = api_error(refused.value)
    assert status == 403
    assert 'admission webhook "validate.gpuwarden.io" denied the request' in message
    assert (
        f"resources.limits[memory]: profile kfp-training (rule/kfp-training) sets it to {memory}, "
        "and a resize may not change what gpuwarden set" in message
    )
    after = read_pod(gpuwarden.api, kubeflow_ns, stored["metadata"]["name"])
    assert governed(after)["resources"]["limits"]["memory"] == memory
