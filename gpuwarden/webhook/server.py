"""The webhook server's life: TLS listener, periodic reloads, graceful stop, and N workers."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import gc
import logging
import math
import multiprocessing
import os
import signal
import ssl
import tempfile
from asyncio import sslproto
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

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
from gpuwarden.webhook import logs
from gpuwarden.webhook.app import (
    RequestObserver,
    Settings,
    WebhookContext,
    admission_app,
    probes_app,
)
from gpuwarden.webhook.metrics import MULTIPROC_ENV, Metrics
from gpuwarden.webhook.policies import ObjectSource, PolicyReloader

log = logging.getLogger("gpuwarden.webhook")


class ServeError(Exception):
    """The server cannot start as configured; the message says what to change."""


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """What connections may hold on each listener, so that memory stays bounded however many
    arrive: a cap on their number, and a time limit on every phase that waits on the client."""

    # Connections held at once, per listener and worker. A new one past it closes the one that
    # has waited on its client longest (in the TLS handshake, between requests, or in a
    # request's headers or body), or is itself closed if every one is being answered.
    max_connections: int = 1000
    # From accepting a connection to the end of its TLS handshake (asyncio's default is 60 s).
    handshake_timeout: float = 5.0
    # From a request's first byte to the end of its headers.
    header_timeout: float = 10.0
    # A kept-alive connection with no request (aiohttp's default is about an hour); also the
    # time from the handshake to the first request's headers.
    keepalive_timeout: float = 30.0


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


# Connections ----------------------------------------------------------------------------

# asyncio's TLS protocol reads the socket into a buffer of its own, 256 KiB that it allocates
# and touches for every connection as it is accepted: most of what an idle connection cost. Here
# one buffer per listener serves them all (see _TLSProtocol). It is also what one read can add
# to what a connection holds, past the limits below: one TLS record (at most 16 KiB) per read.
TLS_READ_BUFFER = 16 * 1024
# What a connection may hold of a request that its handler is not reading (yet: one waiting for
# room under --max-body-bytes-in-flight, say) before reading from the socket stops: the TLS
# layer's encrypted bytes (256 KiB by asyncio's default) and aiohttp's decrypted ones (twice its
# read size, 64 KiB by default). With the defaults and a 64 KiB read buffer, each of a thousand
# connections streaming a body held about 630 KiB (a 512Mi replica would have been killed);
# with these, about 90 KiB (docs/webhook.md, reliability).
TLS_PENDING_BYTES = 16 * 1024
REQUEST_READ_SIZE = 16 * 1024

# Why gpuwarden closed a connection (the label of gpuwarden_connections_closed_total).
ConnectionCloseReason = Literal["limit", "refused", "handshake_timeout", "header_timeout"]


class _TLSProtocol(sslproto.SSLProtocol):
    """asyncio's server-side TLS protocol reading into its listener's buffer, which tells its
    connection when the socket is there and when it is gone: asyncio tells the application
    protocol nothing about a connection that never finished its handshake."""

    max_size = TLS_READ_BUFFER

    def __init__(
        self,
        connection: _Connection,
        context: ssl.SSLContext,
        *,
        limits: ConnectionLimits,
        read_buffer: bytearray,
    ) -> None:
        loop = asyncio.get_running_loop()
        # asyncio wakes this when the handshake ends. Nobody waits on it, and a cancelled one is
        # left alone (an exception set on one never awaited would be logged at collection).
        waiter: asyncio.Future[None] = loop.create_future()
        waiter.cancel()
        super().__init__(
            loop,
            connection,
            context,
            waiter,
            server_side=True,
            # The connection's own timer closes it first, and counts it; this is a backstop.
            ssl_handshake_timeout=math.ceil(limits.handshake_timeout) + 1,
            # Closing waits this long for the client's close_notify (30 s by default).
            ssl_shutdown_timeout=limits.handshake_timeout,
        )
        # The socket transport asks for the buffer, reads into it and hands it back, and this
        # copies the bytes into its TLS object, all in one call: never across an await, so the
        # connections of one event loop can share one buffer. (The one asyncio has just made
        # for this connection goes back to the allocator; should a later asyncio name these
        # differently, each connection just keeps its own.)
        self._ssl_buffer = read_buffer
        self._ssl_buffer_view = memoryview(read_buffer)
        self._connection = connection
        self._client_spoke = False

    def buffer_updated(self, nbytes: int) -> None:
        self._client_spoke = True
        super().buffer_updated(nbytes)

    def _do_handshake(self) -> None:
        # asyncio calls this first as the connection is made, before the client has said
        # anything, and OpenSSL then allocates its handshake buffers (about 40 KiB) only to learn
        # that it must wait for the ClientHello; so wait for it here. Should a later asyncio
        # rename the method, this override goes unused and nothing else changes.
        if self._client_spoke:
            super()._do_handshake()  # type: ignore[misc]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._connection.socket_made(transport):
            super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._connection.socket_lost()


class _Refused(asyncio.Protocol):
    """A connection past the limit while every other one is being answered: closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.abort()


