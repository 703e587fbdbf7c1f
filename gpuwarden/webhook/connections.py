"""The listener's connections: how many are held, how long each may wait on its client.

A TCP site (:class:`GuardedSite`), with or without TLS, whose own protocol sits under aiohttp's:
it counts connections from their accept, closes the one that has waited on its client longest
when one arrives past the cap, times out handshakes and header reads, shares one TLS read buffer
among a listener's connections, and tells a SIGTERM drain which are in the middle of something.
"""

from __future__ import annotations

import asyncio
import collections
import math
import ssl
from asyncio import sslproto
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from gpuwarden.webhook.app import RequestObserver
from gpuwarden.webhook.metrics import Metrics


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
