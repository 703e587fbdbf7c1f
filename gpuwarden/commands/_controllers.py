"""What the controller commands (tenant-controller, pool-controller) share: their options, the
policy files read again as they change, the cluster client, and running until a signal."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from kubernetes import client as k8s_client

from gpuwarden.commands.shared import LOG_LEVELS, UsageError
from gpuwarden.kube.client import KubeConfigError, api_client
from gpuwarden.policy import PolicySet
from gpuwarden.webhook import logs
from gpuwarden.webhook.policies import PolicyReloader


def add_policies_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument(
        "--policies",
        "-p",
        action="append",
        required=True,
        type=Path,
        metavar="PATH",
        help=help_text,
    )


def add_cluster_arguments(parser: argparse.ArgumentParser, watch_help: str) -> None:
    """--kubeconfig, --watch-timeout and --log-level."""
    parser.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    parser.add_argument(
        "--watch-timeout", type=int, default=300, metavar="SECONDS", help=watch_help
    )
    parser.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="JSON log lines from this level"
    )


def start(args: argparse.Namespace) -> Callable[[], PolicySet | None]:
    """JSON logs configured and the policies loaded: each call reads them again if the files
    changed (a warning printed when the new files do not load, the last good set kept). Raises
    UsageError for a bad --watch-timeout or policies that do not load."""
    logs.configure(args.log_level)
    if args.watch_timeout < 1:
        raise UsageError("--watch-timeout must be at least 1")
    reloader = PolicyReloader(args.policies)

    def policies() -> PolicySet | None:
        result = reloader.check()
        if result.error:
            print(f"warning: policies not reloaded: {result.error}", file=sys.stderr)
        return reloader.state.policies

    if policies() is None:
        raise UsageError(str(reloader.state.error))
    return policies


def cluster(args: argparse.Namespace) -> k8s_client.ApiClient:
    """The client for --kubeconfig (or in-cluster); UsageError without credentials."""
    try:
        return api_client(args.kubeconfig)
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None


def until_signalled(stop: Callable[[], None]) -> None:
    """Call ``stop`` (on a thread of its own) at SIGTERM or SIGINT."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=stop, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
