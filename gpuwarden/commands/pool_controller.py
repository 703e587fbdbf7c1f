"""`gpuwarden pool-controller`: GPU nodes move between the whole and the MPS pool as demand does."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gpuwarden.commands._controllers import (
    add_cluster_arguments,
    add_policies_argument,
    cluster,
    start,
    until_signalled,
)
from gpuwarden.commands.shared import UsageError
from gpuwarden.kube.pools import PoolController
from gpuwarden.policy.render.pools import PoolSettings, pool_settings

HELP = (
    "Move drained GPU nodes between the device plugin's whole-GPU and MPS configs as demand "
    "changes (the nvidia backend's pools; docs/pools.md)."
)

EXIT_OK = 0


def register(parser: argparse.ArgumentParser) -> None:
    add_policies_argument(
        parser,
        "policy file or directory; repeatable (read again when it changes); the first nvidia "
        "backend with pools is followed",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="plan at least this often, besides on every node or GPU pod change (default 10)",
    )
    add_cluster_arguments(parser, "seconds of each node and pod watch (default 300)")


def _no_pools(paths: list[Path]) -> str:
    named = ", ".join(str(path) for path in paths)
    return (
        f"no nvidia backend with pools in {named}: set spec.backend (or a profile's backend) to "
        "{type: nvidia, mpsReplicas: N, pools: {wholeConfig: ..., sharedConfig: ...}}"
    )


def run(args: argparse.Namespace) -> int:
    if not math.isfinite(args.interval) or args.interval <= 0:
        raise UsageError("--interval must be a number of seconds above 0")
    policies = start(args)
    first = policies()
    if first is None or pool_settings(first) is None:
        raise UsageError(_no_pools(args.policies))
    warned = False

    def settings() -> PoolSettings | None:
        nonlocal warned
        current = policies()
        found = None if current is None else pool_settings(current)
        if found is None and not warned:
            print(f"warning: {_no_pools(args.policies)}; no node is moved", file=sys.stderr)
        warned = found is None
        return found

    controller = PoolController(
        cluster(args), settings, interval=args.interval, watch_timeout=args.watch_timeout
    )
    until_signalled(controller.stop)
    controller.run()
    return EXIT_OK
