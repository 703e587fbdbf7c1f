"""Connections cannot exhaust the server's memory (issue 19, item 3), and a SIGTERM drain answers
the requests still arriving (item 10).

Every connection below goes to a real listener over loopback; the HTTPS clients verify the
server's certificate. Idle ones are of every kind a client can leave hanging: no TLS handshake,
a handshake and nothing more, or request headers never finished.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpuwarden.cli import build_parser
from gpuwarden.commands.serve import config_from, fitted_max_connections
from gpuwarden.policy import Decision
from gpuwarden.webhook.app import INLINE_BODY, BodyBudget, Settings
from gpuwarden.webhook.decide import Endpoint, decide
from gpuwarden.webhook.review import Review
from gpuwarden.webhook.server import ConnectionLimits

from .support import RawConnection, Webhook, notebook_pod, review

# Long enough that nothing times out during a test that is not about timeouts.
PATIENT = ConnectionLimits(
    max_connections=16, handshake_timeout=60, header_timeout=60, keepalive_timeout=60
)
# Short, for the tests that wait for the timeouts (they poll; nothing asserts on durations),
# yet long enough for a loaded machine to finish the handshakes the test means to finish.
HASTY = ConnectionLimits(
    max_connections=64, handshake_timeout=1.0, header_timeout=1.0, keepalive_timeout=2.0
)
WITHIN = 20.0  # how long a poll waits for what it expects before the test fails


async def eventually(check: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WITHIN
    while True:
        outcome = check()
        if outcome if isinstance(outcome, bool) else await outcome:
            return
        assert time.monotonic() < deadline, f"not within {WITHIN:g}s: {what}"
        await asyncio.sleep(0.02)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Read until the server closes the connection; False if it is still open at the deadline."""
    try:
        async with asyncio.timeout(WITHIN):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        pass
    return True


