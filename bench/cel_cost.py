"""What the chart's matchConditions cost the API server on the biggest objects a tenant can send
(issue 29 item 6), measured against the real kube-apiserver of the e2e suites.

Every CEL comprehension (``exists``, ``map``) costs the API server quadratic time in the
elements it iterates (its cost tracker's stack, see gpuwarden/policy/render/scope.py). The old
conditions iterated every key of a ConfigMap and every env variable of every container; the new
ones iterate bounded collections only and send larger objects to the webhook unread.

For each object, the time of a dry-run create (best of ``--repeat``) with no webhook
configurations, with the chart's configurations of the old code (``--old``, by default the
commit before the fix, its chart rendered with helm) and of the new code. The configurations
call bench/load.py's bare webhook (parse, answer allowed), so a condition that sends the object
costs the call and nothing of gpuwarden's; ``sent`` says whether it did. An error (a condition
over the API server's cost budget, a timeout) is printed in place of the time.

    .venv/bin/python -m bench.cel_cost            # 40k and 80k keys, 20k env vars, 3 MiB objects
    .venv/bin/python -m bench.cel_cost --quick    # 40k keys, 20k env vars, one try each
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from bench.apiserver_pods import DEFAULT_POLICIES
from bench.apiserver_webhooks import _webhook_calls, wait_for
from bench.load import baseline_server
from bench.old_code import before_adding, extract
from gpuwarden.certs.loopback import loopback_directory
from gpuwarden.lab.cluster.controlplane import ControlPlane, Process, Tools, free_ports
from gpuwarden.lab.cluster.webhookstack import (
    RELEASE_NAME,
    RELEASE_NAMESPACE,
    chart_values_for,
    chart_webhook_configurations,
    delete_webhook_configurations,
    install_webhook_configurations,
    webhook_names,
)
from gpuwarden.policy.render.scope import (
    MAX_CONFIG_MAP_KEYS,
    MAX_CONTAINER_ITEMS,
    MAX_CONTAINERS,
    MAX_ITEMS,
)

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "tenant-a"
LABELS = {"app.kubernetes.io/part-of": "kubeflow-profile"}
#: The API server's limit on a request body (k8s.io/apiserver pkg/apis/cel/config.go
#: MaxRequestSizeBytes): the biggest object a tenant can send, in a dry run too.
MAX_REQUEST = 3 * 1024 * 1024

Obj = dict[str, Any]


def config_map(keys: int) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "big", "namespace": NAMESPACE},
        "data": {f"KEY_{i:06d}": "1" for i in range(keys)},
    }


def cpu_pod(variables: int) -> Obj:
    env = [{"name": f"VAR_{i:06d}", "value": "1"} for i in range(variables)]
    container = {"name": "main", "image": "busybox", "env": env}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cpu", "namespace": NAMESPACE},
        "spec": {"containers": [container]},
    }


def at_the_bounds() -> Obj:
    """The pod the new conditions iterate most: just under every bound of scope.py."""
    pod = cpu_pod(0)
    per_container = MAX_CONTAINER_ITEMS // MAX_CONTAINERS
    pod["spec"]["containers"] = [
        {
            "name": f"c{i}",
            "image": "busybox",
            "env": [{"name": f"VAR_{j}", "value": "1"} for j in range(per_container)],
        }
        for i in range(MAX_CONTAINERS)
    ]
    pod["spec"]["volumes"] = [{"name": f"v{i}", "emptyDir": {}} for i in range(MAX_ITEMS)]
    for field in ("labels", "annotations"):
        pod["metadata"][field] = {f"example.com/k{i}": "x" for i in range(MAX_ITEMS)}
    return pod


def filling(make: Callable[[int], Obj]) -> Obj:
    """The object of ``make`` with as many elements as a request body under MAX_REQUEST holds
    (as the kubernetes client encodes it)."""
    per_element = len(json.dumps(make(1001))) - len(json.dumps(make(1)))
    return make(int(MAX_REQUEST * 0.97) * 1000 // per_element)


def render(helm: Path, chart: Path, workdir: Path) -> list[Obj]:
    workdir.mkdir(parents=True, exist_ok=True)
    values = workdir / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values_for((DEFAULT_POLICIES,))))
    argv = [
        str(helm),
        "template",
        RELEASE_NAME,
        str(chart),
        "-n",
        RELEASE_NAMESPACE,
        "-f",
        str(values),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if isinstance(doc, dict)]


def dry_run(api: k8s_client.ApiClient, obj: Obj) -> Callable[[], None]:
    core: Any = k8s_client.CoreV1Api(api)
    create = (
        core.create_namespaced_config_map
        if obj["kind"] == "ConfigMap"
        else (core.create_namespaced_pod)
    )

    def call() -> None:
        create(NAMESPACE, obj, dry_run="All", _preload_content=False, _request_timeout=120)

    return call


def timed(call: Callable[[], None], repeat: int) -> tuple[str, str]:
    """The best time, or "error", and the error's message."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            call()
        except ApiException as exc:
            try:
                message = str(json.loads(exc.body or "")["message"])
            except (TypeError, ValueError, KeyError):
                message = str(exc.body)
            return f"error {exc.status}", message[:300]
        best = min(best, time.perf_counter() - start)
    return f"{best:.3f}s", ""


