"""Import Alibaba's GPU cluster trace ``cluster-trace-gpu-v2023`` for `gpuwarden simulate`.

The trace (github.com/alibaba/clusterdata, folder ``cluster-trace-gpu-v2023``) was published with
the USENIX ATC '23 paper "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent". Two kinds of CSV file, recognised by their header line:

* pod lists ``openb_pod_list_*.csv``: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,
  qos,pod_phase,creation_time,deletion_time,scheduled_time``. Times are seconds on the trace's
  own clock; ``gpu_milli`` is the thousandths of one GPU a GPU-sharing pod asks (then
  ``num_gpu`` is 1) or 1000 for whole GPUs; ``gpu_spec`` lists the models a pod may run on,
  separated by ``|`` (empty, or ``nan`` as pandas prints it: any GPU); ``scheduled_time`` is
  empty for a pod that was never scheduled. (The ``multigpu*.csv`` lists have only the first
  five columns, no times, and cannot be replayed.)
* node lists ``openb_node_list_gpu_node.csv`` (and ``..._all_node.csv``): ``sn,cpu_milli,
  memory_mib,gpu,model``.

Parsing is pure (text in, values out); a malformed row is a :class:`TraceError` that names the
source, the data row (the first line after the header is row 1) and the column.

How pods become :class:`TraceRow` values (every default):

* Only GPU pods: rows with ``num_gpu`` 0 are CPU pods and are skipped. Pods that were never
  scheduled (empty ``scheduled_time``) never ran and are skipped too. Every row is still
  checked, CPU pods and pods outside the window included.
* ``at`` = ``creation_time`` minus the start: the window's start when a window is given, else the
  earliest ``creation_time`` of the pods returned, so the trace starts at 0. ``window=(start,
  end)`` (trace seconds) keeps the pods created in [start, end).
* ``duration`` = ``deletion_time`` - ``scheduled_time``, the time it ran. A pod never deleted
  (empty ``deletion_time``) runs until the trace's end, the latest time in the file (the
  published lists instead write that end, 12902960, for pods still running). A duration of 0 or
  less is raised to :data:`MIN_DURATION` (1 s).
* ``namespace`` and ``kind`` from ``qos`` through a :class:`QosMapping`; by default
  ``LS`` -> serving / kserve-predictor, ``BE`` -> batch / katib-trial (preemptible batch),
  ``Burstable`` and ``Guaranteed`` -> training / training-job. A GPU pod whose qos is not mapped
  is an error. Each namespace is a Kubeflow profile namespace
  (:data:`~gpuwarden.lab.inputs.defaulttrace.PROFILE_NAMESPACE_LABELS`).
* ``gpus`` = ``num_gpu`` when ``gpu_milli`` is 1000; a shared request (``gpu_milli`` below
  1000, ``num_gpu`` 1) asks ``gpu_milli / 1000`` of one GPU and keeps that share busy
  (``busy`` = ``gpu_milli / 1000``); whole-GPU pods are busy :data:`DEFAULT_BUSY` of their kind.
* ``memory_used`` (bytes per GPU): the trace records no GPU memory use, so a pod is taken to use
  the memory it is entitled to: ``gpu_milli / 1000`` of its GPU's memory, the smallest of the
  models ``gpu_spec`` allows. A pod without ``gpu_spec`` uses ``gpu_milli / 1000`` of
  ``gpu_memory_mib`` when the caller gives it (the memory of the lab's GPUs), else 0.
* ``gpu_products``: ``gpu_spec``'s models as GPU Feature Discovery product names
  (:data:`MODEL_PRODUCTS`), duplicates dropped, in the spec's order; empty: () (any GPU).
* ``name`` is the trace's pod name (``openb-pod-0017``); ``labels`` are empty, ``checkpoint`` and
  ``run`` None. ``cpu_milli``, ``memory_mib`` and ``pod_phase`` are checked (numbers) or read
  but not used.
* ``sample=N`` keeps N of the GPU pods (after the window), chosen with ``random.Random(seed)``.
  Rows come back by arrival (then row). No GPU pod left is an error.

How nodes become :class:`GpuNodePool` values: GPU nodes only (``gpu`` 0 skipped; a list
without any is an error; ``sample=N`` keeps N of them, chosen with ``random.Random(seed)``, so
that a few real nodes of mixed models make the trace's arrivals contend), one pool per (model, GPUs per node) named like ``v100m16-8`` (``-2``,
``-3`` ... added should two names collide), sorted by name, with one replica per GPU (no MPS)
and the model's GFD product name and memory (``nvidia.com/gpu.memory``, MiB) from
:data:`MODEL_PRODUCTS`:

=========  ========================  =========  =============================================
model      GFD product               MiB        note
=========  ========================  =========  =============================================
V100M16    Tesla-V100-SXM2-16GB      16384      as GFD reports it with current drivers
V100M32    Tesla-V100-SXM2-32GB      32768      (older drivers report a little less: 16160,
P100       Tesla-P100-PCIE-16GB      16384      32510, 16280, 15109, 22731)
T4         Tesla-T4                  15360
A10        NVIDIA-A10                23028
G1         Alibaba-G1                10000      undisclosed Alibaba models: the memory is the
G2         Alibaba-G2                20000      FGD simulator's assumption, not a measurement
G3         Alibaba-G3                30000
=========  ========================  =========  =============================================

A model not in the table (in ``gpu_spec`` or a node list) is kept as ``Alibaba-<model>``
(characters a label value cannot hold become ``-``) with :data:`UNKNOWN_MODEL_MEMORY_MIB`
(16384 MiB). The node lists' CPU and memory columns are checked but not used: lab nodes have
fixed CPU and memory.
"""

