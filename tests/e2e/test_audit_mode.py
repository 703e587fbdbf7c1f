"""Audit mode through the real API server (issue 32, item 1): with the chart's
webhook.enforcementAction=audit (serve --enforcement-action audit), a pod over its tenant's limit
is created, the client gets the denial as warnings, and the API server's audit log records the
validating webhook's would-deny annotations; a tenant that enforces is still denied."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpuwarden.cli import main
from gpuwarden.lab.cluster.webhookstack import (
    WebhookStack,
    create_pod,
    gpu_probe_pod,
    pod_annotations,
    webhook_stack,
)

from .controlplane import ControlPlane, Tools
from .test_jobs_notebooks import GROUP, PLURAL, notebook_crd, notebook_in
from .webhook import AuditLog, api_error, serve_crd

SUFFIX = uuid.uuid4().hex[:8]
AUDITED = f"e2e-audit-{SUFFIX}"
ENFORCED = f"e2e-enforced-{SUFFIX}"
POLICY = f"""\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {{name: e2e-audit}}
spec:
  backend: native
  profiles:
    - {{name: whole, gpuShare: false, maxMemory: 80Gi}}
  defaultProfile: whole
  tenants:
    - name: audited
      namespaces: [{AUDITED}]
      limits: {{maxGpusPerPod: 1}}
    - name: enforced
      namespaces: [{ENFORCED}]
      limits: {{maxGpusPerPod: 1}}
      enforcementAction: enforce
"""


@pytest.fixture(scope="module")
def auditing(
    control_plane: ControlPlane, e2e_tools: Tools, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookStack]:
    workdir = tmp_path_factory.mktemp("audit-mode")
    files = workdir / "files"
    files.mkdir()
    (files / "e2e-audit.yaml").write_text(POLICY)
    api = control_plane.api_client()
    try:
        with webhook_stack(
            api,
            kubeconfig=control_plane.kubeconfig_path,
            helm=e2e_tools.helm,
            workdir=workdir,
            policies=(files,),
            chart_values={"webhook": {"enforcementAction": "audit"}},
        ) as stack:
            assert "--enforcement-action=audit" in stack.server.argv()
            stack.tenant_namespace(name=AUDITED)
            stack.tenant_namespace(name=ENFORCED)
            yield stack
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _two_gpus(namespace: str) -> dict[str, Any]:
    pod = gpu_probe_pod(namespace)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    return pod


def test_a_pod_over_its_limit_is_created_with_the_warning(
    auditing: WebhookStack, audit_log: AuditLog
) -> None:
    pod = _two_gpus(AUDITED)
    created = create_pod(auditing.api, pod)
    assert created.status == 201
    said = " ".join(created.warnings)
    assert "gpuwarden (audit) would deny the pod:" in said
    assert "tenant audited allows at most 1 per pod" in said
    # Audit relaxes the denial only: the pod got its profile.
    assert pod_annotations(created.pod)["gpuwarden.io/tenant"] == "audited"
    event = audit_log.pod_creation(AUDITED, created.pod["metadata"]["name"])
    annotations = event.get("annotations") or {}
    assert annotations["validate.gpuwarden.io/would-deny"] == "tenant_limits"
    assert annotations["validate.gpuwarden.io/would-deny-reason"] == "TenantLimit"


def test_a_tenant_that_enforces_is_still_denied(auditing: WebhookStack) -> None:
    with pytest.raises(ApiException) as refused:
        create_pod(auditing.api, _two_gpus(ENFORCED))
    status, message = api_error(refused.value)
    assert status == 403
    assert "tenant enforced allows at most 1 per pod" in message


def test_gpuwarden_audit_reads_the_running_pods_from_the_cluster(
    auditing: WebhookStack,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`gpuwarden audit --cluster`: the pod audit mode let in is what enforcing would deny."""
    created = create_pod(auditing.api, _two_gpus(AUDITED))
    served = str(auditing.server.policies[0])
    kubeconfig = str(control_plane.kubeconfig_path)
    code = main(["audit", "-p", served, "--cluster", "--kubeconfig", kubeconfig, "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    pods = {p["name"]: p for p in report["pods"] if p["namespace"] == AUDITED}
    mine = pods[created.pod["metadata"]["name"]]
    assert mine["tenant"] == "audited"
    assert mine["verdict"] == "deny"
    assert mine["wouldDeny"]["check"] == "tenantLimits"
    # Admitted under audit with its profile, it would be changed no further.
    assert mine["wouldChange"] == []


def test_gpuwarden_audit_reads_the_notebooks_from_the_cluster(
    auditing: WebhookStack,
    control_plane: ControlPlane,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Notebook over its tenant's limit, let in under audit, is what enforcing would deny:
    `audit --cluster` lists Notebooks as it lists the Training Operator's jobs."""
    objects = serve_crd(auditing.api, notebook_crd())
    nb = notebook_in(AUDITED, gpus="2")
    name = nb["metadata"]["name"]
    objects.create_namespaced_custom_object(GROUP, "v1", AUDITED, PLURAL, nb)
    try:
        kubeconfig = str(control_plane.kubeconfig_path)
        served = str(auditing.server.policies[0])
        code = main(["audit", "-p", served, "--cluster", "--kubeconfig", kubeconfig, "-o", "json"])
        report = json.loads(capsys.readouterr().out)
    finally:
        objects.delete_namespaced_custom_object(GROUP, "v1", AUDITED, PLURAL, name)
    assert code == 1
    (mine,) = [j for j in report["jobs"] if j["namespace"] == AUDITED and j["name"] == name]
    assert mine["kind"] == "Notebook"
    assert mine["verdict"] == "deny"
    assert "Notebook: " in mine["wouldDeny"]["message"]
    assert "tenant audited allows at most 1 per pod" in mine["wouldDeny"]["message"]
