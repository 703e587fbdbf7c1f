"""Fixtures on a real control plane, one per test session, shared by every suite (tests/conftest.py)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s_client

from gpuwarden.lab.cluster.gpuwardenserver import (
    POLICIES_DIR,
)
from gpuwarden.lab.cluster.webhookstack import (
    WebhookStack,
    plane_webhook_stack,
)

from .controlplane import ControlPlane, Tools, build_tools
from .webhook import AUDIT_POLICY, AuditLog


@pytest.fixture(scope="session")
def e2e_tools(pytestconfig: pytest.Config) -> Tools:
    """kube-apiserver, etcd, kubectl and helm, built by hack/build-tools.sh if missing.

    Never skips: a cold cache means a long (tens of minutes) build, shown live on the terminal.
    """
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    if capture is None:
        return build_tools()
    with capture.global_and_fixture_disabled():
        return build_tools(stdout=sys.stderr)


@pytest.fixture(scope="session")
def audit_log(tmp_path_factory: pytest.TempPathFactory) -> AuditLog:
    """The API server's audit log of pod creations (Metadata level, JSON lines).

    The admission webhooks' audit annotations in it are the API server's own account of which
    webhook it called, in which round, and whether that call mutated the pod or failed open.
    """
    directory = tmp_path_factory.mktemp("audit")
    (directory / "policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
    return AuditLog(directory / "audit.log")


@pytest.fixture(scope="session")
def control_plane(e2e_tools: Tools, audit_log: AuditLog) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver, started once per session and stopped at its end.

    Set GPUWARDEN_E2E_KEEP=1 to keep the work directory (logs, certificates, kubeconfig).
    """
    plane = ControlPlane(
        e2e_tools,
        keep_workdir=bool(os.environ.get("GPUWARDEN_E2E_KEEP")),
        extra_apiserver_args=(
            f"--audit-policy-file={audit_log.path.parent / 'policy.yaml'}",
            f"--audit-log-path={audit_log.path}",
        ),
    )
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def api_client(control_plane: ControlPlane) -> Iterator[k8s_client.ApiClient]:
    """An admin ApiClient for one test, closed afterwards."""
    api = control_plane.api_client()
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def namespace(api_client: k8s_client.ApiClient) -> str:
    """A fresh, uniquely named namespace.

    It is not deleted afterwards: with no namespace controller running, a deleted namespace
    would only sit in Terminating, and the unique name keeps tests apart anyway.
    """
    name = f"e2e-{uuid.uuid4().hex[:10]}"
    k8s_client.CoreV1Api(api_client).create_namespace(
        k8s_client.V1Namespace(metadata=k8s_client.V1ObjectMeta(name=name))
    )
    return name


@pytest.fixture(scope="module")
def gpuwarden_policies() -> Sequence[Path]:
    """The policy files the module's gpuwarden ships through the chart (override per module)."""
    return (POLICIES_DIR,)


@pytest.fixture(scope="module")
def gpuwarden(
    control_plane: ControlPlane,
    e2e_tools: Tools,
    tmp_path_factory: pytest.TempPathFactory,
    gpuwarden_policies: Sequence[Path],
) -> Iterator[WebhookStack]:
    """gpuwarden serve (one per test module) registered through the chart's webhooks.

    The PriorityClasses the policies imply are created first, as the chart does.
    """
    with plane_webhook_stack(
        control_plane,
        helm=e2e_tools.helm,
        workdir=tmp_path_factory.mktemp("gpuwarden"),
        policies=gpuwarden_policies,
    ) as stack:
        yield stack