class _Connection(asyncio.Protocol, RequestObserver):
    """One accepted connection: the application protocol under TLS, the socket's own without.

    It makes aiohttp's request handler only once the handshake is done, passes everything on to
    it, and keeps its listener told which phase it is in: waiting on its client (in the
    handshake, between requests, in a request's headers or body) or being answered.
    """

    def __init__(self, site: GuardedSite) -> None:
        self._site = site
        self._loop = asyncio.get_running_loop()
        self._socket: asyncio.Transport | None = None
        self._handler: asyncio.Protocol | None = None
        # The handshake's timeout (header reads are timed by the site, see header_started).
        self._timer: asyncio.TimerHandle | None = None
        self._requests = 0
        self.handshaken = False
        self._reading_headers = False
        # Off the listener's books: closed, or being closed by it.
        self.gone = False

    @property
    def pending(self) -> bool:
        """In its handshake, its request headers or a request: a SIGTERM drain waits for it."""
        return not self.gone and (
            not self.handshaken or self._reading_headers or self._requests > 0
        )

    def time_out_handshake(self, seconds: float) -> None:
        self._timer = self._loop.call_later(seconds, self.abort, "handshake_timeout")

    def abort(self, reason: ConnectionCloseReason | None = None) -> None:
        """Close at once, without a TLS goodbye: to make room, or past a timeout."""
        if self.gone:
            return
        if reason is not None:
            self._site.count_closed(reason)
        self._forget()
        if self._socket is not None:
            self._socket.abort()

    # The socket, under TLS ------------------------------------------------------------

    def socket_made(self, transport: asyncio.BaseTransport) -> bool:
        """Whether to go on with the handshake."""
        assert isinstance(transport, asyncio.Transport)
        self._socket = transport
        if self.gone:  # closed for another one as it was being accepted
            transport.abort()
        return not self.gone

    def socket_lost(self) -> None:
        self._forget()

    # asyncio.Protocol, after the handshake ----------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self._socket is None:  # no TLS: this is the socket
            self._socket = transport
        if self.gone:  # closed for another one as it was being accepted
            transport.abort()
            return
        if isinstance(transport, sslproto._SSLProtocolTransport):
            transport.set_read_buffer_limits(high=TLS_PENDING_BYTES)
        self.handshaken = True
        self._cancel_timer()
        handler = self._site.make_handler()
        if handler is None:  # the server is stopping
            self.abort()
            return
        self._handler = handler
        handler.connection_made(transport)
        self._site.changed()

    def data_received(self, data: bytes) -> None:
        if not self._requests and not self._reading_headers:
            # The first byte of a request: its headers must be in within the timeout, and the
            # connection is no longer the idlest one (a request is arriving on it).
            self._reading_headers = True
            self._site.header_started(self)
            self._site.progressed(self)
        if self._handler is not None:
            self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received() if self._handler is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handler is not None:
            self._handler.connection_lost(exc)
            self._handler = None
        self._forget()

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    # RequestObserver --------------------------------------------------------------------

    def request_started(self) -> None:
        self._requests += 1
        if self._reading_headers:
            self._reading_headers = False
            self._site.header_done(self)
        # Its body may still be coming (or waiting for room): the handler's deadline bounds that
        # wait, and the connection may still be closed to make room, as the latest to progress.
        self._site.progressed(self)

    def request_received(self) -> None:
        self._site.answering(self)

    def request_finished(self) -> None:
        self._requests -= 1
        if not self._requests:
            self._site.progressed(self)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _forget(self) -> None:
        if self.gone:
            return
        self.gone = True
        self._cancel_timer()
        self._site.forget(self)


