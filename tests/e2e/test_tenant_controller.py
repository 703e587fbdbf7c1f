"""`gpuwarden tenant-controller` against a real kube-apiserver (issue 32, item 2).

A Kubeflow profile namespace appears after the chart was installed; its tenant selects it by
label, so `render` wrote nothing for it. The controller, run as the real command with the chart's
arguments and as a user bound to the chart's ClusterRole and nothing else, gives it the tenant's
ResourceQuota and Kueue LocalQueue, what render would have written had the tenant listed it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.gpuwardenserver import wait_for
from gpuwarden.lab.cluster.kueue import crd_manifests, module_dir
from gpuwarden.lab.cluster.webhookstack import RELEASE_NAME, render_chart
from gpuwarden.policy import load_paths
from gpuwarden.policy.render.claims import claim_templates
from gpuwarden.policy.render.objects import RenderOptions, render

from .controlplane import ControlPlane, Tools

USER = "e2e-tenant-controller"
LABEL = "e2e.gpuwarden.io/tenant-controller"
POLICY = f"""\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {{name: e2e-tenants}}
spec:
  backend: volcano
  profiles:
    - {{name: e2e-tc-shared, maxMemory: 16Gi, priority: 100}}
    - {{name: e2e-tc-dra, maxMemory: 8Gi, backend: {{type: dra, deviceClassName: gpu.example.com}}}}
  defaultProfile: e2e-tc-shared
  tenants:
    - name: e2e-tc-listed
      namespaces: [e2e-tc-listed]
      quota: {{gpus: 4}}
    - name: e2e-tc-profiles
      namespaceSelector: {{matchLabels: {{{LABEL}: "yes"}}}}
      quota: {{gpus: 2, hard: {{pods: "20"}}}}
      limits: {{gpuMemoryQuota: 32Gi}}
"""


@contextlib.contextmanager
def _as_chart_role(plane: ControlPlane, chart: list[dict[str, Any]], path: Path) -> Iterator[Path]:
    """A kubeconfig for USER, bound to (a copy of) the chart's tenant-controller ClusterRole."""
    (role,) = [
        doc
        for doc in chart
        if doc["kind"] == "ClusterRole"
        and doc["metadata"]["name"] == f"{RELEASE_NAME}-tenant-controller"
    ]
    with plane.client_as(USER, role["rules"]):
        yield plane.write_kubeconfig_for(path, USER)


def _install_local_queue_crd(api: k8s_client.ApiClient) -> None:
    (crd,) = [
        c for c in crd_manifests(module_dir()) if c["metadata"]["name"].startswith("localqueues.")
    ]
    ext: Any = k8s_client.ApiextensionsV1Api(api)
    with contextlib.suppress(ApiException):  # 409: another suite installed Kueue's CRDs
        ext.create_custom_resource_definition(crd)

    def established() -> bool:
        conditions = ext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions
        return any(c.type == "Established" and c.status == "True" for c in conditions or [])

    wait_for("Kueue's LocalQueue CRD to be established", established)


@pytest.fixture(scope="module")
def policies_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tenant-controller-policies")
    (directory / "tenants.yaml").write_text(POLICY)
    return directory


