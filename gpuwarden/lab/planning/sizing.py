"""How many MPS nodes a strategy's shared pods need: a platform team sizes its MPS pool to the
shared demand it expects instead of carving out a fixed share of the cluster (pure: from each
trace row's pod as the policy core decided it offline, no cluster involved)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

from gpuwarden.lab.cluster.nodes import pod_devices
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.policy import Admission


def _shared_rows(
    rows: Sequence[TraceRow], decisions: Mapping[int, Admission]
) -> Iterator[tuple[TraceRow, int]]:
    """Each row whose pod the strategy admits with MPS slices, and how many."""
    for row in rows:
        decision = decisions.get(row.row)
        if decision is None or not decision.allowed:
            continue
        _, slices = pod_devices(decision.pod)
        if slices:
            yield row, slices


def shared_demand(rows: Sequence[TraceRow], decisions: Mapping[int, Admission]) -> int:
    """The most MPS slices the strategy's pods ask for at once, each pod alive from its arrival
    for its duration (0 when it shares nothing)."""
    events: list[tuple[float, int]] = []
    for row, slices in _shared_rows(rows, decisions):
        events += [(row.at, slices), (row.at + row.duration, -slices)]
    peak = current = 0
    for _, change in sorted(events):  # an end before a start at the same moment
        current += change
        peak = max(peak, current)
    return peak


def shared_slice_hours(
    rows: Sequence[TraceRow], decisions: Mapping[int, Admission], horizon: float
) -> dict[str, float]:
    """MPS slice-hours each namespace's pods ask for under the strategy, of the rows that
    arrive within the horizon (what its share of the MPS nodes is sized to)."""
    out: dict[str, float] = {}
    for row, slices in _shared_rows(rows, decisions):
        if row.at < horizon:
            out[row.namespace] = out.get(row.namespace, 0.0) + slices * row.duration / 3600
    return out


def mps_nodes_for(slices: int, gpus_per_node: int, replicas: int) -> int:
    """Nodes of ``gpus_per_node`` GPUs shared ``replicas`` ways that hold ``slices`` at once."""
    if slices <= 0:
        return 0
    return max(1, math.ceil(slices / (gpus_per_node * replicas)))
