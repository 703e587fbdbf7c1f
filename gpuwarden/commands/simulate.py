"""`gpuwarden simulate`: replay a workload trace on the scheduling lab, once per strategy."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from gpuwarden.commands._inputs import InputError, eprint, load_cluster
from gpuwarden.lab import simulate
from gpuwarden.lab.cluster.controlplane import (
    REPO_ROOT,
    ControlPlaneError,
    Tools,
    ToolsMissingError,
)
from gpuwarden.lab.cluster.nodes import GpuNodePool
from gpuwarden.lab.inputs.alibaba import (
    NODE_HEADER,
    is_alibaba_nodes,
    is_alibaba_pods,
    parse_alibaba_nodes,
    parse_alibaba_pods,
    parse_qos_mapping,
)
from gpuwarden.lab.inputs.defaulttrace import BUILTIN_TRACES, default_namespaces
from gpuwarden.lab.inputs.trace import TraceError, TraceRow, parse_seconds, parse_trace, trace_csv
from gpuwarden.lab.planning.follow import FollowPools
from gpuwarden.lab.planning.plan import (
    StrategyPlan,
    plan_strategy,
    services_note,
    settle_split,
    split_candidates,
    split_plan,
)
from gpuwarden.lab.planning.sizing import shared_slice_hours
from gpuwarden.lab.planning.strategies import (
    KUEUE_SUFFIX,
    NO_IDLE_SUFFIX,
    STAND_INS,
    Layout,
    Strategy,
    builtin_strategies,
    kueue_variant,
    offered_gpu_hours,
    strategy_from_paths,
    without_idle_rules,
)
from gpuwarden.lab.replay.fill import (
    FGD_TARGET,
    FILL_SCHEDULERS,
    FillPod,
    FillRun,
    fill_json,
    fill_mps_nodes,
    fill_pods,
    fill_table,
    run_fill,
)
from gpuwarden.lab.reporting.plot import PlotUnavailableError, write_png
from gpuwarden.lab.reporting.report import StrategyReport, TraceLoad, table
from gpuwarden.lab.reporting.sweep import (
    split_bound,
    split_figures,
    sweep_json,
    sweep_table,
    tenant_shares,
)
from gpuwarden.policy import PolicyError

HELP = (
    "Replay a workload trace on a lab cluster (kube-apiserver, kube-scheduler, KWOK GPU nodes) "
    "under each strategy and compare GPU work delivered, GPUs busy and allocated, tenants' waits "
    "and preemptions"
)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def register(parser: argparse.ArgumentParser) -> None:
    _trace_options(parser)
    _strategy_options(parser)
    _lab_options(parser)
    _output_options(parser)
    _fill_options(parser)


def _fill_options(parser: argparse.ArgumentParser) -> None:
    """The fill experiment (FGD's allocation ratio) instead of the replay."""
    parser.add_argument(
        "--fill",
        type=float,
        metavar="RATIO",
        help="instead of the replay: pods arrive in trace order and never leave until they ask "
        f"RATIO of the GPUs (FGD's experiment: {FGD_TARGET}; random trace pods added, or "
        "removed, with --seed), each scheduled once by kube-scheduler's default profile and "
        "by gpuwarden-binpack; prints the GPU allocation ratio of each",
    )
    parser.add_argument(
        "--fill-order",
        choices=("shuffled", "trace"),
        default="shuffled",
        help="--fill: the trace's pods shuffled with --seed, as FGD's published runs (default), "
        "or in trace order",
    )


def _trace_options(parser: argparse.ArgumentParser) -> None:
    """The trace to replay and how to read it."""
    parser.add_argument(
        "--trace",
        metavar="FILE|builtin:NAME",
        help="YAML or CSV trace, an Alibaba cluster-trace-gpu-v2023 pod list (by its header), "
        f"or a built-in trace ({', '.join('builtin:' + n for n in BUILTIN_TRACES)}; "
        "default builtin:week)",
    )
    parser.add_argument(
        "--node-list",
        metavar="FILE",
        help="the Alibaba trace's node list (openb_node_list_gpu_node.csv): the lab's GPU "
        "nodes instead of --nodes x --gpus-per-node",
    )
    parser.add_argument(
        "--node-sample",
        type=int,
        metavar="N",
        help="with --node-list: N of its GPU nodes, drawn with --seed (a few real nodes of "
        "mixed models, so that the trace's arrivals contend)",
    )
    parser.add_argument(
        "--qos",
        action="append",
        default=[],
        metavar="QOS=NAMESPACE:KIND",
        help="Alibaba traces: the tenant namespace and workload kind of a qos class "
        "(default LS=serving:kserve-predictor, BE=batch:katib-trial, "
        "Burstable=training:training-job, Guaranteed=training:training-job); repeatable",
    )
    parser.add_argument(
        "--window",
        metavar="START,END",
        help="Alibaba traces: replay the pods created from START to END (trace time: seconds "
        "or durations such as 2d, 3d12h)",
    )
    parser.add_argument(
        "--sample", type=int, metavar="N", help="Alibaba traces: replay N of the GPU pods"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="the --sample, --node-sample and --fill draws (default 0)",
    )
    parser.add_argument("--trace-format", choices=("yaml", "csv"), help="default: by extension")


def _strategy_options(parser: argparse.ArgumentParser) -> None:
    """The strategies to compare: the cluster's namespaces and the policy sets."""
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
        "-p",
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
        "the --policies ones; NAME+kueue: that strategy with a Kueue-queued tenant per namespace, "
        "its quota in proportion to what it asks for; NAME-no-idle: that strategy without its "
        "profiles' idle rules)",
    )


