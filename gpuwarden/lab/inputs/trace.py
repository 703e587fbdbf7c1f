"""Workload traces for `gpuwarden simulate`: what arrives when, asking for what, for how long.

A trace is YAML (a list of rows, or ``{rows: [...]}``) or CSV with a header line. Each row:

=========  ===========================================================================
at         arrival, from the start of the trace: seconds, or a duration (``1d6h``, ``90m``)
namespace  the tenant namespace the pod is created in (one the simulation knows)
kind       the Kubeflow workload kind (kfp-step, training-job, trainjob, katib-trial,
           notebook, kserve-predictor)
name       the workload's name (task of a pipeline step, job, experiment, notebook, ...);
           optional, defaults to the kind
gpus       GPUs the pod asks for: a whole number (1 or more), or a share of one GPU
           below 1 (``0.25``: what a GPU-sharing cluster's ``gpu_milli: 250`` asks); a pod
           asking a share asks one device
duration   batch kinds: how long its work takes on the GPUs it asks for at full speed;
           notebook and kserve-predictor: how long it is wanted (from ``at``)
memory     GPU memory it actually uses on each of its GPUs (a quantity: ``12Gi``)
labels     extra pod labels: a mapping in YAML, ``key=value;key=value`` in CSV (optional)
busy       the share of a GPU's SMs it keeps busy at full speed, 0..1, as DCGM's
           DCGM_FI_DEV_GPU_UTIL would report for it alone (optional; :data:`DEFAULT_BUSY`
           per kind, or the share it asks when that is lower)
checkpoint seconds between its checkpoints (optional; absent: a restart loses everything)
run        rows with the same ``run`` execute one after another in row order, like a
           pipeline's steps (optional); their ``at`` must not go back in time
products   GPU Feature Discovery product names the pod may run on (a list in YAML,
           ``a;b`` in CSV; optional: any GPU)
idle       notebook rows: the last part of ``duration`` (seconds, or a duration) in which
           the session's work is done and it sits idle, holding its GPU, until its user
           closes it (optional; absent or 0: busy to the end)
idle_busy  the share of a GPU's SMs it keeps busy in that idle tail, 0..1 (optional,
           only with ``idle``; default 0, at most ``busy``)
=========  ===========================================================================

Parsing is pure: text in, rows out, or a :class:`TraceError` naming the row.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import yaml

from gpuwarden.lab.inputs.workloads import WORKLOAD_KINDS, workload_pod
from gpuwarden.policy.pod.quantity import QuantityError, parse_non_negative

FIELDS = (
    "at",
    "namespace",
    "kind",
    "name",
    "gpus",
    "duration",
    "memory",
    "labels",
    "busy",
    "checkpoint",
    "run",
    "products",
    "idle",
    "idle_busy",
)
REQUIRED = ("at", "namespace", "kind", "gpus", "duration", "memory")
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


#: Kinds whose rows are work to complete; the others are services wanted for a lifetime.
BATCH_KINDS = frozenset({"kfp-step", "training-job", "trainjob", "katib-trial"})
#: ``busy`` when a row gives none: training keeps its GPUs nearly saturated, a pipeline step
#: less so (input, checkpoints), a notebook idles most of the time, a predictor follows its
#: traffic.
DEFAULT_BUSY: Mapping[str, float] = {
    "kfp-step": 0.7,
    "training-job": 0.9,
    "trainjob": 0.9,
    "katib-trial": 0.8,
    "notebook": 0.1,
    "kserve-predictor": 0.3,
}


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the source and the row."""


@dataclass(frozen=True)
class TraceRow:
    row: int
    at: float  # seconds from the start
    namespace: str
    kind: str
    name: str
    gpus: float  # whole GPUs (1, 2, ...) or a share of one (0 < gpus < 1)
    duration: float  # seconds
    memory_used: Decimal  # bytes, per GPU
    labels: Mapping[str, str] = field(default_factory=dict)
    busy: float = 1.0  # SM share kept busy on each of its GPUs at full speed
    checkpoint: float | None = None  # seconds between checkpoints; None: none
    run: str | None = None  # rows of one run execute one after another
    gpu_products: tuple[str, ...] = ()  # GFD product names it may run on (); any)
    idle: float = 0.0  # notebooks: seconds at the end of ``duration`` it sits idle
    idle_busy: float = 0.0  # SM share kept busy in that idle tail

    @property
    def idle_from(self) -> float | None:
        """When its idle tail starts (seconds from the start; None: it has none)."""
        return self.at + self.duration - self.idle if self.idle > 0 else None

    @property
    def work_duration(self) -> float:
        """``duration`` without its idle tail: how long it is wanted for work."""
        return self.duration - self.idle

    @property
    def batch(self) -> bool:
        """Work to complete (True) or a service wanted for its duration (False)."""
        return self.kind in BATCH_KINDS

    @property
    def devices(self) -> int:
        """GPU devices the pod asks for (a share asks one)."""
        return max(1, math.ceil(self.gpus))

    @property
    def offered_gpu_seconds(self) -> float:
        return self.gpus * self.duration


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
    gpus = parse_gpus(raw["gpus"])
    busy = DEFAULT_BUSY[kind] if raw.get("busy") in (None, "") else parse_share(raw["busy"])
    checkpoint = None
    if raw.get("checkpoint") not in (None, ""):
        checkpoint = parse_seconds(raw["checkpoint"])
        if checkpoint <= 0:
            raise ValueError(f"checkpoint {raw['checkpoint']!r} must be above 0")
    run = None if raw.get("run") in (None, "") else str(raw["run"])
    products = raw.get("products") or ()
    if isinstance(products, str):
        products = [p.strip() for p in products.split(";") if p.strip()]
    if not isinstance(products, list | tuple) or not all(isinstance(p, str) for p in products):
        raise ValueError(f"products {products!r} must be a list of GPU product names")
    try:
        memory = parse_non_negative(raw["memory"])
    except QuantityError as exc:
        raise ValueError(f"memory {raw['memory']!r}: {exc}") from None
    if raw.get("busy") in (None, ""):
        busy = min(busy, gpus)
    idle, idle_busy = parse_idle(raw, kind, duration, busy)
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
        busy=busy,
        checkpoint=checkpoint,
        run=run,
        gpu_products=tuple(products),
        idle=idle,
        idle_busy=idle_busy,
    )


