"""`gpuwarden tenant-controller`: quotas and LocalQueues for namespaces tenants select by label."""

from __future__ import annotations

import argparse
import threading

from gpuwarden.commands._controllers import (
    add_cluster_arguments,
    add_policies_argument,
    cluster,
    start,
    until_signalled,
)
from gpuwarden.kube.tenants import TenantController

HELP = (
    "Apply each tenant's ResourceQuota (and with --kueue its LocalQueue), and the dra backend's "
    "ResourceClaimTemplates, in every namespace the tenant selects by label, as the namespace "
    "appears (render writes those of listed namespaces)."
)

EXIT_OK = 0


def register(parser: argparse.ArgumentParser) -> None:
    add_policies_argument(
        parser, "policy file or directory; repeatable (read again when it changes)"
    )
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="also apply a LocalQueue 'default' pointing at the tenant's ClusterQueue",
    )
    add_cluster_arguments(
        parser,
        "seconds of each namespace watch; every namespace is applied again after it "
        "(so a policy change reaches them all) (default 300)",
    )


def run(args: argparse.Namespace) -> int:
    policies = start(args)
    controller = TenantController(
        cluster(args), policies, with_kueue=args.kueue, watch_timeout=args.watch_timeout
    )
    stop = threading.Event()
    until_signalled(stop.set)
    controller.start()
    stop.wait()
    controller.stop()
    return EXIT_OK
