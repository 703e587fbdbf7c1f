"""`gpuwarden pool-controller`: GPU nodes move between the whole and the MPS pool as demand does."""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from gpuwarden.commands.shared import LOG_LEVELS
from gpuwarden.kube.client import KubeConfigError, api_client
from gpuwarden.kube.pools import PoolController
from gpuwarden.policy.render.pools import PoolSettings, pool_settings
from gpuwarden.webhook import logs
from gpuwarden.webhook.policies import PolicyReloader

HELP = (
    "Move drained GPU nodes between the device plugin's whole-GPU and MPS configs as demand "
    "changes (the nvidia backend's pools; docs/pools.md)."
)

EXIT_OK, EXIT_USAGE = 0, 2


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies",
        "-p",
        action="append",
        required=True,
        type=Path,
        metavar="PATH",
        help="policy file or directory; repeatable (read again when it changes); the first "
        "nvidia backend with pools is followed",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="plan at least this often, besides on every node or GPU pod change (default 10)",
    )
    parser.add_argument(
        "--watch-timeout",
        type=int,
        default=300,
        metavar="SECONDS",
        help="seconds of each node and pod watch (default 300)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="JSON log lines from this level"
    )


def _no_pools(paths: list[Path]) -> str:
    named = ", ".join(str(path) for path in paths)
    return (
        f"no nvidia backend with pools in {named}: set spec.backend (or a profile's backend) to "
        "{type: nvidia, mpsReplicas: N, pools: {wholeConfig: ..., sharedConfig: ...}}"
    )


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    if not math.isfinite(args.interval) or args.interval <= 0:
        print("error: --interval must be a number of seconds above 0", file=sys.stderr)
        return EXIT_USAGE
    if args.watch_timeout < 1:
        print("error: --watch-timeout must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    reloader = PolicyReloader(args.policies)
    reloader.check()
    if reloader.state.policies is None:
        print(f"error: {reloader.state.error}", file=sys.stderr)
        return EXIT_USAGE
    if pool_settings(reloader.state.policies) is None:
        print(f"error: {_no_pools(args.policies)}", file=sys.stderr)
        return EXIT_USAGE

    def settings() -> PoolSettings | None:
        result = reloader.check()
        if result.error:
            print(f"warning: policies not reloaded: {result.error}", file=sys.stderr)
        policies = reloader.state.policies
        found = None if policies is None else pool_settings(policies)
        if found is None and result.changed:
            print(f"warning: {_no_pools(args.policies)}; no node is moved", file=sys.stderr)
        return found

    try:
        api = api_client(args.kubeconfig)
    except KubeConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    controller = PoolController(
        api, settings, interval=args.interval, watch_timeout=args.watch_timeout
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=controller.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    controller.run()
    return EXIT_OK
