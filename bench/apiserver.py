"""Pod creation through a real kube-apiserver: no webhook, gpuwarden, and Kyverno (issue 13).

One etcd + kube-apiserver on loopback (gpuwarden.lab.controlplane, the e2e suites' control plane)
serves four runs in one go:

* **none**: no admission webhook is registered;
* **echo**: bench/load.py's bare handler (answers allowed, no patch) behind the chart's webhook
  configurations: what calling any mutating + validating pair costs the API server;
* **gpuwarden**: ``gpuwarden serve`` with the chart's Mutating and Validating
  WebhookConfigurations, set up exactly as the e2e suites do it (tests/e2e/webhook.py);
* **kyverno**: Kyverno's admission controller (hack/build-kyverno.sh), run out of cluster against
  the same API server (``--serverIP``), with its CRDs and ConfigMaps from its module's config/ and
  the ClusterPolicies of bench/kyverno/.

In each run, concurrent clients (8 and 32 by default; threads spread over a few processes, each
with its own keep-alive connection) create the seven example pods with ``dryRun=All`` through the
``kubernetes`` Python client for a fixed time after a warm-up. A webhook's time is split into
several runs, each after a control run of the same pods in kube-system (which every webhook
configuration leaves out), so that both see the same machine. Printed: pods/s, p50/p99 creation
latency, the latency each webhook adds to its control, the ratios, and the CPU per created pod of
the API server, etcd, the webhook and the clients (from /proc, this run's processes only). Then
the offline CLIs on the same 2,000 pods: ``gpuwarden apply`` against ``kyverno apply``.

Everything listens on 127.0.0.1. Run: ``python bench/apiserver.py`` (about 5 minutes; ``make
bench-peers`` builds the tools first). ``--quick`` for a shorter run; ``--no-kyverno`` when
Kyverno is not built.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwarden.lab.cluster.controlplane import ControlPlane, Tools, cache_dir, free_ports  # noqa: E402

KYVERNO_POLICIES = ROOT / "bench" / "kyverno"
EXAMPLES = ROOT / "examples"
NAMESPACES_FILE = EXAMPLES / "namespaces.yaml"
DEFAULT_POLICIES = ROOT / "policies"

#: Targets of issue 13.
TARGET_ADDED_RATIO = 0.5
TARGET_THROUGHPUT_RATIO = 0.9

PEERS = ("none", "echo", "gpuwarden", "kyverno")
#: Both webhook configurations leave kube-system out (their namespaceSelectors): pods created
#: there while a webhook is registered are the control runs, interleaved with the webhook's.
CONTROL_NAMESPACE = "kube-system"
#: The peers whose policies change the pods (none and the echo webhook change nothing).
MUTATING_PEERS = ("gpuwarden", "kyverno")
#: What each run's pods must show before it is measured: the annotation both policies set.
GOVERNED_ANNOTATION = "gpuwarden.io/profile"
KYVERNO_NAMESPACE = "kyverno"
KYVERNO_CA_SECRET = "kyverno-svc.kyverno.svc.kyverno-tls-ca"
KYVERNO_TLS_SECRET = "kyverno-svc.kyverno.svc.kyverno-tls-pair"
KYVERNO_INSTALL_MANIFEST = Path("config") / "install-latest-testing.yaml"

Obj = dict[str, Any]


# --- statistics (pure) -------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ``values`` by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class RunStats:
    """One (peer, clients) run: completed creations within the measured window."""

    peer: str
    clients: int
    seconds: float
    latencies_ms: tuple[float, ...]
    errors: int
    #: CPU milliseconds each group of processes spent in the measured window.
    cpu_ms: Mapping[str, float] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.latencies_ms)

    def cpu_per_pod(self, group: str) -> float:
        if group not in self.cpu_ms or not self.count:
            return math.nan
        return self.cpu_ms[group] / self.count

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 50) if self.latencies_ms else math.nan

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 99) if self.latencies_ms else math.nan


@dataclass(frozen=True)
class Added:
    """The latency a webhook adds to the no-webhook run at the same concurrency."""

    peer: str
    clients: int
    p50_ms: float
    p99_ms: float
    throughput_ratio: float


def added_latency(run: RunStats, baseline: RunStats) -> Added:
    if run.clients != baseline.clients:
        raise ValueError(f"{run.clients} clients against a baseline of {baseline.clients}")
    ratio = run.rate / baseline.rate if baseline.rate > 0 else math.nan
    return Added(run.peer, run.clients, run.p50 - baseline.p50, run.p99 - baseline.p99, ratio)


def ratio(numerator: float, denominator: float) -> float:
    """numerator/denominator, NaN where that means nothing (a webhook that adds nothing)."""
    if denominator <= 0 or math.isnan(denominator) or math.isnan(numerator):
        return math.nan
    return numerator / denominator


def verdict(value: float, target: float, *, at_most: bool) -> str:
    if math.isnan(value):
        return "not measured"
    met = value <= target if at_most else value >= target
    return "met" if met else "not met"


def format_runs(runs: Sequence[RunStats]) -> list[str]:
    lines = [f"{'webhooks':<18}{'clients':>8}{'pods/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"]
    for run in runs:
        lines.append(
            f"{run.peer:<18}{run.clients:>8}{run.rate:>9.0f}{run.p50:>9.2f}{run.p99:>9.2f}"
            f"{run.errors:>8}"
        )
    return lines


CPU_GROUPS = ("kube-apiserver", "etcd", "webhook", "clients")


def format_cpu(runs: Sequence[RunStats]) -> list[str]:
    """CPU milliseconds per created pod, per group of processes (others' processes excluded)."""
    lines = [f"{'CPU ms per pod':<16}{'clients':>8}" + "".join(f"{g:>15}" for g in CPU_GROUPS)]
    for run in runs:
        if not run.cpu_ms:
            continue
        cells = "".join(
            f"{'-' if math.isnan(v := run.cpu_per_pod(g)) else f'{v:.2f}':>15}" for g in CPU_GROUPS
        )
        lines.append(f"{run.peer:<16}{run.clients:>8}{cells}")
    return lines


def control_name(peer: str) -> str:
    """The name of the no-webhook control runs interleaved with ``peer``'s runs."""
    return f"ctl-{peer}"


def pooled(runs: Sequence[RunStats], peer: str | None = None) -> RunStats:
    """Several runs of one peer and concurrency as one: all their latencies, their total time."""
    if not runs:
        raise ValueError("no runs to pool")
    if len({r.clients for r in runs}) != 1:
        raise ValueError("pooling runs of different concurrency")
    return RunStats(
        peer or runs[0].peer,
        runs[0].clients,
        sum(r.seconds for r in runs),
        tuple(ms for r in runs for ms in r.latencies_ms),
        sum(r.errors for r in runs),
        {g: sum(r.cpu_ms.get(g, 0.0) for r in runs) for g in {g for r in runs for g in r.cpu_ms}},
    )


def comparisons(runs: Sequence[RunStats]) -> list[str]:
    """Added latency per webhook and concurrency, the gpuwarden/Kyverno ratios, the verdicts."""
    by_key = {(run.peer, run.clients): run for run in runs}
    clients = sorted({run.clients for run in runs})
    lines = [
        f"{'added vs control':<17}{'clients':>8}{'p50 +ms':>9}{'p99 +ms':>9}{'pods/s ratio':>14}"
    ]
    added: dict[tuple[str, int], Added] = {}
    for peer in ("echo", "gpuwarden", "kyverno"):
        for n in clients:
            # The control run interleaved with this webhook's runs, else the no-webhook run.
            run = by_key.get((peer, n))
            base = by_key.get((control_name(peer), n)) or by_key.get(("none", n))
            if run is None or base is None:
                continue
            a = added_latency(run, base)
            added[(peer, n)] = a
            lines.append(
                f"{peer:<17}{n:>8}{a.p50_ms:>9.2f}{a.p99_ms:>9.2f}{a.throughput_ratio:>13.2f}x"
            )
    for n in clients:
        echo, gw, ky = (added.get((p, n)) for p in ("echo", "gpuwarden", "kyverno"))
        if echo is not None:
            lines.append(
                f"{n} clients: a webhook that only answers allowed (echo) keeps "
                f"{echo.throughput_ratio:.2f}x the no-webhook throughput and adds "
                f"{echo.p50_ms:.2f} ms at p50: the floor of any webhook pair here"
            )
        if gw is not None:
            lines.append(
                f"{n} clients: gpuwarden keeps {gw.throughput_ratio:.2f}x the no-webhook "
                f"throughput (target >= {TARGET_THROUGHPUT_RATIO}): "
                f"{verdict(gw.throughput_ratio, TARGET_THROUGHPUT_RATIO, at_most=False)}"
            )
        if gw is not None and ky is not None:
            r50, r99 = ratio(gw.p50_ms, ky.p50_ms), ratio(gw.p99_ms, ky.p99_ms)
            lines.append(
                f"{n} clients: gpuwarden adds {r50:.2f}x Kyverno's added latency at p50, "
                f"{r99:.2f}x at p99 (target <= {TARGET_ADDED_RATIO}): "
                f"p50 {verdict(r50, TARGET_ADDED_RATIO, at_most=True)}, "
                f"p99 {verdict(r99, TARGET_ADDED_RATIO, at_most=True)}"
            )
    return lines


@dataclass(frozen=True)
class CliTiming:
    """An offline CLI on ``pods`` pods and on one pod (its start-up), wall-clock seconds."""

    name: str
    pods: int
    seconds: float
    startup_seconds: float

    @property
    def rate(self) -> float:
        """Pods per second of the whole run, start-up included."""
        return self.pods / self.seconds if self.seconds > 0 else math.nan

    @property
    def marginal_rate(self) -> float:
        """Decisions per second once started: the extra pods over the extra time."""
        extra = self.seconds - self.startup_seconds
        return (self.pods - 1) / extra if extra > 0 else math.nan


def format_cli(timings: Sequence[CliTiming]) -> list[str]:
    if not timings:
        return []
    pods = timings[0].pods
    lines = [
        f"{f'offline, {pods:,} pods':<22}{'wall s':>8}{'pods/s':>9}{'1-pod s':>9}"
        f"{'decisions/s':>13}"
    ]
    for t in timings:
        lines.append(
            f"{t.name:<22}{t.seconds:>8.2f}{t.rate:>9.0f}{t.startup_seconds:>9.2f}"
            f"{t.marginal_rate:>13.0f}"
        )
    if len(timings) == 2:
        lines.append(
            f"{timings[0].name} / {timings[1].name}: {ratio(timings[0].rate, timings[1].rate):.1f}x "
            f"pods/s, {ratio(timings[0].marginal_rate, timings[1].marginal_rate):.1f}x decisions/s"
        )
    return lines


# --- arguments (pure) --------------------------------------------------------------------------


def parse_clients(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not values or any(v < 1 or v > 256 for v in values):
        raise argparse.ArgumentTypeError(f"client counts must be 1..256: {text!r}")
    return values


def parse_peers(text: str) -> tuple[str, ...]:
    values = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [v for v in values if v not in PEERS]
    if unknown or not values:
        raise argparse.ArgumentTypeError(f"peers are {', '.join(PEERS)}; got {text!r}")
    # Always in the order of PEERS: none first, it is every comparison's baseline.
    return tuple(p for p in PEERS if p in values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--clients", type=parse_clients, default=(8, 32), help="e.g. 8,32")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per run")
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="a webhook's measured time is split into this many runs, each after a control run",
    )
    parser.add_argument(
        "--processes", type=int, default=2, help="client processes the threads are spread over"
    )
    parser.add_argument(
        "--peers", type=parse_peers, default=PEERS, help="none,echo,gpuwarden,kyverno"
    )
    parser.add_argument("--no-kyverno", action="store_true", help="leave Kyverno out")
    parser.add_argument("--cli-pods", type=int, default=2000, help="pods for the offline CLIs")
    parser.add_argument("--no-cli", action="store_true", help="skip the offline CLI comparison")
    parser.add_argument("--quick", action="store_true", help="3 s runs, 500 CLI pods")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--mix",
        action="store_true",
        help="instead: a Kubeflow namespace's mix (CPU pods, a KFP run's pods, GPU pods) with "
        "no webhook and with gpuwarden, per class of pod (webhook.scope: policies)",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.rounds, args.cli_pods = 3.0, 0.5, 2, 500
    if args.no_kyverno:
        args.peers = tuple(p for p in args.peers if p != "kyverno")
    if args.duration <= 0 or args.warmup < 0:
        raise SystemExit("--duration must be > 0 and --warmup >= 0")
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    if args.processes < 1:
        raise SystemExit("--processes must be >= 1")
    if args.cli_pods < 2:
        raise SystemExit("--cli-pods must be >= 2")
    return args


# --- the pods ----------------------------------------------------------------------------------


# The examples bench/kyverno/ mirrors rule for rule; newer ones (Workspaces, LLMInferenceService,
# the Trainer launcher) have no Kyverno counterpart to compare against.
MIRRORED_EXAMPLES = (
    "katib-trial",
    "kfp-driver",
    "kfp-train-step",
    "kserve-predictor",
    "notebook",
    "pytorchjob-worker",
    "trainjob-node",
)


def example_pods() -> list[Obj]:
    """The seven Kubeflow example pods that bench/kyverno mirrors, in their tenant namespaces."""
    pods: list[Obj] = []
    for path in (EXAMPLES / f"{name}.yaml" for name in MIRRORED_EXAMPLES):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "Pod":
                pods.append(doc)
    if not pods:
        raise SystemExit(f"no Pod manifests in {EXAMPLES}")
    return pods


def mix_pods() -> dict[str, list[Obj]]:
    """A Kubeflow profile namespace's pods by class, in tenant-a.

    cpu: pods the default policy cannot change (a web server, a CPU notebook, a CPU KServe
    predictor), which the chart's matchConditions keep away from gpuwarden; kfp-cpu: a KFP run's
    driver and a CPU step, which are sent (the default policy gives pipeline steps GPUs by task
    name); gpu: GPU pods (a training step, a notebook, a predictor).
    """
    plain = yaml.safe_load((DEFAULT_POLICIES / "tests" / "pods" / "plain-web.yaml").read_text())
    examples = {name: yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()) for name in (
        "kfp-driver", "kfp-train-step", "notebook", "kserve-predictor")}  # fmt: skip

    def without_gpus(pod: Obj, name: str) -> Obj:
        copied: Obj = json.loads(json.dumps(pod))
        copied["metadata"]["name"] = name
        for container in copied["spec"]["containers"]:
            for section in ("limits", "requests"):
                values = (container.get("resources") or {}).get(section) or {}
                for key in [k for k in values if k.startswith("nvidia.com/")]:
                    del values[key]
        return copied

    classes = {
        "cpu": [
            plain,
            without_gpus(examples["notebook"], "cpu-notebook-0"),
            without_gpus(examples["kserve-predictor"], "cpu-predictor-0"),
        ],
        "kfp-cpu": [
            examples["kfp-driver"],
            without_gpus(examples["kfp-train-step"], "cpu-step-0"),
        ],
        "gpu": [examples["kfp-train-step"], examples["notebook"], examples["kserve-predictor"]],
    }
    return {name: in_namespace(pods, "tenant-a") for name, pods in classes.items()}