class GuardedSite(web.BaseSite):
    """A TCP site, with or without TLS, that holds at most ``limits.max_connections``.

    Its own protocol sits under aiohttp's, so it can count connections from their accept, close
    the one that has waited on its client longest when a new one arrives past the limit, time
    out handshakes and header reads, and tell a SIGTERM drain which connections are still in the
    middle of something.
    """

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        limits: ConnectionLimits,
        metrics: Metrics,
        listener: str,
        reuse_port: bool = False,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        assert runner.server is not None  # BaseSite has checked
        self._aiohttp_server: web.Server = runner.server
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        self.limits = limits
        self._open: set[_Connection] = set()
        # Connections waiting on their client (in the handshake, between requests, in a
        # request's headers or body), the one that made progress longest ago first: the ones
        # that may be closed to make room. The others are being answered.
        self._waiting: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        self._serving = True
        self._change = asyncio.Event()
        # Connections reading a request's headers, by the time they must be done (in order: the
        # timeout is the same for all). One timer for them all, at the earliest: cheaper than
        # arming and cancelling one per request.
        self._header_deadlines: collections.OrderedDict[_Connection, float] = (
            collections.OrderedDict()
        )
        self._header_timer: asyncio.TimerHandle | None = None
        self._open_gauge = metrics.connections_open.labels(listener)
        self._closed_counter = metrics.connections_closed
        self._listener = listener
        # Shared by the TLS connections (see _TLSProtocol); one per listener, so per event loop.
        self._tls_read_buffer = bytearray(TLS_READ_BUFFER)

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://{self._host}:{self._port}"

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accept,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_port=self._reuse_port or None,
        )

    def _accept(self) -> asyncio.BaseProtocol:
        if len(self._open) >= self.limits.max_connections and not self._close_longest_waiting():
            self.count_closed("refused")
            return _Refused()
        connection = _Connection(self)
        self._open.add(connection)
        self._waiting[connection] = None
        self._open_gauge.inc()
        if self._ssl_context is None:
            return connection
        connection.time_out_handshake(self.limits.handshake_timeout)
        return _TLSProtocol(
            connection, self._ssl_context, limits=self.limits, read_buffer=self._tls_read_buffer
        )

    def _close_longest_waiting(self) -> bool:
        for longest in self._waiting:
            longest.abort("limit")
            return True
        return False

    # Told by the connections ------------------------------------------------------------

    def make_handler(self) -> asyncio.Protocol | None:
        """aiohttp's handler for a connection whose handshake is done; None once stopping."""
        return self._aiohttp_server() if self._serving else None

    def progressed(self, connection: _Connection) -> None:
        """The connection has just made progress, and waits on its client (again)."""
        if connection.gone:
            return
        self._waiting[connection] = None
        self._waiting.move_to_end(connection)
        self._change.set()

    def answering(self, connection: _Connection) -> None:
        self._waiting.pop(connection, None)

    def header_started(self, connection: _Connection) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.header_timeout
        self._header_deadlines[connection] = deadline
        if self._header_timer is None:
            self._header_timer = loop.call_at(deadline, self._expire_headers)

    def header_done(self, connection: _Connection) -> None:
        self._header_deadlines.pop(connection, None)

    def _expire_headers(self) -> None:
        self._header_timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._header_deadlines:
            connection, deadline = self._header_deadlines.popitem(last=False)
            if deadline > now:
                self._header_deadlines[connection] = deadline
                self._header_deadlines.move_to_end(connection, last=False)
                self._header_timer = loop.call_at(deadline, self._expire_headers)
                return
            connection.abort("header_timeout")

    def forget(self, connection: _Connection) -> None:
        self._open.discard(connection)
        self._waiting.pop(connection, None)
        self._header_deadlines.pop(connection, None)
        self._open_gauge.dec()
        self._change.set()

    def changed(self) -> None:
        self._change.set()

    def count_closed(self, reason: ConnectionCloseReason) -> None:
        self._closed_counter.labels(self._listener, reason).inc()

    # Stopping ---------------------------------------------------------------------------

    async def settled(self) -> None:
        """Return once no connection is in its handshake, its request headers or a request."""
        while any(connection.pending for connection in self._open):
            self._change.clear()
            await self._change.wait()

    def stop_serving(self) -> None:
        """Make no more request handlers, and close the connections still handshaking."""
        self._serving = False
        for connection in list(self._open):
            if not connection.handshaken:
                connection.abort()

    def abort_all(self) -> None:
        """Close whatever is left, at once (those aiohttp closed may await a TLS goodbye)."""
        for connection in list(self._open):
            connection.abort()
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None


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


