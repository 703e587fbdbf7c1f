"""The answer and the admission line are joined from precomputed parts: byte for byte what
encoding the whole dict with orjson gives."""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from gpuwarden.policy import Decision
from gpuwarden.webhook.logs import ADMISSION_LOGGER, AdmissionLog
from gpuwarden.webhook.review import PatchBase64, Review, encode, encode_bytes


def _review(api_version: str = "admission.k8s.io/v1", uid: str = "u-1") -> Review:
    return Review(
        api_version=api_version,
        uid=uid,
        operation="CREATE",
        namespace="team-a",
        kind="Pod",
        group="",
        resource="pods",
        sub_resource="",
        obj={},
        old_obj=None,
        dry_run=False,
    )


PATCH = (
    {"op": "add", "path": "/metadata/annotations/x", "value": 'é"\n'},
    {"path": "/spec/nodeSelector", "op": "add", "value": {"b": "1", "a": "2"}},
)
DECISIONS = [
    Decision(),
    Decision(patch=PATCH, warnings=("one", 'two "quoted" ü'), tenant="a", profile="p"),
    Decision(patch=PATCH, audit_annotations={"gpuwarden/x": "1", "a": "ü"}),
    Decision(allowed=False, code=403, reason="Forbidden", message='no "GPUs" for you\n'),
    Decision(allowed=False, code=200, reason="NotAReason", message=""),
    Decision(allowed=False, code=503, reason="ServiceUnavailable", warnings=("w",)),
]


@pytest.mark.parametrize("decision", DECISIONS)
@pytest.mark.parametrize("mutating", [True, False])
@pytest.mark.parametrize(
    "review",
    [_review(), _review("admission.k8s.io/v1beta1", 'odd "uid" \u2028 ✓'), _review("other/v9")],
)
def test_answer_bytes_are_the_encoded_dict(
    review: Review, decision: Decision, mutating: bool
) -> None:
    expected = orjson.dumps(encode(review, decision, mutating=mutating))
    assert encode_bytes(review, decision, mutating=mutating) == expected


@pytest.fixture
def admission_info() -> Iterator[None]:
    logger = logging.getLogger(ADMISSION_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)


FIELDS = {
    "uid": "u-1",
    "endpoint": "mutate",
    "operation": "CREATE",
    "namespace": "tëam",
    "pod": "x" * 300,
    "kind": "Pod",
    "tenant": None,
    "profile": "p",
    "rule": None,
    "decision": "allowed",
    "reason": None,
    "message": 'say "no"\n',
    "patched": True,
    "dry_run": False,
    "duration_ms": 0.125,
    "worker": 42,
}


@pytest.mark.parametrize(
    "fields",
    [
        FIELDS,
        {**FIELDS, "pod": "p-0"},
        {"pod": "x" * 256},
        {"pod": "x" * 257},
        {"pod": "ü" * 257, "n": 1},
        {"a": "", "b": None, "pod": "y" * 257},
        {},
        {"msg": "own", **FIELDS},
        {"when": ValueError("not JSON")},
    ],
)
@pytest.mark.usefixtures("admission_info")
def test_admission_line_is_the_formatters_json(fields: dict[str, object]) -> None:
    stream = io.StringIO()
    admission_log = AdmissionLog(stream, clock=lambda: 1767323045.0065)
    admission_log.write(dict(fields))
    line = {
        "ts": "2026-01-02T03:04:05.006+00:00",
        "level": "info",
        "logger": "gpuwarden.admission",
        "msg": "admission",
        **{
            key: f"{value[:256]}...({len(value)} characters)"
            if isinstance(value, str) and len(value) > 256
            else value
            for key, value in fields.items()
        },
    }
    assert stream.getvalue() == orjson.dumps(line, default=str).decode() + "\n"


def test_patch_base64_is_remembered_within_its_bounds() -> None:
    remembered = PatchBase64(entries=2, max_bytes=8)
    patches = [b"[1]", b"[2]", b"[3]", b"[1]", b"[" + b"9" * 20 + b"]"]
    for patch in patches:
        assert remembered(patch) == base64.b64encode(patch)
    assert len(remembered._encoded) == 2
    assert set(remembered._encoded) == {b"[3]", b"[1]"}  # the oldest went; the long one stayed out
    decision = Decision(patch=PATCH)
    review = _review()
    assert encode_bytes(review, decision, mutating=True, patch_base64=remembered) == orjson.dumps(
        encode(review, decision, mutating=True)
    )
