"""`gpuwarden node-agent`: the DaemonSet process on GPU nodes (MPS limits, enforcement, metrics)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from gpuwarden.commands.shared import LOG_LEVELS
from gpuwarden.kube.client import KubeConfigError, api_client
from gpuwarden.kube.node_pods import NodeCluster
from gpuwarden.node import mps
from gpuwarden.node.agent import ON_VIOLATION, AgentConfig, NodeAgent, run_loop, run_once
from gpuwarden.node.hardlimits import detect_memory_limits
from gpuwarden.node.metrics import agent_registry
from gpuwarden.node.nvml import NvmlError, PynvmlNvml
from gpuwarden.node.procfs import ProcFs
from gpuwarden.policy.pod.quantity import QuantityError, parse_non_negative

HELP = "Run the node agent: MPS limits from pod policies, GPU-memory enforcement, metrics."

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_PREFIX = "gpuwarden node-agent"


def register(parser: argparse.ArgumentParser) -> None:
    _node_options(parser)
    _mps_options(parser)
    _metrics_options(parser)
    _host_options(parser)


def _node_options(parser: argparse.ArgumentParser) -> None:
    """Which node, which cluster, how often, and what a violation does."""
    parser.add_argument(
        "--node-name",
        default=None,
        metavar="NAME",
        help="this node's name (the pods watched are those with spec.nodeName equal to it; "
        "default: $NODE_NAME)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        metavar="FILE",
        help="kubeconfig (default: in-cluster)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between enforcement passes (default 10)",
    )
    parser.add_argument(
        "--on-violation",
        choices=ON_VIOLATION,
        default="event",
        help="for a container over its cap or using a GPU it was not granted, beyond an Event "
        "and a metric: terminate its MPS clients, or evict the pod",
    )


def _mps_options(parser: argparse.ArgumentParser) -> None:
    """Where the MPS control daemon and its pipes are, and how it is started."""
    parser.add_argument(
        "--mps-root",
        type=Path,
        default=Path(mps.DEVICE_PLUGIN_ROOT),
        metavar="DIR",
        help="the MPS root of NVIDIA's device plugin (its chart's mps.root); the daemon's "
        "directories are <root>/<resource>/pipe and <root>/<resource>/log",
    )
    parser.add_argument(
        "--mps-resource",
        default=mps.DEVICE_PLUGIN_RESOURCE,
        metavar="RESOURCE",
        help="the resource the device plugin shares through MPS: nvidia.com/gpu, or "
        "nvidia.com/gpu.shared where its sharing config sets renameByDefault",
    )
    parser.add_argument(
        "--mps-pipe-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the MPS daemon's pipe directory (default: <root>/<resource>/pipe)",
    )
    parser.add_argument(
        "--mps-log-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the MPS daemon's log directory (default: <root>/<resource>/log)",
    )
    parser.add_argument(
        "--mps-control-bin",
        default="nvidia-cuda-mps-control",
        metavar="PATH",
        help="the MPS control program (default nvidia-cuda-mps-control, found on PATH)",
    )
    parser.add_argument(
        "--mps-replicas",
        type=int,
        default=None,
        metavar="N",
        help="the replicas NVIDIA's device plugin makes of each GPU for MPS (its sharing "
        "config's replicas): an MPS slice is then reported as 1/N of a GPU allocated (default: "
        "sized by the pod's thread percentage, else its memory cap)",
    )
    parser.add_argument(
        "--mps-daemon",
        choices=("manage", "external", "off"),
        default="manage",
        help="manage: start the MPS control daemon when none answers; external: another "
        "component runs it (NVIDIA's device plugin in MPS mode); off: no MPS at all, where "
        "pods share GPUs through HAMi-core (the volcano and hami backends): monitoring only",
    )


def _metrics_options(parser: argparse.ArgumentParser) -> None:
    """The metrics endpoint, and the limits enforced beyond MPS."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9400,
        metavar="PORT",
        help="Prometheus metrics port (default 9400; 0: none)",
    )
    parser.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        metavar="HOST",
        help="address the metrics port listens on (default 0.0.0.0)",
    )
    parser.add_argument(
        "--hard-limits",
        choices=("auto", "off"),
        default="auto",
        help="cgroup hard GPU-memory limits where the driver offers `nvidia-smi memory-limits`",
    )
    parser.add_argument(
        "--memory-ceiling",
        default=None,
        metavar="QUANTITY",
        help="never let the MPS daemon default exceed this (e.g. 20Gi)",
    )


def _host_options(parser: argparse.ArgumentParser) -> None:
    """The host's /proc and cgroups, one-pass mode, logging."""
    parser.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        metavar="DIR",
        help="the host's /proc, to find GPU processes' pods (default /proc)",
    )
    parser.add_argument(
        "--cgroup-root",
        type=Path,
        default=Path("/sys/fs/cgroup"),
        metavar="DIR",
        help="the host's cgroup filesystem, for hard limits (default /sys/fs/cgroup)",
    )
    parser.add_argument(
        "--once", action="store_true", help="run one pass, print its report as JSON, and exit"
    )
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="log verbosity (default info)"
    )


