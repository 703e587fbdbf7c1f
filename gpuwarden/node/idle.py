"""Which pods sit on idle GPUs, and when their profile's idle rule acts: pure, given one tick's
usage and a clock value.

A pod with an idle rule (``gpuwarden.io/idle``, written by the webhook from its profile's
``idle``) and allocated GPUs is *idle* in a tick when the GPUs its containers keep busy are below
``below`` percent of those they are allocated (see :mod:`gpuwarden.node.usage`; a container with
no GPU process is busy 0). Its idle episode starts at the first such tick and ends at the first
tick it is not idle (or when it leaves the node). Once an episode has lasted ``after`` seconds the
rule acts, once per episode:

* ``stop`` on a Kubeflow Notebook's pod: the agent sets the Notebook's stop annotation;
* ``notify``, and ``stop`` on any other pod (training and serving are never stopped): an Event
  on the pod and its owner.

A tick whose readings are incomplete (an NVML call failed) says nothing of idleness: episodes
neither start, end nor act in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from gpuwarden.node.pods import PodInfo
from gpuwarden.node.usage import ContainerUse


@dataclass(frozen=True)
class IdleEpisode:
    """A pod idle since ``since`` (a clock value, seconds); ``acted`` once its rule acted."""

    since: float
    acted: bool = False


@dataclass(frozen=True)
class IdlePod:
    """A pod idle in this tick: its GPUs allocated and busy (whole-GPU units), for how long."""

    pod: PodInfo
    allocated: float
    busy: float
    idle_for: float


@dataclass(frozen=True)
class IdleAct:
    """The rule acts on ``pod``: ``stop`` its Notebook, or ``notify``."""

    idle: IdlePod
    action: Literal["stop", "notify"]
    asked: str  # the rule's action, which a non-notebook pod's "stop" turns into "notify"


@dataclass(frozen=True)
class IdleTick:
    episodes: Mapping[str, IdleEpisode]  # pod UID -> its episode, for the next tick
    idle: tuple[IdlePod, ...]
    acts: tuple[IdleAct, ...]


def _totals(containers: Sequence[ContainerUse]) -> dict[str, tuple[float, float]]:
    """Pod UID -> (allocated, busy) over its containers."""
    out: dict[str, tuple[float, float]] = {}
    for use in containers:
        allocated, busy = out.get(use.allocation.pod.uid, (0.0, 0.0))
        out[use.allocation.pod.uid] = (allocated + use.allocation.allocated, busy + use.busy)
    return out


def track_idle(
    episodes: Mapping[str, IdleEpisode],
    pods: Mapping[str, PodInfo],
    containers: Sequence[ContainerUse],
    now: float,
    *,
    complete: bool = True,
) -> IdleTick:
    """This tick's idle pods and the rules that act, given the episodes of the last tick."""
    if not complete:
        kept = {uid: episode for uid, episode in episodes.items() if uid in pods}
        return IdleTick(kept, (), ())
    following: dict[str, IdleEpisode] = {}
    idle: list[IdlePod] = []
    acts: list[IdleAct] = []
    for uid, (allocated, busy) in sorted(_totals(containers).items()):
        pod = pods.get(uid)
        if pod is None or pod.idle is None or allocated <= 0:
            continue
        if Decimal(busy * 100 / allocated) >= pod.idle.below:
            continue  # busy: the episode, if any, ends
        episode = episodes.get(uid) or IdleEpisode(since=now)
        now_idle = IdlePod(pod, allocated, busy, max(0.0, now - episode.since))
        idle.append(now_idle)
        if not episode.acted and now_idle.idle_for >= pod.idle.after:
            action: Literal["stop", "notify"] = (
                "stop" if pod.idle.action == "stop" and pod.notebook is not None else "notify"
            )
            acts.append(IdleAct(now_idle, action, pod.idle.action))
            episode = IdleEpisode(since=episode.since, acted=True)
        following[uid] = episode
    return IdleTick(following, tuple(idle), tuple(acts))