def parse_idle(
    raw: Mapping[str, Any], kind: str, duration: float, busy: float
) -> tuple[float, float]:
    """(``idle``, ``idle_busy``) of a row: a notebook's idle tail within its duration, and
    what it keeps busy then (no more than at work); ValueError else."""
    given, tail_busy = raw.get("idle"), raw.get("idle_busy")
    if given in (None, ""):
        if tail_busy not in (None, ""):
            raise ValueError("idle_busy is the busy share of an idle tail: give idle too")
        return 0.0, 0.0
    idle = parse_seconds(given)
    if idle and kind != "notebook":
        raise ValueError(
            f"idle {given!r}: only notebook rows have an idle tail (this row is a {kind})"
        )
    if not 0 <= idle <= duration:
        raise ValueError(f"idle {given!r} must be from 0 to the row's duration ({duration:g}s)")
    share = 0.0
    if tail_busy not in (None, ""):
        try:
            share = parse_share(tail_busy)
        except ValueError as exc:
            raise ValueError(f"idle_{exc}") from None
        if share > busy:
            raise ValueError(
                f"idle_busy {tail_busy!r} is above the row's busy ({busy:g}): idle keeps less busy"
            )
    return idle, share


def parse_gpus(value: object) -> float:
    """A whole number of GPUs (1 or more) or a share of one (0 < share < 1); ValueError else."""
    text = str(value).strip()
    try:
        if isinstance(value, bool):
            raise ValueError
        gpus = float(text)
    except ValueError:
        gpus = math.nan
    if not math.isfinite(gpus) or gpus <= 0 or (gpus > 1 and not gpus.is_integer()):
        raise ValueError(
            f"gpus {value!r} must be a whole number of 1 or more, or a share of one GPU (0.5)"
        )
    return gpus


def parse_share(value: object) -> float:
    """``busy``: a number from 0 to 1; ValueError else."""
    try:
        if isinstance(value, bool):
            raise ValueError
        share = float(str(value).strip())
    except ValueError:
        share = math.nan
    if not 0 <= share <= 1:
        raise ValueError(f"busy {value!r} must be a number from 0 to 1")
    return share


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
    check_runs(rows, source)
    return sorted(rows, key=lambda r: (r.at, r.row))


def check_runs(rows: Iterable[TraceRow], source: str) -> None:
    """Each run's steps, in row order, arrive no earlier than the step before and stay in one
    namespace; TraceError naming the first step that does not."""
    last: dict[str, TraceRow] = {}
    for row in sorted(rows, key=lambda r: r.row):
        if row.run is None:
            continue
        before = last.get(row.run)
        if before is not None and row.at < before.at:
            raise TraceError(
                f"{source}: row {row.row}: run {row.run!r}: at {row.at:g}s is before the "
                f"step in row {before.row} ({before.at:g}s); a run's steps go in row order"
            )
        if before is not None and row.namespace != before.namespace:
            raise TraceError(
                f"{source}: row {row.row}: run {row.run!r}: namespace {row.namespace!r} is not "
                f"row {before.row}'s {before.namespace!r}; a run stays in one namespace"
            )
        last[row.run] = row


def trace_csv(rows: Iterable[TraceRow]) -> str:
    """Rows as a CSV trace that parse_trace reads back to the same rows."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS)
    for r in rows:
        labels = ";".join(f"{k}={v}" for k, v in r.labels.items())
        memory = f"{int(r.memory_used / 2**20)}Mi"
        gpus = str(int(r.gpus)) if r.gpus >= 1 else repr(r.gpus)
        writer.writerow(
            [
                repr(r.at),
                r.namespace,
                r.kind,
                r.name,
                gpus,
                repr(r.duration),
                memory,
                labels,
                repr(r.busy),
                "" if r.checkpoint is None else repr(r.checkpoint),
                r.run or "",
                ";".join(r.gpu_products),
                repr(r.idle) if r.idle else "",
                repr(r.idle_busy) if r.idle else "",
            ]
        )
    return out.getvalue()


#: Every replayed pod carries its trace row here (the replay's watch selects on it).
ROW_LABEL = "lab.gpuwarden.io/trace-row"


def row_pod(row: TraceRow, name: str) -> dict[str, Any]:
    """The pod a trace row becomes, as its Kubeflow controller would create it."""
    return workload_pod(
        row.kind,
        name=name,
        namespace=row.namespace,
        workload=row.name,
        gpus=row.devices,
        labels={**row.labels, ROW_LABEL: str(row.row)},
        products=row.gpu_products,
    )
