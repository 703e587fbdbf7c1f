"""AdmissionReview (admission.k8s.io/v1 and v1beta1) in and out, as plain data.

Decoding never raises anything but :class:`ReviewError`, whose message tells the caller which
field is wrong; encoding turns a policy :class:`Decision` into the response the API server
expects.
"""

from __future__ import annotations

import binascii
import json
import re
import reprlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, cast

import orjson

from gpuwarden.policy import AdmissionRequest, Decision
from gpuwarden.policy.admission.decision import Operation
from gpuwarden.policy.pod import jobs

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
OPERATIONS: tuple[Operation, ...] = ("CREATE", "UPDATE", "DELETE", "CONNECT")
_STATUS_REASONS = frozenset(
    {
        "Forbidden",
        "Invalid",
        "BadRequest",
        "InternalError",
        "Timeout",
        "Unauthorized",
        "ServiceUnavailable",
    }
)


def short_repr(value: Any) -> str:
    """A value's repr cut short, so an error names a bad value without echoing all of it."""
    shorten = reprlib.Repr()
    shorten.maxstring = shorten.maxother = 60
    shorten.maxlist = shorten.maxdict = shorten.maxtuple = 4
    shorten.maxlevel = 2
    return shorten.repr(value)


class ReviewError(Exception):
    """A request that is not a usable AdmissionReview; answered 400 with this message."""


class Review(NamedTuple):
    """The parts of an AdmissionReview request that gpuwarden reads (a named tuple: made for
    every review, and a frozen dataclass's eleven guarded assignments cost as much as the
    checks that come before them)."""

    api_version: str
    uid: str
    operation: Operation
    namespace: str
    kind: str
    group: str
    resource: str
    sub_resource: str
    obj: Mapping[str, Any] | None
    old_obj: Mapping[str, Any] | None
    dry_run: bool

    @property
    def is_pod(self) -> bool:
        return self.group == "" and (self.kind == "Pod" or self.resource == "pods")

    @property
    def is_job(self) -> bool:
        """A Kubeflow Training Operator job (PyTorchJob and its kin, kubeflow.org/v1), a Katib
        Experiment (kubeflow.org/v1beta1), or a batch/v1 Job (Katib's trials)."""
        return jobs.kind_for(self.group, self.kind, self.resource) is not None

    @property
    def is_config_map(self) -> bool:
        return self.group == "" and (self.kind == "ConfigMap" or self.resource == "configmaps")

    @property
    def pod_name(self) -> str:
        source = self.obj if self.obj is not None else self.old_obj
        meta = source.get("metadata") if source is not None else None
        if not isinstance(meta, dict):
            return ""
        name = meta.get("name")
        if isinstance(name, str) and name:
            return name
        generate = meta.get("generateName")
        return f"{generate}*" if isinstance(generate, str) and generate else ""

    def admission_request(self) -> AdmissionRequest:
        return AdmissionRequest(
            operation=self.operation,
            namespace=self.namespace,
            pod=self.obj or {},
            old_pod=self.old_obj,
            sub_resource=self.sub_resource,
            uid=self.uid,
            dry_run=self.dry_run,
        )


