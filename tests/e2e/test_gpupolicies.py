"""GPUPolicy objects through the real API server: apply, fix, break, delete.

The chart's CRD is installed, and `gpuwarden serve` runs with the chart's arguments as a user
bound to the chart's webhook ClusterRole and nothing else: every status below was written with
the chart's RBAC. What an admin sees is what is checked: `kubectl get gpupolicies`, each
object's status (Ready, its reason and message, the generation observed), /readyz, and the pods
the webhook mutates.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.gpuwardenserver import (
    wait_for,
)
from gpuwarden.lab.cluster.webhookstack import (
    CHART_DIR,
    KUBEFLOW_PROFILE_LABELS,
    RELEASE_NAME,
    Obj,
    WebhookStack,
    create_pod,
    gpu_probe_pod,
    pod_annotations,
    render_chart,
    webhook_stack,
)
from gpuwarden.policy.pod import keys
from gpuwarden.policy.spec.schema import CRD_NAME, CRD_PLURAL, CRD_VERSION

from .controlplane import ControlPlane, Tools

USER = "e2e-gpupolicy-webhook"  # the webhook's identity: the chart's ClusterRole only
PROFILE = "e2e-gpol-shared"
FILES_TENANT = "e2e-gpol-files"
TEAM = "e2e-gpol-team"  # the object, and the tenant it defines
FILES_POLICY = f"""\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {{name: e2e-gpol-files}}
spec:
  backend: volcano
  profiles:
    - {{name: {PROFILE}, gpuShare: true, maxMemory: 16Gi, priority: 150}}
  defaultProfile: {PROFILE}
  tenants:
    - name: {FILES_TENANT}
      namespaceSelector: {{matchLabels: {{e2e.gpuwarden.io/gpupolicy: files}}}}
"""


def _custom(api: k8s_client.ApiClient) -> Any:
    return k8s_client.CustomObjectsApi(api)


def _kubeconfig_for(plane: ControlPlane, user: str, path: Path) -> Path:
    """A kubeconfig authenticating as ``user`` (a client certificate: CN is the user)."""
    return plane.write_kubeconfig_for(path, user)


@contextlib.contextmanager
def _bound_to_chart_role(api: k8s_client.ApiClient, chart: list[Obj], user: str) -> Iterator[None]:
    """``user`` bound to (a copy of) the chart's webhook ClusterRole, for the block."""
    role = next(
        doc
        for doc in chart
        if doc.get("kind") == "ClusterRole" and doc["metadata"]["name"] == f"{RELEASE_NAME}-webhook"
    )
    name = f"{user}-{uuid.uuid4().hex[:6]}"
    rbac: Any = k8s_client.RbacAuthorizationV1Api(api)
    group = "rbac.authorization.k8s.io"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": role["rules"]})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": group, "kind": "User", "name": user}],
        }
    )
    try:
        yield
    finally:
        with contextlib.suppress(ApiException):
            rbac.delete_cluster_role_binding(name)
        with contextlib.suppress(ApiException):
            rbac.delete_cluster_role(name)


@pytest.fixture(scope="module")
def gpupolicy_stack(
    control_plane: ControlPlane, e2e_tools: Tools, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookStack]:
    workdir = tmp_path_factory.mktemp("gpupolicies")
    control_plane.kubectl("apply", "-f", str(CHART_DIR / "crds" / f"{CRD_NAME}.yaml"))
    control_plane.wait_established(CRD_NAME)
    files = workdir / "files"
    files.mkdir()
    (files / "e2e-gpol-files.yaml").write_text(FILES_POLICY)
    api = control_plane.api_client()
    try:
        chart = render_chart(e2e_tools.helm, workdir=workdir)
        kubeconfig = _kubeconfig_for(control_plane, USER, workdir / "webhook.kubeconfig")
        with (
            _bound_to_chart_role(api, chart, USER),
            webhook_stack(
                api,
                kubeconfig=kubeconfig,
                helm=e2e_tools.helm,
                workdir=workdir,
                policies=(files,),
            ) as stack,
        ):
            yield stack
    finally:
        # The control plane is shared: no object of this module may reach another's webhook.
        with contextlib.suppress(ApiException):
            _custom(api).delete_cluster_custom_object(keys.API_GROUP, CRD_VERSION, CRD_PLURAL, TEAM)
        api.close()  # type: ignore[no-untyped-call]


# --- what an admin does and sees -------------------------------------------------------------


def kubectl_apply(plane: ControlPlane, spec: Mapping[str, Any]) -> None:
    """`kubectl apply` the GPUPolicy TEAM with ``spec``."""
    doc = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.POLICY_KIND,
        "metadata": {"name": TEAM},
        "spec": dict(spec),
    }
    plane.kubectl("apply", "-f", "-", input=json.dumps(doc))


