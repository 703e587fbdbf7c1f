"""Pod creation through a real kube-apiserver: no webhook, gpuwarden, and Kyverno (issue 13).

One etcd + kube-apiserver on loopback (gpuwarden.lab.cluster.controlplane, the e2e suites' control plane)
serves four runs in one go:

* **none**: no admission webhook is registered;
* **echo**: bench/load.py's bare handler (answers allowed, no patch) behind the chart's webhook
  configurations: what calling any mutating + validating pair costs the API server;
* **gpuwarden**: ``gpuwarden serve`` with the chart's Mutating and Validating
  WebhookConfigurations, set up exactly as the e2e suites do it (gpuwarden.lab.cluster.webhookstack);
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

This file is the command line and the order of the runs; apiserver_pods.py holds the pods,
apiserver_load.py the clients and CPU accounting, apiserver_webhooks.py and apiserver_kyverno.py
the webhooks, apiserver_offline.py the CLIs, apiserver_stats.py and apiserver_report.py the
figures and what is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.apiserver_kyverno import KyvernoTools, kyverno_webhooks  # noqa: E402
from bench.apiserver_load import Runner, interleaved, pids_with  # noqa: E402
from bench.apiserver_offline import cli_timings  # noqa: E402
from bench.apiserver_pods import (  # noqa: E402
    CONTROL_NAMESPACE,
    Obj,
    example_pods,
    in_namespace,
    mix_pods,
)
from bench.apiserver_report import (  # noqa: E402
    compare_outputs,
    comparisons,
    format_cli,
    format_cpu,
    format_runs,
)
from bench.apiserver_stats import RunStats, added_latency, control_name  # noqa: E402
from bench.apiserver_webhooks import (  # noqa: E402
    check_run,
    echo_webhooks,
    gpuwarden_webhooks,
    prepare_cluster,
)
from gpuwarden.lab.cluster.controlplane import ControlPlane, Tools  # noqa: E402

PEERS = ("none", "echo", "gpuwarden", "kyverno")


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


# --- the runs ----------------------------------------------------------------------------------


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
            runner = Runner(plane.kubeconfig_path, pool, args.warmup, args.processes)
            runner("none", max(args.clients), 3.0, classes["cpu"])  # warm-up, unmeasured
            for name, pods in classes.items():
                for clients in args.clients:
                    runs.append(runner(f"none/{name}", clients, args.duration, pods))
            with gpuwarden_webhooks(plane, workdir / "gpuwarden"):
                for name, pods in classes.items():
                    control = in_namespace(pods, CONTROL_NAMESPACE)
                    for clients in args.clients:
                        runs += interleaved(
                            runner,
                            clients,
                            args.duration,
                            args.rounds,
                            control=(f"ctl/{name}", control),
                            hooked=(f"gpuwarden/{name}", pods),
                        )
        print_mix(args, classes, runs)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def print_mix(
    args: argparse.Namespace, classes: dict[str, list[Obj]], runs: list[RunStats]
) -> None:
    print()
    print(
        f"through the API server, dryRun=All, {args.duration:g} s per class and concurrency "
        f"(gpuwarden's in {args.rounds} runs, each after a control run of the same pods in "
        f"{CONTROL_NAMESPACE}): " + "; ".join(f"{k}: {len(v)} pods" for k, v in classes.items())
    )
    for line in format_runs(runs):
        print(line)
    by_key = {(run.peer, run.clients): run for run in runs}
    print(f"{'gpuwarden adds':<17}{'clients':>8}{'p50 +ms':>9}{'p99 +ms':>9}{'pods/s ratio':>14}")
    for name in classes:
        for clients in args.clients:
            added = added_latency(
                by_key[(f"gpuwarden/{name}", clients)], by_key[(f"ctl/{name}", clients)]
            )
            print(
                f"{name:<17}{clients:>8}{added.p50_ms:>9.2f}{added.p99_ms:>9.2f}"
                f"{added.throughput_ratio:>13.2f}x"
            )


def kyverno_tools(args: argparse.Namespace) -> KyvernoTools | None:
    """Kyverno's build from the cache, unless it is left out."""
    if args.no_kyverno:
        return None
    try:
        return KyvernoTools.load()
    except FileNotFoundError as exc:
        raise SystemExit(f"{exc} (or pass --no-kyverno)") from None