async def tcp_only(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection that never starts a TLS handshake."""
    return await asyncio.open_connection("127.0.0.1", port)


async def partial_headers(webhook: Webhook) -> RawConnection:
    """A TLS connection (certificate verified) that starts a request and never ends its headers."""
    conn = await RawConnection.open(webhook.server.port, webhook.ssl)
    conn.writer.write(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic")
    await conn.writer.drain()
    return conn


async def metric(webhook: Webhook, name: str, **labels: str) -> float:
    _, text = await webhook.get("/metrics", metrics_port=True)
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    pattern = re.escape(f"{name}{{{wanted}}}" if labels else name) + r" ([0-9.e+]+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def review_body(padding: int = 0) -> bytes:
    pod = notebook_pod()
    if padding:
        pod["metadata"]["annotations"]["padding"] = "x" * padding
    return json.dumps(review(pod)).encode()


def head(body_length: int) -> bytes:
    return (
        b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {body_length}\r\n\r\n".encode()
    )


async def test_past_the_cap_the_idlest_close_and_the_webhook_still_answers(
    make_webhook: Callable[..., Any],
) -> None:
    webhook: Webhook = await make_webhook(connections=PATIENT)
    port, cap = webhook.server.port, PATIENT.max_connections
    # The oldest: handshakes done, then nothing, or a request never finished.
    handshaken = [await RawConnection.open(port, webhook.ssl) for _ in range(4)]
    unfinished = [await partial_headers(webhook) for _ in range(4)]
    # Then three times the cap of connections that never start TLS.
    silent = [await tcp_only(port) for _ in range(3 * cap)]

    status, text = await webhook.get("/readyz")
    assert status == 200 and text.startswith("ready"), text
    await webhook.serves()  # a real AdmissionReview, answered with its patch
    assert webhook.server.open_connections <= cap

    # The idlest went first: every one of the earliest kinds was closed for a newer connection.
    for conn in [*handshaken, *unfinished]:
        assert await closed_by_server(conn.reader)
    for reader, _ in silent[: 2 * cap]:
        assert await closed_by_server(reader)
    assert (
        await metric(
            webhook, "gpuwarden_connections_closed_total", listener="https", reason="limit"
        )
        >= 2 * cap
    )
    assert await metric(webhook, "gpuwarden_connections_open", listener="https") <= cap
    for _, writer in silent:
        writer.close()


async def test_the_metrics_port_is_bounded_too(make_webhook: Callable[..., Any]) -> None:
    webhook: Webhook = await make_webhook(connections=PATIENT)
    cap = PATIENT.max_connections
    assert webhook.server.metrics_port is not None
    silent = [await tcp_only(webhook.server.metrics_port) for _ in range(3 * cap)]
    # A fresh connection gets in past them all, and is answered.
    assert await metric(webhook, "gpuwarden_connections_open", listener="metrics") <= cap
    closed = await metric(
        webhook, "gpuwarden_connections_closed_total", listener="metrics", reason="limit"
    )
    assert closed >= 2 * cap
    for reader, _ in silent[: 2 * cap]:
        assert await closed_by_server(reader)
    for _, writer in silent:
        writer.close()


async def test_a_request_being_answered_is_never_closed_to_make_room(
    make_webhook: Callable[..., Any],
) -> None:
    """Past the cap, a request whose body is still coming may be closed (it waits on its
    client, like an idle connection); one that has arrived and is being answered never is."""
    webhook: Webhook = await make_webhook(connections=PATIENT)
    port, cap = webhook.server.port, PATIENT.max_connections
    context = webhook.server.context
    assert context is not None
    # Evaluations of large reviews run in a thread: hold this one there until released.
    release = threading.Event()

    def evaluate(endpoint: Endpoint, request: Review) -> Decision:
        if request.uid == "held":
            release.wait(WITHIN)
        state = context.reloader.state
        return decide(endpoint, request, state.policies, context.cluster.view())

    context.evaluate = evaluate
    large = review(notebook_pod(), uid="held")
    large["request"]["object"]["metadata"]["annotations"]["padding"] = "x" * (INLINE_BODY + 1)
    held_body = json.dumps(large).encode()
    answering = await RawConnection.open(port, webhook.ssl)
    answering.writer.write(head(len(held_body)) + held_body)
    await answering.writer.drain()
    await eventually(lambda: context.in_flight == 1, "the large review is being evaluated")

    body = review_body()
    arriving = await RawConnection.open(port, webhook.ssl)
    arriving.writer.write(head(len(body)) + body[: len(body) // 2])
    await arriving.writer.drain()
    await eventually(lambda: context.in_flight == 2, "the second request reached its handler")

    silent = [await tcp_only(port) for _ in range(3 * cap)]
    await webhook.serves()
    assert await closed_by_server(arriving.reader), "a request still arriving was kept"
    release.set()
    status, data = await asyncio.wait_for(answering.response(), WITHIN)
    assert status == 200 and json.loads(data)["response"]["uid"] == "held"
    for _, writer in silent:
        writer.close()


async def test_every_connection_left_hanging_is_closed_within_its_timeout(
    make_webhook: Callable[..., Any],
) -> None:
    webhook: Webhook = await make_webhook(connections=HASTY)
    port = webhook.server.port
    no_handshake = [await tcp_only(port) for _ in range(3)]
    # A client that starts its handshake and stops: the server waits for the rest.
    stalled_reader, stalled = await tcp_only(port)
    stalled.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    handshake_only = [await RawConnection.open(port, webhook.ssl) for _ in range(3)]
    unfinished = [await partial_headers(webhook) for _ in range(3)]

    for reader in [*(r for r, _ in no_handshake), stalled_reader]:
        assert await closed_by_server(reader), "a connection without a handshake stayed open"
    for conn in unfinished:
        assert await closed_by_server(conn.reader), "unfinished request headers stayed open"
    for conn in handshake_only:
        assert await closed_by_server(conn.reader), "an idle kept-alive connection stayed open"
    await eventually(lambda: webhook.server.open_connections == 0, "all connections closed")

    timeouts = {
        reason: await metric(
            webhook, "gpuwarden_connections_closed_total", listener="https", reason=reason
        )
        for reason in ("handshake_timeout", "header_timeout")
    }
    assert timeouts == {"handshake_timeout": 4, "header_timeout": 3}
    await webhook.serves()  # and the server goes on serving


async def test_headers_may_take_their_time_up_to_the_timeout(
    make_webhook: Callable[..., Any],
) -> None:
    """The header timer starts at the request's first byte, not at the connection's start, and
    a finished request restarts it: a kept-alive connection serves request after request."""
    limits = ConnectionLimits(
        max_connections=16, handshake_timeout=60, header_timeout=60, keepalive_timeout=60
    )
    webhook: Webhook = await make_webhook(connections=limits)
    conn = await RawConnection.open(webhook.server.port, webhook.ssl)
    body = review_body()
    for _ in range(3):
        status, data = await conn.request("POST", "/mutate", body)
        assert status == 200 and json.loads(data)["response"]["allowed"] is True
    await conn.close()


async def test_request_bodies_in_flight_are_bounded(make_webhook: Callable[..., Any]) -> None:
    """Past --max-body-bytes-in-flight a request waits for room, and gets 503 at its deadline."""
    settings = Settings(max_body=64 * 1024, max_body_in_flight=64 * 1024, deadline=0.5)
    webhook: Webhook = await make_webhook(settings=settings, connections=PATIENT)
    context = webhook.server.context
    assert context is not None
    bodies = context.bodies
    # Requests elsewhere hold all of it, and keep holding it past the next one's deadline.
    assert bodies.try_take(bodies.limit)
    status, text = await webhook.post("/mutate", review_body())
    assert status == 503 and "--max-body-bytes-in-flight" in text, text
    assert bodies.held == bodies.limit  # the refused one gave back nothing it did not take

    # They finish while the next one waits: it is answered.
    waiting = asyncio.create_task(webhook.admit("mutate", review(notebook_pod())))

    async def second_wait() -> bool:
        return await metric(webhook, "gpuwarden_admission_body_waits_total") >= 2

    await eventually(second_wait, "the second request waits for room")
    bodies.give_back(bodies.limit)
    assert (await asyncio.wait_for(waiting, WITHIN))["allowed"] is True
    await eventually(lambda: bodies.held == 0, "every share given back")


async def test_the_body_budget_lets_what_fits_pass_a_waiting_large_share() -> None:
    bodies = BodyBudget(100)
    assert bodies.try_take(60)
    large = asyncio.create_task(bodies.take(50))
    await eventually(lambda: bodies.waiting == 1, "the large share waits")
    assert bodies.try_take(30)  # what fits goes past it
    assert not bodies.try_take(20)
    bodies.give_back(60)
    await eventually(lambda: large.done(), "the large share fits once the first is back")
    assert bodies.held == 80
    cancelled = asyncio.create_task(bodies.take(100))
    await eventually(lambda: bodies.waiting == 1, "a third share waits")
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert bodies.waiting == 0
    bodies.give_back(30)
    bodies.give_back(50)
    assert bodies.held == 0


async def test_sigterm_drain_answers_requests_whose_headers_are_still_arriving(
    make_webhook: Callable[..., Any],
) -> None:
    webhook: Webhook = await make_webhook(connections=PATIENT)
    body = review_body()
    request = head(len(body)) + body
    cut = request.index(b"Content-Length")
    arriving = await RawConnection.open(webhook.server.port, webhook.ssl)
    arriving.writer.write(request[:cut])
    await arriving.writer.drain()
    idle = await RawConnection.open(webhook.server.port, webhook.ssl)
    assert (await idle.request("POST", "/mutate", body))[0] == 200

    stopping = asyncio.create_task(webhook.server.stop())
    await eventually(
        lambda: webhook.server.context is not None and webhook.server.context.draining, "draining"
    )
    arriving.writer.write(request[cut:])
    await arriving.writer.drain()
    status, data = await asyncio.wait_for(arriving.response(), WITHIN)
    assert status == 200 and json.loads(data)["response"]["allowed"] is True
    await asyncio.wait_for(stopping, WITHIN)
    assert await closed_by_server(idle.reader)


def test_the_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    # In a child process, whose soft limit starts low (this one's stays as it is).
    script = (
        "import resource\n"
        "from gpuwarden.commands.serve import raise_open_file_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "print(raise_open_file_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    reported, soft, hard = (int(value) for value in out)
    assert hard == resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = hard if hard != resource.RLIM_INFINITY else 1 << 20
    assert reported == soft == expected


def test_max_connections_is_lowered_to_fit_the_open_file_limit() -> None:
    assert fitted_max_connections(1000, 1_048_576) == 1000
    assert fitted_max_connections(1000, 1024) == (1024 - 256) // 2


def test_connection_options_reach_the_server_config() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--policies=p",
            "--cert-dir=c",
            "--max-connections=50",
            "--handshake-timeout=2",
            "--header-timeout=3",
            "--keepalive-timeout=40",
            "--max-body-bytes-in-flight=9000000",
        ]
    )
    config = config_from(args, open_files=1_048_576)
    assert config.connections == ConnectionLimits(
        max_connections=50, handshake_timeout=2, header_timeout=3, keepalive_timeout=40
    )
    assert config.settings.max_body_in_flight == 9_000_000
    defaults = config_from(build_parser().parse_args(["serve", "--policies=p", "--cert-dir=c"]))
    assert defaults.connections == ConnectionLimits()
