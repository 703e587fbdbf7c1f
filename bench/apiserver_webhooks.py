"""The webhooks the API server calls in the runs: bench/load.py's bare handler behind the chart's
webhook configurations (echo), and gpuwarden as the chart installs it (gpuwarden.lab.cluster.webhookstack,
as the e2e suites set it up); the cluster every run sees, and each run's check of its pods."""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from bench.apiserver_load import pids_with
from bench.apiserver_pods import DEFAULT_POLICIES, ROOT, Obj, namespace_manifests
from bench.apiserver_report import comparable
from gpuwarden.certs.loopback import loopback_directory
from gpuwarden.lab.cluster.controlplane import ControlPlane, free_ports
from gpuwarden.lab.cluster.webhookstack import (
    chart_values_for,
    chart_webhook_configurations,
    delete_webhook_configurations,
    ensure_priority_classes,
    install_webhook_configurations,
    plane_webhook_stack,
    render_chart,
    wait_until_governed,
    webhook_names,
)

#: The peers whose policies change the pods (none and the echo webhook change nothing).
MUTATING_PEERS = ("gpuwarden", "kyverno")

#: What each run's pods must show before it is measured: the annotation both policies set.
GOVERNED_ANNOTATION = "gpuwarden.io/profile"


def wait_for(what: str, probe: Callable[[], bool], timeout: float, poll: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            if probe():
                return
        except Exception as exc:  # a probe against a server that is still starting
            last = f" (last error: {type(exc).__name__}: {str(exc)[:300]})"
        if time.monotonic() >= deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}{last}")
        time.sleep(poll)


def dry_run_pod(plane: ControlPlane, pod: Mapping[str, Any]) -> Obj:
    api = plane.api_client()
    try:
        core: Any = k8s_client.CoreV1Api(api)
        response = core.create_namespaced_pod(
            pod["metadata"]["namespace"], dict(pod), dry_run="All", _preload_content=False
        )
        created: Obj = json.loads(response.data)
        return created
    finally:
        api.close()  # type: ignore[no-untyped-call]


def governed(created: Mapping[str, Any]) -> bool:
    return GOVERNED_ANNOTATION in ((created.get("metadata") or {}).get("annotations") or {})


def check_run(plane: ControlPlane, peer: str, pods: Sequence[Obj]) -> dict[str, Obj]:
    """Each example once; the pods come back governed exactly when a webhook is in the path."""
    out: dict[str, Obj] = {}
    for pod in pods:
        created = dry_run_pod(plane, pod)
        out[str(pod["metadata"]["name"])] = comparable(created)
    count = sum(1 for c in out.values() if GOVERNED_ANNOTATION in c["annotations"])
    if peer not in MUTATING_PEERS and count:
        raise RuntimeError(f"{count} pods came back governed through {peer}, which decides nothing")
    if peer in MUTATING_PEERS and count == 0:
        raise RuntimeError(f"no pod came back governed through {peer}")
    print(f"  {peer}: {count} of {len(pods)} example pods governed", flush=True)
    return out


def prepare_cluster(plane: ControlPlane, workdir: Path) -> None:
    """The example namespaces with their labels, and the PriorityClasses gpuwarden's chart
    installs (both policies set them; every run sees the same cluster)."""
    for manifest in namespace_manifests():
        labels = {
            k: v
            for k, v in (manifest["metadata"].get("labels") or {}).items()
            if k != "kubernetes.io/metadata.name"
        }
        metadata = {"name": manifest["metadata"]["name"], "labels": labels}
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
        plane.kubectl("apply", "-f", "-", input=json.dumps(body))
    workdir.mkdir(parents=True, exist_ok=True)
    chart = render_chart(
        plane.helm_path, values=chart_values_for((DEFAULT_POLICIES,)), workdir=workdir
    )
    api = plane.api_client()
    try:
        ensure_priority_classes(api, [d for d in chart if d.get("kind") == "PriorityClass"])
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _webhook_calls(plane: ControlPlane, names: Sequence[str]) -> float:
    """How many admission webhook calls the API server has made to webhooks of these names."""
    text = plane.kubectl("get", "--raw", "/metrics").stdout
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_admission_webhook_admission_duration_seconds_count{") and any(
            f'name="{n}"' in line for n in names
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextlib.contextmanager
def echo_webhooks(plane: ControlPlane, workdir: Path, probe_pod: Obj) -> Iterator[list[int]]:
    """The floor of any webhook: bench/load.py's bare aiohttp handler (parse the review, answer
    allowed, no patch) behind the chart's own webhook configurations (same rules, selectors,
    timeouts), so the API server does all the calling a webhook costs it."""
    workdir.mkdir(parents=True, exist_ok=True)
    certs = loopback_directory(workdir / "certs")
    (port,) = free_ports(1)
    process = plane.spawn(
        "echo-webhook",
        [
            sys.executable,
            str(ROOT / "bench" / "load.py"),
            "--baseline-server",
            str(port),
            str(certs.tls_cert),
            str(certs.tls_key),
        ],
    )
    chart = render_chart(
        plane.helm_path, values=chart_values_for((DEFAULT_POLICIES,)), workdir=workdir
    )
    configs = chart_webhook_configurations(
        chart,
        base_url=f"https://127.0.0.1:{port}",
        ca_bundle_b64=base64.b64encode(certs.ca_cert.read_bytes()).decode(),
    )
    names = [
        *webhook_names(configs, "MutatingWebhookConfiguration"),
        *webhook_names(configs, "ValidatingWebhookConfiguration"),
    ]
    api = plane.api_client()
    try:
        install_webhook_configurations(api, configs)
        before = _webhook_calls(plane, names)

        def called() -> bool:
            if process.popen.poll() is not None:
                raise SystemExit(f"the echo webhook exited:\n{process.tail()}")
            dry_run_pod(plane, probe_pod)
            return _webhook_calls(plane, names) > before

        wait_for("the API server to call the echo webhooks", called, timeout=60.0)
        yield [process.popen.pid]
    finally:
        delete_webhook_configurations(api, configs)
        api.close()  # type: ignore[no-untyped-call]
        process.terminate(10.0)


@contextlib.contextmanager
def gpuwarden_webhooks(plane: ControlPlane, workdir: Path) -> Iterator[list[int]]:
    """gpuwarden serve and the chart's webhook configurations, as the e2e suites set them up."""
    workdir.mkdir(parents=True, exist_ok=True)
    with plane_webhook_stack(
        plane, helm=plane.helm_path, workdir=workdir, policies=(DEFAULT_POLICIES,)
    ) as stack:
        for manifest in namespace_manifests():
            name = manifest["metadata"]["name"]
            tenant = name if name in ("tenant-a", "tenant-b") else "kubeflow-profiles"
            wait_until_governed(stack.api, name, tenant, timeout=60.0)
        # The server's process: the only one with its certificate directory in its argv.
        yield pids_with(f"--cert-dir={workdir / 'server' / 'certs'}")
