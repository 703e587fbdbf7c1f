"""The agent's ticks: the in-process fake NVML, the fake MPS tool spawned for real, a fake /proc."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwarden.node import mps
from gpuwarden.node.agent import (
    REASON_BAD_ANNOTATION,
    REASON_CAP_EXCEEDED,
    REASON_OVERSUBSCRIBED,
    REASON_UNKNOWN_PROCESS,
    AgentConfig,
    Eviction,
    NodeAgent,
    NodeEvent,
    PodEvent,
)
from gpuwarden.node.fake import FakeNvml
from gpuwarden.node.mps import ProcessMpsControl, device_plugin_directories
from gpuwarden.node.procfs import ProcFs

from .conftest import FakeProc, GiB, agent_for, container_id, make_pod, sample
from .mps_fake import FakeMps

UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"
UID_C = "cccccccc-0000-4000-8000-000000000003"
CID_A = container_id(0xA1)
SERVER = 700


def pod_a(**kwargs: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "uid": UID_A,
        "cap": "4Gi",
        "threads": 50,
        "container_ids": {CID_A: "main"},
    }
    return make_pod("train-a", **(defaults | kwargs))


def pod_b(**kwargs: Any) -> dict[str, Any]:
    return make_pod("train-b", **({"uid": UID_B, "cap": "10Gi", "threads": 30} | kwargs))


def with_client(
    nvml: FakeNvml, proc: FakeProc, fake_mps: FakeMps, pid: int, used: int, *, pod_uid: str = UID_A
) -> None:
    """A CUDA process of pod A's main container, connected to the MPS server."""
    if str(SERVER) not in fake_mps.state()["servers"]:
        fake_mps.add_server(SERVER, uid=1000)
        proc.add_mps_server(SERVER, 1000)
        nvml.run(0, SERVER, 300 * 2**20, mps_client=False)
    fake_mps.add_client(SERVER, pid)
    proc.add_pod_process(pid, pod_uid, CID_A)
    nvml.run(0, pid, used)


