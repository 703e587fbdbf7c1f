"""What the pools did in a replay whose MPS pool followed demand (``--mps-nodes follow``): the
nodes that moved, how often and which way, how long their drains took, and what the
controller's log says it started, finished and cancelled."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.lab.cluster.deviceplugin import Cordon, Move
from gpuwarden.lab.cluster.nodes import SHARED_CONFIG
from gpuwarden.lab.cluster.poolcontroller import move_counts
from gpuwarden.lab.reporting.report import format_duration, percentile


@dataclass(frozen=True)
class PoolMoves:
    """The moves of one replay (simulated seconds)."""

    nodes: Mapping[str, int]  # node -> config changes
    to_shared: int
    to_whole: int
    # From cordon to its config label's change, each move that drained (an empty node moves at
    # once: cordoned and relabelled together, until its device plugin advertises the new config).
    drains: tuple[float, ...]
    cancelled: int  # cordons lifted without a move
    controller: Mapping[str, int]  # what its log says: started, finished, cancelled
    rejected: int = 0  # pods a kubelet refused: bound to a node whose config had just changed
    shared_nodes: tuple[int, float, int, int] = (0, 0.0, 0, 0)  # at start, average, least, most

    def as_json(self) -> dict[str, Any]:
        return {
            "nodes": dict(self.nodes),
            "toShared": self.to_shared,
            "toWhole": self.to_whole,
            "drainSeconds": {
                "count": len(self.drains),
                "p50": percentile(self.drains, 0.5),
                "p95": percentile(self.drains, 0.95),
                "max": max(self.drains, default=None),
            },
            "cancelled": self.cancelled,
            "controllerLog": dict(self.controller),
            "sharedNodes": dict(
                zip(("start", "average", "least", "most"), self.shared_nodes, strict=True)
            ),
            "kubeletRejected": self.rejected,
        }

    def notes(self) -> tuple[str, ...]:
        """The table's notes: the pools' size over time, then the moves' details."""
        start, average, least, most = self.shared_nodes
        moved = ", ".join(f"{node} {count}" for node, count in sorted(self.nodes.items()))
        drains = (
            f"drains (cordon to relabel) took {format_duration(percentile(self.drains, 0.5))} "
            f"at p50, {format_duration(percentile(self.drains, 0.95))} at p95; "
            if self.drains
            else ""
        )
        notes = [
            f"the pools followed demand: MPS nodes {start} at the start, {average:.1f} on "
            f"average, {least} to {most}; {self.to_shared} moves to the MPS pool, {self.to_whole} "
            f"to the whole-GPU pool, {self.cancelled} cancelled",
            f"{drains}moves per node: {moved or 'none'}",
        ]
        if self.rejected:
            notes.append(
                f"{self.rejected} pods bound as a node changed config, before its device plugin "
                "advertised the new one, were refused by its kubelet and recreated"
            )
        return tuple(notes)


def pool_moves(
    moves: Sequence[Move],
    cordons: Sequence[Cordon],
    log: Sequence[Mapping[str, Any]],
    *,
    start: float,
    scale: float,
    horizon: float,
    shared_at_start: int,
    rejected: int = 0,
) -> PoolMoves:
    """The moves the device plugin's emulation applied and the cordons it saw (its clock from
    ``start``, ``scale`` simulated seconds per second, to ``horizon``), with the controller's
    ``log``; ``shared_at_start`` MPS nodes when the replay started."""

    def simulated(at: float) -> float:
        return max((at - start) * scale, 0.0)

    # What happened after the horizon (a replay that ran late) is left out.
    moves = [m for m in moves if simulated(m.at) <= horizon]
    cordons = [c for c in cordons if simulated(c.start) <= horizon]
    nodes: dict[str, int] = {}
    shared, least, most = shared_at_start, shared_at_start, shared_at_start
    area, last = 0.0, 0.0
    for move in sorted(moves, key=lambda m: m.at):
        nodes[move.node] = nodes.get(move.node, 0) + 1
        at = simulated(move.at)
        area += shared * (at - last)
        last = at
        shared += 1 if move.after == SHARED_CONFIG else -1
        least, most = min(least, shared), max(most, shared)
    area += shared * (horizon - last)
    return PoolMoves(
        nodes=nodes,
        to_shared=sum(1 for m in moves if m.after == SHARED_CONFIG),
        to_whole=sum(1 for m in moves if m.after != SHARED_CONFIG),
        drains=tuple(
            simulated(c.relabelled) - simulated(c.start)
            for c in cordons
            if c.relabelled is not None
            and c.relabelled > c.start
            and simulated(c.relabelled) <= horizon
        ),
        cancelled=sum(1 for c in cordons if c.relabelled is None),
        controller=move_counts([dict(r) for r in log]),
        rejected=rejected,
        shared_nodes=(shared_at_start, area / horizon if horizon > 0 else 0.0, least, most),
    )
