"""The aiohttp applications: admission endpoints on the TLS port, probes and metrics on both."""

from __future__ import annotations

import asyncio
import bisect
import collections
import datetime
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from gpuwarden.kube.cluster import ClusterSource
from gpuwarden.policy import Decision
from gpuwarden.policy.spec.model import EnforcementAction
from gpuwarden.webhook.decide import Endpoint, FailureMode, decide, failure_decision
from gpuwarden.webhook.logs import AdmissionLog
from gpuwarden.webhook.metrics import CONTENT_TYPE, Metrics
from gpuwarden.webhook.policies import PolicyReloader
from gpuwarden.webhook.review import PatchBase64, Review, ReviewError, decode, encode_bytes

DEFAULT_MAX_BODY = 6 * 1024 * 1024
# Request bodies held at once, from reading to answering (a decoded review takes several times
# its size): four of the largest, or about a thousand typical 20 KiB reviews.
DEFAULT_BODY_BYTES_IN_FLIGHT = 4 * DEFAULT_MAX_BODY
# Bodies up to this size are evaluated on the event loop (well under a millisecond); larger
# ones in a thread, so that the deadline can answer for them if evaluation runs long.
INLINE_BODY = 64 * 1024

log = logging.getLogger("gpuwarden.webhook")


@dataclass(frozen=True)
class Settings:
    failure_mode: FailureMode = "deny"
    # Answer before the API server gives up (the webhook's timeoutSeconds, 10 s by default).
    deadline: float = 8.0
    max_body: int = DEFAULT_MAX_BODY
    # Bytes of request bodies being read or evaluated at once, over all connections: a request
    # holds what it has received of its body (see BodyBudget), and waits (within its deadline)
    # for room when that does not fit.
    max_body_in_flight: int = DEFAULT_BODY_BYTES_IN_FLIGHT
    # A body must be in within body_grace seconds of its headers, plus its declared size (or
    # max_body's, if chunked) at body_min_rate bytes a second; later, the client has stalled
    # and gets 408. The API server sends a review whole, at once.
    body_grace: float = 1.0
    body_min_rate: float = 1024 * 1024
    # Longest wait for a live read of a namespace the watch cache has not seen (at most half
    # of what is left of the deadline).
    namespace_lookup_timeout: float = 2.0
    # With --client-ca: admission requests must come with a verified client certificate.
    require_client_certificate: bool = False
    # `serve --enforcement-action`: the enforcementAction of policies that set none.
    enforcement_action: EnforcementAction = "enforce"


class BodyRefused(Exception):
    """A wait for room under --max-body-bytes-in-flight that ended without it."""


def _nothing() -> None:
    pass


class BodyShare:
    """One request's part of the budget while its body arrives piece by piece."""

    __slots__ = ("age", "evict", "evicted", "held")

    def __init__(self, age: int) -> None:
        self.age = age
        self.held = 0
        # Ends the request's body read at once (it is answered 408 and its connection closed).
        self.evict: Callable[[], None] = _nothing
        # Evicted, or refused for an older request: its bytes are on their way back.
        self.evicted = False