def test_start_runs_the_daemon_and_the_first_tick_sets_the_ceilings(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = NodeAgent(AgentConfig(node_name="gpu-node-1"), nvml, control, ProcFs(proc.root))
    assert "started the MPS control daemon" in agent.start()
    report = agent.tick([pod_a(), pod_b()])
    assert report.mps_healthy is True
    assert report.commands == (
        "set_default_device_pinned_mem_limit 0 10240M",
        "set_default_active_thread_percentage 50",
    )
    state = fake_mps.state()
    assert state["default_mem"] == {"0": "10240M"} and state["default_threads"] == 50.0
    assert report.gpus[0].ceiling == 10 * GiB
    # nothing changed: nothing is sent again
    before = fake_mps.changes()
    assert agent.tick([pod_a(), pod_b()]).commands == ()
    assert fake_mps.changes() == before
    # the big pod leaves: the ceiling comes down for servers started from now on
    agent.tick([pod_a()])
    assert fake_mps.state()["default_mem"] == {"0": "4096M"}


def test_a_running_server_gets_its_pods_limits_for_the_clients_it_creates_next(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    fake_mps.add_server(SERVER, uid=1000)  # started earlier, with the daemon's old defaults
    proc.add_mps_server(SERVER, 1000)
    early = fake_mps.add_client(SERVER, 9000)
    assert early["mem"] == {}
    small = pod_a(cap="2Gi", threads=20, run_as_user=1000)
    big = pod_b(cap="16Gi", threads=80, run_as_user=2000)
    report = agent.tick([small, big])
    assert "set_device_pinned_mem_limit 700 0 2048M" in report.commands
    assert "set_active_thread_percentage 700 20" in report.commands
    server = fake_mps.server(SERVER)
    assert server["mem"] == {"0": "2048M"} and server["threads"] == 20.0
    # pod A's first client, started after the tick, gets A's cap even with its env unset
    assert fake_mps.add_client(SERVER, 9001) == {"threads": 20.0, "mem": {"0": "2048M"}}
    # while the daemon default (for UID 2000's server, started later) is the 16Gi ceiling
    assert fake_mps.state()["default_mem"] == {"0": "16384M"}


def test_a_container_over_its_cap_gets_one_event_per_episode(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    with_client(nvml, proc, fake_mps, 9001, 5 * GiB)
    report = agent.tick([pod_a()])
    [violation] = report.violations
    assert (violation.container, violation.used, violation.cap) == ("main", 5 * GiB, 4 * GiB)
    [event] = [a for a in report.actions if isinstance(a, PodEvent)]
    assert event.reason == REASON_CAP_EXCEEDED and event.pod.uid == UID_A
    assert "container main uses 5.00 GiB of GPU memory on GPU 0" in event.message
    assert "above its cap 4Gi (PIDs 9001)" in event.message
    assert agent.tick([pod_a()]).actions == ()  # still over: no second event
    nvml.run(0, 9001, 3 * GiB)
    assert agent.tick([pod_a()]).violations == ()
    nvml.run(0, 9001, 6 * GiB)
    assert [a.reason for a in agent.tick([pod_a()]).actions] == [REASON_CAP_EXCEEDED]
    assert agent.violation_counts() == {("team-a", "train-a", "event"): 2}


def test_a_pod_that_left_the_node_is_forgotten(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    """Its violation counter (a metric series per pod) goes with it, so the agent's memory and
    series do not grow with every pod the node ever ran."""
    agent = agent_for(nvml, control, proc)
    with_client(nvml, proc, fake_mps, 9001, 5 * GiB)
    agent.tick([pod_a()])
    assert agent.violation_counts() == {("team-a", "train-a", "event"): 1}
    agent.tick([pod_b()])
    assert agent.violation_counts() == {}


def test_terminate_sends_terminate_client_to_the_clients_server(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc, on_violation="terminate")
    with_client(nvml, proc, fake_mps, 9001, 3 * GiB)
    # a second process of the same container, not an MPS client: 3 + 2 GiB > 4Gi
    proc.add_pod_process(9002, UID_A, CID_A)
    nvml.run(0, 9002, 2 * GiB, mps_client=False)
    report = agent.tick([pod_a()])
    assert "terminate_client 700 9001" in report.commands
    assert fake_mps.state()["terminated"] == [[SERVER, 9001]]
    [event] = report.actions
    assert isinstance(event, PodEvent)
    assert "the agent terminated its MPS client(s) 9001" in event.message
    assert "PID 9002 is not an MPS client, so MPS cannot terminate it" in event.message


def test_evict_asks_for_one_eviction(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc, on_violation="evict")
    with_client(nvml, proc, fake_mps, 9001, 5 * GiB)
    actions = agent.tick([pod_a()]).actions
    assert [type(a) for a in actions] == [PodEvent, Eviction]
    assert actions[1].pod.uid == UID_A
    nvml.run(0, 9001, 3 * GiB)
    agent.tick([pod_a()])
    nvml.run(0, 9001, 5 * GiB)
    assert not any(isinstance(a, Eviction) for a in agent.tick([pod_a()]).actions)


def test_processes_of_no_known_pod_are_flagged_but_mps_servers_are_not(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    with_client(nvml, proc, fake_mps, 9001, GiB)
    proc.add(5555, "0::/user.slice/user-0.slice/session-1.scope\n", uid=0)
    nvml.run(0, 5555, 2 * GiB, mps_client=False)
    gone = "dddddddd-0000-4000-8000-000000000004"
    proc.add_pod_process(5556, gone, container_id(5))
    nvml.run(0, 5556, GiB)
    report = agent.tick([pod_a()])
    assert sorted(u.pid for u in report.unknown) == [5555, 5556]
    events = [a for a in report.actions if isinstance(a, NodeEvent)]
    assert [e.reason for e in events] == [REASON_UNKNOWN_PROCESS] * 2
    assert "PID 5555 on GPU 0 of node gpu-node-1 uses 2.00 GiB" in events[0].message
    assert gone in events[1].message
    assert agent.tick([pod_a()]).actions == ()


def test_limits_come_back_after_the_daemon_dies(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    agent.tick([pod_a(), pod_b()])
    fake_mps.crash()
    fake_mps.clear_log()
    report = agent.tick([pod_a(), pod_b()])
    assert fake_mps.changes() == [
        "-d",
        "set_default_device_pinned_mem_limit 0 10240M",
        "set_default_active_thread_percentage 50",
    ]
    assert report.reapplied and report.mps_healthy
    assert any("does not answer" in e for e in report.errors)
    assert agent.daemon_restarts == 1


def test_a_restart_by_someone_else_between_ticks_is_noticed(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    agent.tick([pod_a()])
    fake_mps.crash()
    control.start_daemon()  # a new daemon: new PID, defaults back to 100% / no memory limit
    report = agent.tick([pod_a()])
    assert report.reapplied
    assert fake_mps.state()["default_mem"] == {"0": "4096M"}
    assert fake_mps.state()["default_threads"] == 50.0


def test_a_daemon_nobody_restarts_reads_unhealthy(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc, manage_daemon=False)
    report = agent.tick([pod_a()])
    assert report.mps_healthy is False and report.commands == ()
    assert sample(agent, "gpuwarden_node_mps_daemon_healthy") == 0
    control.start_daemon()
    assert agent.tick([pod_a()]).commands[0] == "set_default_device_pinned_mem_limit 0 4096M"


def test_mps_is_refused_on_mig_gpus(
    control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    nvml = FakeNvml()
    nvml.add_gpu(80 * GiB, mig_enabled=True)
    nvml.add_gpu(40 * GiB)
    agent = NodeAgent(AgentConfig(node_name="gpu-node-1"), nvml, control, ProcFs(proc.root))
    messages = agent.start()
    assert any(
        "GPU 0" in m and "has MIG enabled" in m and "does not run MPS" in m for m in messages
    )
    report = agent.tick([pod_a()])
    assert report.commands == (
        "set_default_device_pinned_mem_limit 1 4096M",
        "set_default_active_thread_percentage 50",
    )
    assert [g.managed for g in report.gpus] == [False, True]
    assert report.gpus[0].note is not None and "MIG" in report.gpus[0].note


def test_a_node_of_mig_gpus_only_runs_no_daemon(
    control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    nvml = FakeNvml()
    nvml.add_gpu(80 * GiB, mig_enabled=True)
    agent = NodeAgent(AgentConfig(node_name="gpu-node-1"), nvml, control, ProcFs(proc.root))
    assert "no GPU on this node can use MPS; monitoring only" in agent.start()
    report = agent.tick([pod_a()])
    assert report.mps_healthy is None and not fake_mps.running() and fake_mps.log() == []


def test_oversubscribed_gpu_is_reported_once(
    control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    nvml = FakeNvml()
    nvml.add_gpu(16 * GiB)
    agent = agent_for(nvml, control, proc)
    pods = [
        pod_a(cap="8Gi", created="2025-01-01T00:00:00Z"),
        pod_b(cap="8Gi", created="2025-01-02T00:00:00Z"),
    ]
    assert agent.tick(pods).oversubscribed == ()
    pods.append(make_pod("late", uid=UID_C, cap="8Gi", created="2025-01-03T00:00:00Z"))
    report = agent.tick(pods)
    [over] = report.oversubscribed
    assert over.caps == 24 * GiB
    reasons = [(type(a).__name__, a.reason) for a in report.actions]
    assert reasons == [("NodeEvent", REASON_OVERSUBSCRIBED), ("PodEvent", REASON_OVERSUBSCRIBED)]
    assert isinstance(report.actions[1], PodEvent) and report.actions[1].pod.name == "late"
    assert "24.00 GiB" in report.actions[0].message and "16.00 GiB" in report.actions[0].message
    assert agent.tick(pods).actions == ()
    assert sample(agent, "gpuwarden_node_gpu_oversubscribed", gpu="0") == 1
    assert sample(agent, "gpuwarden_node_gpu_memory_reserved_bytes", gpu="0") == 24 * GiB


def test_unreadable_annotations_get_one_event(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    bad = pod_a(cap="lots")
    [event] = agent.tick([bad]).actions
    assert isinstance(event, PodEvent) and event.reason == REASON_BAD_ANNOTATION
    assert "gpuwarden.io/gpu-memory-limit='lots'" in event.message
    assert agent.tick([bad]).actions == ()


def test_a_forged_annotation_on_one_pod_leaves_the_others_enforced(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    """A GPU count that isdigit() accepts and int() refuses made every tick of the node raise."""
    agent = agent_for(nvml, control, proc)
    with_client(nvml, proc, fake_mps, 9001, 5 * GiB)
    forged = pod_b(extra_annotations={"gpuwarden.io/gpu-count": "\u00b2"})
    report = agent.tick([pod_a(), forged])
    assert [(v.container, v.used) for v in report.violations] == [("main", 5 * GiB)]
    reasons = {(a.pod.uid, a.reason) for a in report.actions if isinstance(a, PodEvent)}
    assert reasons == {(UID_A, REASON_CAP_EXCEEDED), (UID_B, REASON_BAD_ANNOTATION)}


def test_metrics_show_usage_against_cap(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    with_client(nvml, proc, fake_mps, 9001, 5 * GiB)
    agent.tick([pod_a()])
    pod = {"namespace": "team-a", "pod": "train-a", "node": "gpu-node-1"}
    container = pod | {"container": "main", "gpu": "0"}
    assert sample(agent, "gpuwarden_node_pod_gpu_memory_used_bytes", **container) == 5 * GiB
    assert sample(agent, "gpuwarden_node_pod_gpu_memory_cap_bytes", **container) == 4 * GiB
    assert sample(agent, "gpuwarden_node_pod_over_cap", **container) == 1
    assert sample(agent, "gpuwarden_node_pod_mps_thread_percentage", **pod) == 50
    assert sample(agent, "gpuwarden_node_violations_total", action="event", **pod) == 1
    assert sample(agent, "gpuwarden_node_gpu_memory_ceiling_bytes", gpu="0") == 4 * GiB
    assert sample(agent, "gpuwarden_node_gpu_memory_total_bytes", gpu="0") == 40 * GiB
    assert sample(agent, "gpuwarden_node_mps_servers") == 1
    assert sample(agent, "gpuwarden_node_mps_daemon_healthy") == 1
    # the pod leaves: its series go with it, the counter too (series per pod name would
    # otherwise grow with every pod the node ever ran)
    nvml.exit(9001)
    agent.tick([])
    assert sample(agent, "gpuwarden_node_pod_gpu_memory_used_bytes", pod="train-a") is None
    assert sample(agent, "gpuwarden_node_violations_total", pod="train-a") is None


def test_hard_limits_key_on_the_pod_cgroup_before_its_first_process(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps, tmp_path: Path
) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    pod_dir = (
        root
        / "kubepods.slice/kubepods-burstable.slice"
        / f"kubepods-burstable-pod{UID_A.replace('-', '_')}.slice"
    )
    pod_dir.mkdir(parents=True)
    agent = agent_for(nvml, control, proc, hard_limits=True, cgroup_root=root)
    agent.tick([pod_a(containers=("main", "helper"))])
    assert nvml.cgroup_limits == [(0, str(pod_dir), 8 * GiB)]  # 4Gi per GPU container, two of them
    agent.tick([pod_a(containers=("main", "helper"))])
    assert len(nvml.cgroup_limits) == 1


def test_a_gpu_nvml_cannot_read_is_an_error_not_a_crash(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    nvml.failing[0] = "GPU is lost"
    report = agent.tick([pod_a()])
    assert any("GPU is lost" in e for e in report.errors)
    assert report.commands  # the MPS limits are still set


def test_report_is_plain_json(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    import json

    agent = agent_for(nvml, control, proc, on_violation="evict")
    with_client(nvml, proc, fake_mps, 9001, 5 * GiB)
    data = json.loads(json.dumps(agent.tick([pod_a()]).to_json()))
    assert data["violations"][0]["pod"]["name"] == "train-a"
    assert [a["kind"] for a in data["actions"]] == ["PodEvent", "Eviction"]


def test_a_capped_process_named_like_an_mps_server_is_still_checked(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    proc.add_pod_process(9001, UID_A, CID_A)
    (proc.root / "9001" / "comm").write_text("nvidia-cuda-mps\n")
    nvml.run(0, 9001, 5 * GiB, mps_client=False)
    # while a real server outside any pod, named so, is recognised even when MPS cannot list it
    proc.add_mps_server(701, 0)
    nvml.run(0, 701, 300 * 2**20, mps_client=False)
    report = agent.tick([pod_a()])
    assert [v.pids for v in report.violations] == [(9001,)]
    assert report.unknown == ()


def test_managing_the_device_plugins_daemon_the_agent_sets_caps_above_the_equal_share(
    nvml: FakeNvml, mps_bin: Path, proc: FakeProc, tmp_path: Path
) -> None:
    """NVIDIA's device plugin gives each MPS client 1/replicas of a GPU (40Gi / 4 = 10Gi and 25%
    here) and a client can only lower that; where the agent runs the daemon the plugin's pods
    use (<root>/<resource>/pipe), the pods' own caps hold, above that share too."""
    layout = device_plugin_directories(tmp_path / "run-nvidia-mps", "nvidia.com/gpu.shared")
    control = ProcessMpsControl(binary=str(mps_bin), pipe_dir=layout.pipe, log_dir=layout.log)
    fake = FakeMps(layout.pipe)
    agent = agent_for(nvml, control, proc)
    assert fake.running() and control.daemon_pid() == fake.state()["daemon_pid"]
    fake.add_server(SERVER, uid=1000)
    proc.add_mps_server(SERVER, 1000)
    big = pod_a(cap="16Gi", threads=50, run_as_user=1000)
    report = agent.tick([big])
    assert report.commands == (
        "set_default_device_pinned_mem_limit 0 16384M",
        "set_default_active_thread_percentage 50",
        "set_device_pinned_mem_limit 700 0 16384M",
        "set_active_thread_percentage 700 50",
    )
    # the pod's next client gets its cap, whatever its environment says
    assert fake.add_client(SERVER, 9001) == {"threads": 50.0, "mem": {"0": "16384M"}}


def test_on_the_device_plugins_own_daemon_the_agent_sets_the_pods_limits_too(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    """external: the plugin started the daemon with its equal share, as daemon.go's Start does."""
    control.start_daemon()
    control.send(mps.set_default_mem(0, 10240))
    control.send(mps.set_default_threads(25))
    fake_mps.clear_log()
    agent = agent_for(nvml, control, proc, manage_daemon=False)
    assert not agent.started_daemon
    agent.tick([pod_a(cap="16Gi", threads=50)])
    assert fake_mps.changes() == [
        "set_default_device_pinned_mem_limit 0 16384M",
        "set_default_active_thread_percentage 50",
    ]
