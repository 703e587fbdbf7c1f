"""A review whose JSON repeats a key is refused with 400 naming the key (issue 29, item 12).

orjson, like most parsers, keeps the last of a repeated key; another reader could keep the
first. The API server never repeats one, so whoever sends such a review is told so.
"""

from __future__ import annotations

import json

import pytest

from gpuwarden.webhook.review import ReviewError, decode

from .support import Webhook, notebook_pod, review


def body_with_a_repeated_key() -> bytes:
    """The review of a GPU pod whose container's resources appear twice, the second asking none."""
    text = json.dumps(review(notebook_pod()))
    resources = '"resources": {"limits":'
    assert text.count(resources) == 1
    return text.replace(resources, '"resources": {}, ' + resources).encode()


async def test_a_repeated_key_is_refused_with_400_naming_it(webhook: Webhook) -> None:
    status, text = await webhook.post("/mutate", body_with_a_repeated_key())
    assert status == 400, text
    assert "duplicate key 'resources'" in text


@pytest.mark.parametrize(
    "body",
    [
        # A colon escaped in a string cannot hide the repeated key from the count.
        b'{"apiVersion": "admission.k8s.io/v1", "apiVersion": "x\\u003a"}',
        b'{"kind": "AdmissionReview", "request": {"uid": "a", "uid": "b"}}',
        b'{"a": {"b": 1, "c": {"d": [1, {"e": 1, "e": 2}]}}}',
    ],
)
def test_every_repeated_key_is_found(body: bytes) -> None:
    with pytest.raises(ReviewError, match="duplicate key"):
        decode(body)


def test_colons_in_strings_and_escapes_are_not_taken_for_keys() -> None:
    pod = notebook_pod()
    pod["metadata"]["annotations"]["note"] = 'a:b "c":d \\": <x> & y\\u003a'
    decoded = decode(json.dumps(review(pod)).encode())
    assert decoded.obj is not None
    assert decoded.obj["metadata"]["annotations"]["note"] == pod["metadata"]["annotations"]["note"]
    escaped = json.dumps(review(pod)).replace(":b", "\\u003ab").encode()
    decoded = decode(escaped)
    assert decoded.obj is not None
    assert decoded.obj["metadata"]["annotations"]["note"].startswith("a:b")
