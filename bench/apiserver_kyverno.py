"""Kyverno's admission controller, run out of cluster against the same API server with its CRDs
and ConfigMaps from its module's config/ and the ClusterPolicies of bench/kyverno/
(hack/build-kyverno.sh builds it)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.apiserver_pods import ROOT, Obj, namespace_manifests
from bench.apiserver_webhooks import dry_run_pod, governed, wait_for
from gpuwarden.lab.cluster.controlplane import ControlPlane, cache_dir, free_ports

KYVERNO_POLICIES = ROOT / "bench" / "kyverno"

KYVERNO_NAMESPACE = "kyverno"

KYVERNO_CA_SECRET = "kyverno-svc.kyverno.svc.kyverno-tls-ca"

KYVERNO_TLS_SECRET = "kyverno-svc.kyverno.svc.kyverno-tls-pair"

KYVERNO_INSTALL_MANIFEST = Path("config") / "install-latest-testing.yaml"


@dataclass(frozen=True)
class KyvernoTools:
    admission: Path
    cli: Path
    module: Path

    @classmethod
    def load(cls, cache: Path | None = None) -> KyvernoTools:
        env_file = (cache or cache_dir()) / "kyverno.env"
        if not env_file.is_file():
            raise FileNotFoundError(f"{env_file} does not exist; run hack/build-kyverno.sh")
        values = dict(
            line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line
        )
        tools = cls(
            admission=Path(values.get("KYVERNO", "")),
            cli=Path(values.get("KYVERNO_CLI", "")),
            module=Path(values.get("KYVERNO_MODULE", "")),
        )
        for path in (tools.admission, tools.cli):
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise FileNotFoundError(f"{path} (from {env_file}) is not an executable file")
        if not (tools.module / "config" / "crds").is_dir():
            raise FileNotFoundError(
                f"{tools.module}/config/crds missing; run hack/build-kyverno.sh"
            )
        return tools


def kyverno_configmaps(module: Path) -> list[Obj]:
    """The admission controller's ConfigMaps (kyverno, kyverno-metrics) of Kyverno's install."""
    text = (module / KYVERNO_INSTALL_MANIFEST).read_text()
    return [
        doc
        for doc in yaml.safe_load_all(text)
        if isinstance(doc, dict)
        and doc.get("kind") == "ConfigMap"
        and (doc.get("metadata") or {}).get("namespace") == KYVERNO_NAMESPACE
    ]


def kyverno_values_file(path: Path) -> Path:
    """The CLI's namespace labels (a namespaceSelector needs them offline), from namespaces.yaml."""
    values = {
        "apiVersion": "cli.kyverno.io/v1alpha1",
        "kind": "Values",
        "namespaceSelector": [
            {"name": m["metadata"]["name"], "labels": dict(m["metadata"].get("labels") or {})}
            for m in namespace_manifests()
        ],
    }
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def kyverno_argv(tools: KyvernoTools, kubeconfig: Path, port: int, metrics_port: int) -> list[str]:
    env = {
        # What the Deployment of Kyverno's install gives the container, with a pod name of our own.
        "KYVERNO_NAMESPACE": KYVERNO_NAMESPACE,
        "KYVERNO_POD_NAME": "kyverno-admission-controller-bench",
        "KYVERNO_SERVICEACCOUNT_NAME": "kyverno-admission-controller",
        "KYVERNO_ROLE_NAME": "kyverno:admission-controller",
        "KYVERNO_DEPLOYMENT": "kyverno-admission-controller",
        "KYVERNO_SVC": "kyverno-svc",
        "INIT_CONFIG": "kyverno",
        "METRICS_CONFIG": "kyverno-metrics",
    }
    return [
        "/usr/bin/env",
        *(f"{k}={v}" for k, v in env.items()),
        str(tools.admission),
        f"--kubeconfig={kubeconfig}",
        # Out of cluster: webhooks point at https://<serverIP><path>, the certificate names it.
        f"--serverIP=127.0.0.1:{port}",
        "--webhookServerHost=127.0.0.1",
        f"--webhookServerPort={port}",
        f"--caSecretName={KYVERNO_CA_SECRET}",
        f"--tlsSecretName={KYVERNO_TLS_SECRET}",
        "--metricsHost=127.0.0.1",
        f"--metricsPort={metrics_port}",
        "--controllerRuntimeMetricsAddress=0",
        # As Kyverno's install runs it (config/install-latest-testing.yaml).
        "--loggingFormat=text",
        "--v=2",
        "--omitEvents=PolicyApplied,PolicySkipped",
        "--enablePolicyException=false",
    ]


def _kyverno_webhooks_ready(plane: ControlPlane) -> bool:
    names = plane.kubectl(
        "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations", "-o", "name"
    ).stdout
    return "kyverno-resource-mutating-webhook-cfg" in names and (
        "kyverno-resource-validating-webhook-cfg" in names
    )


@contextlib.contextmanager
def kyverno_webhooks(
    plane: ControlPlane, tools: KyvernoTools, probe_pod: Obj
) -> Iterator[list[int]]:
    """Kyverno's admission controller out of cluster, with bench/kyverno's ClusterPolicies."""
    crds = tools.module / "config" / "crds"
    plane.kubectl("apply", "--server-side", "-R", "-f", str(crds), timeout=120)
    plane.kubectl(
        "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s", timeout=90
    )
    plane.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kyverno"}}
        ),
    )
    for configmap in kyverno_configmaps(tools.module):
        plane.kubectl("apply", "-f", "-", input=json.dumps(configmap))
    port, metrics_port = free_ports(2)
    process = plane.spawn("kyverno", kyverno_argv(tools, plane.kubeconfig_path, port, metrics_port))
    try:
        plane.kubectl("apply", "-f", str(KYVERNO_POLICIES / "mutate.yaml"))
        plane.kubectl("apply", "-f", str(KYVERNO_POLICIES / "validate.yaml"))

        def ready() -> bool:
            if process.popen.poll() is not None:
                raise SystemExit(f"kyverno exited ({process.popen.returncode}):\n{process.tail()}")
            return _kyverno_webhooks_ready(plane) and governed(dry_run_pod(plane, probe_pod))

        try:
            wait_for("Kyverno's webhooks to mutate a pod", ready, timeout=240.0, poll=0.5)
        except RuntimeError as exc:
            raise SystemExit(f"{exc}\nkyverno log {process.log_path}:\n{process.tail()}") from None
        yield [process.popen.pid]
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            plane.kubectl(
                "delete", "clusterpolicies.kyverno.io", "--all", "--wait=false", check=False
            )
        process.terminate(15.0)
        # Kyverno leaves its webhook configurations behind; nothing may call a server that is gone.
        plane.kubectl(
            "delete",
            "mutatingwebhookconfigurations,validatingwebhookconfigurations",
            "-l",
            "webhook.kyverno.io/managed-by",
            "--ignore-not-found",
            check=False,
        )
