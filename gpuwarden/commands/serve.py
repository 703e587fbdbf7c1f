"""`gpuwarden serve`: the mutating and validating admission webhook over HTTPS."""

from __future__ import annotations

import argparse
import logging
import re
import resource
import sys
from pathlib import Path
from typing import get_args

from gpuwarden.certs.material import LOCAL_NAMES, serving_names
from gpuwarden.kube.client import KubeConfigError
from gpuwarden.policy.admission.manifests import ManifestError
from gpuwarden.policy.spec.model import EnforcementAction
from gpuwarden.webhook import logs
from gpuwarden.webhook.app import DEFAULT_BODY_BYTES_IN_FLIGHT, DEFAULT_MAX_BODY, Settings
from gpuwarden.webhook.connections import ConnectionLimits
from gpuwarden.webhook.server import ServeConfig, ServeError
from gpuwarden.webhook.workers import serve

HELP = "Serve the admission webhook (/mutate, /validate) over HTTPS, with probes and metrics."

log = logging.getLogger("gpuwarden.webhook")

LIMITS = ConnectionLimits()
# Descriptors a worker needs besides its connections: listeners, watch streams, the policy and
# certificate files, logs, the supervisor's pipes.
OTHER_FILES = 256


def register(parser: argparse.ArgumentParser) -> None:
    _listen_options(parser)
    _tls_options(parser)
    _cluster_options(parser)
    _behaviour_options(parser)
    _connection_options(parser)


def _listen_options(parser: argparse.ArgumentParser) -> None:
    """Where it serves and what it serves."""
    parser.add_argument(
        "--policies",
        "-p",
        action="append",
        required=True,
        metavar="PATH",
        help="policy file or directory (a ConfigMap volume works); repeatable; reloaded on change",
    )
    parser.add_argument(
        "--host",
        default="0.0.0.0",
        help="address to listen on (default 0.0.0.0)",
        metavar="ADDRESS",
    )
    parser.add_argument(
        "--port", type=int, default=8443, help="HTTPS port (default 8443)", metavar="PORT"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        help="plain-HTTP port for /metrics, /healthz and /readyz (default 9090; 0 picks one, -1 disables)",
        metavar="PORT",
    )


def _tls_options(parser: argparse.ArgumentParser) -> None:
    """The serving certificate."""
    tls = parser.add_argument_group("TLS")
    tls.add_argument(
        "--cert-dir",
        type=Path,
        help="directory with ca.crt, tls.crt and tls.key; issued here when absent, renewed before expiry",
        metavar="DIR",
    )
    tls.add_argument(
        "--tls-cert", type=Path, help="serving certificate (reloaded on change)", metavar="FILE"
    )
    tls.add_argument(
        "--tls-key", type=Path, help="serving key (reloaded on change)", metavar="FILE"
    )
    tls.add_argument(
        "--client-ca",
        type=Path,
        help="require client certificates signed by this CA (the API server's)",
        metavar="FILE",
    )
    tls.add_argument(
        "--service",
        help="Service name: its DNS names go into an issued certificate",
        metavar="NAME",
    )
    tls.add_argument(
        "--service-namespace",
        default="gpuwarden",
        help="the Service's namespace",
        metavar="NAMESPACE",
    )
    tls.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS name or IP for an issued certificate; repeatable",
    )


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    """Where the cluster's namespaces, PriorityClasses and ConfigMaps come from."""
    cluster = parser.add_argument_group("cluster data")
    cluster.add_argument(
        "--namespaces",
        type=Path,
        metavar="FILE",
        help="Namespace, PriorityClass and ConfigMap manifests; run without a cluster",
    )
    cluster.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig (default: in-cluster, then ~/.kube/config)",
        metavar="FILE",
    )
    cluster.add_argument(
        "--watch-policies",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also serve the cluster's GPUPolicy objects (after the files, in name order) and "
        "write each one's status (default: on with a cluster, off with --namespaces)",
    )
    cluster.add_argument(
        "--watch-timeout",
        type=int,
        default=300,
        help="seconds before each watch is restarted from its resourceVersion (default 300)",
        metavar="SECONDS",
    )


