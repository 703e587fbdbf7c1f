"""Workload traces for `gpuwarden simulate`: what arrives when, asking for what, for how long.

A trace is YAML (a list of rows, or ``{rows: [...]}``) or CSV with a header line. Each row:

=========  ===========================================================================
at         arrival, from the start of the trace: seconds, or a duration (``1d6h``, ``90m``)
namespace  the tenant namespace the pod is created in (one the simulation knows)
kind       the Kubeflow workload kind (kfp-step, training-job, trainjob, katib-trial,
           notebook, kserve-predictor)
name       the workload's name (task of a pipeline step, job, experiment, notebook, ...);
           optional, defaults to the kind
gpus       whole GPUs the pod asks for (1 or more)
duration   how long it runs once started (same forms as ``at``; above 0)
memory     GPU memory it actually uses on each of its GPUs (a quantity: ``12Gi``)
labels     extra pod labels: a mapping in YAML, ``key=value;key=value`` in CSV (optional)
=========  ===========================================================================

Parsing is pure: text in, rows out, or a :class:`TraceError` naming the row.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import yaml

from gpuwarden.lab.workloads import WORKLOAD_KINDS
from gpuwarden.policy.quantity import QuantityError, parse_non_negative

FIELDS = ("at", "namespace", "kind", "name", "gpus", "duration", "memory", "labels")
REQUIRED = ("at", "namespace", "kind", "gpus", "duration", "memory")
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the source and the row."""


@dataclass(frozen=True)
class TraceRow:
    row: int
    at: float  # seconds from the start
    namespace: str
    kind: str
    name: str
    gpus: int
    duration: float  # seconds
    memory_used: Decimal  # bytes, per GPU
    labels: Mapping[str, str] = field(default_factory=dict)


def parse_seconds(value: object) -> float:
    """Seconds from a number or a duration such as ``1d6h30m`` or ``1.5h``; ValueError else."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    negative = text.startswith("-")
    body = text.removeprefix("-")
    parts = _DURATION.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"{value!r} is not a duration (seconds, or like 1d6h30m, 90m, 1.5h)")
    seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    return -seconds if negative else seconds


def _labels(value: object) -> dict[str, str]:
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        out: dict[str, str] = {}
        for item in value.split(";"):
            key, sep, val = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"labels {value!r}: write key=value;key=value")
            out[key.strip()] = val.strip()
        return out
    raise ValueError(f"labels must be a mapping or key=value;key=value, not {value!r}")


def parse_row(raw: Mapping[str, Any], row: int, namespaces: Collection[str]) -> TraceRow:
    """One row; ValueError with what is wrong (the caller adds where)."""
    unknown = sorted(set(map(str, raw)) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown column {', '.join(unknown)} (columns: {', '.join(FIELDS)})")
    missing = [key for key in REQUIRED if raw.get(key) in (None, "")]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    namespace = str(raw["namespace"])
    if namespace not in namespaces:
        raise ValueError(
            f"unknown tenant namespace {namespace!r} (known: {', '.join(sorted(namespaces))})"
        )
    kind = str(raw["kind"])
    if kind not in WORKLOAD_KINDS:
        raise ValueError(f"unknown kind {kind!r} (one of {', '.join(WORKLOAD_KINDS)})")
    at = parse_seconds(raw["at"])
    if at < 0:
        raise ValueError(f"at {raw['at']!r} is before the start of the trace")
    duration = parse_seconds(raw["duration"])
    if duration <= 0:
        raise ValueError(f"duration {raw['duration']!r} must be above 0")
    gpus_raw = raw["gpus"]
    if isinstance(gpus_raw, bool) or not str(gpus_raw).strip().isdigit():
        raise ValueError(f"gpus {gpus_raw!r} must be a whole number of 1 or more")
    gpus = int(str(gpus_raw).strip())
    if gpus < 1:
        raise ValueError(f"gpus {gpus_raw!r} must be a whole number of 1 or more")
    try:
        memory = parse_non_negative(raw["memory"])
    except QuantityError as exc:
        raise ValueError(f"memory {raw['memory']!r}: {exc}") from None
    return TraceRow(
        row=row,
        at=at,
        namespace=namespace,
        kind=kind,
        name=str(raw.get("name") or kind),
        gpus=gpus,
        duration=duration,
        memory_used=memory,
        labels=_labels(raw.get("labels")),
    )


def _yaml_rows(text: str, source: str) -> list[tuple[int, Any]]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TraceError(f"{source}: not valid YAML: {exc}") from None
    if isinstance(doc, Mapping) and "rows" in doc:
        doc = doc["rows"]
    if not isinstance(doc, list):
        raise TraceError(f"{source}: expected a list of rows (or a mapping with rows:)")
    return list(enumerate(doc, start=1))


def _csv_rows(text: str, source: str) -> list[tuple[int, Any]]:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise TraceError(f"{source}: empty CSV (the first line names the columns)")
    rows: list[tuple[int, Any]] = []
    for number, record in enumerate(reader, start=1):
        if None in record:
            raise TraceError(f"{source}: row {number}: more values than columns")
        rows.append((number, {k.strip(): (v or "").strip() for k, v in record.items()}))
    return rows


def parse_trace(
    text: str, source: str, namespaces: Collection[str], *, fmt: str | None = None
) -> list[TraceRow]:
    """The rows of a trace, by arrival time; TraceError naming ``source`` and the row.

    ``fmt`` is ``yaml`` or ``csv``; by default a ``.csv`` source is CSV and anything else YAML.
    """
    fmt = fmt or ("csv" if source.lower().endswith(".csv") else "yaml")
    raw_rows = _csv_rows(text, source) if fmt == "csv" else _yaml_rows(text, source)
    if not raw_rows:
        raise TraceError(f"{source}: the trace has no rows")
    rows: list[TraceRow] = []
    for number, raw in raw_rows:
        if not isinstance(raw, Mapping):
            raise TraceError(f"{source}: row {number}: expected a mapping of columns")
        try:
            rows.append(parse_row(raw, number, namespaces))
        except ValueError as exc:
            raise TraceError(f"{source}: row {number}: {exc}") from None
    return sorted(rows, key=lambda r: (r.at, r.row))


def trace_csv(rows: Iterable[TraceRow]) -> str:
    """Rows as a CSV trace that parse_trace reads back to the same rows."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS)
    for r in rows:
        labels = ";".join(f"{k}={v}" for k, v in r.labels.items())
        memory = f"{int(r.memory_used / 2**20)}Mi"
        writer.writerow(
            [repr(r.at), r.namespace, r.kind, r.name, r.gpus, repr(r.duration), memory, labels]
        )
    return out.getvalue()