def _string(value: Any, field: str, *, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        kind = "missing" if value is None else f"a {type(value).__name__}, not a string"
        raise ReviewError(f"{field} is {kind}")
    return value


def _object(value: Any, field: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ReviewError(f"{field} must be an object, not a {type(value).__name__}")
    return value


def _group_kind(value: Any, field: str, name_key: str) -> tuple[str, str]:
    if value is None:
        return "", ""
    if not isinstance(value, dict):
        raise ReviewError(f"{field} must be an object, not a {type(value).__name__}")
    return _string(value.get("group"), f"{field}.group"), _string(
        value.get(name_key), f"{field}.{name_key}"
    )


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ReviewError(
                f"duplicate key {short_repr(key)} in an object of the review: each key may "
                "appear once (the API server never repeats one; a parser keeping either value "
                "would read a different object)"
            )
        seen[key] = value
    return seen


# A colon spelled as an escape in a string of the body, which hides it from the count below.
_ESCAPED_COLON = re.compile(rb"\\u003[aA]")


def _check_unique(body: bytes, data: Any) -> None:
    """Refuse a body whose JSON repeats a key within an object, which orjson (like most
    parsers) reads as the last value. Every key has its colon, outside strings, so a body that
    holds more colons than the parsed value written back has lost a key; only then, or if a
    colon in a string is escaped (which could hide it), is it parsed again, slowly, to name the
    key. The counts cost about 1.5 microseconds per KiB of body."""
    try:
        written = orjson.dumps(data)
    except TypeError:  # nested deeper than orjson writes (255 levels): the slow parse judges
        written = b""
    if body.count(b":") != written.count(b":") or _ESCAPED_COLON.search(body):
        try:
            json.loads(body, object_pairs_hook=_refuse_duplicate_keys)
        except (RecursionError, ValueError) as exc:  # deeper than this parser goes
            raise ReviewError(f"malformed JSON: {type(exc).__name__}: {exc}") from None


def decode(body: bytes) -> Review:
    """Parse and check an AdmissionReview request body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ReviewError(f"malformed JSON: {exc}") from None
    _check_unique(body, data)
    if not isinstance(data, dict):
        raise ReviewError(f"expected an AdmissionReview object, got a JSON {type(data).__name__}")
    kind, api_version = data.get("kind"), data.get("apiVersion")
    if kind != "AdmissionReview" or api_version not in API_VERSIONS:
        raise ReviewError(
            f"expected kind AdmissionReview with apiVersion {' or '.join(API_VERSIONS)}, "
            f"got kind {short_repr(kind)} apiVersion {short_repr(api_version)}"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid is missing or empty; the response must echo it")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise ReviewError(
            f"request.operation must be one of {', '.join(OPERATIONS)}, got {short_repr(operation)}"
        )
    # The usual shapes are checked inline; anything else goes to the helpers that name what
    # is wrong (in the same order).
    kind_ref, resource_ref = request.get("kind"), request.get("resource")
    if not (
        type(kind_ref) is dict
        and type(group := kind_ref.get("group", "")) is str
        and type(kind_name := kind_ref.get("kind", "")) is str
    ):
        group, kind_name = _group_kind(kind_ref, "request.kind", "kind")
    if not (
        type(resource_ref) is dict
        and type(resource_group := resource_ref.get("group", "")) is str
        and type(resource := resource_ref.get("resource", "")) is str
    ):
        resource_group, resource = _group_kind(resource_ref, "request.resource", "resource")
    dry_run = request.get("dryRun", False)
    if dry_run is None:
        dry_run = False
    if not isinstance(dry_run, bool):
        raise ReviewError(f"request.dryRun must be a boolean, not {short_repr(dry_run)}")
    obj, old = request.get("object"), request.get("oldObject")
    if type(obj) is not dict:
        obj = _object(obj, "request.object")
    if old is not None and type(old) is not dict:
        old = _object(old, "request.oldObject")
    namespace = request.get("namespace")
    if type(namespace) is not str:
        namespace = _string(namespace, "request.namespace")
    if not namespace and obj is not None:
        meta = obj.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("namespace"), str):
            namespace = meta["namespace"]
    return Review(
        api_version=str(api_version),
        uid=uid,
        operation=cast(Operation, operation),
        namespace=namespace,
        kind=kind_name,
        group=group or resource_group,
        resource=resource,
        sub_resource=sub_resource
        if type(sub_resource := request.get("subResource")) is str
        else _string(sub_resource, "request.subResource"),
        obj=obj,
        old_obj=old,
        dry_run=dry_run,
    )


def _reason(decision: Decision) -> str:
    return decision.reason if decision.reason in _STATUS_REASONS else "Forbidden"


# The response's fixed parts, as orjson writes them: the body is joined from these and the
# few values that vary, so the base64 patch (most of an answer) is neither decoded into a str
# nor scanned again for characters to escape.
_KIND_AND_UID = b',"kind":"AdmissionReview","response":{"uid":'
_HEADS = MappingProxyType(
    {version: b'{"apiVersion":"' + version.encode() + b'"' for version in API_VERSIONS}
)
_PATCH = b',"patchType":"JSONPatch","patch":"'


def base64(data: bytes) -> bytes:
    """``data`` in base64, as the AdmissionReview's patch field carries it."""
    return binascii.b2a_base64(data, newline=False)


class PatchBase64:
    """The base64 of the patches encoded last, by their bytes: the replicas of one workload get
    the same patch, and encoding a typical 2 KiB patch costs more than the rest of the answer.
    At most ``entries`` of them, each at most ``max_bytes`` long (larger ones are not kept)."""

    def __init__(self, entries: int = 64, max_bytes: int = 16 * 1024) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self._encoded: dict[bytes, bytes] = {}

    def __call__(self, patch: bytes) -> bytes:
        encoded = self._encoded.get(patch)
        if encoded is None:
            encoded = base64(patch)
            if len(patch) <= self.max_bytes:
                if len(self._encoded) >= self.entries:
                    del self._encoded[next(iter(self._encoded))]  # the oldest
                self._encoded[patch] = encoded
        return encoded


def encode_bytes(
    review: Review,
    decision: Decision,
    *,
    mutating: bool,
    patch_base64: Callable[[bytes], bytes] = base64,
) -> bytes:
    """The response body: :func:`encode`'s AdmissionReview as compact JSON, byte for byte."""
    allowed = decision.allowed
    head = _HEADS.get(review.api_version) or b'{"apiVersion":' + orjson.dumps(review.api_version)
    parts = [head, _KIND_AND_UID, orjson.dumps(review.uid)]
    parts.append(b',"allowed":true' if allowed else b',"allowed":false')
    if mutating and allowed and decision.patch:
        parts += (_PATCH, patch_base64(decision.patch_bytes()), b'"')
    if decision.warnings:
        parts += (b',"warnings":', orjson.dumps(decision.warnings))
    if decision.audit_annotations:
        parts += (b',"auditAnnotations":', orjson.dumps(dict(decision.audit_annotations)))
    if not allowed:
        parts += (b',"status":', orjson.dumps(_status(decision)))
    parts.append(b"}}")
    return b"".join(parts)


def _status(decision: Decision) -> dict[str, Any]:
    return {
        "code": decision.code if 400 <= decision.code < 600 else 403,
        "message": decision.message or "denied by gpuwarden",
        "reason": _reason(decision),
    }


def encode(review: Review, decision: Decision, *, mutating: bool) -> dict[str, Any]:
    """The AdmissionReview response for ``decision`` (a patch only from /mutate, when allowed)."""
    response: dict[str, Any] = {"uid": review.uid, "allowed": decision.allowed}
    if mutating and decision.allowed and decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64(decision.patch_bytes()).decode()
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    if decision.audit_annotations:
        response["auditAnnotations"] = dict(decision.audit_annotations)
    if not decision.allowed:
        response["status"] = _status(decision)
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}