def _lab_options(parser: argparse.ArgumentParser) -> None:
    """The lab's clock and its GPU nodes."""
    parser.add_argument(
        "--real-time",
        type=float,
        default=360.0,
        metavar="SECONDS",
        help="wall-clock seconds the whole trace is replayed in (default 360)",
    )
    parser.add_argument(
        "--horizon",
        metavar="DURATION",
        help="simulated time to replay: seconds or durations such as 3d12h (default: the "
        "trace's end)",
    )
    parser.add_argument(
        "--nodes", type=int, default=8, metavar="N", help="the lab's GPU nodes (default 8)"
    )
    parser.add_argument(
        "--gpus-per-node", type=int, default=8, metavar="N", help="GPUs on each node (default 8)"
    )
    parser.add_argument(
        "--mps-nodes",
        type=_mps_nodes,
        default=None,
        metavar="N|auto|sweep[:N,...]|follow",
        help="nodes that share GPUs through MPS, for strategies that share (default auto: as many "
        "as the strategy's shared pods ask for at most at once, within what leaves whole-GPU "
        "work its share); sweep: replay each sharing strategy with the auto estimate and the "
        f"{SWEEP_SIZE - 1} other counts that leave the most work reachable (sweep:N,...: these "
        "counts) and recommend one; follow: start from auto's split and run gpuwarden "
        "pool-controller against the lab, which moves drained nodes between the pools through "
        "the device plugin's config label",
    )
    parser.add_argument(
        "--shared-headroom",
        type=int,
        metavar="N",
        help="--mps-nodes follow: free MPS replicas the controller keeps ready beyond what shared "
        "pods hold and wait for (its policy's pools.sharedHeadroom; default: "
        f"{FOLLOW_HEADROOM_GPUS} GPUs' replicas)",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="labs replayed at once (default: every strategy at once; with --mps-nodes sweep, "
        f"{SWEEP_PARALLEL})",
    )
    parser.add_argument(
        "--mps-replicas", type=int, default=4, metavar="N", help="MPS replicas per GPU (default 4)"
    )
    parser.add_argument(
        "--stand-in",
        choices=STAND_INS,
        default="mps",
        help="what replays Volcano and HAMi policies: mps (default): their shared profiles on "
        "MPS nodes of NVIDIA's device plugin, the rest on whole-GPU nodes; dra: every GPU node "
        "a DRA node of the lab's driver, where any GPU is shared or whole, allocated by "
        "kube-scheduler by GPU memory and a core share of 100 per device (the dra backend)",
    )


def _output_options(parser: argparse.ArgumentParser) -> None:
    """What is written: the table's format, the plot, the trace as replayed."""
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="the comparison as a table (default) or JSON",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="write the figures to a PNG")
    parser.add_argument(
        "--dump-trace",
        choices=("csv", "yaml"),
        help="print the trace that would be replayed, and exit",
    )


