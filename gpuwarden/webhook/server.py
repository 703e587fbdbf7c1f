"""The webhook server's life: TLS listener, periodic reloads, graceful stop.

Its connections are guarded by :mod:`gpuwarden.webhook.connections`; ``--workers N`` runs N of
these servers under :mod:`gpuwarden.webhook.workers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import logging
import os
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiohttp import web

from gpuwarden.certs.rotation import (
    CertDirectory,
    CertificateError,
    ServingNames,
    ensure_directory,
)
from gpuwarden.certs.tlsreload import TLSConfigError, TLSFiles, TLSReloader
from gpuwarden.kube.client import api_client
from gpuwarden.kube.cluster import ClusterSource, StaticCluster, WatchedCluster
from gpuwarden.kube.gpupolicies import GPUPolicyWatch
from gpuwarden.webhook.app import (
    Settings,
    WebhookContext,
    admission_app,
    probes_app,
)
from gpuwarden.webhook.connections import REQUEST_READ_SIZE, ConnectionLimits, GuardedSite
from gpuwarden.webhook.metrics import Metrics
from gpuwarden.webhook.policies import ObjectSource, PolicyReloader

# ConnectionLimits is part of ServeConfig, and imported from here with it.
__all__ = [
    "ConnectionLimits",
    "ServeConfig",
    "ServeError",
    "WebhookServer",
    "cluster_source",
    "policy_object_source",
    "prepare_certificates",
]

log = logging.getLogger("gpuwarden.webhook")

LINGERING_TIME = 1.0


class ServeError(Exception):
    """The server cannot start as configured; the message says what to change."""


@dataclass(frozen=True)
class ServeConfig:
    policies: tuple[Path, ...]
    host: str = "0.0.0.0"
    port: int = 8443
    metrics_port: int | None = 9090
    cert_dir: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    serving_names: tuple[str, ...] = ("localhost", "127.0.0.1")
    namespaces_file: Path | None = None
    # Serve GPUPolicy objects from the API server with the files, and write their status.
    watch_policies: bool = False
    kubeconfig: Path | None = None
    workers: int = 1
    settings: Settings = field(default_factory=Settings)
    reload_interval: float = 2.0
    renew_interval: float = 300.0
    shutdown_timeout: float = 30.0
    # After SIGTERM, keep accepting this long (answering "Connection: close", /readyz 503)
    # while the endpoint removal reaches the API server and kube-proxy.
    drain_delay: float = 0.0
    watch_timeout: int = 300
    log_level: str = "info"
    reuse_port: bool = False
    # The one worker that renews self-managed certificates (the others only reload them).
    leader: bool = True
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    def tls_files(self) -> TLSFiles:
        if self.cert_dir is not None:
            directory = CertDirectory(self.cert_dir)
            return TLSFiles(directory.tls_cert, directory.tls_key, self.client_ca)
        if self.tls_cert is None or self.tls_key is None:
            raise ServeError("give --cert-dir DIR, or both --tls-cert and --tls-key")
        return TLSFiles(self.tls_cert, self.tls_key, self.client_ca)


def prepare_certificates(config: ServeConfig) -> list[str]:
    """With --cert-dir, issue or renew what is needed there; returns what was done."""
    if config.cert_dir is None:
        return []
    try:
        return ensure_directory(config.cert_dir, ServingNames.of(config.serving_names))
    except (CertificateError, OSError, ValueError) as exc:
        raise ServeError(f"--cert-dir {config.cert_dir}: {exc}") from exc


def policy_object_source(config: ServeConfig) -> ObjectSource | None:
    if not config.watch_policies:
        return None
    return GPUPolicyWatch(
        api_client(config.kubeconfig),
        watch_timeout=config.watch_timeout,
        write_status=config.leader,  # one writer per replica, not one per worker
    )


def cluster_source(config: ServeConfig) -> ClusterSource:
    if config.namespaces_file is not None:
        return StaticCluster(config.namespaces_file)
    return WatchedCluster(api_client(config.kubeconfig), watch_timeout=config.watch_timeout)


def _timestamp(moment: datetime.datetime | None) -> float:
    return moment.timestamp() if moment is not None else 0.0


class WebhookServer:
    """One server process: start(), then stop() (or run() until SIGTERM/SIGINT)."""

    def __init__(
        self,
        config: ServeConfig,
        *,
        cluster: ClusterSource | None = None,
        policy_objects: ObjectSource | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self._cluster = cluster
        self._policy_objects = policy_objects
        self._clock = clock
        self._runners: list[web.AppRunner] = []
        self._sites: list[GuardedSite] = []
        self._ticker: asyncio.Task[None] | None = None
        self._since_renew = 0.0
        self.tls: TLSReloader | None = None
        self.context: WebhookContext | None = None
        self.port = 0
        self.metrics_port: int | None = None

    # Start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        for line in prepare_certificates(config) if config.leader else []:
            log.info(line)
        try:
            self.tls = TLSReloader(config.tls_files())
        except TLSConfigError as exc:
            raise ServeError(str(exc)) from exc
        objects = self._policy_objects
        if objects is None:
            objects = policy_object_source(config)
        reloader = PolicyReloader(config.policies, objects=objects)
        cluster = self._cluster or cluster_source(config)
        settings = replace(config.settings, require_client_certificate=config.client_ca is not None)
        self.context = context = WebhookContext(
            reloader=reloader, cluster=cluster, metrics=self.metrics, settings=settings
        )
        self._reload_policies()
        cluster.start()
        reloader.start()
        limits = config.connections
        main = web.AppRunner(
            admission_app(context),
            access_log=None,
            shutdown_timeout=config.shutdown_timeout,
            handle_signals=False,
            keepalive_timeout=limits.keepalive_timeout,
            read_bufsize=REQUEST_READ_SIZE,
            # A request whose connection is gone (closed by its client, or to make room) stops
            # at once, and lets go of its body and its place under --max-body-bytes-in-flight:
            # otherwise each would hold them until its deadline, and closing connections faster
            # than that could still pile up memory.
            handler_cancellation=True,
            # A request refused with its body unread (413, 408) is read on and discarded this
            # long before its connection closes, so that its client gets to read the answer
            # (aiohttp's default is 10 s: a stalled client's connection would stay that long).
            lingering_time=LINGERING_TIME,
        )
        await main.setup()
        self._runners.append(main)
        await self._start_site(main, config.port, ssl_context=self.tls.context, listener="https")
        self.port = _bound_port(main)
        context.certificate_served = True
        self._update_certificate_metrics()
        if config.metrics_port is not None:
            probes = web.AppRunner(
                probes_app(context),
                access_log=None,
                handle_signals=False,
                keepalive_timeout=limits.keepalive_timeout,
                read_bufsize=REQUEST_READ_SIZE,
            )
            await probes.setup()
            self._runners.append(probes)
            await self._start_site(
                probes, config.metrics_port, ssl_context=None, listener="metrics"
            )
            self.metrics_port = _bound_port(probes)
        self.tick()
        # Everything loaded so far lives as long as the server: keep the collector off it, so
        # its full collections stay short (they land in some request's latency).
        gc.freeze()
        self._ticker = asyncio.create_task(self._tick_forever())
        log.info(
            "serving",
            extra={
                "fields": {
                    "address": f"https://{config.host}:{self.port}",
                    "metrics": self.metrics_port,
                    "policies": [str(p) for p in config.policies],
                    "fingerprint": reloader.state.fingerprint,
                    "pid": os.getpid(),
                }
            },
        )

    async def _start_site(
        self, runner: web.AppRunner, port: int, *, ssl_context: ssl.SSLContext | None, listener: str
    ) -> None:
        site = GuardedSite(
            runner,
            self.config.host,
            port,
            ssl_context=ssl_context,
            limits=self.config.connections,
            metrics=self.metrics,
            listener=listener,
            reuse_port=self.config.reuse_port,
        )
        await site.start()
        self._sites.append(site)

    @property
    def open_connections(self) -> int:
        """Connections held on the HTTPS listener now."""
        return self._sites[0].open_connections if self._sites else 0

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (up to shutdown_timeout), close."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        await self._drain()
        for site in self._sites:
            site.stop_serving()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        for site in self._sites:
            site.abort_all()
        self._sites.clear()
        if self.context is not None:
            self.context.admission_log.flush()
            self.context.cluster.stop()
            self.context.reloader.stop()
            self.context.executor.shutdown(wait=False, cancel_futures=True)

    async def _announce_shutdown(self, again: asyncio.Event) -> None:
        """Go unready and close connections after each answer, still accepting new ones, for
        drain_delay seconds (a second signal ends it early)."""
        if self.context is None or self.config.drain_delay <= 0:
            return
        self.context.draining = True
        again.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(again.wait(), self.config.drain_delay)

    async def _drain(self) -> None:
        """Close the listeners, then wait for the requests already arriving to be answered.

        aiohttp's own shutdown stops reading from connections, which would strand a request
        whose headers or body are still arriving; so the connections accepted before the
        listener closed finish their handshake, and the requests begun on them are answered,
        before it runs (each phase has its own timeout; all of it, shutdown_timeout).
        """
        if not self._runners or self.context is None:
            return
        context = self.context
        context.draining = True
        for runner in self._runners:
            for site in list(runner.sites):
                await site.stop()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.shutdown_timeout):
                for site in self._sites:
                    await site.settled()
                if context.in_flight:
                    await context.idle.wait()

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT, then stop gracefully."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        try:
            await stop.wait()
            log.info("stopping: finishing in-flight requests")
            await self._announce_shutdown(stop)
        finally:
            await self.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        log.info("stopped")

    # Periodic work ----------------------------------------------------------------------

    async def _tick_forever(self) -> None:
        interval = self.config.reload_interval
        while True:
            await asyncio.sleep(interval)
            self._since_renew += interval
            try:
                self.tick()
            except Exception:
                log.exception("periodic check failed")

    def tick(self) -> None:
        """One round of periodic work: policies, certificates, cache metrics."""
        self._reload_policies()
        if self._since_renew >= self.config.renew_interval:
            self._since_renew = 0.0
            self._renew_certificates()
        self._reload_certificates()
        self._update_cache_metrics()

    def _reload_policies(self) -> None:
        assert self.context is not None
        reloader = self.context.reloader
        result = reloader.check()
        state = reloader.state
        metrics = self.metrics
        metrics.policy_loaded.set(1 if state.policies is not None else 0)
        if not result.changed:
            return
        if result.ok:
            metrics.policy_reloads.labels("ok").inc()
            metrics.policy_last_reload_failed.set(0)
            log.info(
                "policies loaded",
                extra={
                    "fields": {
                        "fingerprint": state.fingerprint,
                        "profiles": len(state.policies.profiles) if state.policies else 0,
                    }
                },
            )
        else:
            metrics.policy_reloads.labels("failed").inc()
            metrics.policy_last_reload_failed.set(1)
            log.error(
                "policy reload failed; "
                + ("the previous set still serves" if state.policies else "GPU pods are denied"),
                extra={"fields": {"error": result.error, "fingerprint": state.fingerprint}},
            )

    def _renew_certificates(self) -> None:
        if self.config.cert_dir is None or not self.config.leader:
            return
        try:
            for line in prepare_certificates(self.config):
                log.info(line)
        except ServeError as exc:
            log.error("certificate renewal failed", extra={"fields": {"error": str(exc)}})

    def _reload_certificates(self) -> None:
        assert self.tls is not None and self.context is not None
        outcome = self.tls.check()
        if outcome.changed:
            self.metrics.cert_reloads.labels("ok").inc()
            self.context.certificate_error = None
            log.info(
                "serving certificate reloaded",
                extra={"fields": {"not_after": str(self.tls.not_after)}},
            )
            self._update_certificate_metrics()
        elif outcome.error and outcome.error != self.context.certificate_error:
            self.metrics.cert_reloads.labels("failed").inc()
            self.context.certificate_error = outcome.error
            log.warning(
                "serving certificate files changed but cannot be loaded yet; "
                "the previous certificate still serves",
                extra={"fields": {"error": outcome.error}},
            )

    def _update_certificate_metrics(self) -> None:
        if self.tls is not None:
            self.metrics.cert_expiry.set(_timestamp(self.tls.not_after))
            if self.context is not None:
                self.context.certificate_not_after = self.tls.not_after

    def _update_cache_metrics(self) -> None:
        assert self.context is not None
        cluster = self.context.cluster
        age = cluster.age()
        if age is not None:
            self.metrics.cache_age.set(age)
        for name, stats in cluster.stats().items():
            self.metrics.cache_synced.labels(name).set(1 if stats.lists else 0)
            self.metrics.cache_relists.labels(name).set(stats.lists)
            self.metrics.cache_watch_restarts.labels(name).set(stats.watch_restarts)


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise ServeError("the listener has no address")
