"""The memory a restart's list of ConfigMaps takes (issue 29 item 5), against the real
kube-apiserver of the e2e suites: ``--count`` ConfigMaps of about 1 MB (``--keys`` keys each) in
one namespace, then the ConfigMap informer's first list, once with the old code and once with the
new, each in a fresh process. The old code (``--old``, by default the commit before the fix,
extracted with ``git archive``) asked for pages of 500, parsed each page whole and kept every key
name; the new one asks for pages of 50, parses one object at a time and keeps a few keys and
counts per ConfigMap. Printed: the process's peak resident memory during the list above what it
held before (what the chart's 512Mi limit is measured against), what stays held after it, and
how long the list took.

    .venv/bin/python -m bench.informer_memory            # 150 ConfigMaps of 1 MB
    .venv/bin/python -m bench.informer_memory --quick    # 40 of them
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from bench.old_code import before_adding, extract
from gpuwarden.lab.cluster.controlplane import ControlPlane, Tools

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "bulk"

# Run in the tree under test: the ConfigMap informer of the webhook's cache, one list.
_LIST = """
import gc, json, resource, sys, time
from kubernetes import config
from gpuwarden.kube.cluster import WatchedCluster

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

api = config.new_client_from_config(sys.argv[1])
informer = WatchedCluster(api, track_pods=False).informers["configmaps"]
gc.collect()
before = rss_mib()
start = time.perf_counter()
informer._list()
took = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
gc.collect()
print(json.dumps({"before": before, "peak": peak, "after": rss_mib(), "seconds": took}))
"""


def config_map(name: str, keys: int, size: int) -> dict[str, Any]:
    value = "v" * max(size // keys - len('"KEY_000000":"",'), 1)
    data = {f"KEY_{i:06d}": value for i in range(keys)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def measure(tree: Path, kubeconfig: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _LIST, str(kubeconfig)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"the list failed in {tree}:\n{done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", help="git ref of the old code (default: before the fix)")
    parser.add_argument("--count", type=int, default=150, help="ConfigMaps (150)")
    parser.add_argument("--keys", type=int, default=10_000, help="keys per ConfigMap (10,000)")
    parser.add_argument("--bytes", type=int, default=1_000_000, help="bytes per ConfigMap (1 MB)")
    parser.add_argument("--quick", action="store_true", help="40 ConfigMaps")
    args = parser.parse_args(argv)
    count = 40 if args.quick else args.count
    old_ref = args.old or before_adding("bench/informer_memory.py")
    tools = Tools.load()
    with (
        tempfile.TemporaryDirectory(prefix="gpuwarden-informer-") as tmp,
        ControlPlane(tools) as plane,
    ):
        trees = {"old": extract(old_ref, Path(tmp) / "old"), "new": ROOT}
        api = plane.api_client()
        core: Any = k8s_client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        start = time.monotonic()
        for i in range(count):
            body = config_map(f"big-{i:03d}", args.keys, args.bytes)
            core.create_namespaced_config_map(NAMESPACE, body, _preload_content=False)
        size = len(json.dumps(config_map("x", args.keys, args.bytes), separators=(",", ":")))
        print(
            f"{count} ConfigMaps of {args.keys} keys, {size / 1e6:.2f} MB each, created in "
            f"{time.monotonic() - start:.0f}s; old code {old_ref}, new the working tree"
        )
        results = {name: measure(tree, plane.kubeconfig_path) for name, tree in trees.items()}
    print(f"{'':>4} {'before':>9} {'peak':>9} {'peak-before':>12} {'kept':>9} {'list took':>10}")
    for name, r in results.items():
        print(
            f"{name:>4} {r['before']:>6.0f}MiB {r['peak']:>6.0f}MiB {r['peak'] - r['before']:>9.0f}MiB "
            f"{r['after'] - r['before']:>6.0f}MiB {r['seconds']:>9.2f}s"
        )
    old, new = results["old"], results["new"]
    print(
        f"peak above the start: {(old['peak'] - old['before']) / (new['peak'] - new['before']):.1f}x "
        "less with the new code"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
