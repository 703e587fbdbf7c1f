"""The dra backend through the real kube-apiserver 1.37.2 and the chart's webhooks: the rendered
ResourceClaimTemplates are accepted as they are (resource.k8s.io/v1, applied as the tenant
controller applies them), a shared pod is stored with gpuwarden's claim and no nvidia.com/gpu,
and a pod that brings gpuwarden's claim name itself is refused.

The API server runs with its default feature gates, as every e2e suite does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.tenants import server_side_apply
from gpuwarden.lab.cluster.webhookstack import (
    KUBEFLOW_PROFILE_LABELS,
    WebhookStack,
    create_pod,
    gpu_probe_pod,
)
from gpuwarden.policy.render.claims import claim_templates

from .webhook import api_error, pod_exists, read_pod

TENANT_LABELS = {**KUBEFLOW_PROFILE_LABELS, "e2e.gpuwarden.io/tenant": "dra"}
POLICY = """
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: dra}
spec:
  backend: {type: dra, deviceClassName: gpuwarden-lab-gpu, coresCapacity: cores}
  profiles:
    - {name: notebook, maxMemory: 16Gi, threadPercentage: 25}
    - {name: small, maxMemory: 4Gi}
    - {name: train, gpuShare: false, gpus: 2}
  defaultProfile: train
  tenants:
    - name: dra
      namespaceSelector: {matchLabels: {e2e.gpuwarden.io/tenant: dra}}
"""


@pytest.fixture(scope="module")
def gpuwarden_policies(tmp_path_factory: pytest.TempPathFactory) -> Sequence[Path]:
    path = tmp_path_factory.mktemp("dra") / "dra.yaml"
    path.write_text(POLICY)
    return (path,)


@pytest.fixture(scope="module")
def dra_namespace(gpuwarden: WebhookStack) -> str:
    namespace = gpuwarden.tenant_namespace("e2e-dra", TENANT_LABELS)
    for template in claim_templates(gpuwarden.policies, namespace, TENANT_LABELS):
        server_side_apply(gpuwarden.api, template)
    return namespace


def _pod(namespace: str, profile: str) -> dict[str, Any]:
    pod = gpu_probe_pod(namespace)
    pod["metadata"]["labels"] = {"gpuwarden.io/profile": profile}
    return pod


def test_the_api_server_keeps_the_rendered_template_as_it_is(
    gpuwarden: WebhookStack, dra_namespace: str
) -> None:
    wanted = claim_templates(gpuwarden.policies, dra_namespace, TENANT_LABELS)
    assert [t["metadata"]["name"] for t in wanted] == ["gpuwarden-notebook", "gpuwarden-small"]
    for template in wanted:
        name = template["metadata"]["name"]
        stored: Any = k8s_client.CustomObjectsApi(gpuwarden.api).get_namespaced_custom_object(
            "resource.k8s.io", "v1", dra_namespace, "resourceclaimtemplates", name
        )
        # Nothing pruned or changed (the server adds only the claims' empty metadata).
        assert stored["spec"] == {**template["spec"], "metadata": {}}
        assert stored["metadata"]["labels"] == template["metadata"]["labels"]


def test_a_shared_pod_is_stored_with_the_claim_and_no_gpu_resource(
    gpuwarden: WebhookStack, dra_namespace: str
) -> None:
    pod = _pod(dra_namespace, "notebook")
    created = create_pod(gpuwarden.api, pod)
    stored = read_pod(gpuwarden.api, dra_namespace, pod["metadata"]["name"])
    assert stored["spec"]["resourceClaims"] == [
        {"name": "gpuwarden-gpu", "resourceClaimTemplateName": "gpuwarden-notebook"}
    ]
    main = next(c for c in stored["spec"]["containers"] if c["name"] == "main")
    assert main["resources"]["claims"] == [{"name": "gpuwarden-gpu"}]
    assert "nvidia.com/gpu" not in json.dumps(main["resources"])
    assert any(
        "main: nvidia.com/gpu 1 replaced by claim gpuwarden-gpu (template gpuwarden-notebook)"
        in warning
        for warning in created.warnings
    ), created.warnings


def test_a_whole_pod_keeps_nvidia_gpu_and_gets_no_claim(
    gpuwarden: WebhookStack, dra_namespace: str
) -> None:
    pod = _pod(dra_namespace, "train")
    create_pod(gpuwarden.api, pod)
    stored = read_pod(gpuwarden.api, dra_namespace, pod["metadata"]["name"])
    main = next(c for c in stored["spec"]["containers"] if c["name"] == "main")
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "resourceClaims" not in stored["spec"]


def test_a_pod_bringing_gpuwardens_claim_is_refused(
    gpuwarden: WebhookStack, dra_namespace: str
) -> None:
    pod = _pod(dra_namespace, "train")
    pod["spec"]["resourceClaims"] = [
        {"name": "gpuwarden-gpu", "resourceClaimTemplateName": "gpuwarden-notebook"}
    ]
    with pytest.raises(ApiException) as raised:
        create_pod(gpuwarden.api, pod)
    status, text = api_error(raised.value)
    assert status == 403, text
    assert (
        "spec.resourceClaims[gpuwarden-gpu]: template gpuwarden-notebook is gpuwarden's, for "
        "pods of a shared profile on the dra backend, and profile train (label) takes no claim"
    ) in text
    assert not pod_exists(gpuwarden.api, dra_namespace, pod["metadata"]["name"])
