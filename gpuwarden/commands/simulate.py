"""`gpuwarden simulate`: replay a workload trace on the scheduling lab, once per strategy."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from gpuwarden.commands._inputs import InputError, eprint, load_cluster
from gpuwarden.lab import simulate
from gpuwarden.lab.controlplane import REPO_ROOT, ControlPlaneError, Tools, ToolsMissingError
from gpuwarden.lab.defaulttrace import default_namespaces, default_trace
from gpuwarden.lab.plot import PlotUnavailableError, write_png
from gpuwarden.lab.report import table
from gpuwarden.lab.strategies import Layout, Strategy, builtin_strategies, strategy_from_paths
from gpuwarden.lab.trace import TraceError, TraceRow, parse_seconds, parse_trace, trace_csv
from gpuwarden.policy import PolicyError

HELP = (
    "Replay a workload trace on a lab cluster (kube-apiserver, kube-scheduler, KWOK GPU nodes) "
    "under each strategy and compare GPU allocation, memory use, waits and preemptions"
)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace", metavar="FILE", help="YAML or CSV trace (default: the built-in week)"
    )
    parser.add_argument("--trace-format", choices=("yaml", "csv"), help="default: by extension")
    parser.add_argument(
        "--namespaces",
        action="append",
        default=[],
        metavar="FILE",
        help="Namespace manifests of the trace's tenants (default: the built-in trace's four "
        "Kubeflow Profile namespaces); repeatable",
    )
    parser.add_argument(
        "--policies",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="one more strategy: this policy file or directory (named NAME, else after the "
        "path); repeatable",
    )
    parser.add_argument(
        "--only",
        metavar="NAME,...",
        help="replay only these strategies (of no-governance, sharing-only, default-policy and "
        "the --policies ones)",
    )
    parser.add_argument(
        "--real-time",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="wall-clock seconds the whole trace is replayed in (default 180)",
    )
    parser.add_argument("--horizon", help="simulated time to replay (default: the trace's end)")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument(
        "--mps-nodes",
        type=int,
        default=2,
        help="nodes that share GPUs through MPS, for strategies that share (default 2)",
    )
    parser.add_argument("--mps-replicas", type=int, default=4, help="MPS replicas per GPU")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    parser.add_argument("--plot", metavar="FILE.png", help="write the figures to a PNG")
    parser.add_argument(
        "--dump-trace",
        choices=("csv", "yaml"),
        help="print the trace that would be replayed, and exit",
    )


def _rows(args: argparse.Namespace, namespaces: dict[str, dict[str, str]]) -> list[TraceRow]:
    if args.trace is None:
        return default_trace()
    try:
        text = Path(args.trace).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{args.trace}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{args.trace}: not a text file") from None
    return parse_trace(text, args.trace, namespaces, fmt=args.trace_format)


def _namespaces(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    if not args.namespaces:
        return default_namespaces()
    view = load_cluster(args.namespaces)
    return {ns: dict(labels) for ns, labels in view.namespace_labels.items()}


def _strategies(args: argparse.Namespace) -> list[Strategy]:
    strategies = builtin_strategies(REPO_ROOT / "policies")
    for given in args.policies:
        name, sep, path = given.partition("=")
        if not sep:
            name, path = Path(given).stem, given
        if not Path(path).exists():
            raise InputError(f"--policies {given}: no such file or directory")
        strategies.append(strategy_from_paths(name, [Path(path)]))
    names = [s.name for s in strategies]
    if len(set(names)) != len(names):
        raise InputError(f"two strategies with the same name: {', '.join(names)}")
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown or not wanted:
            raise InputError(f"--only: no strategy {', '.join(unknown)} (have {', '.join(names)})")
        strategies = [s for s in strategies if s.name in wanted]
    return strategies


def _dump(rows: list[TraceRow], fmt: str) -> str:
    if fmt == "csv":
        return trace_csv(rows)
    return yaml.safe_dump(
        {
            "rows": [
                {
                    "at": r.at,
                    "namespace": r.namespace,
                    "kind": r.kind,
                    "name": r.name,
                    "gpus": r.gpus,
                    "duration": r.duration,
                    "memory": f"{int(r.memory_used / 2**20)}Mi",
                    **({"labels": dict(r.labels)} if r.labels else {}),
                }
                for r in rows
            ]
        },
        sort_keys=False,
    )


def _plan(args: argparse.Namespace) -> simulate.Plan | None:
    namespaces = _namespaces(args)
    rows = _rows(args, namespaces)
    if args.dump_trace:
        sys.stdout.write(_dump(rows, args.dump_trace))
        return None
    try:
        horizon = (
            parse_seconds(args.horizon) if args.horizon else max(r.at + r.duration for r in rows)
        )
    except ValueError as exc:
        raise InputError(f"--horizon: {exc}") from None
    if horizon <= 0 or args.real_time <= 0:
        raise InputError("--horizon and --real-time must be above 0")
    if min(args.nodes, args.gpus_per_node, args.mps_replicas) < 1 or args.mps_nodes < 0:
        raise InputError("--nodes, --gpus-per-node and --mps-replicas must be 1 or more")
    layout = Layout(args.nodes, args.gpus_per_node, args.mps_nodes, args.mps_replicas)
    return simulate.Plan(rows, _strategies(args), layout, namespaces, horizon, args.real_time)


def run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except (InputError, TraceError) as exc:
        eprint(f"error: {exc}")
        return EXIT_USAGE
    except PolicyError as exc:
        for issue in exc.issues:
            eprint(f"error: {issue}")
        return EXIT_USAGE
    if plan is None:
        return EXIT_OK
    try:
        tools = Tools.load()
        reports = simulate.run(plan, tools, progress=sys.stderr)
    except ToolsMissingError as exc:
        eprint(f"error: {exc}")
        return EXIT_USAGE
    except ControlPlaneError as exc:
        eprint(f"error: the lab did not come up: {exc}")
        return EXIT_FAILED
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        eprint(f"error: the lab's API server failed a request: {exc}")
        return EXIT_FAILED
    if args.output == "json":
        body = {
            "scale": plan.scale,
            "layout": {
                "nodes": plan.layout.nodes,
                "gpusPerNode": plan.layout.gpus_per_node,
                "mpsNodes": plan.layout.mps_nodes,
                "mpsReplicas": plan.layout.mps_replicas,
            },
            "strategies": [r.as_json() for r in reports],
        }
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        sys.stdout.write(table(reports) + "\n")
    if args.plot:
        try:
            write_png(reports, Path(args.plot))
        except PlotUnavailableError as exc:
            eprint(f"error: {exc}")
            return EXIT_USAGE
        eprint(f"wrote {args.plot}")
    return EXIT_OK