class _Wait:
    __slots__ = ("age", "granted", "need", "share")

    def __init__(self, age: int, need: int, share: BodyShare | None) -> None:
        self.age = age
        self.need = need
        self.share = share
        self.granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class BodyBudget:
    """Bytes of request bodies that may be held at once: memory stays bounded however many
    requests arrive together, and a client that does not send its body holds none of it.

    A body already in when its request is handled takes its size; one still arriving takes
    each piece as it comes (a share), so a request that declares a large body and sends little
    holds little. A request that does not fit waits (within its deadline), the oldest first,
    though whatever fits goes, so small reviews are not held up behind a large one. Room is
    made for a request whose body is complete by closing the requests whose bodies wait on
    their client, the one that received a byte longest ago first (never one being answered).
    Should every byte held belong to requests waiting here, the youngest of them are refused
    until the oldest fits (one body of the largest size always fits on its own).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        # In age order (oldest first), not arrival order.
        self._waiting: list[_Wait] = []
        # Shares whose request waits on its client for more of its body, the one that received
        # a byte longest ago first: the ones closed to make room.
        self._on_client: collections.OrderedDict[BodyShare, None] = collections.OrderedDict()
        # Held by evicted or refused requests, given back as their handlers end.
        self._coming_back = 0
        self._ages = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def share(self) -> BodyShare:
        """A share for a request whose body is still arriving (give it back with close())."""
        return BodyShare(next(self._ages))

    def try_take(self, size: int) -> bool:
        """Take the bytes now if they fit."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    async def take(self, size: int, *, make_room: bool = False) -> None:
        """Wait until the bytes fit (cancel the wait to give up); with ``make_room`` (a body
        that is in whole), close requests whose bodies wait on their client to make room."""
        if not self.try_take(size):
            await self._wait(_Wait(next(self._ages), size, None), make_room)

    def try_add(self, share: BodyShare, size: int) -> bool:
        """Add the bytes to the share now if they fit."""
        if self.held + size > self.limit:
            return False
        self.held += size
        share.held += size
        return True

    async def add(self, share: BodyShare, size: int, *, make_room: bool) -> None:
        """Wait until the bytes fit, as take(), and add them to the share; raises BodyRefused
        if the share must give way to an older one (see the class)."""
        if not self.try_add(share, size):
            await self._wait(_Wait(share.age, size, share), make_room)

    def awaiting_client(self, share: BodyShare) -> None:
        """The share's request waits for more of its body (from now: the latest to have
        received a byte)."""
        self._on_client[share] = None

    def received(self, share: BodyShare) -> None:
        self._on_client.pop(share, None)

    def close(self, share: BodyShare) -> None:
        """The share's request has been answered (or has given up): its bytes come back."""
        self._on_client.pop(share, None)
        if share.evicted:
            self._coming_back -= share.held
        held, share.held = share.held, 0
        self.give_back(held)

    def give_back(self, size: int) -> None:
        self.held -= size
        if not self._waiting:
            return
        for entry in list(self._waiting):
            if self.held + entry.need <= self.limit:
                self._grant(entry)
        self._break_deadlock()

    async def _wait(self, entry: _Wait, make_room: bool) -> None:
        if make_room:
            self._make_room(entry.need)
        bisect.insort(self._waiting, entry, key=lambda wait: wait.age)
        self._break_deadlock()
        try:
            await entry.granted
        except BaseException:
            granted = entry.granted
            if not granted.done() or granted.cancelled():
                if entry in self._waiting:
                    self._waiting.remove(entry)
            elif granted.exception() is None and entry.share is None:
                self.give_back(entry.need)  # granted as the wait was cancelled: pass it on
            raise

    def _grant(self, entry: _Wait) -> None:
        self._waiting.remove(entry)
        self.held += entry.need
        if entry.share is not None:
            entry.share.held += entry.need
        entry.granted.set_result(None)

    def _make_room(self, size: int) -> None:
        """Evict requests waiting on their client until ``size`` bytes will have come back."""
        while self.limit - self.held + self._coming_back < size and self._on_client:
            share, _ = self._on_client.popitem(last=False)
            self._give_way(share)
            share.evict()

    def _give_way(self, share: BodyShare) -> None:
        share.evicted = True
        self._coming_back += share.held

    def _break_deadlock(self) -> None:
        """Refuse the youngest waiting requests that hold bytes, while every byte held is
        theirs (so none would come back) and the oldest waiting does not fit."""
        while self._waiting and not self._coming_back:
            holders = [entry for entry in self._waiting if entry.share and entry.share.held]
            if not holders or sum(entry.share.held for entry in holders if entry.share) < self.held:
                return
            youngest = holders[-1]
            if youngest is self._waiting[0]:
                return  # the oldest holds it all and still waits: it cannot happen (see above)
            assert youngest.share is not None
            self._waiting.remove(youngest)
            self._give_way(youngest.share)
            youngest.granted.set_exception(BodyRefused())