def cpu_groups(
    plane: ControlPlane, webhook_pids: list[int]
) -> dict[str, Callable[[], Sequence[int]]]:
    """The processes whose CPU each run counts; ``webhook_pids`` is filled in per peer."""
    return {
        "kube-apiserver": lambda: pids_with(f"--cert-dir={plane.workdir}"),
        "etcd": lambda: pids_with(f"--data-dir={plane.workdir}"),
        "webhook": lambda: webhook_pids,
        "clients": lambda: [p.pid for p in multiprocessing.active_children() if p.pid],
    }


def peer_webhooks(
    peer: str, plane: ControlPlane, workdir: Path, pods: list[Obj], kyverno: KyvernoTools | None
) -> contextlib.AbstractContextManager[list[int] | None]:
    """The webhooks of ``peer`` while they are registered, as their processes' ids (none: no
    process; None: a peer that cannot run here)."""
    if peer == "none":
        return contextlib.nullcontext([])
    if peer == "echo":
        return echo_webhooks(plane, workdir / "echo", pods[0])
    if peer == "gpuwarden":
        return gpuwarden_webhooks(plane, workdir / "gpuwarden")
    if kyverno is None:
        return contextlib.nullcontext(None)
    probe = next(p for p in pods if p["metadata"]["name"].startswith("alice-"))
    return kyverno_webhooks(plane, kyverno, probe)


def measure_peer(
    args: argparse.Namespace, plane: ControlPlane, runner: Runner, peer: str, pods: list[Obj]
) -> list[RunStats]:
    """Each concurrency's runs of one peer (a webhook's interleaved with control runs)."""
    control_pods = in_namespace(pods, CONTROL_NAMESPACE)
    runs: list[RunStats] = []
    if peer != "none":
        check_run(plane, "none", control_pods)
    for clients in args.clients:
        if peer == "none":
            stats: Sequence[RunStats] = [runner(peer, clients, args.duration, pods)]
        else:
            # Control and webhook runs in turn, so both see the same machine.
            stats = interleaved(
                runner,
                clients,
                args.duration,
                args.rounds,
                control=(control_name(peer), control_pods),
                hooked=(peer, pods),
            )
        for run in stats:
            print("  " + format_runs([run])[1], flush=True)
        runs += stats
    return runs


def print_runs(
    args: argparse.Namespace,
    pods: list[Obj],
    runs: list[RunStats],
    outputs: dict[str, dict[str, Obj]],
) -> None:
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
    if "gpuwarden" in outputs and "kyverno" in outputs:
        for line in compare_outputs(outputs["gpuwarden"], outputs["kyverno"]):
            print(line)


def run(args: argparse.Namespace) -> int:
    if args.mix:
        return run_mix(args)
    tools = Tools.load()
    kyverno = kyverno_tools(args)
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
            webhook_pids: list[int] = []
            groups = cpu_groups(plane, webhook_pids)
            runner = Runner(plane.kubeconfig_path, pool, args.warmup, args.processes, groups)
            # The fresh API server's caches and the client processes' imports, unmeasured.
            runner("none", max(args.clients), 3.0, pods)
            for peer in args.peers:
                print(f"{peer}:", flush=True)
                began = time.monotonic()
                with peer_webhooks(peer, plane, workdir, pods, kyverno) as pids:
                    if pids is None:
                        continue
                    webhook_pids[:] = pids
                    outputs[peer] = check_run(plane, peer, pods)
                    print(f"  ready after {time.monotonic() - began:.1f} s", flush=True)
                    runs += measure_peer(args, plane, runner, peer, pods)
        print_runs(args, pods, runs, outputs)
        if args.keep:
            (workdir / "pods.json").write_text(json.dumps(outputs, indent=1, sort_keys=True))
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
