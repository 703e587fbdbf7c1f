"""The pure decisions: ceilings, per-server limits, violations, oversubscription, strangers."""

from __future__ import annotations

from gpuwarden.node import limits
from gpuwarden.node.limits import MpsServer, ObservedProcess
from gpuwarden.node.nvml import GpuDevice
from gpuwarden.node.pods import PodInfo, pod_info
from gpuwarden.node.procfs import CgroupOwner

from .conftest import GiB, container_id, make_pod


def gpu(index: int, total: int = 40 * GiB) -> GpuDevice:
    return GpuDevice(index, f"GPU-{index}", "A100", total, "exclusive-process", False)


def info(pod: dict[str, object]) -> PodInfo:
    parsed = pod_info(pod)
    assert parsed is not None
    return parsed


def pods(*items: dict[str, object]) -> dict[str, PodInfo]:
    return limits.gpu_pods(info(p) for p in items)


def proc(
    gpu_index: int,
    pid: int,
    used: int | None,
    pod: PodInfo | None,
    cid: int = 1,
    server: int | None = None,
) -> ObservedProcess:
    owner = (
        CgroupOwner(pod.ref.uid, container_id(cid), f"/kubepods/pod{pod.ref.uid}", True)
        if pod is not None
        else None
    )
    return ObservedProcess(
        gpu=gpu_index,
        pid=pid,
        used_memory=used,
        mps_client=True,
        owner=owner,
        pod=pod.ref if pod is not None else None,
        server=server,
    )


def test_single_gpu_ceiling_is_the_largest_cap() -> None:
    known = pods(make_pod("a", uid="a", cap="4Gi"), make_pod("b", uid="b", cap="10Gi"))
    plan = limits.plan_mps([gpu(0)], known, [], [])
    assert plan.default_mem_mib == {0: 10 * 1024}
    assert plan.default_threads == 50


def test_a_configured_ceiling_is_never_exceeded() -> None:
    known = pods(make_pod("b", uid="b", cap="10Gi"))
    assert limits.plan_mps([gpu(0)], known, [], [], 6 * GiB).default_mem_mib == {0: 6 * 1024}
    # and with no capped pod the configured ceiling stands in for the whole GPU
    assert limits.plan_mps([gpu(0)], {}, [], [], 6 * GiB).default_mem_mib == {0: 6 * 1024}
    assert limits.plan_mps([gpu(0)], {}, [], []).default_mem_mib == {0: 40 * 1024}


def test_multi_gpu_ceilings_follow_where_pods_run() -> None:
    a = info(make_pod("a", uid="a", cap="4Gi"))
    b = info(make_pod("b", uid="b", cap="12Gi"))
    known = {"a": a, "b": b}
    # b runs on GPU 1; a has no process yet, so it may land on either
    plan = limits.plan_mps([gpu(0), gpu(1)], known, [proc(1, 10, GiB, b)], [])
    assert plan.default_mem_mib == {0: 4 * 1024, 1: 12 * 1024}


def test_thread_ceiling_counts_a_governed_pod_without_threads_as_full() -> None:
    known = pods(make_pod("a", uid="a", threads=20), make_pod("b", uid="b", threads=None))
    assert limits.plan_mps([gpu(0)], known, [], []).default_threads == 100
    assert limits.plan_mps([gpu(0)], {}, [], []).default_threads == 100


def test_server_of_one_uid_gets_its_pods_limits_before_their_first_client() -> None:
    small = info(make_pod("small", uid="s", cap="2Gi", threads=20, run_as_user=1000))
    big = info(make_pod("big", uid="b", cap="16Gi", threads=80, run_as_user=2000))
    known = {"s": small, "b": big}
    servers = [
        MpsServer(pid=500, uid=1000),
        MpsServer(pid=501, uid=2000),
        MpsServer(pid=502, uid=0),
    ]
    plan = limits.plan_mps([gpu(0)], known, [], servers)
    assert plan.default_mem_mib == {0: 16 * 1024}
    assert plan.servers[500].mem_mib == {0: 2 * 1024}
    assert plan.servers[500].threads == 20
    assert plan.servers[500].pods == (small.ref,)
    assert plan.servers[501].mem_mib == {0: 16 * 1024}
    # a server no known pod uses gets the ceiling
    assert plan.servers[502].mem_mib == {0: 16 * 1024} and plan.servers[502].threads == 80


def test_server_shared_with_an_uncapped_pod_keeps_the_ceiling() -> None:
    capped = info(make_pod("c", uid="c", cap="2Gi", run_as_user=1000))
    free = info(make_pod("f", uid="f", cap=None, threads=None, run_as_user=1000, gpus=1))
    plan = limits.plan_mps([gpu(0)], {"c": capped, "f": free}, [], [MpsServer(500, 1000)])
    assert plan.servers[500].mem_mib == {0: 2 * 1024}  # the ceiling itself is 2Gi here
    other = info(make_pod("o", uid="o", cap="8Gi", run_as_user=3000))
    plan = limits.plan_mps(
        [gpu(0)], {"c": capped, "f": free, "o": other}, [], [MpsServer(500, 1000)]
    )
    assert plan.servers[500].mem_mib == {0: 8 * 1024}