#: How many MPS node counts `--mps-nodes sweep` replays (the auto estimate among them), and how
#: many labs it replays at once (each lab takes most of a core).
SWEEP_SIZE, SWEEP_PARALLEL = 3, 2


#: --mps-nodes follow's sharedHeadroom unless --shared-headroom says: this many GPUs' replicas.
FOLLOW_HEADROOM_GPUS = 4


@dataclass(frozen=True)
class FollowDemand:
    """`--mps-nodes follow`: the MPS pool follows demand during the replay."""


@dataclass(frozen=True)
class SplitSweep:
    """`--mps-nodes sweep`: the counts to replay (empty: chosen by :func:`split_candidates`)."""

    counts: tuple[int, ...] = ()


def _mps_nodes(text: str) -> int | SplitSweep | FollowDemand | None:
    if text.strip() == "auto":
        return None
    if text.strip() == "follow":
        return FollowDemand()
    word, sep, listed = text.strip().partition(":")
    if word == "sweep":
        return _sweep_counts(listed) if sep else SplitSweep()
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of nodes, auto, sweep or follow"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more (or auto)")
    return value


def _sweep_counts(listed: str) -> SplitSweep:
    try:
        counts = tuple(sorted({int(n) for n in listed.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"sweep:{listed}: write sweep:N,N,... (MPS node counts)"
        ) from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"sweep:{listed}: each count must be 1 or more")
    return SplitSweep(counts)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None


def _window(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    start, sep, end = text.partition(",")
    try:
        if not sep:
            raise ValueError("write START,END")
        return parse_seconds(start), parse_seconds(end)
    except ValueError as exc:
        raise InputError(f"--window {text!r}: {exc}") from None


def _alibaba_only(args: argparse.Namespace) -> None:
    given = [
        flag
        for flag, value in (
            ("--qos", args.qos),
            ("--window", args.window),
            ("--sample", args.sample),
        )
        if value
    ]
    if given:
        raise InputError(f"{', '.join(given)}: only for an Alibaba pod list (--trace FILE.csv)")


def _trace(
    args: argparse.Namespace,
) -> tuple[list[TraceRow], dict[str, dict[str, str]]]:
    """The rows to replay and their tenant namespaces."""
    name = args.trace or "builtin:week"
    if name.startswith("builtin:"):
        _alibaba_only(args)
        generate = BUILTIN_TRACES.get(name.removeprefix("builtin:"))
        if generate is None:
            known = ", ".join("builtin:" + n for n in BUILTIN_TRACES)
            raise InputError(f"--trace {name}: no such built-in trace (have {known})")
        return generate(), _namespaces(args, default_namespaces())
    text = _read(name)
    if is_alibaba_pods(text):
        mapping = parse_qos_mapping(args.qos, "--qos")
        if args.sample is not None and args.sample < 1:
            raise InputError("--sample must be 1 or more")
        rows = parse_alibaba_pods(
            text,
            name,
            mapping,
            window=_window(args.window),
            sample=args.sample,
            seed=args.seed,
            gpu_memory_mib=None if args.node_list else Layout().gpu_memory_mib,
        )
        return rows, _namespaces(args, mapping.namespaces())
    _alibaba_only(args)
    namespaces = _namespaces(args, default_namespaces())
    return parse_trace(text, name, namespaces, fmt=args.trace_format), namespaces


def _namespaces(
    args: argparse.Namespace, default: dict[str, dict[str, str]]
) -> dict[str, dict[str, str]]:
    if not args.namespaces:
        return default
    view = load_cluster(args.namespaces)
    return {ns: dict(labels) for ns, labels in view.namespace_labels.items()}


def _layout(args: argparse.Namespace) -> Layout:
    if min(args.nodes, args.gpus_per_node, args.mps_replicas) < 1:
        raise InputError("--nodes, --gpus-per-node and --mps-replicas must be 1 or more")
    pools: tuple[GpuNodePool, ...] = ()
    if args.node_sample is not None and args.node_sample < 1:
        raise InputError("--node-sample must be 1 or more")
    if args.node_list:
        text = _read(args.node_list)
        if not is_alibaba_nodes(text):
            raise InputError(
                f"{args.node_list}: not an Alibaba node list (its header is not "
                f"{','.join(NODE_HEADER)})"
            )
        pools = tuple(
            parse_alibaba_nodes(text, args.node_list, sample=args.node_sample, seed=args.seed)
        )
    elif args.node_sample is not None:
        raise InputError("--node-sample: only with --node-list")
    mps = None if isinstance(args.mps_nodes, SplitSweep | FollowDemand) else args.mps_nodes
    dra = args.stand_in == "dra"
    if dra and args.mps_nodes is not None:
        raise InputError(
            "--mps-nodes: with --stand-in dra every GPU node is a DRA node, where any GPU is "
            "shared or whole: there are no MPS nodes to size, sweep or move (leave --mps-nodes out)"
        )
    return Layout(args.nodes, args.gpus_per_node, mps, args.mps_replicas, node_pools=pools, dra=dra)


def _strategies(
    args: argparse.Namespace, queued: Callable[[Strategy], Strategy] | None = None
) -> list[Strategy]:
    """The strategies to replay; ``queued`` makes a strategy's tenant-queue variant, which
    ``--only`` asks for as NAME+kueue."""
    strategies = builtin_strategies(REPO_ROOT / "policies", args.stand_in)
    for given in args.policies:
        name, sep, path = given.partition("=")
        if not sep:
            name, path = Path(given).stem, given
        if not Path(path).exists():
            raise InputError(f"--policies {given}: no such file or directory")
        strategies.append(strategy_from_paths(name, [Path(path)], args.stand_in))
    names = [s.name for s in strategies]
    if len(set(names)) != len(names):
        raise InputError(f"two strategies with the same name: {', '.join(names)}")
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        bases = {s.name: s for s in strategies if s.policies is not None}
        strategies += _without_idle(wanted, bases, names)
        for name in wanted:
            base = bases.get(name.removesuffix(KUEUE_SUFFIX))
            if name.endswith(KUEUE_SUFFIX) and args.stand_in == "dra":
                raise InputError(
                    f"--only {name}: with --stand-in dra, Kueue's quotas (per resource: "
                    "nvidia.com/gpu and MPS replicas) do not count DRA claims; replay it with "
                    "--stand-in mps"
                )
            if name.endswith(KUEUE_SUFFIX) and base is not None and queued is not None:
                strategies.append(queued(base))
                names.append(name)
        unknown = sorted(set(wanted) - set(names))
        if unknown or not wanted:
            raise InputError(f"--only: no strategy {', '.join(unknown)} (have {', '.join(names)})")
        strategies = [s for s in strategies if s.name in wanted]
    return strategies


def _without_idle(
    wanted: list[str], bases: dict[str, Strategy], names: list[str]
) -> list[Strategy]:
    """The NAME-no-idle strategies ``--only`` asks for (their names added to ``names``)."""
    out: list[Strategy] = []
    for name in wanted:
        base = bases.get(name.removesuffix(NO_IDLE_SUFFIX))
        if name.endswith(NO_IDLE_SUFFIX) and base is not None and name not in names:
            out.append(without_idle_rules(base))
            names.append(name)
    return out


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
                    "busy": r.busy,
                    **({"labels": dict(r.labels)} if r.labels else {}),
                    **({"checkpoint": r.checkpoint} if r.checkpoint is not None else {}),
                    **({"run": r.run} if r.run is not None else {}),
                    **({"products": list(r.gpu_products)} if r.gpu_products else {}),
                }
                for r in rows
            ]
        },
        sort_keys=False,
    )


