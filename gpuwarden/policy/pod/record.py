"""The decision gpuwarden records on a pod, as one codec: the webhook writes it, and the webhook's
quota charge, `explain` and the node agent read it back by the same rules.

Reading rule: a value is read only in the form gpuwarden writes it. Nothing is stripped, and
whitespace, a sign, an exponent, digits other than ASCII 0-9 or a number out of range make the
value malformed. A malformed value is not guessed at: the record leaves that field unrecorded
(None, as if the annotation were absent) and says why in ``problems``; reading never raises.
Names (tenant, profile, policy, backend, rule) are taken as written: they are only ever compared
with the policies' names, and a name that matches none already means nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Final

from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import QuantityError, format_bytes, parse_non_negative
from gpuwarden.policy.pod.resources import ContainerRef

# At most 9 digits: every count gpuwarden records fits, and int() never meets a forged
# 5,000-digit value (Python refuses to convert those, with a ValueError).
_WHOLE: Final = re.compile(r"[0-9]{1,9}")
# The forms format_bytes writes, read without the general quantity grammar (the hot path).
_BYTES: Final = re.compile(r"([0-9]{1,12})(Ki|Mi|Gi|Ti|Pi|Ei|)")
_BINARY_FACTORS: Final = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
# apimachinery's limit, which parse_non_negative holds every other form to.
_MAX_BYTES: Final = 2**63
_RATIO: Final = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
# Container names, each a DNS-1123 label (what the API server accepts in
# spec.containers[].name), separated by commas.
_CONTAINER_NAME = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_CONTAINER_NAMES: Final = re.compile(rf"{_CONTAINER_NAME}(?:,{_CONTAINER_NAME})*")


#: The fields PodRecord.admitted_gpu_memory uses.
CHARGE_FIELDS: Final = ("gpu_count", "gpu_memory_limit", "containers")
#: The fields that say which decision was recorded (placement keeps a recorded rule).
DECISION_FIELDS: Final = ("profile", "rule", "containers")


@dataclass(frozen=True)
class IdleRecord:
    """A profile's idle rule as the node agent reads it: act after ``after`` seconds below
    ``below`` percent of the allocated GPUs busy."""

    action: str  # "stop" or "notify"
    after: int
    below: Decimal


_IDLE: Final = re.compile(
    r"action=(stop|notify),after=([0-9]{1,9})s,below=([0-9]{1,3}(?:\.[0-9]{1,3})?)%"
)


def _idle(raw: str) -> IdleRecord:
    match = _IDLE.fullmatch(raw)
    if match is None or int(match[2]) == 0 or not 0 < Decimal(match[3]) <= 100:
        raise ValueError(
            "must read action=stop|notify,after=<seconds>s,below=<percent>% "
            "(after above 0, below above 0 and at most 100)"
        )
    return IdleRecord(action=match[1], after=int(match[2]), below=Decimal(match[3]))


def _write_idle(value: IdleRecord) -> str:
    return f"action={value.action},after={value.after}s,below={value.below:f}%"


@dataclass(frozen=True)
class PodRecord:
    """What gpuwarden recorded on a pod (its ``gpuwarden.io/*`` decision annotations); None
    where nothing, or nothing readable, is recorded."""

    profile: str | None = None
    policy: str | None = None
    tenant: str | None = None
    backend: str | None = None
    gpu_count: int | None = None
    gpu_shared: bool | None = None
    preemptible: bool | None = None
    # Bytes per GPU container per GPU: the cap the node agent enforces (gpu-memory-limit).
    gpu_memory_limit: int | None = None
    # Bytes per GPU container per GPU the scheduler reserves (the cap over the overcommit ratio).
    gpu_memory_reserved: int | None = None
    overcommit_ratio: Decimal | None = None
    thread_percentage: int | None = None
    # Where the decision came from: "rule/<name>", "label", "default"...
    rule: str | None = None
    # The containers the decision applies to; () is a recorded empty list.
    containers: tuple[str, ...] | None = None
    # The profile's idle rule (profiles without one record none).
    idle: IdleRecord | None = None
    # The annotations that could not be read, as messages naming each one and its value.
    problems: tuple[str, ...] = ()

    def to_annotations(self) -> dict[str, str]:
        """The annotations for every recorded field, in the order the webhook's patch writes them."""
        out: dict[str, str] = {}
        for codec in _CODECS:
            value = getattr(self, codec.field)
            if value is not None:
                out[codec.key] = codec.write(value)
        return out

    @classmethod
    def from_annotations(
        cls, annotations: Mapping[str, str], fields: Iterable[str] | None = None
    ) -> PodRecord:
        """Read a pod's annotations; malformed values are left unrecorded and named in
        ``problems`` (see the module docstring for the rule). ``fields`` reads only those
        fields (the others stay None), for a reader on the admission hot path that needs few."""
        values: dict[str, Any] = {}
        problems: list[str] = []
        for codec in _CODECS if fields is None else (_CODEC_OF[field] for field in fields):
            raw = annotations.get(codec.key)
            if raw is None:
                continue
            try:
                values[codec.field] = codec.read(raw)
            except ValueError as exc:  # QuantityError is one
                problems.append(f"annotation {codec.key}={raw!r}: {exc}")
        if problems:
            return cls(**values, problems=tuple(problems))
        return cls(**values) if values else _UNRECORDED

    def admitted_gpu_memory(self, refs: Iterable[ContainerRef]) -> Decimal:
        """GPU memory the pod holds against its tenant's quota: its cap on each GPU of each
        recorded container (the container's own GPU count in ``refs``, else the recorded count,
        else 1); nothing without a readable cap."""
        if self.gpu_memory_limit is None:
            return Decimal(0)
        recorded = self.gpu_count or 1
        names = self.containers or ("",)
        by_name = {ref.name: ref for ref in refs if ref.name in names}
        total = 0
        for name in names:
            ref = by_name.get(name)
            try:
                asked = ref.asked_gpus() if ref is not None else None
            except QuantityError:
                asked = None
            total += asked or recorded
        return Decimal(self.gpu_memory_limit) * total


def _name(raw: str) -> str:
    return raw


def _whole(raw: str) -> int:
    if _WHOLE.fullmatch(raw) is None:
        raise ValueError("must be a whole number")
    return int(raw)


def _percentage(raw: str) -> int:
    value = int(raw) if _WHOLE.fullmatch(raw) is not None else 0
    if not 1 <= value <= 100:
        raise ValueError("must be a whole number from 1 to 100")
    return value


def _flag(raw: str) -> bool:
    if raw not in ("true", "false"):
        raise ValueError("must be true or false")
    return raw == "true"


def _write_flag(value: bool) -> str:
    return "true" if value else "false"


def _bytes(raw: str) -> int:
    canonical = _BYTES.fullmatch(raw)
    if canonical is not None:  # what format_bytes writes: "8Gi", "15754Mi", "1500"
        value = int(canonical[1]) * _BINARY_FACTORS[canonical[2]]
        if value < _MAX_BYTES:
            return value
    # Any other quantity (or one too large, which parse_non_negative refuses), rounded up to a
    # whole byte as format_bytes writes it.
    return int(parse_non_negative(raw).to_integral_value(rounding=ROUND_CEILING))


def _ratio(raw: str) -> Decimal:
    value = Decimal(raw) if _RATIO.fullmatch(raw) is not None else Decimal(0)
    if value < 1:
        raise ValueError("must be a number of at least 1")
    return value


def _write_ratio(value: Decimal) -> str:
    # Fixed-point, never an exponent (which _ratio refuses): "1.5", "2", "16".
    return f"{value:f}"


def _names(raw: str) -> tuple[str, ...]:
    if not raw:
        return ()
    if _CONTAINER_NAMES.fullmatch(raw) is None:
        raise ValueError("must be container names separated by commas")
    return tuple(raw.split(","))


def _write_names(value: tuple[str, ...]) -> str:
    return ",".join(value)


@dataclass(frozen=True)
class _Codec:
    """One annotation: the record field it holds, how it is read and how it is written."""

    key: str
    field: str
    read: Callable[[str], Any]
    write: Callable[[Any], str]


# In the order the webhook writes them (the patch bytes depend on it).
_CODECS: Final = (
    _Codec(keys.ANNOTATION_PROFILE, "profile", _name, str),
    _Codec(keys.ANNOTATION_POLICY, "policy", _name, str),
    _Codec(keys.ANNOTATION_TENANT, "tenant", _name, str),
    _Codec(keys.ANNOTATION_BACKEND, "backend", _name, str),
    _Codec(keys.ANNOTATION_GPU_COUNT, "gpu_count", _whole, str),
    _Codec(keys.ANNOTATION_GPU_SHARED, "gpu_shared", _flag, _write_flag),
    _Codec(keys.ANNOTATION_PREEMPTIBLE, "preemptible", _flag, _write_flag),
    _Codec(keys.ANNOTATION_GPU_MEMORY_LIMIT, "gpu_memory_limit", _bytes, format_bytes),
    _Codec(keys.ANNOTATION_GPU_MEMORY_RESERVED, "gpu_memory_reserved", _bytes, format_bytes),
    _Codec(keys.ANNOTATION_OVERCOMMIT_RATIO, "overcommit_ratio", _ratio, _write_ratio),
    _Codec(keys.ANNOTATION_THREAD_PERCENTAGE, "thread_percentage", _percentage, str),
    _Codec(keys.ANNOTATION_IDLE, "idle", _idle, _write_idle),
    _Codec(keys.ANNOTATION_RULE, "rule", _name, str),
    _Codec(keys.ANNOTATION_CONTAINERS, "containers", _names, _write_names),
)
_CODEC_OF: Final = {codec.field: codec for codec in _CODECS}

_UNRECORDED: Final = PodRecord()


def field_annotations(values: Mapping[str, Any]) -> dict[str, str]:
    """The annotations of some record fields (by field name, in the order given) as
    ``PodRecord.to_annotations`` writes them, for a writer on the hot path that knows only these."""
    out: dict[str, str] = {}
    for name, value in values.items():
        if value is not None:
            codec = _CODEC_OF[name]
            out[codec.key] = codec.write(value)
    return out
