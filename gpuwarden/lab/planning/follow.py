"""`--mps-nodes follow`: the MPS pool follows demand during the replay. The split the replay
starts from is auto's; ``gpuwarden pool-controller`` then moves drained nodes between the
whole-GPU and the MPS pool through the device plugin's config label, against the lab's API
server (:mod:`gpuwarden.lab.cluster.poolcontroller`), and the lab's device plugin emulation
(:mod:`gpuwarden.lab.cluster.deviceplugin`) advertises what each node's config gives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.lab.cluster.nodes import CONFIG_LABEL, SHARED_CONFIG, WHOLE_CONFIG
from gpuwarden.lab.planning.strategies import with_nvidia_fields

#: Seconds of wall-clock time between the controller's passes (it also acts on every change
#: its watches see).
FOLLOW_INTERVAL = 0.2
#: The policy's default least time a node stays in a pool after it moved (simulated seconds).
HOLD_SECONDS = 600.0


@dataclass(frozen=True)
class FollowPools:
    """How the replay's pools follow demand: free shared replicas kept ready beyond what
    waits (``shared_headroom``), the least simulated time a node stays in a pool after it
    moved (``hold_seconds``), and the controller's ``--interval`` (wall-clock seconds)."""

    shared_headroom: int
    hold_seconds: float = HOLD_SECONDS
    interval: float = FOLLOW_INTERVAL

    def pools(self, scale: float) -> dict[str, Any]:
        """The nvidia backend's ``pools`` for a replay at ``scale`` simulated seconds per
        wall-clock second (the controller runs on the wall clock)."""
        return {
            "configLabel": CONFIG_LABEL,
            "wholeConfig": WHOLE_CONFIG,
            "sharedConfig": SHARED_CONFIG,
            "sharedHeadroom": self.shared_headroom,
            "holdSeconds": self.hold_seconds / scale,
        }

    def note(self, start: int, nodes: int) -> str:
        return (
            f"MPS pools follow demand from auto's {start} of {nodes} nodes (gpuwarden "
            f"pool-controller, sharedHeadroom {self.shared_headroom}, holdSeconds "
            f"{self.hold_seconds:g}): no fixed split bounds the work, the work ceiling does"
        )


def pools_policy_texts(
    sources: Sequence[tuple[str, str]], replicas: int, follow: FollowPools, scale: float
) -> list[tuple[str, str]]:
    """The strategy's policy files as the controller reads them: every nvidia backend with the
    layout's ``mpsReplicas`` and :meth:`FollowPools.pools`."""
    fields = {"mpsReplicas": replicas, "pools": follow.pools(scale)}
    return [(source, with_nvidia_fields(text, source, fields)) for source, text in sources]