def namespace_manifests() -> list[Obj]:
    return [
        doc
        for doc in yaml.safe_load_all(NAMESPACES_FILE.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "Namespace"
    ]


def in_namespace(pods: Sequence[Obj], namespace: str) -> list[Obj]:
    """Copies of ``pods`` in ``namespace``."""
    out = copy.deepcopy(list(pods))
    for pod in out:
        pod["metadata"]["namespace"] = namespace
    return out


def numbered_pods(pods: Sequence[Obj], count: int) -> list[Obj]:
    """``count`` pods, the examples in turn, each with a unique name."""
    out: list[Obj] = []
    for i in range(count):
        pod = copy.deepcopy(pods[i % len(pods)])
        meta = pod["metadata"]
        suffix = f"-{i:05d}"
        meta["name"] = str(meta["name"])[: 63 - len(suffix)] + suffix
        out.append(pod)
    return out


# --- the load: concurrent dry-run creations ------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Wall-clock (time.time) bounds of one run, shared by every client process."""

    start: float  # the warm-up begins
    measure_from: float
    until: float


def _client_thread(
    kubeconfig: str,
    pods: Sequence[Obj],
    offset: int,
    window: Window,
    latencies: list[float],
    errors: list[int],
) -> None:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException

    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    api = k8s_client.ApiClient(configuration)
    core: Any = k8s_client.CoreV1Api(api)
    i = offset
    try:
        while time.time() < window.start:
            time.sleep(0.001)
        while True:
            pod = pods[i % len(pods)]
            i += 1
            began = time.time()
            if began >= window.until:
                break
            ok = True
            t0 = time.perf_counter()
            try:
                response = core.create_namespaced_pod(
                    pod["metadata"]["namespace"], pod, dry_run="All", _preload_content=False
                )
                _ = response.data
                response.release_conn()
                ok = response.status == 201
            except ApiException:
                ok = False
            elapsed_ms = (time.perf_counter() - t0) * 1000.0
            if began >= window.measure_from and time.time() <= window.until:
                if ok:
                    latencies.append(elapsed_ms)
                else:
                    errors.append(1)
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _client_process(
    kubeconfig: str, pods: list[Obj], threads: int, first: int, window: Window
) -> tuple[list[float], int]:
    """``threads`` closed-loop clients in one process; their latencies (ms) and error count."""
    latencies: list[float] = []
    errors: list[int] = []
    workers = [
        threading.Thread(
            target=_client_thread,
            args=(kubeconfig, pods, first + t, window, latencies, errors),
            daemon=True,
        )
        for t in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=window.until - time.time() + 60.0)
    return latencies, len(errors)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a live process (0 for one that has gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name may hold spaces and parentheses; the fields follow the last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def pids_with(needle: str) -> list[int]:
    """Processes whose command line contains ``needle``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            out.append(int(entry.name))
    return out


def cpu_snapshot(groups: Mapping[str, Callable[[], Sequence[int]]]) -> dict[str, float]:
    return {name: sum(process_cpu_seconds(pid) for pid in pids()) for name, pids in groups.items()}


def split_clients(clients: int, processes: int) -> list[int]:
    """Threads per process, as even as possible, no process without a thread."""
    processes = max(1, min(processes, clients))
    base, extra = divmod(clients, processes)
    return [base + (1 if p < extra else 0) for p in range(processes)]


def measure(
    peer: str,
    clients: int,
    *,
    kubeconfig: Path,
    pods: list[Obj],
    duration: float,
    warmup: float,
    processes: int,
    pool: Any,
    groups: Mapping[str, Callable[[], Sequence[int]]] | None = None,
) -> RunStats:
    """One closed-loop run of ``clients`` concurrent creators; only the measured window counts."""
    # Time for every pool process to receive its task and connect before the warm-up begins.
    start = time.time() + 0.5
    window = Window(start=start, measure_from=start + warmup, until=start + warmup + duration)
    shares = split_clients(clients, processes)
    firsts = [sum(shares[:p]) for p in range(len(shares))]
    snapshots: list[dict[str, float]] = []

    def watch() -> None:
        # CPU of each group at the start and the end of the measured window.
        for at in (window.measure_from, window.until):
            time.sleep(max(0.0, at - time.time()))
            snapshots.append(cpu_snapshot(groups or {}))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    results = pool.starmap(
        _client_process,
        [
            (str(kubeconfig), pods, n, first, window)
            for n, first in zip(shares, firsts, strict=True)
        ],
    )
    watcher.join(timeout=5.0)
    latencies = tuple(ms for part, _ in results for ms in part)
    errors = sum(e for _, e in results)
    cpu: dict[str, float] = {}
    if len(snapshots) == 2:
        cpu = {g: (snapshots[1][g] - snapshots[0][g]) * 1000.0 for g in snapshots[0]}
    return RunStats(peer, clients, duration, latencies, errors, cpu)


# --- the cluster side --------------------------------------------------------------------------


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
    from kubernetes import client as k8s_client

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


def comparable(pod: Mapping[str, Any]) -> Obj:
    """What both policies set: gpuwarden.io/* and Volcano annotations, scheduler, priority,
    container resources (quantities as the API server canonicalises them)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k.startswith(("gpuwarden.io/", "scheduling.volcano.sh/", "volcano.sh/"))
    }
    return {
        "annotations": annotations,
        "schedulerName": spec.get("schedulerName"),
        "priorityClassName": spec.get("priorityClassName"),
        "priority": spec.get("priority"),
        "preemptionPolicy": spec.get("preemptionPolicy"),
        "resources": {c["name"]: c.get("resources") for c in spec.get("containers") or []},
    }


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """Where two comparable() views differ: field names, annotation keys, container names."""
    out: list[str] = []
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key), theirs.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}[{k}]" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            out.append(key)
    return out


def compare_outputs(ours: Mapping[str, Obj], theirs: Mapping[str, Obj]) -> list[str]:
    same = [name for name, pod in ours.items() if not differences(pod, theirs.get(name) or {})]
    lines = [
        f"Kyverno's pods equal gpuwarden's on {len(same)} of {len(ours)} examples "
        "(gpuwarden.io/* and Volcano annotations, scheduler, priority, resources)"
    ]
    for name, pod in ours.items():
        diff = differences(pod, theirs.get(name) or {})
        if diff:
            lines.append(f"  {name}: {', '.join(diff)} differ")
    return lines


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
    from tests.e2e.webhook import chart_values_for, ensure_priority_classes, render_chart

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
    from gpuwarden.certs.rotation import ServingNames, issue_directory
    from tests.e2e.webhook import (
        chart_values_for,
        chart_webhook_configurations,
        delete_webhook_configurations,
        install_webhook_configurations,
        render_chart,
        webhook_names,
    )

    workdir.mkdir(parents=True, exist_ok=True)
    certs = issue_directory(workdir / "certs", ServingNames(("localhost",), ("127.0.0.1",)))
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
    from tests.e2e.webhook import plane_webhook_stack, wait_until_governed

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


# --- the offline CLIs ----------------------------------------------------------------------------


def time_command(argv: Sequence[str], timeout: float = 900.0) -> float:
    began = time.perf_counter()
    result = subprocess.run(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=timeout,
        check=False,
    )
    seconds = time.perf_counter() - began
    # gpuwarden apply exits 1 when a pod is denied; anything else is a failure of the run.
    if result.returncode not in (0, 1):
        tail = result.stderr.decode(errors="replace")[-2000:]
        raise SystemExit(f"{' '.join(argv[:3])} ... exited {result.returncode}:\n{tail}")
    return seconds


def cli_timings(
    pods: Sequence[Obj], count: int, workdir: Path, kyverno: KyvernoTools | None
) -> list[CliTiming]:
    many = workdir / f"pods-{count}.yaml"
    many.write_text(yaml.safe_dump_all(numbered_pods(pods, count), sort_keys=False))
    one = workdir / "pods-1.yaml"
    one.write_text(yaml.safe_dump_all(numbered_pods(pods, 1), sort_keys=False))
    gpuwarden = shutil.which("gpuwarden", path=str(Path(sys.executable).parent)) or "gpuwarden"
    commands: list[tuple[str, Callable[[Path], list[str]]]] = [
        (
            "gpuwarden apply",
            lambda f: [
                gpuwarden, "apply", "--policies", str(DEFAULT_POLICIES),
                "--namespaces", str(NAMESPACES_FILE), "-o", "patch", str(f),
            ],
        )
    ]  # fmt: skip
    if kyverno is not None:
        values = kyverno_values_file(workdir / "kyverno-values.yaml")
        cli = str(kyverno.cli)
        commands.append(
            (
                "kyverno apply",
                lambda f: [
                    cli, "apply", str(KYVERNO_POLICIES / "mutate.yaml"),
                    str(KYVERNO_POLICIES / "validate.yaml"), "--values-file", str(values),
                    "--resource", str(f), "--remove-color",
                ],
            )
        )  # fmt: skip
    timings = []
    for name, argv in commands:
        time_command(argv(one))  # warm the page cache
        startup = min(time_command(argv(one)) for _ in range(2))
        timings.append(CliTiming(name, count, time_command(argv(many)), startup))
    return timings


# --- the run -----------------------------------------------------------------------------------


def machine_note() -> str:
    load1, _, _ = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {load1:.2f} at the start"


def run_mix(args: argparse.Namespace) -> int:
    """Per class of pod: pods/s and latency with no webhook, then with gpuwarden (each run after
    a control run of the same pods in kube-system), and the latency gpuwarden adds."""
    tools = Tools.load()
    classes = mix_pods()
    workdir = Path(tempfile.mkdtemp(prefix="gpuwarden-bench-mix-"))
    print(f"bench/apiserver.py --mix: {machine_note()}; work directory {workdir}", flush=True)
    runs: list[RunStats] = []
    context = multiprocessing.get_context("spawn")
    try:
        with (
            ControlPlane(tools, keep_workdir=args.keep) as plane,
            context.Pool(args.processes) as pool,
        ):
            prepare_cluster(plane, workdir / "cluster")

            def one_run(peer: str, clients: int, duration: float, batch: list[Obj]) -> RunStats:
                return measure(
                    peer,
                    clients,
                    kubeconfig=plane.kubeconfig_path,
                    pods=batch,
                    duration=duration,
                    warmup=args.warmup,
                    processes=args.processes,
                    pool=pool,
                )

            one_run("none", max(args.clients), 3.0, classes["cpu"])  # warm-up, unmeasured
            for name, pods in classes.items():
                for clients in args.clients:
                    runs.append(one_run(f"none/{name}", clients, args.duration, pods))
            with gpuwarden_webhooks(plane, workdir / "gpuwarden"):
                for name, pods in classes.items():
                    control = in_namespace(pods, CONTROL_NAMESPACE)
                    for clients in args.clients:
                        part = args.duration / args.rounds
                        controls, hooked = [], []
                        for _ in range(args.rounds):
                            controls.append(one_run(f"ctl/{name}", clients, part, control))
                            hooked.append(one_run(f"gpuwarden/{name}", clients, part, pods))
                        runs += [pooled(controls), pooled(hooked)]
        print()
        print(
            f"through the API server, dryRun=All, {args.duration:g} s per class and concurrency "
            f"(gpuwarden's in {args.rounds} runs, each after a control run of the same pods in "
            f"{CONTROL_NAMESPACE}): " + "; ".join(f"{k}: {len(v)} pods" for k, v in classes.items())
        )
        for line in format_runs(runs):
            print(line)
        by_key = {(run.peer, run.clients): run for run in runs}
        print(
            f"{'gpuwarden adds':<17}{'clients':>8}{'p50 +ms':>9}{'p99 +ms':>9}{'pods/s ratio':>14}"
        )
        for name in classes:
            for clients in args.clients:
                added = added_latency(
                    by_key[(f"gpuwarden/{name}", clients)], by_key[(f"ctl/{name}", clients)]
                )
                print(
                    f"{name:<17}{clients:>8}{added.p50_ms:>9.2f}{added.p99_ms:>9.2f}"
                    f"{added.throughput_ratio:>13.2f}x"
                )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.mix:
        return run_mix(args)
    tools = Tools.load()
    kyverno: KyvernoTools | None = None
    if not args.no_kyverno:
        try:
            kyverno = KyvernoTools.load()
        except FileNotFoundError as exc:
            raise SystemExit(f"{exc} (or pass --no-kyverno)") from None
    pods = example_pods()
    workdir = Path(tempfile.mkdtemp(prefix="gpuwarden-bench-apiserver-"))
    print(f"bench/apiserver.py: {machine_note()}; work directory {workdir}", flush=True)
    runs: list[RunStats] = []
    outputs: dict[str, dict[str, Obj]] = {}
    context = multiprocessing.get_context("spawn")
    try:
        with (
            ControlPlane(tools, keep_workdir=args.keep) as plane,
            context.Pool(args.processes) as pool,
        ):
            prepare_cluster(plane, workdir / "cluster")

            control_pods = in_namespace(pods, CONTROL_NAMESPACE)

            webhook_pids: list[int] = []
            groups: dict[str, Callable[[], Sequence[int]]] = {
                "kube-apiserver": lambda: pids_with(f"--cert-dir={plane.workdir}"),
                "etcd": lambda: pids_with(f"--data-dir={plane.workdir}"),
                "webhook": lambda: webhook_pids,
                "clients": lambda: [p.pid for p in multiprocessing.active_children() if p.pid],
            }

            def one_run(peer: str, clients: int, duration: float, batch: list[Obj]) -> RunStats:
                return measure(
                    peer,
                    clients,
                    groups=groups,
                    kubeconfig=plane.kubeconfig_path,
                    pods=batch,
                    duration=duration,
                    warmup=args.warmup,
                    processes=args.processes,
                    pool=pool,
                )

            def measure_all(peer: str, began: float) -> None:
                outputs[peer] = check_run(plane, peer, pods)
                print(f"  ready after {time.monotonic() - began:.1f} s", flush=True)
                if peer != "none":
                    check_run(plane, "none", control_pods)
                for clients in args.clients:
                    if peer == "none":
                        stats = [one_run(peer, clients, args.duration, pods)]
                    else:
                        # Control and webhook runs in turn, so both see the same machine.
                        part = args.duration / args.rounds
                        controls, hooked = [], []
                        for _ in range(args.rounds):
                            controls.append(one_run("ctl", clients, part, control_pods))
                            hooked.append(one_run(peer, clients, part, pods))
                        stats = [pooled(controls, control_name(peer)), pooled(hooked)]
                    for run in stats:
                        print("  " + format_runs([run])[1], flush=True)
                    runs.extend(stats)

            # The fresh API server's caches and the client processes' imports, unmeasured.
            one_run("none", max(args.clients), 3.0, pods)
            for peer in args.peers:
                print(f"{peer}:", flush=True)
                began = time.monotonic()
                if peer == "none":
                    measure_all(peer, began)
                elif peer == "echo":
                    with echo_webhooks(plane, workdir / "echo", pods[0]) as pids:
                        webhook_pids[:] = pids
                        measure_all(peer, began)
                elif peer == "gpuwarden":
                    with gpuwarden_webhooks(plane, workdir / "gpuwarden") as pids:
                        webhook_pids[:] = pids
                        measure_all(peer, began)
                elif kyverno is not None:
                    probe = next(p for p in pods if p["metadata"]["name"].startswith("alice-"))
                    with kyverno_webhooks(plane, kyverno, probe) as pids:
                        webhook_pids[:] = pids
                        measure_all(peer, began)
        print()
        print(
            f"through the API server: dryRun=All creations of the {len(pods)} example pods, "
            f"{args.duration:g} s per peer and concurrency (a webhook's in {args.rounds} runs, "
            f"each after a control run of the same pods in {CONTROL_NAMESPACE}, which no webhook "
            f"serves: the ctl- rows), {args.warmup:g} s warm-up per run, clients spread over "
            f"{args.processes} processes"
        )
        for line in format_runs(runs) + comparisons(runs):
            print(line)
        print(
            "CPU per created pod, from /proc of this run's processes only (others' processes on "
            "the machine excluded; the API server's time includes calling the webhooks):"
        )
        for line in format_cpu(runs):
            print(line)
        if args.keep:
            (workdir / "pods.json").write_text(json.dumps(outputs, indent=1, sort_keys=True))
        if "gpuwarden" in outputs and "kyverno" in outputs:
            for line in compare_outputs(outputs["gpuwarden"], outputs["kyverno"]):
                print(line)
        if not args.no_cli:
            print()
            for line in format_cli(cli_timings(pods, args.cli_pods, workdir, kyverno)):
                print(line)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