from __future__ import annotations

import csv
import io
import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from gpuwarden.lab.cluster.nodes import GpuNodePool
from gpuwarden.lab.inputs.defaulttrace import PROFILE_NAMESPACE_LABELS
from gpuwarden.lab.inputs.trace import DEFAULT_BUSY, TraceError, TraceRow
from gpuwarden.lab.inputs.workloads import WORKLOAD_KINDS

POD_HEADER = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
NODE_HEADER = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
#: The pod lists without times (``openb_pod_list_multigpu*.csv``).
_TIMELESS_POD_HEADER = POD_HEADER[:5]

#: Alibaba GPU model -> (GPU Feature Discovery product name, GPU memory in MiB as GFD reports it).
MODEL_PRODUCTS: Mapping[str, tuple[str, int]] = {
    "V100M16": ("Tesla-V100-SXM2-16GB", 16384),
    "V100M32": ("Tesla-V100-SXM2-32GB", 32768),
    "P100": ("Tesla-P100-PCIE-16GB", 16384),
    "T4": ("Tesla-T4", 15360),
    "A10": ("NVIDIA-A10", 23028),
    "G1": ("Alibaba-G1", 10000),
    "G2": ("Alibaba-G2", 20000),
    "G3": ("Alibaba-G3", 30000),
}
#: GPU memory (MiB) assumed for a model not in :data:`MODEL_PRODUCTS`.
UNKNOWN_MODEL_MEMORY_MIB = 16384
#: The shortest duration a pod is given (seconds); shorter or negative ones are raised to it.
MIN_DURATION = 1.0
#: qos -> (namespace, workload kind) unless overridden.
DEFAULT_QOS: Mapping[str, tuple[str, str]] = {
    "LS": ("serving", "kserve-predictor"),
    "BE": ("batch", "katib-trial"),
    "Burstable": ("training", "training-job"),
    "Guaranteed": ("training", "training-job"),
}

_MODELS_BY_UPPER = {model.upper(): model for model in MODEL_PRODUCTS}
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_POOL_UNSAFE = re.compile(r"[^a-z0-9]+")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_UNKNOWN_PREFIX = "Alibaba-"


# -- models -----------------------------------------------------------------------------------


def model_product(model: str) -> tuple[str, int]:
    """(GFD product name, memory MiB) of an Alibaba model; an unknown one as ``Alibaba-<model>``
    with :data:`UNKNOWN_MODEL_MEMORY_MIB`. ValueError for a name with nothing usable in it."""
    name = model.strip()
    known = _MODELS_BY_UPPER.get(name.upper())
    if known is not None:
        return MODEL_PRODUCTS[known]
    safe = _LABEL_UNSAFE.sub("-", name).strip("-._")[: 63 - len(_UNKNOWN_PREFIX)].strip("-._")
    if not safe:
        raise ValueError(f"{model!r} is not a GPU model name")
    return f"{_UNKNOWN_PREFIX}{safe}", UNKNOWN_MODEL_MEMORY_MIB


def _spec_models(spec: str) -> list[str]:
    text = spec.strip()
    if text.lower() in ("", "nan"):
        return []
    return [part.strip() for part in text.split("|") if part.strip()]


