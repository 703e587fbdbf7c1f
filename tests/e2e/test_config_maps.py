"""ConfigMaps judged through a real API server: a key that a pod's envFrom would make into
NVIDIA_VISIBLE_DEVICES or CUDA_MPS_* is refused when the ConfigMap is created or changed, since
pods read it again at every container start (issue 19, item 6).

The chart's ValidatingWebhookConfiguration carries a second webhook for ConfigMaps that hold
such keys (webhook.configMaps), which is what these tests go through.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.webhookstack import WebhookStack, create_namespace

from .webhook import api_error


@pytest.fixture(scope="module")
def config_maps_judged(gpuwarden: WebhookStack) -> WebhookStack:
    """The chart's own ConfigMap webhook (webhook.configMaps, on by default) is installed."""
    (validating,) = [c for c in gpuwarden.configs if c["kind"] == "ValidatingWebhookConfiguration"]
    assert "validate-configmaps.gpuwarden.io" in [h["name"] for h in validating["webhooks"]]
    return gpuwarden


@pytest.fixture(scope="module")
def kubeflow_ns(gpuwarden: WebhookStack) -> str:
    return gpuwarden.tenant_namespace("e2e-cm")


def create_config_map(stack: WebhookStack, namespace: str, data: dict[str, str]) -> Any:
    body = k8s_client.V1ConfigMap(
        metadata=k8s_client.V1ObjectMeta(name=f"env-{uuid.uuid4().hex[:8]}"), data=data
    )
    return k8s_client.CoreV1Api(stack.api).create_namespaced_config_map(namespace, body)


def refused(call: Any) -> str:
    with pytest.raises(ApiException) as caught:
        call()
    status, message = api_error(caught.value)
    assert status == 403
    assert 'admission webhook "validate-configmaps.gpuwarden.io" denied the request' in message
    return message


def test_a_key_that_sets_a_denied_variable_is_refused(
    config_maps_judged: WebhookStack, kubeflow_ns: str
) -> None:
    stack = config_maps_judged
    message = refused(
        lambda: create_config_map(stack, kubeflow_ns, {"NVIDIA_VISIBLE_DEVICES": "all"})
    )
    assert (
        "gpuwarden denied the ConfigMap: data[NVIDIA_VISIBLE_DEVICES]: a pod's envFrom would set "
        "NVIDIA_VISIBLE_DEVICES, which can escape GPU isolation; rename or remove the key"
    ) in message


def test_a_key_added_after_admission_is_refused(
    config_maps_judged: WebhookStack, kubeflow_ns: str
) -> None:
    stack = config_maps_judged
    core = k8s_client.CoreV1Api(stack.api)
    made = create_config_map(stack, kubeflow_ns, {"LOG_LEVEL": "info", "CUDA_HOME": "/cuda"})
    name = made.metadata.name
    message = refused(
        lambda: core.patch_namespaced_config_map(
            name, kubeflow_ns, {"data": {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mine"}}
        )
    )
    assert "data[CUDA_MPS_PIPE_DIRECTORY]: a pod's envFrom would set CUDA_MPS_PIPE_DIRECTORY" in (
        message
    )
    stored = core.read_namespaced_config_map(name, kubeflow_ns)
    assert stored.data == {"LOG_LEVEL": "info", "CUDA_HOME": "/cuda"}
    core.patch_namespaced_config_map(name, kubeflow_ns, {"data": {"LOG_LEVEL": "debug"}})


def test_namespaces_gpuwarden_does_not_govern_are_left_alone(
    config_maps_judged: WebhookStack,
) -> None:
    namespace, _ = create_namespace(config_maps_judged.api, "e2e-plain", {})
    create_config_map(config_maps_judged, namespace, {"NVIDIA_VISIBLE_DEVICES": "all"})
