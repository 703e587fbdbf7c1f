"""Install, upgrade (with a changed CRD) and uninstall with the real helm binary against a real
kube-apiserver, as docs/install.md says, while a tenant keeps creating pods (issue 32, item 3).

No kubelet or kube-proxy runs here, so the chart's Service has no reachable endpoint. A Helm v4
post-renderer plugin points the webhooks the chart installs at `gpuwarden serve` running on
loopback (clientConfig.service becomes clientConfig.url, nothing else changes), so the API
server calls a live webhook with failurePolicy Fail from install to uninstall. Every pod the
tenant creates meanwhile must be created; after the uninstall exactly what the docs name is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.gpuwardenserver import (
    POLICIES_DIR,
    GpuwardenServer,
    running_server,
    wait_for,
)
from gpuwarden.lab.cluster.webhookstack import (
    KUBEFLOW_PROFILE_LABELS,
    RELEASE_NAME,
    RELEASE_NAMESPACE,
    chart_policies,
    chart_serve_args,
    chart_values_for,
    create_namespace,
    create_pod,
    gpu_probe_pod,
    pod_annotations,
    render_chart,
    wait_until_governed,
)
from gpuwarden.policy.spec.schema import CRD_NAME

from .support import CHART, REPO

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

from e2e.controlplane import ControlPlane, Tools, ToolsMissingError, build_tools  # noqa: E402

PLUGIN = "gpuwarden-loopback"
REWRITE = """\
import sys, yaml
sys.path[:0] = {path!r}
from gpuwarden.lab.cluster.webhookstack import chart_webhook_configurations
base_url, ca = sys.argv[1], open(sys.argv[2]).read().strip()
out = []
for doc in yaml.safe_load_all(sys.stdin):
    if isinstance(doc, dict) and doc.get("kind", "").endswith("WebhookConfiguration"):
        (doc,) = chart_webhook_configurations([doc], base_url=base_url, ca_bundle_b64=ca)
    if doc:
        out.append(doc)
yaml.safe_dump_all(out, sys.stdout, sort_keys=False)
"""


@dataclass
class Tenant:
    """Creates one CPU pod and one GPU pod per step until stopped, noting each failure."""

    api: k8s_client.ApiClient
    namespace: str
    phase: str = "before install"
    steps: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            phase = self.phase
            for pod in (_cpu_pod(self.namespace), gpu_probe_pod(self.namespace)):
                try:
                    create_pod(self.api, pod)
                except ApiException as exc:
                    self.failures.append(f"{phase}: {pod['metadata']['name']}: {exc.body}")
            self.steps[phase] = self.steps.get(phase, 0) + 1

    def enter(self, phase: str) -> None:
        """Move to ``phase`` once the previous one has had a few steps."""
        previous = self.phase
        wait_for(f"pods created during {previous}", lambda: self.steps.get(previous, 0) >= 3, 60)
        self.phase = phase


def _cpu_pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"step-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/python:3.12"}]},
    }


def _privileged_gpu_pod(namespace: str) -> dict[str, Any]:
    """A pod the validating webhook denies whatever the mutating one does."""
    pod = gpu_probe_pod(namespace)
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return pod


def _admitted(api: k8s_client.ApiClient, pod: dict[str, Any]) -> bool:
    try:
        create_pod(api, pod, dry_run=True)
    except ApiException as exc:
        assert exc.status == 403, exc.body
        return False
    return True


@pytest.fixture(scope="module")
def tools() -> Tools:
    try:
        return Tools.load()
    except ToolsMissingError:
        return build_tools()


@pytest.fixture(scope="module")
def plane(tools: Tools) -> Iterator[ControlPlane]:
    with ControlPlane(tools) as control_plane:
        control_plane.kubectl("create", "namespace", RELEASE_NAMESPACE)
        yield control_plane


def _plugin(directory: Path, ca_file: Path) -> dict[str, str]:
    """A Helm v4 postrenderer/v1 plugin (pkg/postrenderer/postrenderer.go) in ``directory``;
    the environment that makes helm find it."""
    plugin = directory / PLUGIN
    plugin.mkdir(parents=True)
    script = plugin / "rewrite.py"
    script.write_text(REWRITE.format(path=[str(REPO)]))
    runner = plugin / "run.sh"
    runner.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    runner.chmod(0o755)
    meta = {
        "apiVersion": "v1",
        "name": PLUGIN,
        "type": "postrenderer/v1",
        "version": "0.1.0",
        "runtime": "subprocess",
        "runtimeConfig": {"platformCommand": [{"command": "${HELM_PLUGIN_DIR}/run.sh"}]},
    }
    (plugin / "plugin.yaml").write_text(yaml.safe_dump(meta))
    return {**os.environ, "HELM_PLUGINS": str(directory)}


def _changed_chart(workdir: Path) -> Path:
    """The chart with an optional field added to the CRD's spec, as a new version would ship."""
    chart = workdir / "chart-next"
    subprocess.run(["cp", "-r", str(CHART), str(chart)], check=True)
    path = chart / "crds" / f"{CRD_NAME}.yaml"
    crd = yaml.safe_load(path.read_text())
    for version in crd["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec["properties"]["e2eNextField"] = {
            "type": "string",
            "description": "An optional field a later chart adds",
        }
    path.write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def _left(plane: ControlPlane) -> set[str]:
    """Every object of the release, or that gpuwarden made, still in the cluster."""
    kinds = plane.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    wanted = [k for k in kinds if not k.startswith(("events", "componentstatuses"))]
    found: set[str] = set()
    for selector in (
        f"app.kubernetes.io/instance={RELEASE_NAME}",
        "app.kubernetes.io/managed-by=gpuwarden",
    ):
        out = plane.kubectl("get", ",".join(wanted), "-A", "-l", selector, "-o", "json").stdout
        for item in json.loads(out)["items"]:
            found.add(f"{item['kind']} {item['metadata']['name']}")
    crds = json.loads(plane.kubectl("get", "crd", "-o", "json").stdout)["items"]
    found |= {f"CustomResourceDefinition {c['metadata']['name']}" for c in crds}
    if any(c["metadata"]["name"] == CRD_NAME for c in crds):
        out = plane.kubectl("get", "gpupolicies", "-o", "json").stdout
        found |= {f"GPUPolicy {i['metadata']['name']}" for i in json.loads(out)["items"]}
    return found