class RequestObserver:
    """Told how far a request on its connection has got. The listener's connection protocol
    (connections.py) is one: it times header reads, closes connections that wait on their client
    (never one whose request is being answered) to make room, and drains on SIGTERM. Requests
    for unknown paths never reach a handler and go untold."""

    __slots__ = ()

    def request_started(self) -> None:
        """The request's headers are in and its handler runs; its body may still be coming."""

    def request_received(self) -> None:
        """The whole request is in: the server, not the client, has the next move."""

    def request_finished(self) -> None:
        """The handler has returned its answer."""


def _observer(request: web.Request) -> RequestObserver | None:
    transport = request.transport
    observer = transport.get_protocol() if transport is not None else None
    return observer if isinstance(observer, RequestObserver) else None


@dataclass
class WebhookContext:
    """Everything a request handler reads; the server owns and updates it."""

    reloader: PolicyReloader
    cluster: ClusterSource
    metrics: Metrics
    settings: Settings = field(default_factory=Settings)
    certificate_served: bool = False
    certificate_error: str | None = None
    certificate_not_after: datetime.datetime | None = None
    admission_log: AdmissionLog = field(default_factory=AdmissionLog)
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="evaluate")
    )
    # Set on SIGTERM: answers carry "Connection: close" so clients move to another replica.
    draining: bool = False
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Live namespace reads under way, shared by the requests waiting for the same namespace.
    namespace_lookups: dict[str, asyncio.Future[str | None]] = field(default_factory=dict)
    # Test seam: replaces the policy core call (to provoke internal errors).
    evaluate: Callable[[Endpoint, Review], Decision] | None = None
    bodies: BodyBudget = field(init=False)

    def __post_init__(self) -> None:
        # At least one body of the largest size must fit, or such a request would wait forever.
        settings = self.settings
        self.bodies = BodyBudget(max(settings.max_body_in_flight, settings.max_body))

    def readiness(self) -> tuple[bool, list[str]]:
        """Whether to take traffic, and lines explaining what is missing or degraded."""
        missing: list[str] = []
        notes: list[str] = []
        if self.draining:
            missing.append("shutting down: finishing the requests in flight")
        state = self.reloader.state
        if state.policies is None:
            missing.append(f"no valid policy loaded: {state.error or 'not loaded yet'}")
        else:
            notes.append(f"policies: {state.fingerprint}")
            if state.error:
                notes.append(
                    "last policy reload failed (the previous set still serves): " + state.error
                )
        if not self.certificate_served:
            missing.append(
                f"certificate not served: {self.certificate_error or 'TLS listener not started'}"
            )
        elif (
            self.certificate_not_after is not None
            and self.certificate_not_after <= datetime.datetime.now(datetime.UTC)
        ):
            missing.append(
                f"the serving certificate expired at {self.certificate_not_after:%Y-%m-%d %H:%M} "
                "UTC; renew it (gpuwarden certs rotate, or its issuer)"
            )
        elif self.certificate_error:
            notes.append(f"new certificate files not loadable yet: {self.certificate_error}")
        missing += self.reloader.missing()
        notes += self.reloader.notes()
        missing += self.cluster.missing()
        # Served anyway: refusing every pod over a slow watch would be worse than stale labels.
        notes += self.cluster.stale()
        return not missing, missing + notes


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message.rstrip("\n") + "\n")


def _client_certificate(request: web.Request) -> bool:
    """Whether the TLS peer presented a certificate (the handshake has verified any it did)."""
    transport = request.transport
    return transport is not None and bool(transport.get_extra_info("peercert"))