def _fail(message: str, code: int) -> int:
    print(f"{_PREFIX}: {message}", file=sys.stderr)
    return code


def _config(args: argparse.Namespace) -> AgentConfig | str:
    node = args.node_name or os.environ.get("NODE_NAME", "")
    if not node.strip():
        return "--node-name is required (or set NODE_NAME, e.g. from the downward API)"
    if not args.interval > 0:
        return f"--interval must be a positive number of seconds, not {args.interval}"
    if not 0 <= args.metrics_port <= 65535:
        return f"--metrics-port must be 0-65535, not {args.metrics_port}"
    ceiling: int | None = None
    if args.memory_ceiling is not None:
        try:
            ceiling = int(parse_non_negative(args.memory_ceiling))
        except QuantityError as exc:
            return f"--memory-ceiling: {exc}"
        if ceiling < 2**20:
            return f"--memory-ceiling {args.memory_ceiling} is below 1Mi"
    if args.mps_replicas is not None and args.mps_replicas < 1:
        return f"--mps-replicas must be at least 1, not {args.mps_replicas}"
    try:
        mps.device_plugin_directories(args.mps_root, args.mps_resource)
    except ValueError as exc:
        return f"--mps-resource: {exc}"
    return AgentConfig(
        node_name=node.strip(),
        on_violation=args.on_violation,
        memory_ceiling=ceiling,
        cgroup_root=args.cgroup_root,
        manage_daemon=args.mps_daemon == "manage",
        mps_replicas=args.mps_replicas,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("gpuwarden.node")
    config = _config(args)
    if isinstance(config, str):
        return _fail(config, EXIT_USAGE)
    try:
        api = api_client(args.kubeconfig)
    except KubeConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)

    try:
        nvml = PynvmlNvml.open()
    except NvmlError as exc:
        return _fail(str(exc), EXIT_FAILED)
    cluster = NodeCluster(api, config.node_name)
    try:
        devices = nvml.devices()
        binary = None if args.mps_daemon == "off" else shutil.which(args.mps_control_bin)
        if binary is None and args.mps_daemon != "off" and any(not d.mig_enabled for d in devices):
            return _fail(
                f"{args.mps_control_bin} not found: MPS needs the driver's "
                "nvidia-cuda-mps-control (mount the driver root into the container, or pass "
                "--mps-control-bin)",
                EXIT_FAILED,
            )
        control = None
        if binary is not None:
            layout = mps.device_plugin_directories(args.mps_root, args.mps_resource)
            control = mps.ProcessMpsControl(
                binary,
                pipe_dir=args.mps_pipe_dir or layout.pipe,
                log_dir=args.mps_log_dir or layout.log,
            )
        hard = False
        if args.hard_limits == "auto":
            support = detect_memory_limits()
            hard = support.available
            log.info("hard GPU-memory limits: %s (%s)", "on" if hard else "off", support.detail)
        driver = nvml.driver()
        log.info(
            "NVIDIA driver %s, CUDA %s, node %s",
            driver.driver_version,
            driver.cuda_version,
            config.node_name,
        )
        agent = NodeAgent(
            dataclasses.replace(config, hard_limits=hard),
            nvml,
            control,
            ProcFs(args.proc_root),
            log=log,
        )
        agent.start()
        if not cluster.start(timeout=30.0):
            return _fail(
                f"cannot list the pods of node {config.node_name}: "
                f"{cluster.informer.stats.last_error or 'no answer within 30s'}",
                EXIT_FAILED,
            )
        if args.once:
            report = run_once(agent, cluster, log)
            print(json.dumps(report.to_json(), indent=2, sort_keys=True))
            return EXIT_OK
        return _serve(args, agent, cluster, control, log)
    except NvmlError as exc:
        return _fail(str(exc), EXIT_FAILED)
    finally:
        cluster.stop()
        nvml.close()


def _serve(
    args: argparse.Namespace,
    agent: NodeAgent,
    cluster: NodeCluster,
    control: mps.ProcessMpsControl | None,
    log: logging.Logger,
) -> int:
    if args.metrics_port:
        from prometheus_client import start_http_server

        try:
            server, _thread = start_http_server(
                args.metrics_port, addr=args.metrics_host, registry=agent_registry(agent)
            )
        except OSError as exc:
            return _fail(
                f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}",
                EXIT_FAILED,
            )
        log.info("metrics on http://%s:%d/metrics", args.metrics_host, args.metrics_port)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        run_loop(agent, cluster, args.interval, stop, log)
    finally:
        if args.metrics_port:
            server.shutdown()
        if control is not None and agent.started_daemon:
            # The daemon lives in this container and goes when it stops; quit lets it end its
            # servers cleanly. A daemon the agent found running is left alone.
            try:
                control.send(mps.QUIT)
            except mps.MpsError as exc:
                log.warning("quitting the MPS control daemon: %s", exc)
    return EXIT_OK
