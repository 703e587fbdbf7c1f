"""Every kind of bad request gets a 4xx with a message, and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gpuwarden.webhook.app import INLINE_BODY, Settings
from gpuwarden.webhook.review import Review

from .support import Webhook, notebook_pod, review


def _with_request(**changes: Any) -> bytes:
    data = review(notebook_pod())
    for key, value in changes.items():
        if value is None:
            data["request"].pop(key, None)
        else:
            data["request"][key] = value
    return json.dumps(data).encode()


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("empty", b"", "malformed JSON"),
    ("not json", b"{not json", "malformed JSON"),
    ("invalid utf-8", b'{"kind": "\xff\xfe"}', "malformed JSON"),
    ("json array", b"[]", "got a JSON list"),
    ("wrong kind", json.dumps({**review(notebook_pod()), "kind": "Pod"}).encode(), "kind"),
    (
        "wrong apiVersion",
        json.dumps({**review(notebook_pod()), "apiVersion": "admission.k8s.io/v2"}).encode(),
        "apiVersion",
    ),
    (
        "no request",
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
        "request",
    ),
    ("missing uid", _with_request(uid=None), "uid"),
    ("empty uid", _with_request(uid=""), "uid"),
    ("uid not a string", _with_request(uid=7), "uid"),
    ("bad operation", _with_request(operation="PATCH"), "operation"),
    ("object not an object", _with_request(object="pod"), "request.object"),
    ("missing object on create", _with_request(object=None), "request.object"),
    ("dryRun not a bool", _with_request(dryRun="yes"), "dryRun"),
    ("kind not an object", _with_request(kind="Pod"), "request.kind"),
    ("namespace not a string", _with_request(namespace=["a"]), "request.namespace"),
    (
        "resources not an object",
        json.dumps(
            review({**notebook_pod(), "spec": {"containers": [{"name": "a", "resources": "8Gi"}]}})
        ).encode(),
        "request.object.spec.containers[0].resources must be an object, not string",
    ),
    (
        "label value not a string",
        json.dumps(
            review({**notebook_pod(), "metadata": {"name": "x", "labels": {"a": 1}}})
        ).encode(),
        "request.object.metadata.labels['a'] must be a string",
    ),
    ("deep nesting", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "malformed JSON"),
]


@pytest.mark.parametrize(
    ("body", "expect"), [(b, e) for _, b, e in BAD_BODIES], ids=[n for n, _, _ in BAD_BODIES]
)
async def test_bad_reviews_get_400_with_a_message(
    webhook: Webhook, body: bytes, expect: str
) -> None:
    for endpoint in ("/mutate", "/validate"):
        status, text = await webhook.post(endpoint, body)
        assert status == 400, text
        assert expect in text
        assert "Traceback" not in text
    await webhook.serves()


async def test_a_body_over_the_limit_gets_413(make_webhook: Callable[..., Any]) -> None:
    hook: Webhook = await make_webhook(settings=Settings(max_body=64 * 1024))
    big = json.dumps(review(notebook_pod()) | {"padding": "x" * 70_000}).encode()
    status, text = await hook.post("/mutate", big)
    assert status == 413 and "limit" in text

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 10_000

    # A chunked upload declares no length: it is cut off while being read.
    async with hook.session.post(hook.url + "/mutate", data=chunks(), ssl=hook.ssl) as resp:
        assert resp.status == 413
        assert "limit" in await resp.text()
    await hook.serves()


async def test_other_methods_and_paths(webhook: Webhook) -> None:
    status, text = await webhook.get("/mutate")
    assert status == 405 and text.strip()
    status, text = await webhook.post("/nowhere", b"{}")
    assert status == 404 and text.strip()
    await webhook.serves()


@pytest.mark.parametrize(("mode", "allowed"), [("deny", False), ("allow", True)])
async def test_an_internal_error_is_answered_by_the_failure_mode(
    make_webhook: Callable[..., Any], mode: str, allowed: bool
) -> None:
    hook: Webhook = await make_webhook(settings=Settings(failure_mode=mode))  # type: ignore[arg-type]
    assert hook.server.context is not None

    def broken(endpoint: str, item: Review) -> Any:
        raise RuntimeError(f"a bug evaluating {item.uid}")

    hook.server.context.evaluate = broken
    response = await hook.admit("mutate", review(notebook_pod(), uid="boom"))
    assert response["allowed"] is allowed
    assert "patch" not in response
    if allowed:
        assert "internal error" in response["warnings"][0]
    else:
        assert response["status"]["code"] == 500
        assert "boom" in response["status"]["message"]
    hook.server.context.evaluate = None
    await hook.serves()
    _, text = await hook.get("/metrics")
    assert 'gpuwarden_admission_internal_errors_total{endpoint="mutate"} 1.0' in text


async def test_a_slow_evaluation_is_cut_off_by_the_deadline(
    make_webhook: Callable[..., Any],
) -> None:
    hook: Webhook = await make_webhook(settings=Settings(deadline=0.5))
    assert hook.server.context is not None
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stuck(endpoint: str, item: Review) -> Any:
        # Runs on the evaluation thread: blocks until the test lets it go.
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=10)
        raise AssertionError("answered after the deadline")

    hook.server.context.evaluate = stuck
    # Large reviews are evaluated off the event loop, where the deadline can answer for them.
    pod = notebook_pod()
    pod["metadata"]["annotations"]["padding"] = "x" * (INLINE_BODY + 1)
    started = time.monotonic()
    response = await hook.admit("mutate", review(pod))
    elapsed = time.monotonic() - started
    release.set()
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert elapsed < 5
    hook.server.context.evaluate = None
    await hook.serves()


async def test_a_body_that_never_arrives_times_out(make_webhook: Callable[..., Any]) -> None:
    hook: Webhook = await make_webhook(settings=Settings(deadline=0.5))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", hook.server.port, ssl=hook.ssl, server_hostname="127.0.0.1"
    )
    writer.write(
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), timeout=10)
    assert b" 408 " in status_line
    writer.close()
    await hook.serves()


@pytest.mark.parametrize("encoding", ["deflate", "gzip"])
async def test_a_body_that_does_not_match_its_encoding_gets_400(
    webhook: Webhook, encoding: str
) -> None:
    status, text = await webhook.post(
        "/mutate", b"0123456789", headers={"Content-Encoding": encoding}
    )
    assert status == 400, text
    assert "request body cannot be read" in text and "Traceback" not in text
    await webhook.serves()


async def test_a_huge_wrong_value_is_not_echoed_whole(webhook: Webhook) -> None:
    """A 400 names the field and shows the start of the value: never megabytes of it."""
    data = review(notebook_pod())
    data["kind"] = "K" * 1_000_000
    status, text = await webhook.post("/mutate", json.dumps(data).encode())
    assert status == 400 and "expected kind AdmissionReview" in text
    assert len(text) < 1_000
    data = review(notebook_pod())
    data["request"]["dryRun"] = ["x"] * 100_000
    status, text = await webhook.post("/mutate", json.dumps(data).encode())
    assert status == 400 and "request.dryRun must be a boolean" in text
    assert len(text) < 1_000
    await webhook.serves()