def products_for_spec(spec: str) -> tuple[str, ...]:
    """GFD product names of a ``gpu_spec`` (``V100M16|V100M32``), duplicates dropped, in order;
    () for an empty spec (any GPU). ValueError for a model name with nothing usable in it."""
    products: list[str] = []
    for model in _spec_models(spec):
        product = model_product(model)[0]
        if product not in products:
            products.append(product)
    return tuple(products)


def _spec_memory_mib(spec: str) -> int | None:
    """The smallest memory of the models a spec allows; None when it allows any GPU."""
    models = _spec_models(spec)
    return min(model_product(m)[1] for m in models) if models else None


# -- qos --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QosMapping:
    """For each trace ``qos`` value, the (namespace, workload kind) its pods are replayed as."""

    targets: Mapping[str, tuple[str, str]] = field(default_factory=lambda: dict(DEFAULT_QOS))

    def target(self, qos: str) -> tuple[str, str] | None:
        return self.targets.get(qos)

    def namespaces(self) -> dict[str, dict[str, str]]:
        """Each namespace the mapping uses, with its Kubeflow profile namespace labels."""
        return {
            namespace: dict(PROFILE_NAMESPACE_LABELS)
            for namespace in sorted({ns for ns, _ in self.targets.values()})
        }


def parse_qos_mapping(specs: Sequence[str], source: str) -> QosMapping:
    """The default mapping with ``QOS=namespace:kind`` overrides (later ones win); TraceError
    naming ``source`` and the bad spec."""
    targets = dict(DEFAULT_QOS)
    for spec in specs:
        qos, sep, target = spec.partition("=")
        namespace, sep2, kind = target.partition(":")
        qos, namespace, kind = qos.strip(), namespace.strip(), kind.strip()
        where = f"{source}: qos mapping {spec!r}"
        if not sep or not sep2 or not qos or not namespace or not kind:
            raise TraceError(f"{where}: write QOS=namespace:kind (LS=serving:kserve-predictor)")
        if not _DNS_LABEL.match(namespace):
            raise TraceError(
                f"{where}: namespace {namespace!r} is not a DNS label (lower case letters, "
                "digits and '-', at most 63)"
            )
        if kind not in WORKLOAD_KINDS:
            raise TraceError(f"{where}: unknown kind {kind!r} (one of {', '.join(WORKLOAD_KINDS)})")
        targets[qos] = (namespace, kind)
    return QosMapping(targets)


# -- CSV --------------------------------------------------------------------------------------


def _header(text: str) -> tuple[str, ...] | None:
    first = text.lstrip("\ufeff").strip().split("\n", 1)[0]
    if not first.strip():
        return None
    return tuple(cell.strip() for cell in first.strip().split(","))


def is_alibaba_pods(text: str) -> bool:
    """Whether ``text`` is a cluster-trace-gpu-v2023 pod list (by its header line)."""
    return _header(text) == POD_HEADER


def is_alibaba_nodes(text: str) -> bool:
    """Whether ``text`` is a cluster-trace-gpu-v2023 node list (by its header line)."""
    return _header(text) == NODE_HEADER


def _records(
    text: str, source: str, header: tuple[str, ...], what: str
) -> Iterator[tuple[int, dict[str, str]]]:
    """(data row number from 1, values by column); TraceError for a wrong header or a row with
    more values than columns. Blank lines are not rows."""
    found = _header(text)
    if found != header:
        hint = ""
        if what == "pod" and found == _TIMELESS_POD_HEADER:
            hint = " (this list has no creation/deletion/scheduled times: it cannot be replayed)"
        got = "nothing" if found is None else ",".join(found)
        raise TraceError(
            f"{source}: not an Alibaba cluster-trace-gpu-v2023 {what} list: the header is "
            f"{got}, expected {','.join(header)}{hint}"
        )
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff").strip()))
    next(reader)
    number = 0
    for values in reader:
        if not values or all(not v.strip() for v in values):
            continue
        number += 1
        if len(values) > len(header):
            raise TraceError(
                f"{source}: row {number}: more values than columns ({len(values)} for "
                f"{len(header)}: {','.join(header)})"
            )
        padded = [v.strip() for v in values] + [""] * (len(header) - len(values))
        yield number, dict(zip(header, padded, strict=True))


def _number(record: Mapping[str, str], column: str, *, optional: bool = False) -> float | None:
    """A non-negative finite number; None when empty and ``optional``; ValueError naming the
    column else."""
    text = record[column]
    if text == "":
        if optional:
            return None
        raise ValueError(f"{column}: missing")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{column}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{column}: {text!r} is not a number")
    if value < 0:
        raise ValueError(f"{column}: {text!r} is negative")
    return value


