"""The pure idle tracking of gpuwarden.node.idle: episodes, once per episode, stop on notebooks
only, and no judgement on incomplete readings."""

from __future__ import annotations

from decimal import Decimal

from gpuwarden.node.idle import IdleEpisode, track_idle
from gpuwarden.node.pods import OwnerRef, PodInfo, PodRef
from gpuwarden.node.usage import Allocation, ContainerUse
from gpuwarden.policy.pod.record import IdleRecord

RULE = IdleRecord(action="stop", after=3600, below=Decimal(5))


def pod(name: str, *, notebook: bool = True, rule: IdleRecord | None = RULE) -> PodInfo:
    owner = OwnerRef("apps/v1", "StatefulSet", name, f"sts-{name}")
    return PodInfo(
        ref=PodRef("team", name, f"uid-{name}"),
        phase="Running",
        profile="notebook",
        idle=rule,
        owner=owner,
        notebook=name if notebook else None,
    )


def use(info: PodInfo, busy: float, gpus: int = 2) -> ContainerUse:
    allocation = Allocation(info.ref, "team", "notebook", "main", gpus, 1.0, "whole")
    return ContainerUse(allocation, busy, 0, False)


def test_a_pod_idle_for_after_seconds_acts_once_per_episode() -> None:
    nb = pod("nb")
    pods = {nb.ref.uid: nb}
    first = track_idle({}, pods, [use(nb, 0.09)], 100.0)  # 4.5% of 2 GPUs: idle
    assert first.episodes == {nb.ref.uid: IdleEpisode(since=100.0)}
    assert first.acts == ()
    due = track_idle(first.episodes, pods, [use(nb, 0.0)], 3700.0)
    [act] = due.acts
    assert (act.action, act.idle.idle_for, act.idle.allocated) == ("stop", 3600.0, 2.0)
    later = track_idle(due.episodes, pods, [use(nb, 0.0)], 9000.0)
    assert later.acts == ()
    assert [p.idle_for for p in later.idle] == [8900.0]
    # Busy once ends the episode; idle again starts a new one, which acts again after `after`.
    busy = track_idle(later.episodes, pods, [use(nb, 0.1)], 9100.0)  # 5%: not below
    assert busy.episodes == {} and busy.idle == ()
    again = track_idle(track_idle({}, pods, [use(nb, 0)], 9200.0).episodes, pods, [], 12800.0)
    assert again.acts == ()  # a pod with no allocated container this tick ends its episode
    again = track_idle(
        track_idle({}, pods, [use(nb, 0)], 9200.0).episodes, pods, [use(nb, 0)], 12800.0
    )
    assert [a.action for a in again.acts] == ["stop"]


def test_stop_notifies_pods_that_are_not_notebooks_and_pods_without_a_rule_are_ignored() -> None:
    job, plain = pod("job", notebook=False), pod("plain", rule=None)
    pods = {job.ref.uid: job, plain.ref.uid: plain}
    first = track_idle({}, pods, [use(job, 0), use(plain, 0)], 0.0)
    assert list(first.episodes) == [job.ref.uid]
    [act] = track_idle(first.episodes, pods, [use(job, 0), use(plain, 0)], 3600.0).acts
    assert (act.action, act.asked, act.idle.pod.ref.name) == ("notify", "stop", "job")


def test_an_incomplete_tick_neither_starts_ends_nor_acts() -> None:
    nb = pod("nb")
    pods = {nb.ref.uid: nb}
    first = track_idle({}, pods, [use(nb, 0)], 0.0)
    held = track_idle(first.episodes, pods, [use(nb, 0)], 7200.0, complete=False)
    assert held.episodes == first.episodes and held.acts == ()
    assert track_idle(held.episodes, {}, [], 7300.0, complete=False).episodes == {}