def test_install_upgrade_uninstall_never_fail_a_tenant_pod(
    plane: ControlPlane, tools: Tools, tmp_path: Path
) -> None:
    # Self-managed TLS: cert-manager's CRDs are not here (the caBundle comes from the plugin).
    values = {**chart_values_for([POLICIES_DIR]), "tls": {"mode": "self-managed"}}
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    chart = render_chart(tools.helm, values=values, workdir=tmp_path)
    served = chart_policies(chart, tmp_path / "policies")
    server = GpuwardenServer(
        tmp_path / "server",
        kubeconfig=plane.kubeconfig_path,
        policies=(served,),
        extra_args=chart_serve_args(chart),
    )
    api = plane.api_client()
    namespace, _ = create_namespace(api, "e2e-life", KUBEFLOW_PROFILE_LABELS)

    def helm(*args: str) -> None:
        argv = [str(tools.helm), *args, "--kubeconfig", str(plane.kubeconfig_path)]
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stderr}"

    instance = f"app.kubernetes.io/instance={RELEASE_NAME}"
    with running_server(server):
        ca_file = tmp_path / "ca.b64"
        ca_file.write_text(server.ca_bundle_b64())
        env = _plugin(tmp_path / "plugins", ca_file)
        common = ["--namespace", RELEASE_NAMESPACE, "--post-renderer", PLUGIN]
        common += ["--post-renderer-args", server.base_url, "--post-renderer-args", str(ca_file)]
        tenant = Tenant(api, namespace)
        loop = threading.Thread(target=tenant.run, daemon=True)
        loop.start()
        try:
            tenant.enter("install")
            helm("install", RELEASE_NAME, str(CHART), "-f", str(values_file), *common)
            wait_until_governed(api, namespace, "kubeflow-profiles", timeout=30)
            plane.kubectl(
                "apply",
                "-f",
                "-",
                input=json.dumps(
                    {
                        "apiVersion": "gpuwarden.io/v1alpha1",
                        "kind": "GPUPolicy",
                        "metadata": {"name": "e2e-left-behind"},
                        "spec": {},
                    }
                ),
            )
            tenant.enter("upgrade")
            # docs/install.md, Upgrading: the new CRD first (Helm never upgrades crds/), then the chart.
            nxt = _changed_chart(tmp_path)
            plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(nxt / "crds"))
            helm(
                "upgrade",
                RELEASE_NAME,
                str(nxt),
                "-f",
                str(values_file),
                "--set",
                "webhook.logLevel=debug",
                *common,
            )
            crd = json.loads(plane.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
            props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
                "properties"
            ]
            assert "e2eNextField" in props
            governed = pod_annotations(create_pod(api, gpu_probe_pod(namespace), dry_run=True).pod)
            assert governed.get("gpuwarden.io/tenant") == "kubeflow-profiles"
            tenant.enter("uninstall")
            # docs/install.md, Uninstalling: the validating webhook first (a pod the mutating
            # webhook no longer fixes would be denied by it), then the mutating one, then, once
            # the API server calls neither, the release. The webhook stops before the release
            # goes, as its pods would, to show that nothing needs it any more.
            assert not _admitted(api, _privileged_gpu_pod(namespace))
            plane.kubectl("delete", "validatingwebhookconfiguration", "-l", instance)
            wait_for(
                "the API server to stop calling the validating webhook",
                lambda: _admitted(api, _privileged_gpu_pod(namespace)),
            )
            plane.kubectl("delete", "mutatingwebhookconfiguration", "-l", instance)
            wait_for(
                f"GPU pods in {namespace} to be created without gpuwarden",
                lambda: (
                    "gpuwarden.io/tenant"
                    not in pod_annotations(
                        create_pod(api, gpu_probe_pod(namespace), dry_run=True).pod
                    )
                ),
            )
            tenant.enter("webhook gone")
            server.stop()
            helm("uninstall", RELEASE_NAME, "--namespace", RELEASE_NAMESPACE, "--wait")
            tenant.enter("after uninstall")
            tenant.enter("done")
        finally:
            tenant.stop.set()
            loop.join(30)
    assert tenant.failures == []
    phases = ("install", "upgrade", "uninstall", "webhook gone", "after uninstall")
    assert all(tenant.steps.get(p, 0) >= 3 for p in phases), tenant.steps
    ungoverned = pod_annotations(create_pod(api, gpu_probe_pod(namespace), dry_run=True).pod)
    assert "gpuwarden.io/tenant" not in ungoverned
    assert _left(plane) == {f"CustomResourceDefinition {CRD_NAME}", "GPUPolicy e2e-left-behind"}
    api.close()  # type: ignore[no-untyped-call]
