"""`gpuwarden tenant-controller`: quotas and LocalQueues for namespaces tenants select by label."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from gpuwarden.commands.shared import LOG_LEVELS
from gpuwarden.kube.client import KubeConfigError, api_client
from gpuwarden.kube.tenants import TenantController
from gpuwarden.policy import PolicySet
from gpuwarden.webhook import logs
from gpuwarden.webhook.policies import PolicyReloader

HELP = (
    "Apply each tenant's ResourceQuota (and with --kueue its LocalQueue) in every namespace the "
    "tenant selects by label, as the namespace appears (render writes those of listed namespaces)."
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
        help="policy file or directory; repeatable (read again when it changes)",
    )
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="also apply a LocalQueue 'default' pointing at the tenant's ClusterQueue",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    parser.add_argument(
        "--watch-timeout",
        type=int,
        default=300,
        metavar="SECONDS",
        help="seconds of each namespace watch; every namespace is applied again after it "
        "(so a policy change reaches them all) (default 300)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="JSON log lines from this level"
    )


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    if args.watch_timeout < 1:
        print("error: --watch-timeout must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    reloader = PolicyReloader(args.policies)

    def policies() -> PolicySet | None:
        result = reloader.check()
        if result.error:
            print(f"warning: policies not reloaded: {result.error}", file=sys.stderr)
        return reloader.state.policies

    if policies() is None:
        print(f"error: {reloader.state.error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        api = api_client(args.kubeconfig)
    except KubeConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    controller = TenantController(
        api, policies, with_kueue=args.kueue, watch_timeout=args.watch_timeout
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    controller.start()
    stop.wait()
    controller.stop()
    return EXIT_OK