def _plan(args: argparse.Namespace) -> simulate.Plan | None:
    rows, namespaces = _trace(args)
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
    layout = _layout(args)
    demand = offered_gpu_hours(rows, horizon)
    plans: dict[str, StrategyPlan] = {}

    def planned(strategy: Strategy) -> StrategyPlan:
        # Once per strategy: a tenant-queue variant's base is planned for its sizing.
        if strategy.name not in plans:
            sized = plan_strategy(strategy, layout, rows, namespaces)
            if layout.mps_nodes is None:
                sized = settle_split(sized, rows, _reachable(rows, layout, horizon, sized))
            plans[strategy.name] = sized
        return plans[strategy.name]

    def queued(base: Strategy) -> Strategy:
        # The MPS nodes the base strategy gets, which its tenants' sharedGpus add up to.
        sized = planned(base)
        shared = shared_slice_hours(rows, sized.decisions, horizon) if base.shares else {}
        return kueue_variant(base, namespaces, demand, sized.layout, shared)

    strategies = [_with_services_note(planned(s), rows, horizon) for s in _strategies(args, queued)]
    return simulate.Plan(rows, strategies, layout, namespaces, horizon, args.real_time)


def _with_services_note(
    plan: StrategyPlan, rows: Sequence[TraceRow], horizon: float
) -> StrategyPlan:
    note = services_note(plan, rows, horizon)
    return plan if note is None else replace(plan, notes=(*plan.notes, note))