def _required(record: Mapping[str, str], column: str) -> float:
    value = _number(record, column)
    assert value is not None
    return value


def _whole(record: Mapping[str, str], column: str) -> int:
    value = _required(record, column)
    if not value.is_integer():
        raise ValueError(f"{column}: {record[column]!r} is not a whole number")
    return int(value)


# -- pods -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pod:
    row: int
    name: str
    gpus: float
    gpu_milli: int
    spec: str
    products: tuple[str, ...]
    namespace: str
    kind: str
    created: float
    scheduled: float | None
    deleted: float | None


def _pod(record: Mapping[str, str], number: int, mapping: QosMapping) -> _Pod | None:
    """A GPU pod of one row, None for a CPU pod; ValueError naming the column."""
    if not record["name"]:
        raise ValueError("name: missing")
    _required(record, "cpu_milli")
    _required(record, "memory_mib")
    num_gpu = _whole(record, "num_gpu")
    gpu_milli = _whole(record, "gpu_milli")
    created = _required(record, "creation_time")
    deleted = _number(record, "deletion_time", optional=True)
    scheduled = _number(record, "scheduled_time", optional=True)
    try:
        products = products_for_spec(record["gpu_spec"])
    except ValueError as exc:
        raise ValueError(f"gpu_spec: {exc}") from None
    if num_gpu == 0:
        return None
    if not 1 <= gpu_milli <= 1000:
        raise ValueError(f"gpu_milli: {record['gpu_milli']!r} is not from 1 to 1000")
    if gpu_milli < 1000 and num_gpu > 1:
        raise ValueError(
            f"gpu_milli: {gpu_milli} with num_gpu {num_gpu}: a share of a GPU (below 1000) "
            "asks one GPU"
        )
    target = mapping.target(record["qos"])
    if target is None:
        known = ", ".join(sorted(mapping.targets))
        raise ValueError(
            f"qos: {record['qos']!r} is not mapped (mapped: {known}; map it with "
            f"{record['qos'] or 'QOS'}=namespace:kind)"
        )
    namespace, kind = target
    gpus = float(num_gpu) if gpu_milli == 1000 else gpu_milli / 1000
    return _Pod(
        row=number,
        name=record["name"],
        gpus=gpus,
        gpu_milli=gpu_milli,
        spec=record["gpu_spec"],
        products=products,
        namespace=namespace,
        kind=kind,
        created=created,
        scheduled=scheduled,
        deleted=deleted,
    )


def _window(window: tuple[float, float] | None, source: str) -> tuple[float, float] | None:
    if window is None:
        return None
    start, end = float(window[0]), float(window[1])
    if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end <= start:
        raise TraceError(
            f"{source}: window ({window[0]!r}, {window[1]!r}): the start must be 0 or more "
            "and before the end"
        )
    return start, end


def parse_alibaba_pods(
    text: str,
    source: str,
    mapping: QosMapping,
    *,
    window: tuple[float, float] | None = None,
    sample: int | None = None,
    seed: int = 0,
    gpu_memory_mib: int | None = None,
) -> list[TraceRow]:
    """The GPU pods of a cluster-trace-gpu-v2023 pod list as trace rows, by arrival.

    CPU pods (``num_gpu`` 0) and pods never scheduled are skipped; ``window=(start, end)`` keeps
    pods created in [start, end) (trace seconds) and times them from ``start`` (else from the
    first pod returned); ``sample`` keeps that many of them, chosen with
    ``random.Random(seed)``. ``gpu_memory_mib`` is the memory of the GPU a pod without
    ``gpu_spec`` is taken to get (its ``memory_used`` is 0 without it). The module docstring
    states every mapping. TraceError naming ``source``, the row and the column.
    """
    span = _window(window, source)
    if sample is not None and sample < 1:
        raise TraceError(f"{source}: sample {sample}: keep 1 pod or more")
    pods: list[_Pod] = []
    trace_end = 0.0
    for number, record in _records(text, source, POD_HEADER, "pod"):
        try:
            pod = _pod(record, number, mapping)
        except ValueError as exc:
            raise TraceError(f"{source}: row {number}: {exc}") from None
        for column in ("creation_time", "deletion_time", "scheduled_time"):
            if record[column]:
                trace_end = max(trace_end, float(record[column]))
        if pod is not None and pod.scheduled is not None:
            pods.append(pod)
    if span is not None:
        pods = [p for p in pods if span[0] <= p.created < span[1]]
    if sample is not None and sample < len(pods):
        pods = random.Random(seed).sample(pods, sample)
    if not pods:
        where = "" if span is None else f" created in [{span[0]:g}, {span[1]:g})"
        raise TraceError(f"{source}: no GPU pod that was scheduled{where}")
    start = span[0] if span is not None else min(p.created for p in pods)
    rows = [_row(p, start, trace_end, gpu_memory_mib) for p in pods]
    return sorted(rows, key=lambda r: (r.at, r.row))