def _behaviour_options(parser: argparse.ArgumentParser) -> None:
    """How it runs: workers, failure mode, deadline, body limits, reloads, shutdown, logging."""
    behaviour = parser.add_argument_group("behaviour")
    behaviour.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes sharing the port (SO_REUSEPORT)",
        metavar="N",
    )
    behaviour.add_argument(
        "--failure-mode",
        choices=("allow", "deny"),
        default="deny",
        help="answer to a request gpuwarden fails to evaluate (default deny)",
    )
    behaviour.add_argument(
        "--enforcement-action",
        choices=get_args(EnforcementAction),
        default="enforce",
        help="enforcementAction of the served policies that set none (default enforce): audit "
        "admits what would be denied, with warnings, audit annotations and a metric; dryrun "
        "also leaves pods unchanged, their patch only reported (docs/rollout.md)",
    )
    behaviour.add_argument(
        "--deadline",
        type=float,
        default=8.0,
        help="seconds to answer each request; keep below the webhook's timeoutSeconds (default 8)",
        metavar="SECONDS",
    )
    behaviour.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY,
        help=f"largest AdmissionReview accepted (default {DEFAULT_MAX_BODY})",
        metavar="BYTES",
    )
    behaviour.add_argument(
        "--max-body-bytes-in-flight",
        type=int,
        default=DEFAULT_BODY_BYTES_IN_FLIGHT,
        help="request bodies held at once per worker, from reading to answering; past it a "
        "request waits, within its deadline, then gets 503 "
        f"(default {DEFAULT_BODY_BYTES_IN_FLIGHT}; at least --max-body-bytes)",
        metavar="BYTES",
    )
    behaviour.add_argument(
        "--reload-interval",
        type=float,
        default=2.0,
        help="seconds between checks of the policy and certificate files (default 2)",
        metavar="SECONDS",
    )
    behaviour.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds to finish in-flight requests after SIGTERM (default 30)",
        metavar="SECONDS",
    )
    behaviour.add_argument(
        "--drain-delay",
        type=float,
        default=0.0,
        help="seconds to keep accepting after SIGTERM, unready, while the endpoint removal "
        "reaches the API server (default 0; the chart sets 5)",
        metavar="SECONDS",
    )
    behaviour.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log verbosity (default info)",
    )


def _connection_options(parser: argparse.ArgumentParser) -> None:
    """The limits that keep memory bounded however many connections arrive."""
    connections = parser.add_argument_group(
        "connections (each listener, each worker: memory stays bounded however many arrive)"
    )
    connections.add_argument(
        "--max-connections",
        type=int,
        default=LIMITS.max_connections,
        help="connections held at once; a new one past it closes the one that has waited on "
        "its client longest (handshake, idle, or a request still arriving), never one being "
        f"answered (default {LIMITS.max_connections})",
        metavar="N",
    )
    connections.add_argument(
        "--handshake-timeout",
        type=float,
        default=LIMITS.handshake_timeout,
        help=f"seconds from accepting a connection to the end of its TLS handshake "
        f"(default {LIMITS.handshake_timeout:g})",
        metavar="SECONDS",
    )
    connections.add_argument(
        "--header-timeout",
        type=float,
        default=LIMITS.header_timeout,
        help=f"seconds from a request's first byte to the end of its headers "
        f"(default {LIMITS.header_timeout:g})",
        metavar="SECONDS",
    )
    connections.add_argument(
        "--keepalive-timeout",
        type=float,
        default=LIMITS.keepalive_timeout,
        help=f"seconds a kept-alive connection may wait for its next request "
        f"(default {LIMITS.keepalive_timeout:g})",
        metavar="SECONDS",
    )


def _usage(message: str) -> int:
    log.error("cannot serve", extra={"fields": {"error": message}})
    return 2


def raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard one; return the soft limit now in force.

    Each held connection is a descriptor, and the usual soft limit of 1,024 runs out first:
    accepts then fail, and nothing else (probes, watches) can open a socket either.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Linux refuses an infinite RLIMIT_NOFILE: settle for a million (nr_open's default).
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning(
            "cannot raise the open-file limit",
            extra={"fields": {"soft": soft, "hard": hard, "error": str(exc)}},
        )
        return soft
    return target


def fitted_max_connections(asked: int, open_files: int) -> int:
    """--max-connections lowered, if need be, so both listeners' connections fit in the
    open-file limit (past it accepts fail, and asyncio logs each failure)."""
    fits = max((open_files - OTHER_FILES) // 2, 1)
    if asked <= fits:
        return asked
    log.warning(
        "--max-connections lowered to fit the open-file limit; raise the hard limit "
        "(ulimit -Hn, or the container runtime's LimitNOFILE) to keep it",
        extra={"fields": {"asked": asked, "max_connections": fits, "open_files": open_files}},
    )
    return fits


def config_from(args: argparse.Namespace, *, open_files: int | None = None) -> ServeConfig:
    # The names `certs sync` puts into the shared certificate, so a renewal here matches it.
    if args.service:
        synced = serving_names(args.service, args.service_namespace, args.san)
        names = [*synced.dns_names, *synced.ip_addresses]
    else:
        names = [*LOCAL_NAMES, *args.san]
    if args.host not in ("0.0.0.0", "::", "") and args.host not in names:
        names.append(args.host)
    metrics_port = None if args.metrics_port < 0 else args.metrics_port
    max_connections = args.max_connections
    if open_files is not None:
        max_connections = fitted_max_connections(max_connections, open_files)
    return ServeConfig(
        policies=tuple(Path(p) for p in args.policies),
        host=args.host,
        port=args.port,
        metrics_port=metrics_port,
        cert_dir=args.cert_dir,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        client_ca=args.client_ca,
        serving_names=tuple(dict.fromkeys(names)),
        namespaces_file=args.namespaces,
        kubeconfig=args.kubeconfig,
        watch_policies=(
            args.namespaces is None if args.watch_policies is None else args.watch_policies
        ),
        workers=args.workers,
        settings=Settings(
            failure_mode=args.failure_mode,
            enforcement_action=args.enforcement_action,
            deadline=args.deadline,
            max_body=args.max_body_bytes,
            max_body_in_flight=args.max_body_bytes_in_flight,
        ),
        connections=ConnectionLimits(
            max_connections=max_connections,
            handshake_timeout=args.handshake_timeout,
            header_timeout=args.header_timeout,
            keepalive_timeout=args.keepalive_timeout,
        ),
        reload_interval=args.reload_interval,
        shutdown_timeout=args.shutdown_timeout,
        drain_delay=args.drain_delay,
        watch_timeout=args.watch_timeout,
        log_level=args.log_level,
    )


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    if args.cert_dir is None and (args.tls_cert is None or args.tls_key is None):
        return _usage("give --cert-dir DIR, or both --tls-cert FILE and --tls-key FILE")
    if args.cert_dir is not None and (args.tls_cert or args.tls_key):
        return _usage("--cert-dir and --tls-cert/--tls-key exclude each other")
    if args.workers < 1:
        return _usage("--workers must be at least 1")
    if args.deadline <= 0:
        return _usage("--deadline must be positive")
    if args.reload_interval <= 0:
        return _usage("--reload-interval must be positive")
    if args.shutdown_timeout < 0 or args.drain_delay < 0:
        return _usage("--shutdown-timeout and --drain-delay must not be negative")
    if args.max_body_bytes < 1024:
        return _usage("--max-body-bytes must be at least 1024")
    if args.max_body_bytes_in_flight < args.max_body_bytes:
        return _usage("--max-body-bytes-in-flight must be at least --max-body-bytes")
    if args.max_connections < 1:
        return _usage("--max-connections must be at least 1")
    if min(args.handshake_timeout, args.header_timeout, args.keepalive_timeout) <= 0:
        return _usage(
            "--handshake-timeout, --header-timeout and --keepalive-timeout must be positive"
        )
    if args.namespaces is not None and not args.namespaces.is_file():
        return _usage(f"--namespaces {args.namespaces}: no such file")
    open_files = raise_open_file_limit()
    try:
        return serve(config_from(args, open_files=open_files))
    except (ServeError, KubeConfigError, ManifestError) as exc:
        return _usage(str(exc))
    except OSError as exc:  # a port taken or not ours: one line, not asyncio's traceback
        print(f"error: {listen_error(exc, args.host, args.port)}", file=sys.stderr)
        return 2


def listen_error(exc: OSError, host: str, port: int) -> str:
    """What a failed start says: the address asyncio could not bind, and why."""
    found = re.search(r"bind on address \('?([^',]*)'?, (\d+)[^)]*\): (.+)", str(exc))
    if found:
        return f"cannot listen on {found[1]}:{found[2]}: {found[3]}"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