def test_clients_tie_pods_to_a_server_whatever_the_uid() -> None:
    a = info(make_pod("a", uid="a", cap="3Gi"))
    b = info(make_pod("b", uid="b", cap="9Gi"))
    observed = [proc(0, 77, GiB, a, server=500)]
    plan = limits.plan_mps([gpu(0)], {"a": a, "b": b}, observed, [MpsServer(500, None, (77,))])
    assert plan.servers[500].mem_mib == {0: 3 * 1024}


def test_commands_only_for_what_changed() -> None:
    plan = limits.MpsPlan(
        default_threads=50,
        default_mem_mib={0: 4096, 1: 8192},
        servers={500: limits.ServerPlan(threads=20, mem_mib={0: 2048})},
    )
    first = limits.plan_commands(plan, {})
    assert [c.command for c in first] == [
        "set_default_device_pinned_mem_limit 0 4096M",
        "set_default_device_pinned_mem_limit 1 8192M",
        "set_default_active_thread_percentage 50",
        "set_device_pinned_mem_limit 500 0 2048M",
        "set_active_thread_percentage 500 20",
    ]
    applied = {c.key: c.value for c in first}
    assert limits.plan_commands(plan, applied) == []
    applied["default_mem/1"] = 1
    assert [c.command for c in limits.plan_commands(plan, applied)] == [
        "set_default_device_pinned_mem_limit 1 8192M"
    ]


def test_processes_of_one_container_add_up_against_its_cap() -> None:
    a = info(make_pod("a", uid="a", cap="4Gi", container_ids={container_id(1): "main"}))
    observed = [
        proc(0, 10, 3 * GiB, a, cid=1, server=500),
        proc(0, 11, 2 * GiB, a, cid=1),
        # a different container of the same pod is counted on its own
        proc(0, 12, 3 * GiB, a, cid=2),
    ]
    found = limits.violations(observed, {"a": a})
    assert len(found) == 1
    v = found[0]
    assert (v.container, v.gpu, v.used, v.cap, v.pids) == ("main", 0, 5 * GiB, 4 * GiB, (10, 11))
    assert v.servers == {10: 500}


def test_under_cap_unknown_usage_and_uncapped_pods_are_no_violation() -> None:
    a = info(make_pod("a", uid="a", cap="4Gi"))
    free = info(make_pod("f", uid="f", cap=None, threads=10))
    observed = [proc(0, 10, 4 * GiB, a), proc(0, 11, None, a, cid=3), proc(0, 12, 30 * GiB, free)]
    assert limits.violations(observed, {"a": a, "f": free}) == []


def test_oversubscription_uses_each_pods_overcommit_ratio() -> None:
    device = gpu(0, total=16 * GiB)
    a = info(make_pod("a", uid="a", cap="8Gi", ratio="2", created="2025-01-01T00:00:00Z"))
    b = info(make_pod("b", uid="b", cap="8Gi", ratio="2", created="2025-01-02T00:00:00Z"))
    known = {"a": a, "b": b}
    placement = limits.place_pods([0], known, [])
    assert limits.oversubscriptions([device], known, placement) == []  # 16Gi of caps <= 16Gi x 2
    c = info(make_pod("c", uid="c", cap="24Gi", ratio="2", created="2025-01-03T00:00:00Z"))
    known["c"] = c
    placement = limits.place_pods([0], known, [])
    [over] = limits.oversubscriptions([device], known, placement)
    assert over.caps == 40 * GiB and over.reserved == 20 * GiB and over.total == 16 * GiB
    assert over.pods[-1] == c.ref  # newest last: the one that tipped it over


def test_unplaced_pods_on_a_multi_gpu_node_do_not_oversubscribe_a_gpu() -> None:
    known = pods(make_pod("a", uid="a", cap="30Gi"), make_pod("b", uid="b", cap="30Gi"))
    placement = limits.place_pods([0, 1], known, [])
    assert placement.unplaced == {"a", "b"}
    assert limits.oversubscriptions([gpu(0), gpu(1)], known, placement) == []


def test_unknown_processes_skip_mps_servers() -> None:
    a = info(make_pod("a", uid="a"))
    stranger_owner = CgroupOwner("ffffffff-ffff-ffff-ffff-ffffffffffff", None, "/kubepods/x", True)
    observed = [
        proc(0, 10, GiB, a),
        ObservedProcess(gpu=0, pid=20, used_memory=GiB),
        ObservedProcess(gpu=0, pid=21, used_memory=GiB, owner=stranger_owner),
        ObservedProcess(gpu=0, pid=22, used_memory=100, is_mps_server=True),
    ]
    found = limits.unknown_processes(observed)
    assert [u.pid for u in found] == [20, 21]
    assert "no pod's cgroup" in found[0].reason
    assert "ffffffff-ffff-ffff-ffff-ffffffffffff" in found[1].reason
