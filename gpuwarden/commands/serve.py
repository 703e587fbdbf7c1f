"""`gpuwarden serve`: the mutating and validating admission webhook over HTTPS."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from gpuwarden.certs.material import LOCAL_NAMES, serving_names
from gpuwarden.kube.client import KubeConfigError
from gpuwarden.policy.manifests import ManifestError
from gpuwarden.webhook import logs
from gpuwarden.webhook.app import DEFAULT_MAX_BODY, Settings
from gpuwarden.webhook.server import ServeConfig, ServeError, serve

HELP = "Serve the admission webhook (/mutate, /validate) over HTTPS, with probes and metrics."

log = logging.getLogger("gpuwarden.webhook")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies",
        action="append",
        required=True,
        metavar="PATH",
        help="policy file or directory (a ConfigMap volume works); repeatable; reloaded on change",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        help="plain-HTTP port for /metrics, /healthz and /readyz (default 9090; 0 picks one, -1 disables)",
    )
    tls = parser.add_argument_group("TLS")
    tls.add_argument(
        "--cert-dir",
        type=Path,
        help="directory with ca.crt, tls.crt and tls.key; issued here when absent, renewed before expiry",
    )
    tls.add_argument("--tls-cert", type=Path, help="serving certificate (reloaded on change)")
    tls.add_argument("--tls-key", type=Path, help="serving key (reloaded on change)")
    tls.add_argument(
        "--client-ca",
        type=Path,
        help="require client certificates signed by this CA (the API server's)",
    )
    tls.add_argument("--service", help="Service name: its DNS names go into an issued certificate")
    tls.add_argument("--service-namespace", default="gpuwarden", help="the Service's namespace")
    tls.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS name or IP for an issued certificate; repeatable",
    )
    cluster = parser.add_argument_group("cluster data")
    cluster.add_argument(
        "--namespaces",
        type=Path,
        metavar="FILE",
        help="Namespace, PriorityClass and ConfigMap manifests; run without a cluster",
    )
    cluster.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    cluster.add_argument(
        "--watch-timeout",
        type=int,
        default=300,
        help="seconds before each watch is restarted from its resourceVersion (default 300)",
    )
    behaviour = parser.add_argument_group("behaviour")
    behaviour.add_argument(
        "--workers", type=int, default=1, help="processes sharing the port (SO_REUSEPORT)"
    )
    behaviour.add_argument(
        "--failure-mode",
        choices=("allow", "deny"),
        default="deny",
        help="answer to a request gpuwarden fails to evaluate (default deny)",
    )
    behaviour.add_argument(
        "--deadline",
        type=float,
        default=8.0,
        help="seconds to answer each request; keep below the webhook's timeoutSeconds (default 8)",
    )
    behaviour.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY,
        help=f"largest AdmissionReview accepted (default {DEFAULT_MAX_BODY})",
    )
    behaviour.add_argument(
        "--reload-interval",
        type=float,
        default=2.0,
        help="seconds between checks of the policy and certificate files (default 2)",
    )
    behaviour.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds to finish in-flight requests after SIGTERM (default 30)",
    )
    behaviour.add_argument(
        "--drain-delay",
        type=float,
        default=0.0,
        help="seconds to keep accepting after SIGTERM, unready, while the endpoint removal "
        "reaches the API server (default 0; the chart sets 5)",
    )
    behaviour.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )


def _usage(message: str) -> int:
    log.error("cannot serve", extra={"fields": {"error": message}})
    return 2


def config_from(args: argparse.Namespace) -> ServeConfig:
    # The names `certs sync` puts into the shared certificate, so a renewal here matches it.
    if args.service:
        synced = serving_names(args.service, args.service_namespace, args.san)
        names = [*synced.dns_names, *synced.ip_addresses]
    else:
        names = [*LOCAL_NAMES, *args.san]
    if args.host not in ("0.0.0.0", "::", "") and args.host not in names:
        names.append(args.host)
    metrics_port = None if args.metrics_port < 0 else args.metrics_port
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
        workers=args.workers,
        settings=Settings(
            failure_mode=args.failure_mode, deadline=args.deadline, max_body=args.max_body_bytes
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
    if args.namespaces is not None and not args.namespaces.is_file():
        return _usage(f"--namespaces {args.namespaces}: no such file")
    try:
        return serve(config_from(args))
    except (ServeError, KubeConfigError, ManifestError) as exc:
        return _usage(str(exc))
