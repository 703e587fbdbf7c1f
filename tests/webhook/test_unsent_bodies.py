"""Bodies declared but not sent hold nobody up (issue 29, item 1).

A request holds under --max-body-bytes-in-flight what it has received of its body, not what its
Content-Length declares; a body that stalls is answered 408 within a time proportional to its
declared size; and when room is short, requests whose bodies wait on their client are closed to
make room for complete ones. Every connection goes to a real listener over loopback TLS.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from gpuwarden.webhook.app import DEFAULT_MAX_BODY, BodyBudget, BodyRefused, Settings
from gpuwarden.webhook.server import ConnectionLimits

from .support import RawConnection, Webhook, notebook_pod, review
from .test_connections import WITHIN, closed_by_server, eventually, head, metric

ROOMY = ConnectionLimits(
    max_connections=64, handshake_timeout=60, header_timeout=60, keepalive_timeout=60
)


async def stalled_body(webhook: Webhook, declared: int, sent: bytes) -> RawConnection:
    """A request to /validate declaring ``declared`` body bytes, of which only ``sent`` come."""
    conn = await RawConnection.open(webhook.server.port, webhook.ssl)
    conn.writer.write(head(declared).replace(b"/mutate", b"/validate") + sent)
    await conn.writer.drain()
    return conn


async def test_declared_but_unsent_bodies_do_not_stop_admission(
    make_webhook: Callable[..., Any],
) -> None:
    """The attack: 24 connections declare the largest body and send one byte. Before, they held
    the whole budget (4 x 6 MiB) and every other review got 503 at its deadline."""
    webhook: Webhook = await make_webhook(connections=ROOMY)
    context = webhook.server.context
    assert context is not None
    attackers = [await stalled_body(webhook, DEFAULT_MAX_BODY, b"{") for _ in range(24)]
    await eventually(lambda: context.in_flight == 24, "every attacker's request is handled")

    response = await webhook.admit("mutate", review(notebook_pod()))
    assert response["allowed"] is True and "patch" in response
    assert context.bodies.waiting == 0
    for conn in attackers:
        await conn.close()


async def test_a_stalled_body_gets_408_and_its_connection_closes(
    make_webhook: Callable[..., Any],
) -> None:
    settings = Settings(body_grace=0.2, body_min_rate=1e12)
    webhook: Webhook = await make_webhook(settings=settings, connections=ROOMY)
    context = webhook.server.context
    assert context is not None
    stalled = await stalled_body(webhook, 100_000, b'{"apiVersion"')
    status, text = await asyncio.wait_for(stalled.response(), WITHIN)
    assert status == 408, text
    assert b"request body of 100000 bytes not received within" in text
    assert await closed_by_server(stalled.reader)
    assert context.bodies.held == 0
    await webhook.serves()


async def test_bodies_waiting_on_their_client_are_closed_to_make_room(
    make_webhook: Callable[..., Any],
) -> None:
    """Clients that send most of a body and stop hold what they sent; a complete review that
    does not fit closes the one that received a byte longest ago, and is answered."""
    limit = 64 * 1024
    settings = Settings(max_body=limit, max_body_in_flight=limit, body_grace=60)
    webhook: Webhook = await make_webhook(settings=settings, connections=ROOMY)
    context = webhook.server.context
    assert context is not None
    bodies = context.bodies
    first = await stalled_body(webhook, limit, b" " * 44_000)
    await eventually(lambda: bodies.held == 44_000, "the first stalled body is held")
    second = await stalled_body(webhook, limit, b" " * 21_000)
    await eventually(lambda: bodies.held == 65_000, "the second stalled body is held")

    response = await webhook.admit("mutate", review(notebook_pod()))
    assert response["allowed"] is True and "patch" in response
    status, text = await asyncio.wait_for(first.response(), WITHIN)
    assert status == 408 and b"closed to make room" in text, text
    assert await closed_by_server(first.reader)
    assert await metric(webhook, "gpuwarden_admission_body_evictions_total") == 1
    # The younger stalled body was not needed, and is still there.
    assert bodies.held == 21_000
    await second.close()
    await eventually(lambda: bodies.held == 0, "every share given back")


async def test_a_body_that_arrives_whole_is_answered_however_it_was_split(
    make_webhook: Callable[..., Any],
) -> None:
    """A body still arriving when its headers are read is read in pieces, each taken from
    the budget as it comes, and answered as any other."""
    webhook: Webhook = await make_webhook(connections=ROOMY)
    body = json.dumps(review(notebook_pod(), uid="split")).encode()
    conn = await RawConnection.open(webhook.server.port, webhook.ssl)
    conn.writer.write(head(len(body)) + body[:100])
    await conn.writer.drain()
    context = webhook.server.context
    assert context is not None
    await eventually(lambda: context.bodies.held == 100, "the first piece is held")
    conn.writer.write(body[100:])
    status, data = await asyncio.wait_for(conn.response(), WITHIN)
    assert status == 200 and json.loads(data)["response"]["uid"] == "split"
    assert context.bodies.held == 0
    await conn.close()


async def test_requests_holding_all_the_room_and_waiting_for_more_give_way_to_the_oldest() -> None:
    bodies = BodyBudget(100)
    older, younger = bodies.share(), bodies.share()
    assert bodies.try_add(older, 50) and bodies.try_add(younger, 50)
    first = asyncio.create_task(bodies.add(older, 10, make_room=False))
    await eventually(lambda: bodies.waiting == 1, "the older waits")
    second = asyncio.create_task(bodies.add(younger, 10, make_room=False))
    with pytest.raises(BodyRefused):
        await asyncio.wait_for(second, WITHIN)
    assert not first.done()
    bodies.close(younger)  # its request is answered 503 and gives back what it held
    await asyncio.wait_for(first, WITHIN)
    assert older.held == 60 and bodies.held == 60
    bodies.close(older)
    assert bodies.held == 0


async def test_a_complete_body_evicts_the_longest_waiting_on_its_client_first() -> None:
    bodies = BodyBudget(100)
    evicted: list[str] = []
    shares = {}
    for name in ("a", "b", "c"):
        share = bodies.share()
        share.evict = lambda name=name: evicted.append(name)  # type: ignore[misc]
        assert bodies.try_add(share, 30)
        shares[name] = share
    # b received a byte last of all: it is evicted last.
    for name in ("a", "c", "b"):
        bodies.awaiting_client(shares[name])
    waiting = asyncio.create_task(bodies.take(50, make_room=True))
    await eventually(lambda: bodies.waiting == 1, "the complete body waits")
    assert evicted == ["a", "c"]
    bodies.close(shares["a"])
    assert not waiting.done()
    bodies.close(shares["c"])
    await asyncio.wait_for(waiting, WITHIN)
    assert bodies.held == 80