# Processes ------------------------------------------------------------------------------


def _worker(config: ServeConfig) -> None:
    logs.configure(config.log_level)
    try:
        asyncio.run(WebhookServer(config).run())
    except ServeError as exc:
        log.error("cannot serve", extra={"fields": {"error": str(exc)}})
        raise SystemExit(2) from exc
    except OSError as exc:
        # A port in use: one log line, not a worker's traceback (the parent stops the others).
        log.error("cannot listen", extra={"fields": {"error": str(exc)}})
        raise SystemExit(2) from exc


def serve(config: ServeConfig) -> int:
    """Run the server in this process, or as ``config.workers`` processes sharing the port."""
    if config.workers <= 1:
        try:
            asyncio.run(WebhookServer(config).run())
        except ServeError as exc:
            log.error("cannot serve", extra={"fields": {"error": str(exc)}})
            return 2
        return 0
    return _serve_workers(config)


def _serve_workers(config: ServeConfig) -> int:
    try:
        for line in prepare_certificates(config):
            log.info(line)
    except ServeError as exc:
        log.error("cannot serve", extra={"fields": {"error": str(exc)}})
        return 2
    with tempfile.TemporaryDirectory(prefix="gpuwarden-metrics-") as metrics_dir:
        # Set before the workers start: prometheus-client picks its storage at import time.
        os.environ[MULTIPROC_ENV] = metrics_dir
        spawn = multiprocessing.get_context("spawn")
        workers = [
            spawn.Process(
                target=_worker,
                args=(replace(config, reuse_port=True, leader=index == 0),),
                name=f"gpuwarden-worker-{index}",
            )
            for index in range(config.workers)
        ]
        return _supervise(workers)


def _supervise(workers: Sequence[Any]) -> int:
    stopping = False

    def forward(signum: int, _: object) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.is_alive() and worker.pid is not None:
                os.kill(worker.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for worker in workers:
            worker.start()
        log.info("workers started", extra={"fields": {"pids": [w.pid for w in workers]}})
        code = 0
        remaining = list(workers)
        while remaining:
            for worker in list(remaining):
                worker.join(timeout=0.2)
                if worker.exitcode is None:
                    continue
                remaining.remove(worker)
                if worker.exitcode != 0:
                    code = max(code, 1 if worker.exitcode < 0 else worker.exitcode)
                if not stopping:
                    log.error(
                        "a worker exited; stopping the others",
                        extra={"fields": {"pid": worker.pid, "exitcode": worker.exitcode}},
                    )
                    code = max(code, 1)
                    forward(signal.SIGTERM, None)
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