def team_spec(namespace: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {"tenants": [{"name": TEAM, "namespaces": [namespace], "overrides": dict(overrides)}]}


def ready_at(api: k8s_client.ApiClient, generation: int) -> Obj:
    """TEAM's Ready condition, once its status is about ``generation``."""

    def probe() -> Obj | None:
        obj = _custom(api).get_cluster_custom_object(keys.API_GROUP, CRD_VERSION, CRD_PLURAL, TEAM)
        assert obj["metadata"]["generation"] == generation
        status = obj.get("status") or {}
        if status.get("observedGeneration") != generation:
            return None
        (condition,) = status["conditions"]
        assert condition["type"] == "Ready" and condition["observedGeneration"] == generation
        return dict(condition)

    return wait_for(f"gpupolicy/{TEAM} status for generation {generation}", probe)


def governed(api: k8s_client.ApiClient, namespace: str) -> tuple[str | None, str | None]:
    """The tenant and GPU-memory cap the webhook gives a GPU pod in ``namespace`` now."""
    annotations = pod_annotations(create_pod(api, gpu_probe_pod(namespace), dry_run=True).pod)
    return annotations.get("gpuwarden.io/tenant"), annotations.get("gpuwarden.io/gpu-memory-limit")


def becomes_governed(api: k8s_client.ApiClient, namespace: str, expected: tuple[str, str]) -> None:
    wait_for(
        f"GPU pods in {namespace} to get tenant and cap {expected}",
        lambda: governed(api, namespace) == expected,
    )


def listed(plane: ControlPlane) -> dict[str, str]:
    """TEAM's row of `kubectl get gpupolicies`, by column."""
    header, *rows = plane.kubectl("get", "gpupolicies").stdout.splitlines()
    columns = header.split()
    assert columns == ["NAME", "READY", "REASON", "BACKEND", "DEFAULT", "PROFILE", "AGE"]
    (row,) = [row.split() for row in rows if row.split()[0] == TEAM]
    return dict(zip(["NAME", "READY", "REASON"], row[:3], strict=True))


def readyz(stack: WebhookStack) -> tuple[int, str]:
    url = f"http://127.0.0.1:{stack.server.metrics_port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_apply_fix_break_delete(gpupolicy_stack: WebhookStack, control_plane: ControlPlane) -> None:
    stack = gpupolicy_stack
    api = stack.api
    namespace = stack.tenant_namespace(
        "e2e-gpol", {**KUBEFLOW_PROFILE_LABELS, "e2e.gpuwarden.io/gpupolicy": "files"}
    )
    assert governed(api, namespace) == (FILES_TENANT, "16Gi")

    # Applied, invalid: the API server stores it (its schema allows it), the webhook refuses it.
    kubectl_apply(control_plane, team_spec(namespace, {"e2e-gpol-nope": {"maxMemory": "4Gi"}}))
    condition = ready_at(api, 1)
    assert (condition["status"], condition["reason"]) == ("False", "Invalid")
    assert condition["message"] == (
        f"gpupolicy/{TEAM}: spec.tenants[0].overrides['e2e-gpol-nope']: "
        f"unknown profile 'e2e-gpol-nope' (known: {PROFILE}); did you mean {PROFILE}?"
    )
    assert listed(control_plane) == {"NAME": TEAM, "READY": "False", "REASON": "Invalid"}
    assert governed(api, namespace) == (FILES_TENANT, "16Gi")  # the status is written once served
    status, text = readyz(stack)
    assert status == 200 and f"gpupolicy/{TEAM} generation 1 is invalid (not served)" in text

    # Fixed: in force.
    kubectl_apply(control_plane, team_spec(namespace, {PROFILE: {"maxMemory": "4Gi"}}))
    condition = ready_at(api, 2)
    assert (condition["status"], condition["reason"]) == ("True", "Valid")
    assert listed(control_plane) == {"NAME": TEAM, "READY": "True", "REASON": "Valid"}
    assert governed(api, namespace) == (TEAM, "4Gi")

    # Broken again: Invalid with the field, and generation 2 stays in force.
    kubectl_apply(
        control_plane,
        team_spec(namespace, {PROFILE: {"gpuShare": False, "overcommitRatio": 1.5}}),
    )
    condition = ready_at(api, 3)
    assert (condition["status"], condition["reason"]) == ("False", "Invalid")
    assert condition["message"].startswith(
        f"gpupolicy/{TEAM}: spec.tenants[0].overrides['{PROFILE}'].overcommitRatio: "
        "must be 1.0 for an exclusive profile"
    )
    assert listed(control_plane)["READY"] == "False"
    assert governed(api, namespace) == (TEAM, "4Gi")
    status, text = readyz(stack)
    assert status == 200
    assert f"gpupolicy/{TEAM} generation 3 is invalid (generation 2 still serves)" in text

    # Deleted: the files alone again.
    control_plane.kubectl("delete", "gpupolicy", TEAM)
    becomes_governed(api, namespace, (FILES_TENANT, "16Gi"))
    assert "gpupolicy/" not in readyz(stack)[1]