def _names(decision: Decision) -> tuple[str, str]:
    return decision.tenant or "none", decision.profile or "none"


class AdmissionHandler:
    """POST /mutate and POST /validate."""

    def __init__(self, context: WebhookContext, endpoint: Endpoint) -> None:
        self.ctx = context
        self.endpoint = endpoint
        self.pid = os.getpid()
        self._mutating = endpoint == "mutate"
        self._base64 = PatchBase64()
        self._latency = context.metrics.latency.labels(endpoint)
        # None where the gauge reads the context's count itself when scraped.
        self._in_flight_gauge = context.metrics.in_flight_gauge(lambda: context.in_flight)
        # The request counter's children by (decision, tenant, profile): a dict lookup per
        # request instead of prometheus-client's locked one. Bounded by the policy's names.
        self._counters: dict[tuple[str, str | None, str | None], Any] = {}

    def _count(self, verdict: str, decision: Decision) -> None:
        key = (verdict, decision.tenant, decision.profile)
        counter = self._counters.get(key)
        if counter is None:
            tenant, profile = _names(decision)
            counter = self._counters[key] = self.ctx.metrics.requests.labels(
                self.endpoint, verdict, tenant, profile
            )
        counter.inc()

    def _evaluate(self, review: Review, namespace_error: str | None = None) -> Decision:
        if self.ctx.evaluate is not None:
            return self.ctx.evaluate(self.endpoint, review)
        state = self.ctx.reloader.state
        return decide(
            self.endpoint,
            review,
            state.policies,
            self.ctx.cluster.view(),
            policy_error=state.error,
            namespace_error=namespace_error,
            default_action=self.ctx.settings.enforcement_action,
        )

    def _needs_namespace(self, review: Review) -> bool:
        """Whether the request's namespace must be read live first (see _resolve_namespace)."""
        if not (review.is_pod or review.is_job) or review.operation in ("DELETE", "CONNECT"):
            return False
        return self.ctx.cluster.needs_lookup(review.namespace)

    async def _resolve_namespace(self, review: Review, started: float) -> str | None:
        """Read a namespace the cluster view lacks; None, or why it cannot.

        A namespace missing from the watch cache (created a moment ago, or the cache not
        synced) is read live once, off the event loop, by a request that needs it; requests
        for the same namespace meanwhile wait for that read.
        """
        ctx = self.ctx
        namespace = review.namespace
        left = ctx.settings.deadline - (time.perf_counter() - started)
        timeout = max(min(ctx.settings.namespace_lookup_timeout, left / 2), 0.05)
        pending = ctx.namespace_lookups.get(namespace)
        if pending is None:
            loop = asyncio.get_running_loop()
            # The loop's default executor: a slow API server must not hold up evaluations.
            pending = loop.run_in_executor(None, ctx.cluster.resolve_namespace, namespace, timeout)
            ctx.namespace_lookups[namespace] = pending
            pending.add_done_callback(lambda _: ctx.namespace_lookups.pop(namespace, None))
        try:
            error = await asyncio.wait_for(asyncio.shield(pending), timeout + 0.5)
        except TimeoutError:
            error = f"reading namespace {namespace} got no answer within {timeout:g}s"
        ctx.metrics.namespace_lookups.labels("failed" if error else "found").inc()
        if error:
            log.warning(
                "namespace unknown: GPU pods there are refused",
                extra={"fields": {"uid": review.uid, "namespace": namespace, "error": error}},
            )
        return error

    def _refuse(self, status: int, message: str, *, close: bool = False) -> web.Response:
        """A refusal; ``close`` for one whose body is left unread (the connection then closes
        at once, rather than read on while aiohttp lingers)."""
        self.ctx.metrics.bad_requests.labels(self.endpoint, str(status)).inc()
        log.info(
            "bad admission request",
            extra={"fields": {"endpoint": self.endpoint, "status": status, "error": message}},
        )
        response = _text(status, f"{self.endpoint}: {message}")
        if close:
            response.force_close()
        return response

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The route's handler, guarded as _no_tracebacks guards the others, in one coroutine
        around _answer rather than a chain of them: this is every admission's path."""
        started = time.perf_counter()
        ctx = self.ctx
        observer = _observer(request)
        if observer is not None:
            observer.request_started()
            if not request.body_exists:
                observer.request_received()
        if self._in_flight_gauge is not None:
            self._in_flight_gauge.inc()
        ctx.in_flight += 1
        ctx.idle.clear()
        try:
            response = self._unreadable(request)
            if response is None:
                response = await self._answer(request, started, observer)
            if ctx.draining:
                response.force_close()
            return response
        except web.HTTPException as exc:
            _with_text(exc)
            raise
        except Exception:
            return _internal_error(request)
        finally:
            if self._in_flight_gauge is not None:
                self._in_flight_gauge.dec()
            ctx.in_flight -= 1
            if ctx.in_flight == 0:
                ctx.idle.set()
            if observer is not None:
                observer.request_finished()

    def _unreadable(self, request: web.Request) -> web.Response | None:
        """The refusal of a request whose body is not to be read at all, or None."""
        settings = self.ctx.settings
        if settings.require_client_certificate and not _client_certificate(request):
            return self._refuse(
                403, "a client certificate signed by the webhook's --client-ca is required"
            )
        length = request.content_length
        if length is not None and length > settings.max_body:
            return self._refuse(
                413, f"request body of {length} bytes is over the limit of {settings.max_body}"
            )
        return None

    def _at_the_limit(self) -> str:
        return (
            f"request bodies in flight are at the limit of {self.ctx.bodies.limit} bytes "
            "(--max-body-bytes-in-flight) and none finished within the deadline"
        )

    async def _wait_for_room(self, size: int, started: float) -> web.Response | None:
        """Wait (within the deadline) for room for a body that is in whole, closing requests
        whose bodies wait on their client to make it; None once held, or the refusal."""
        self.ctx.metrics.body_waits.inc()
        try:
            async with asyncio.timeout(
                self.ctx.settings.deadline - (time.perf_counter() - started)
            ):
                await self.ctx.bodies.take(size, make_room=True)
        except TimeoutError:
            return self._refuse(503, self._at_the_limit())
        return None

    async def _answer(
        self, request: web.Request, started: float, observer: RequestObserver | None
    ) -> web.Response:
        settings = self.ctx.settings
        bodies = self.ctx.bodies
        content = request.content
        if content.is_eof():
            # All there: taken as it lies, without aiohttp's copy into a bytearray and out
            # again, or a timer to arm and cancel. aiohttp's read() refuses a body over
            # client_max_size (--max-body-bytes); so does this.
            body = content.read_nowait()
            size = len(body)
            if size > settings.max_body:
                return self._refuse(
                    413, f"request body is over the limit of {settings.max_body} bytes"
                )
            if not bodies.try_take(size):
                refusal = await self._wait_for_room(size, started)
                if refusal is not None:
                    return refusal
            try:
                return await self._decide(body, started, observer)
            finally:
                bodies.give_back(size)
        share = bodies.share()
        try:
            read = await self._read(request, share, started)
            if isinstance(read, web.Response):
                return read
            return await self._decide(read, started, observer)
        finally:
            bodies.close(share)

    async def _read(
        self, request: web.Request, share: BodyShare, started: float
    ) -> bytes | web.Response:
        """A body still arriving, read as it comes, each piece taken from the budget; or the
        refusal (408 for a client that stalls, or whose request was closed to make room)."""
        settings = self.ctx.settings
        bodies = self.ctx.bodies
        content = request.content
        length = request.content_length
        expected = length if length is not None else settings.max_body
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + settings.deadline - (time.perf_counter() - started)
        allowed = min(settings.body_grace + expected / settings.body_min_rate, deadline - now)
        body_due = now + allowed
        chunks: list[bytes] = []
        size = 0
        waiting_for_room = False
        try:
            async with asyncio.timeout_at(body_due) as timer:
                share.evict = lambda: timer.reschedule(loop.time())
                while True:
                    bodies.awaiting_client(share)
                    try:
                        chunk = await content.readany()
                    finally:
                        bodies.received(share)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > settings.max_body:
                        return self._refuse(
                            413,
                            f"request body is over the limit of {settings.max_body} bytes",
                            close=True,
                        )
                    chunks.append(chunk)
                    if size <= share.held or bodies.try_add(share, size - share.held):
                        continue
                    # No room for this piece: wait for it (up to the deadline; the client's
                    # own clock stops meanwhile). Only for what is in: a client that stalls
                    # after a wait holds no more than it has sent.
                    self.ctx.metrics.body_waits.inc()
                    waiting_for_room, since = True, loop.time()
                    timer.reschedule(deadline)
                    await bodies.add(share, size - share.held, make_room=content.is_eof())
                    waiting_for_room = False
                    body_due = min(deadline, body_due + loop.time() - since)
                    timer.reschedule(body_due)
        except TimeoutError:
            if share.evicted:
                self.ctx.metrics.body_evictions.inc()
                return self._refuse(
                    408,
                    "request body still arriving while others, complete, waited for room "
                    "under --max-body-bytes-in-flight: closed to make room (a client sends "
                    "its review at once)",
                    close=True,
                )
            if waiting_for_room:
                return self._refuse(503, self._at_the_limit(), close=True)
            return self._refuse(
                408,
                f"request body of {expected} bytes not received within {allowed:.3g}s "
                "(a client sends its review at once)",
                close=True,
            )
        except BodyRefused:
            return self._refuse(
                503,
                f"request bodies in flight are at the limit of {bodies.limit} bytes "
                "(--max-body-bytes-in-flight), held by requests older than this one",
                close=True,
            )
        except RequestPayloadError as exc:  # a body that does not match its Content-Encoding
            return self._refuse(400, f"request body cannot be read: {exc}", close=True)
        except ConnectionResetError:  # nobody is left to read the answer
            return self._refuse(400, "the client closed the connection before sending the body")
        return b"".join(chunks)

    async def _decide(
        self, body: bytes, started: float, observer: RequestObserver | None
    ) -> web.Response:
        """The answer to a review whose body is in."""
        settings = self.ctx.settings
        if observer is not None:
            observer.request_received()
        try:
            review = decode(body)
        except ReviewError as exc:
            return self._refuse(400, str(exc))
        namespace_error = None
        if self._needs_namespace(review):
            namespace_error = await self._resolve_namespace(review, started)
        failed = False
        try:
            if len(body) <= INLINE_BODY:
                decision = self._evaluate(review, namespace_error)
            else:
                remaining = max(settings.deadline - (time.perf_counter() - started), 0.001)
                loop = asyncio.get_running_loop()
                decision = await asyncio.wait_for(
                    loop.run_in_executor(
                        self.ctx.executor, self._evaluate, review, namespace_error
                    ),
                    remaining,
                )
        except ReviewError as exc:
            return self._refuse(400, str(exc))
        except Exception as exc:
            failed = True
            self.ctx.metrics.internal_errors.labels(self.endpoint).inc()
            timed_out = isinstance(exc, TimeoutError)
            log.error(
                "evaluation timed out" if timed_out else "evaluation failed",
                exc_info=not timed_out,
                extra={"fields": {"uid": review.uid, "endpoint": self.endpoint}},
            )
            decision = failure_decision(settings.failure_mode, self.endpoint, review.uid)
        return self._reply(review, decision, failed, started)

    def _reply(
        self, review: Review, decision: Decision, failed: bool, started: float
    ) -> web.Response:
        """The answer to a decided review, counted, timed and logged."""
        mutating = self._mutating
        response = web.Response(
            body=encode_bytes(review, decision, mutating=mutating, patch_base64=self._base64),
            content_type="application/json",
        )
        elapsed = time.perf_counter() - started
        verdict = "error" if failed else decision.verdict
        self._count(verdict, decision)
        if decision.audited is not None:
            tenant, _ = _names(decision)
            self.ctx.metrics.audited.labels(self.endpoint, tenant, decision.audited).inc()
        self._latency.observe(elapsed)
        allowed = decision.allowed
        fields = {
            "uid": review.uid,
            "endpoint": self.endpoint,
            "operation": review.operation,
            "namespace": review.namespace,
            "pod": review.pod_name,
            "kind": review.kind,
            "tenant": decision.tenant,
            "profile": decision.profile,
            "rule": decision.rule,
            "decision": verdict,
            # Why a request was denied, as the user read it (logs.py bounds its length).
            "reason": None if allowed else decision.reason,
            "message": None if allowed else decision.message,
            "patched": mutating and allowed and bool(decision.patch),
            "dry_run": review.dry_run,
            "duration_ms": round(elapsed * 1000, 3),
            "worker": self.pid,
        }
        if decision.audited is not None:
            # Under audit or dryrun: the check that would have denied, or "mutation".
            fields["audited"] = decision.audited
        self.ctx.admission_log.write(fields)
        return response