@dataclass(frozen=True)
class Swept:
    """A sharing strategy replayed once per MPS node count: its name, its auto estimate, and
    each split's replayed strategy name, MPS nodes and their GPUs."""

    strategy: str
    auto: int
    splits: tuple[tuple[str, int, int], ...]


def _sweep(plan: simulate.Plan, sweep: SplitSweep) -> tuple[simulate.Plan, list[Swept]]:
    """The plan with each sharing strategy replaced by one per swept split (tenant-queue
    variants keep the split their quotas were made for)."""
    if sweep.counts and sweep.counts[-1] > plan.layout.node_count:
        raise InputError(
            f"--mps-nodes sweep:{','.join(map(str, sweep.counts))}: the lab has "
            f"{plan.layout.node_count} nodes"
        )
    strategies: list[StrategyPlan] = []
    swept: list[Swept] = []
    for planned in plan.strategies:
        if not planned.strategy.shares or planned.strategy.kueue:
            strategies.append(planned)
            continue
        counts = list(sweep.counts) or split_candidates(
            planned,
            plan.rows,
            SWEEP_SIZE,
            _reachable(plan.rows, plan.layout, plan.horizon, planned),
        )
        splits = [
            _with_services_note(split_plan(planned, n), plan.rows, plan.horizon) for n in counts
        ]
        strategies += splits
        swept.append(
            Swept(
                planned.strategy.name,
                planned.layout.mps_nodes or 0,
                tuple(
                    (p.strategy.name, n, p.layout.mps_gpus(True))
                    for p, n in zip(splits, counts, strict=True)
                ),
            )
        )
    return replace(plan, strategies=strategies), swept


def _follow(plan: simulate.Plan, headroom: int | None) -> simulate.Plan:
    """The plan with each sharing strategy's pools following demand from its split."""
    queued = [p.strategy.name for p in plan.strategies if p.strategy.kueue]
    if queued:
        raise InputError(
            f"--mps-nodes follow: {', '.join(queued)}: Kueue's quotas are per resource and fixed "
            "(quota.sharedGpus counts the MPS nodes' GPUs), so its pools cannot follow demand; "
            "replay it with --mps-nodes auto, N or sweep"
        )
    layout = plan.layout
    if headroom is None:
        headroom = FOLLOW_HEADROOM_GPUS * layout.mps_replicas
    follow = FollowPools(headroom)
    strategies = [
        replace(
            planned,
            follow=follow,
            notes=(
                *planned.notes,
                follow.note(planned.layout.mps_nodes or 0, layout.node_count),
            ),
        )
        if planned.strategy.shares
        else planned
        for planned in plan.strategies
    ]
    return replace(plan, strategies=strategies)


def _reachable(
    rows: Sequence[TraceRow], layout: Layout, horizon: float, planned: StrategyPlan
) -> Callable[[int], float]:
    """A count of MPS nodes' split bound for the strategy (GPU-hours)."""
    node_gpus = layout.mps_candidates

    def bound(mps_nodes: int) -> float:
        return split_bound(
            rows,
            planned.decisions,
            gpus=layout.physical_gpus,
            mps_gpus=sum(node_gpus[:mps_nodes]),
            replicas=layout.mps_replicas,
            horizon=horizon,
        )

    return bound