def _row(pod: _Pod, start: float, trace_end: float, gpu_memory_mib: int | None) -> TraceRow:
    assert pod.scheduled is not None
    deleted = trace_end if pod.deleted is None else pod.deleted
    duration = max(MIN_DURATION, deleted - pod.scheduled)
    memory_mib = _spec_memory_mib(pod.spec)
    if memory_mib is None:
        memory_mib = gpu_memory_mib or 0
    memory = Decimal(pod.gpu_milli * memory_mib * 2**20 // 1000)
    shared = pod.gpu_milli < 1000
    return TraceRow(
        row=pod.row,
        at=pod.created - start,
        namespace=pod.namespace,
        kind=pod.kind,
        name=pod.name,
        gpus=pod.gpus,
        duration=duration,
        memory_used=memory,
        labels={},
        busy=pod.gpu_milli / 1000 if shared else DEFAULT_BUSY[pod.kind],
        checkpoint=None,
        run=None,
        gpu_products=pod.products,
    )


# -- nodes ------------------------------------------------------------------------------------


def parse_alibaba_nodes(
    text: str, source: str, *, sample: int | None = None, seed: int = 0
) -> list[GpuNodePool]:
    """The GPU nodes of a cluster-trace-gpu-v2023 node list as pools of identical nodes (same
    model and GPU count), sorted by name; nodes without GPUs are skipped. ``sample=N`` keeps N
    of the GPU nodes, chosen with ``random.Random(seed)`` (every row is still checked).
    TraceError naming ``source``, the row and the column, or saying there is no GPU node."""
    keys = _gpu_node_keys(text, source)
    if not keys:
        raise TraceError(f"{source}: no GPU node (every node has gpu 0)")
    if sample is not None:
        if sample < 1:
            raise TraceError(f"{source}: node sample {sample}: keep 1 node or more")
        if sample > len(keys):
            raise TraceError(
                f"{source}: node sample {sample}: the list has only {len(keys)} GPU nodes"
            )
        keys = random.Random(seed).sample(keys, sample)
    counts: dict[tuple[str, int], int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return _node_pools(counts)


def _gpu_node_keys(text: str, source: str) -> list[tuple[str, int]]:
    """(model, GPUs) of each GPU node, in the list's order; TraceError naming the row."""
    keys: list[tuple[str, int]] = []
    seen: dict[str, int] = {}
    for number, record in _records(text, source, NODE_HEADER, "node"):
        try:
            sn = record["sn"]
            if not sn:
                raise ValueError("sn: missing")
            if sn in seen:
                raise ValueError(f"sn: {sn!r} is already row {seen[sn]}")
            seen[sn] = number
            _required(record, "cpu_milli")
            _required(record, "memory_mib")
            gpus = _whole(record, "gpu")
            if gpus == 0:
                continue
            model = record["model"]
            if not model or model.lower() == "nan":
                raise ValueError(f"model: missing for a node with {gpus} GPUs")
            try:
                model_product(model)
            except ValueError as exc:
                raise ValueError(f"model: {exc}") from None
        except ValueError as exc:
            raise TraceError(f"{source}: row {number}: {exc}") from None
        keys.append((_MODELS_BY_UPPER.get(model.upper(), model), gpus))
    return keys


def _node_pools(counts: Mapping[tuple[str, int], int]) -> list[GpuNodePool]:
    """One pool per (model, GPUs per node) with its node count, sorted by name."""
    pools: list[GpuNodePool] = []
    names: set[str] = set()
    for (model, gpus), count in sorted(counts.items()):
        slug = _POOL_UNSAFE.sub("-", model.lower()).strip("-")[:40].strip("-") or "gpu"
        base = f"{slug}-{gpus}"
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.add(name)
        product, memory = model_product(model)
        pools.append(
            GpuNodePool(
                name=name,
                count=count,
                gpus_per_node=gpus,
                gpu_product=product,
                gpu_memory_mib=memory,
            )
        )
    return sorted(pools, key=lambda p: p.name)