def _probes(context: WebhookContext) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        return _text(200, "ok")

    async def readyz(_: web.Request) -> web.Response:
        ready, lines = context.readiness()
        head = "ready" if ready else "not ready"
        return _text(200 if ready else 503, "\n".join([head, *(f"- {line}" for line in lines)]))

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=context.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE}
        )

    return [
        web.get("/healthz", _no_tracebacks(healthz)),
        web.get("/livez", _no_tracebacks(healthz)),
        web.get("/readyz", _no_tracebacks(readyz)),
        web.get("/metrics", _no_tracebacks(metrics)),
    ]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _with_text(exc: web.HTTPException) -> None:
    """An aiohttp error answer given a body that says what it is, when it has none."""
    if exc.status >= 400 and not exc.text:
        exc.text = f"{exc.status} {exc.reason}"


def _internal_error(request: web.Request) -> web.Response:
    """The answer to a request whose handler failed unexpectedly (logged, with its traceback)."""
    log.exception("unhandled error", extra={"fields": {"path": request.path}})
    return _text(500, "internal error; see the webhook's log")


def _no_tracebacks(handler: Handler) -> Handler:
    """Wrap a handler: nothing unexpected leaks a traceback, and the connection's observer (if
    it has one) hears when the request starts and ends. A wrapper, not a middleware, which would
    cost every admission request a layer of aiohttp's dispatch."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        observer = _observer(request)
        if observer is not None:
            observer.request_started()
            if not request.body_exists:  # a probe: nothing more to wait for
                observer.request_received()
        try:
            return await handler(request)
        except web.HTTPException as exc:
            _with_text(exc)
            raise
        except Exception:
            return _internal_error(request)
        finally:
            if observer is not None:
                observer.request_finished()

    return guarded


def admission_app(context: WebhookContext) -> web.Application:
    """The TLS application the API server calls."""
    # aiohttp refuses a body over client_max_size on read(), chunked uploads included.
    app = web.Application(client_max_size=context.settings.max_body)
    app.add_routes(
        [
            web.post("/mutate", AdmissionHandler(context, "mutate").handle),
            web.post("/validate", AdmissionHandler(context, "validate").handle),
            *_probes(context),
        ]
    )
    return app


def probes_app(context: WebhookContext) -> web.Application:
    """Plain HTTP: /metrics for Prometheus and the probes for the kubelet."""
    app = web.Application()
    app.add_routes(_probes(context))
    return app