def calls_reached(
    plane: ControlPlane, api: k8s_client.ApiClient, names: Sequence[str], echo: Process
) -> bool:
    """Whether a ConfigMap every condition sends reaches the echo webhook (the API server picks
    new configurations up asynchronously)."""
    if echo.popen.poll() is not None:
        raise SystemExit(f"the echo webhook exited:\n{echo.tail()}")
    probe = config_map(1)
    probe["data"] = {"NVIDIA_VISIBLE_DEVICES": "all"}
    before = _webhook_calls(plane, names)
    dry_run(api, probe)()
    return _webhook_calls(plane, names) > before


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", help="git ref of the old chart (default: before the fix)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="40k keys, 20k env vars, one try")
    parser.add_argument("--echo", nargs=3, metavar=("PORT", "CERT", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.echo:
        # A review holds up to 3 MiB of object; aiohttp takes 1 MiB unless told.
        baseline_server(int(args.echo[0]), args.echo[1], args.echo[2], max_body=8 * 1024**2)
        return 0
    repeat = 1 if args.quick else args.repeat
    old_ref = args.old or before_adding("bench/cel_cost.py")
    objects: list[tuple[str, Obj]] = [
        ("ConfigMap, 40,000 keys", config_map(40_000)),
        ("CPU pod, 20,000 env vars", cpu_pod(20_000)),
        ("CPU pod at every bound", at_the_bounds()),
        ("ConfigMap at the bound", config_map(MAX_CONFIG_MAP_KEYS)),
    ]
    if not args.quick:
        objects.insert(1, ("ConfigMap, 80,000 keys", config_map(80_000)))
    # The biggest the API server takes; only the new conditions are tried on them (the old
    # ones need minutes, or run out of the cost budget).
    biggest = [
        ("ConfigMap, 3 MiB of keys", filling(config_map)),
        ("CPU pod, 3 MiB of env vars", filling(cpu_pod)),
    ]
    tools = Tools.load()
    with tempfile.TemporaryDirectory(prefix="gpuwarden-cel-") as tmp, ControlPlane(tools) as plane:
        work = Path(tmp)
        old_tree = extract(old_ref, work / "old", ("charts",))
        charts = {"old": old_tree / "charts" / "gpuwarden", "new": ROOT / "charts" / "gpuwarden"}
        certs = loopback_directory(work / "certs")
        (port,) = free_ports(1)
        echo = plane.spawn(
            "echo-webhook",
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bench.cel_cost import main; "
                "sys.exit(main(sys.argv[1:]))",
                "--echo",
                str(port),
                str(certs.tls_cert),
                str(certs.tls_key),
            ],
        )
        api = plane.api_client()
        core: Any = k8s_client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE, "labels": LABELS}})
        ca = base64.b64encode(certs.ca_cert.read_bytes()).decode()
        configs = {
            name: chart_webhook_configurations(
                render(plane.helm_path, chart, work / name),
                base_url=f"https://127.0.0.1:{port}",
                ca_bundle_b64=ca,
            )
            for name, chart in charts.items()
        }
        names = [
            n
            for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
            for n in webhook_names(configs["new"], kind)
        ]
        results: dict[str, dict[str, str]] = {}
        for variant in ("none", "old", "new"):
            if variant != "none":
                install_webhook_configurations(api, configs[variant])
                wait_for(
                    f"the {variant} webhook configurations",
                    lambda: calls_reached(plane, api, names, echo),
                    timeout=60.0,
                )
            tried = objects + (biggest if variant != "old" else [])
            for label, obj in tried:
                before = _webhook_calls(plane, names)
                took, error = timed(dry_run(api, obj), repeat)
                sent = _webhook_calls(plane, names) > before
                results.setdefault(label, {})[variant] = took + (" sent" if sent else "")
                print(f"  {variant:>4} {label}: {results[label][variant]} {error}", flush=True)
            if variant != "none":
                delete_webhook_configurations(api, configs[variant])
        print(f"\ndry-run create, best of {repeat}; old chart {old_ref}, new the working tree")
        print(f"{'object':<28} {'no webhooks':>12} {'old CEL':>14} {'new CEL':>14}")
        for label, row in results.items():
            print(
                f"{label:<28} {row.get('none', '-'):>12} {row.get('old', 'not tried'):>14} "
                f"{row.get('new', '-'):>14}"
            )
        echo.terminate(10.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
