"""The fill experiment (`gpuwarden simulate --fill RATIO`): pods arrive in trace order and never
leave until what they ask reaches RATIO of the cluster's GPUs; then the GPU allocation ratio.

It is the experiment of the FGD paper ("Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent", USENIX ATC '23), as its simulator
``hkust-adsl/kubernetes-scheduler-simulator`` runs it (``pkg/simulator/core.go``, ``RunCluster``
after ``TunePodsByNodeTotalResource`` in ``pkg/simulator/simulator.go``; ratio 1.3 in
``experiments/run_scripts/generate_run_scripts.py``): the trace's pods in creation order, then,
while their GPU requests add up to less than the target, copies of pods drawn at random from the
trace (``<name>-tuned-<i>``) appended until the next one would pass it, or, when they add up to
more, pods drawn at random removed until they do not. The published runs shuffle the trace's
pods first (``--shuffle-pod=true`` in ``generate_run_scripts.py``, ``SortClusterPods``), ten
seeds from 42; their allocation ratios are column ``130`` of
``experiments/analysis/expected_results/analysis_allo_discrete.csv``. Each pod is scheduled once, in that order;
one that finds no node is left unscheduled and the next one comes (nothing leaves, so it could
never fit later). The allocation ratio is the GPU share the placed pods asked (``gpu_milli`` of a
shared pod) over the cluster's GPUs (``utils.ReportNodeAllocationRate``, its ``MilliGpu`` line).

What differs here (the docs say what it does to the comparison):

* kube-scheduler places every pod (its default profile or the packing profile
  ``gpuwarden-binpack``), on KWOK nodes as NVIDIA's device plugin advertises them;
* a pod asking a share of a GPU asks ``ceil(share x replicas)`` MPS slices of the MPS nodes
  (``nvidia.com/gpu.shared``), a whole-GPU pod ``nvidia.com/gpu`` of the others; the MPS nodes
  are the first nodes (the largest pools first) whose GPUs come nearest to the shared pods'
  share of all the GPUs asked (:func:`fill_mps_nodes`);
* kube-scheduler counts a node's slices, not each GPU's, so a pod of several slices may be
  counted on slices of different GPUs;
* CPU and memory requests are not replayed (FGD's nodes also run out of CPU).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client

from gpuwarden.lab.cluster.controlplane import Tools
from gpuwarden.lab.cluster.nodes import GPU_RESOURCE, SHARED_GPU_RESOURCE, GpuNodePool
from gpuwarden.lab.cluster.schedulinglab import (
    SchedulingLab,
    ensure_namespaces,
    lab_control_plane,
)
from gpuwarden.lab.inputs.trace import TraceRow

#: The scheduler profiles the experiment compares (the lab's kube-scheduler runs both).
FILL_SCHEDULERS = ("default-scheduler", "gpuwarden-binpack")
#: FGD's target: requests of 130% of the cluster's GPUs.
FGD_TARGET = 1.3
MILLI = 1000
FILL_NAMESPACE = "fill"
_BATCH_LABEL = "lab.gpuwarden.io/fill-batch"
_BATCH = 100
_SETTLE_TIMEOUT = 300.0


@dataclass(frozen=True)
class FillPod:
    """One pod of the experiment: whole GPUs, or a share of one GPU (``milli`` thousandths)."""

    name: str
    whole: int
    milli: int  # GPU thousandths asked in all (whole x 1000 for whole-GPU pods)
    products: tuple[str, ...] = ()

    @property
    def shared(self) -> bool:
        return self.whole == 0

    def slices(self, replicas: int) -> int:
        """MPS slices it asks: its share rounded up to whole slices (0 for whole GPUs)."""
        return math.ceil(self.milli * replicas / MILLI) if self.shared else 0


def fill_pod(row: TraceRow) -> FillPod:
    """A trace row's pod: below one GPU, a share of one; else its whole GPUs."""
    milli = round(row.gpus * MILLI)
    if milli < MILLI:
        return FillPod(row.name, 0, max(milli, 1), tuple(row.gpu_products))
    whole = math.ceil(row.gpus)
    return FillPod(row.name, whole, whole * MILLI, tuple(row.gpu_products))