@pytest.fixture(scope="module")
def controller(
    control_plane: ControlPlane,
    e2e_tools: Tools,
    policies_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[subprocess.Popen[str]]:
    """`gpuwarden tenant-controller` with the chart's arguments (kueue.enabled) and RBAC."""
    workdir = tmp_path_factory.mktemp("tenant-controller")
    api = control_plane.api_client()
    _install_local_queue_crd(api)
    api.close()  # type: ignore[no-untyped-call]
    chart = render_chart(e2e_tools.helm, values={"kueue": {"enabled": True}}, workdir=workdir)
    (deployment,) = [
        doc
        for doc in chart
        if doc["kind"] == "Deployment"
        and doc["metadata"]["name"] == f"{RELEASE_NAME}-tenant-controller"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [
        f"--policies={policies_dir}" if arg.startswith("--policies=") else arg
        for arg in container["args"]
    ]
    assert args[0] == "tenant-controller" and "--kueue" in args
    with _as_chart_role(control_plane, chart, workdir / "kubeconfig") as kubeconfig:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", *args, f"--kubeconfig={kubeconfig}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            yield process
        finally:
            process.terminate()
            output, _ = process.communicate(timeout=10)
            print(output)


def _create_namespace(api: k8s_client.ApiClient, name: str, labels: dict[str, str]) -> None:
    k8s_client.CoreV1Api(api).create_namespace(
        k8s_client.V1Namespace(metadata=k8s_client.V1ObjectMeta(name=name, labels=labels))
    )


def _quotas(api: k8s_client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    items = k8s_client.CoreV1Api(api).list_namespaced_resource_quota(namespace).items
    return [api.sanitize_for_serialization(item) for item in items]


def _local_queues(api: k8s_client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    found = k8s_client.CustomObjectsApi(api).list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", namespace, "localqueues"
    )
    return list(found["items"])


def test_a_new_profile_namespace_gets_its_quota_and_queue(
    controller: subprocess.Popen[str], api_client: k8s_client.ApiClient, tmp_path: Path
) -> None:
    namespace = f"e2e-tc-{uuid.uuid4().hex[:8]}"
    _create_namespace(api_client, namespace, {LABEL: "yes"})
    quota = wait_for(
        f"the tenant's ResourceQuota in {namespace}",
        lambda: next(iter(_quotas(api_client, namespace)), None),
        timeout=30,
    )
    queue = wait_for(
        f"the tenant's LocalQueue in {namespace}",
        lambda: next(iter(_local_queues(api_client, namespace)), None),
        timeout=30,
    )
    # What render writes had the tenant listed the namespace by name.
    listing = tmp_path / "listed.yaml"
    listing.write_text(
        POLICY.replace(
            f'namespaceSelector: {{matchLabels: {{{LABEL}: "yes"}}}}', f"namespaces: [{namespace}]"
        )
    )
    rendering = render(load_paths([listing]), RenderOptions(kueue=True))
    (expected_quota,) = [
        o for o in rendering.of_kind("ResourceQuota") if o["metadata"]["namespace"] == namespace
    ]
    (expected_queue,) = [
        o for o in rendering.of_kind("LocalQueue") if o["metadata"]["namespace"] == namespace
    ]
    for got, expected in ((quota, expected_quota), (queue, expected_queue)):
        assert got["metadata"]["name"] == expected["metadata"]["name"]
        assert got["metadata"]["labels"] == expected["metadata"]["labels"]
        assert got["metadata"]["annotations"] == expected["metadata"]["annotations"]
        # (the API server adds the CRD's defaults, as Kueue's stopPolicy: None)
        assert expected["spec"].items() <= got["spec"].items()
    assert quota["metadata"]["name"] == "gpuwarden-e2e-tc-profiles"
    assert quota["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "gpuwarden",
        "gpuwarden.io/tenant": "e2e-tc-profiles",
    }
    assert quota["spec"]["hard"]["pods"] == "20"
    managers = {entry["manager"] for entry in quota["metadata"]["managedFields"]}
    assert "gpuwarden" in managers
    assert queue["metadata"]["name"] == "default"
    assert queue["spec"]["clusterQueue"] == "e2e-tc-profiles"


def _claim_templates(api: k8s_client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    found = k8s_client.CustomObjectsApi(api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", namespace, "resourceclaimtemplates"
    )
    return list(found["items"])


def test_a_new_profile_namespace_gets_the_dra_backends_claim_templates(
    controller: subprocess.Popen[str], api_client: k8s_client.ApiClient, policies_dir: Path
) -> None:
    """Applied under the chart's ClusterRole, as claim_templates renders them."""
    namespace = f"e2e-tc-{uuid.uuid4().hex[:8]}"
    _create_namespace(api_client, namespace, {LABEL: "yes"})
    got = wait_for(
        f"the dra profile's ResourceClaimTemplate in {namespace}",
        lambda: next(iter(_claim_templates(api_client, namespace)), None),
        timeout=30,
    )
    (expected,) = claim_templates(load_paths([policies_dir]), namespace, {LABEL: "yes"})
    assert got["metadata"]["name"] == expected["metadata"]["name"] == "gpuwarden-e2e-tc-dra"
    assert got["metadata"]["labels"] == expected["metadata"]["labels"]
    assert got["spec"]["spec"] == expected["spec"]["spec"]


def test_listed_and_unselected_namespaces_are_left_to_render(
    controller: subprocess.Popen[str], api_client: k8s_client.ApiClient
) -> None:
    """A namespace listed by name gets its objects from the chart (renderedObjects), one no
    tenant selects gets none; a labelled one created afterwards shows the controller ran."""
    unselected = f"e2e-tc-none-{uuid.uuid4().hex[:6]}"
    _create_namespace(api_client, unselected, {})
    with contextlib.suppress(ApiException):
        _create_namespace(api_client, "e2e-tc-listed", {LABEL: "yes"})
    marker = f"e2e-tc-{uuid.uuid4().hex[:8]}"
    _create_namespace(api_client, marker, {LABEL: "yes"})
    wait_for(f"the quota in {marker}", lambda: _quotas(api_client, marker), timeout=30)
    assert _quotas(api_client, unselected) == []
    assert _quotas(api_client, "e2e-tc-listed") == []
    assert controller.poll() is None