def _replay(plan: simulate.Plan, tools: Tools, parallel: int | None) -> list[StrategyReport]:
    """Every strategy's report, ``parallel`` labs at a time (None: all at once)."""
    if parallel is None or parallel >= len(plan.strategies):
        return simulate.run(plan, tools, progress=sys.stderr)
    reports: list[StrategyReport] = []
    for start in range(0, len(plan.strategies), parallel):
        batch = replace(plan, strategies=plan.strategies[start : start + parallel])
        reports += simulate.run(batch, tools, progress=sys.stderr)
    return reports


def _sweep_outputs(
    plan: simulate.Plan, swept: Sequence[Swept], reports: Sequence[StrategyReport], load: TraceLoad
) -> tuple[list[str], list[dict[str, object]]]:
    """Each swept strategy's table and JSON, judged against no governance where it ran."""
    by_name = {r.strategy: r for r in reports}
    plans = {p.strategy.name: p for p in plan.strategies}

    free = by_name.get("no-governance")
    baseline = tenant_shares(free) if free is not None else None
    tables: list[str] = []
    bodies: list[dict[str, object]] = []
    for one in swept:
        figures = [
            split_figures(
                by_name[name],
                n,
                gpus,
                load,
                _reachable(plan.rows, plan.layout, plan.horizon, plans[name])(n),
            )
            for name, n, gpus in one.splits
        ]
        tables.append(sweep_table(one.strategy, one.auto, figures, baseline))
        bodies.append(sweep_json(one.strategy, one.auto, figures, baseline))
    return tables, bodies


def _mps_nodes_json(asked: object, layout: Layout) -> str | int:
    if layout.dra:
        return 0
    if isinstance(asked, FollowDemand):
        return "follow"
    return "auto" if layout.mps_nodes is None else layout.mps_nodes