def fill_pods(
    rows: Sequence[TraceRow],
    capacity_gpus: int,
    target: float,
    seed: int,
    *,
    shuffle: bool = True,
) -> list[FillPod]:
    """The pods that arrive, in order: the rows' pods (``shuffle``: sorted by name, then
    shuffled, as FGD's published runs do; else in trace order), then random copies appended
    while the next keeps the GPUs asked at or under ``target`` x ``capacity_gpus``, or random
    pods removed until they are (FGD's tuning); every draw from ``random.Random(seed)``.
    ValueError for no rows, no capacity or a target not above 0."""
    if not rows:
        raise ValueError("no pod to fill the cluster with")
    if capacity_gpus <= 0 or not target > 0 or not math.isfinite(target):
        raise ValueError(f"target {target!r} of {capacity_gpus} GPUs: both must be above 0")
    originals = [fill_pod(row) for row in rows]
    goal = target * capacity_gpus * MILLI
    rng = random.Random(seed)
    pods = list(originals)
    if shuffle:
        pods.sort(key=lambda p: p.name)
        rng.shuffle(pods)
    asked = sum(p.milli for p in pods)
    while asked > goal:
        asked -= pods.pop(rng.randrange(len(pods))).milli
    copies = 0
    while True:
        pick = originals[rng.randrange(len(originals))]
        if asked + pick.milli > goal:
            return pods
        pods.append(FillPod(f"{pick.name}-tuned-{copies}", pick.whole, pick.milli, pick.products))
        asked += pick.milli
        copies += 1


def fill_mps_nodes(node_gpus: Sequence[int], pods: Sequence[FillPod], replicas: int) -> int:
    """How many of the nodes (GPUs of each, in the order they become MPS nodes) share: the
    count whose GPUs come nearest to the shared pods' part of every GPU asked (slices counted
    as ``1 / replicas`` of a GPU), fewer first on a tie; at least one node when any pod shares,
    and one left whole when any pod asks whole GPUs."""
    shared = sum(p.slices(replicas) for p in pods) / replicas
    whole = sum(p.whole for p in pods)
    if not shared or not node_gpus:
        return 0
    total = sum(node_gpus)
    target = total * shared / (shared + whole)
    cumulative = [sum(node_gpus[:n]) for n in range(len(node_gpus) + 1)]
    low, high = 1, len(node_gpus) - (1 if whole else 0)
    if high < low:
        return low
    return min(range(low, high + 1), key=lambda n: (abs(cumulative[n] - target), n))


@dataclass(frozen=True)
class FillRatios:
    """What the placed pods hold of ``capacity`` GPUs: the share they asked (FGD's ratio), and
    with shared pods counted as the whole slices they got."""

    asked: float
    slices: float
    placed: int
    failed: int

    def as_json(self) -> dict[str, float | int]:
        return {
            "allocationRatio": round(self.asked, 4),
            "sliceRatio": round(self.slices, 4),
            "placed": self.placed,
            "failed": self.failed,
        }


def fill_ratios(
    pods: Sequence[FillPod], placed: set[int], capacity_gpus: int, replicas: int
) -> FillRatios:
    """The allocation ratios of the ``placed`` pods (by index) on ``capacity_gpus`` GPUs."""
    held = [p for i, p in enumerate(pods) if i in placed]
    asked = sum(p.milli for p in held) / MILLI
    sliced = sum(p.whole + p.slices(replicas) / replicas for p in held)
    return FillRatios(
        asked / capacity_gpus, sliced / capacity_gpus, len(held), len(pods) - len(held)
    )


def fill_manifest(
    pod: FillPod, index: int, scheduler: str, replicas: int, batch: int
) -> dict[str, Any]:
    """The ``index``-th pod as created (``fill-<index>``, the trace's name as an annotation):
    one container asking its GPUs (whole or MPS slices), the scheduler profile, and the GPU
    products it may run on."""
    resource = {SHARED_GPU_RESOURCE: str(pod.slices(replicas))} if pod.shared else {}
    resource = resource or {GPU_RESOURCE: str(pod.whole)}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {"name": "main", "image": "fill", "resources": {"limits": resource}},
        ],
    }
    if pod.products:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "nvidia.com/gpu.product",
                                    "operator": "In",
                                    "values": list(pod.products),
                                }
                            ]
                        }
                    ]
                }
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{FILL_NAMESPACE}-{index}",
            "labels": {_BATCH_LABEL: str(batch)},
            "annotations": {"lab.gpuwarden.io/trace-name": pod.name},
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class FillRun:
    """One scheduler profile's fill: the pods it placed, and the wall-clock seconds it took."""

    scheduler: str
    ratios: FillRatios
    seconds: float