def interruptible() -> None:
    """Let Ctrl-C stop the replay even where SIGINT was ignored at start (``nohup``, ``&`` jobs,
    some CI runners): Python then installs no KeyboardInterrupt handler of its own. Only the
    main thread may set handlers; elsewhere the caller's stay."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


_LAB_ERRORS = (
    ToolsMissingError,
    ControlPlaneError,
    ApiException,
    urllib3.exceptions.HTTPError,
    OSError,
)


def _lab_failed(exc: BaseException) -> int:
    """Say why the lab failed; the exit status."""
    if isinstance(exc, ToolsMissingError):
        eprint(f"error: {exc}")
        return EXIT_USAGE
    if isinstance(exc, ControlPlaneError):
        eprint(f"error: the lab did not come up: {exc}")
        return EXIT_FAILED
    eprint(f"error: the lab's API server failed a request: {exc}")
    return EXIT_FAILED


def run(args: argparse.Namespace) -> int:
    interruptible()
    if args.fill is not None:
        return _run_fill(args)
    sweep = args.mps_nodes if isinstance(args.mps_nodes, SplitSweep) else None
    follow = isinstance(args.mps_nodes, FollowDemand)
    swept: list[Swept] = []
    try:
        if args.parallel is not None and args.parallel < 1:
            raise InputError("--parallel must be 1 or more")
        if args.shared_headroom is not None and not follow:
            raise InputError("--shared-headroom: only with --mps-nodes follow")
        if args.shared_headroom is not None and args.shared_headroom < 0:
            raise InputError("--shared-headroom must be 0 or more")
        plan = _plan(args)
        if plan is not None and sweep is not None:
            plan, swept = _sweep(plan, sweep)
        if plan is not None and follow:
            plan = _follow(plan, args.shared_headroom)
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
        parallel = args.parallel if args.parallel or sweep is None else SWEEP_PARALLEL
        reports = _replay(plan, tools, parallel)
    except _LAB_ERRORS as exc:
        return _lab_failed(exc)
    load = simulate.plan_load(plan)
    sweep_tables, sweep_bodies = _sweep_outputs(plan, swept, reports, load)
    if args.output == "json":
        body = {
            **load.as_json(),
            "scale": plan.scale,
            "layout": {
                "nodes": plan.layout.node_count,
                "physicalGpus": plan.layout.physical_gpus,
                "gpusPerNode": plan.layout.gpus_per_node,
                "mpsNodes": _mps_nodes_json(args.mps_nodes, plan.layout),
                "mpsReplicas": plan.layout.mps_replicas,
                **({"standIn": "dra"} if plan.layout.dra else {}),
            },
            "strategies": [r.as_json(load) for r in reports],
            **({"mpsSweep": sweep_bodies} if sweep is not None else {}),
        }
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        sys.stdout.write(table(reports, load) + "\n")
        for text in sweep_tables:
            sys.stdout.write("\n" + text + "\n")
    if args.plot:
        try:
            write_png(reports, Path(args.plot))
        except PlotUnavailableError as exc:
            eprint(f"error: {exc}")
            return EXIT_USAGE
        eprint(f"wrote {args.plot}")
    return EXIT_OK


# -- the fill experiment ------------------------------------------------------------------------


def _fill_plan(args: argparse.Namespace) -> tuple[list[FillPod], Layout]:
    """The pods that arrive and the layout with its MPS nodes resolved."""
    given = [
        flag
        for flag, value in (
            ("--only", args.only),
            ("--policies", args.policies),
            ("--mps-nodes sweep", isinstance(args.mps_nodes, SplitSweep)),
            ("--mps-nodes follow", isinstance(args.mps_nodes, FollowDemand)),
        )
        if value
    ]
    if args.stand_in == "dra":
        raise InputError(
            "--fill: its fractional pods are placed on MPS slices; --stand-in dra has no MPS "
            "nodes (leave --stand-in out)"
        )
    if given:
        raise InputError(
            f"{', '.join(given)}: --fill compares kube-scheduler profiles "
            f"({', '.join(FILL_SCHEDULERS)}), not policies or pool splits"
        )
    if not args.fill > 0 or args.fill > 100:
        raise InputError(f"--fill {args.fill}: a share of the GPUs above 0 (1.3 is 130%)")
    rows, _ = _trace(args)
    layout = _layout(args)
    try:
        pods = fill_pods(
            rows, layout.physical_gpus, args.fill, args.seed, shuffle=args.fill_order == "shuffled"
        )
    except ValueError as exc:
        raise InputError(f"--fill: {exc}") from None
    mps = args.mps_nodes
    if mps is None:
        mps = fill_mps_nodes(layout.mps_candidates, pods, args.mps_replicas)
    return pods, replace(layout, mps_nodes=mps)


def _run_fill(args: argparse.Namespace) -> int:
    try:
        pods, layout = _fill_plan(args)
    except (InputError, TraceError) as exc:
        eprint(f"error: {exc}")
        return EXIT_USAGE
    pools = layout.pools(shares=True)
    runs: list[FillRun] = []

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            sys.stderr.write(f"\r{done:,} of {total:,} pods")
            sys.stderr.flush()

    try:
        tools = Tools.load()
        for scheduler in FILL_SCHEDULERS:
            eprint(f"{scheduler}: {len(pods):,} pods on {layout.node_count:,} nodes")
            runs.append(run_fill(pods, pools, scheduler, tools, args.mps_replicas, progress))
            if sys.stderr.isatty():
                sys.stderr.write("\n")
    except _LAB_ERRORS as exc:
        return _lab_failed(exc)
    summary = {
        "target": args.fill,
        "order": args.fill_order,
        "seed": args.seed,
        "capacityGpus": layout.physical_gpus,
        "nodes": layout.node_count,
        "mpsNodes": layout.mps_nodes,
        "mpsGpus": layout.mps_gpus(shares=True),
        "mpsReplicas": args.mps_replicas,
        "pods": len(pods),
        "sharedPods": sum(1 for p in pods if p.shared),
    }
    if args.output == "json":
        sys.stdout.write(json.dumps(fill_json(runs, summary), indent=2) + "\n")
    else:
        text = fill_table(
            runs,
            capacity_gpus=layout.physical_gpus,
            nodes=layout.node_count,
            mps_nodes=layout.mps_nodes or 0,
            mps_gpus=layout.mps_gpus(shares=True),
            replicas=args.mps_replicas,
            pods=pods,
            target=args.fill,
        )
        sys.stdout.write(text + "\n")
    return EXIT_OK