def _settled(pod: Any) -> bool:
    """Bound, or found unschedulable (nothing leaves: it will not fit later)."""
    if pod.spec.node_name:
        return True
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)


def run_fill(
    pods: Sequence[FillPod],
    pools: Sequence[GpuNodePool],
    scheduler: str,
    tools: Tools,
    replicas: int,
    progress: Callable[[int, int], None] | None = None,
) -> FillRun:
    """Schedule ``pods`` in order (batches of 100, each settled before the next) on a lab of
    ``pools`` with the ``scheduler`` profile."""
    started = time.monotonic()
    capacity = sum(pool.physical_gpus for pool in pools)
    placed: set[int] = set()
    plane = lab_control_plane(tools)
    with plane:
        lab = SchedulingLab(plane, tools)
        lab.start()
        try:
            api = plane.api_client()
            try:
                ensure_namespaces(api, [FILL_NAMESPACE], {})
                lab.add_pools(api, pools)
                core: Any = k8s_client.CoreV1Api(api)
                for batch, first in enumerate(range(0, len(pods), _BATCH)):
                    chunk = pods[first : first + _BATCH]
                    for index, pod in enumerate(chunk, start=first):
                        manifest = fill_manifest(pod, index, scheduler, replicas, batch)
                        core.create_namespaced_pod(FILL_NAMESPACE, manifest)
                    placed |= _await_batch(plane, lab, core, batch, len(chunk))
                    if progress is not None:
                        progress(first + len(chunk), len(pods))
            finally:
                api.close()  # type: ignore[no-untyped-call]
        finally:
            lab.stop()
    ratios = fill_ratios(pods, placed, capacity, replicas)
    return FillRun(scheduler, ratios, time.monotonic() - started)


def _await_batch(plane: Any, lab: SchedulingLab, core: Any, batch: int, size: int) -> set[int]:
    """The bound pods of a batch (by index), once every one is bound or unschedulable."""
    bound: set[int] = set()

    def settled() -> bool:
        listed = core.list_namespaced_pod(
            FILL_NAMESPACE, label_selector=f"{_BATCH_LABEL}={batch}"
        ).items
        bound.clear()
        prefix = f"{FILL_NAMESPACE}-"
        bound.update(int(p.metadata.name.removeprefix(prefix)) for p in listed if p.spec.node_name)
        return len(listed) == size and all(_settled(p) for p in listed)

    plane.poll(
        f"batch {batch} of the fill to be scheduled",
        settled,
        lab.processes,
        time.monotonic() + _SETTLE_TIMEOUT,
    )
    return bound


def fill_table(
    runs: Sequence[FillRun],
    *,
    capacity_gpus: int,
    nodes: int,
    mps_nodes: int,
    mps_gpus: int,
    replicas: int,
    pods: Sequence[FillPod],
    target: float,
) -> str:
    """The experiment's table, one row per scheduler profile."""
    asked = sum(p.milli for p in pods) / MILLI
    shared = sum(1 for p in pods if p.shared)
    lines = [
        f"fill to {target:.0%} of {capacity_gpus:,} GPUs on {nodes:,} nodes: {len(pods):,} pods "
        f"({shared:,} shared) asking {asked:,.1f} GPUs; {mps_nodes:,} MPS nodes "
        f"({mps_gpus:,} GPUs, {replicas} slices each)",
        "",
        "| scheduler profile | placed | failed | allocation ratio (share asked) "
        "| counting whole slices | wall clock |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        r = run.ratios
        lines.append(
            f"| {run.scheduler} | {r.placed:,} | {r.failed:,} | {r.asked:.1%} | {r.slices:.1%} "
            f"| {run.seconds:.0f} s |"
        )
    return "\n".join(lines)


def fill_json(runs: Sequence[FillRun], summary: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **summary,
        "schedulers": [
            {"scheduler": run.scheduler, **run.ratios.as_json(), "seconds": round(run.seconds, 1)}
            for run in runs
        ],
    }
