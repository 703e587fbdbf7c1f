"""Per-container GPU usage: allocation, measured and estimated busy, as the metrics show them.

NVML is the fake at its interface boundary (device figures and per-process samples as the driver
hands them out); /proc is a fake tree; the MPS tool is the fake one, spawned for real.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.node.fake import FakeNvml
from gpuwarden.node.mps import ProcessMpsControl

from .conftest import FakeProc, GiB, agent_for, container_id, make_pod, sample
from .mps_fake import FakeMps

UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"
CID_A, CID_B = container_id(0xA), container_id(0xB)
SERVER = 700


def whole(name: str, uid: str, cid: str, **kwargs: Any) -> dict[str, Any]:
    """A notebook on one whole GPU, profile gpu-1 of tenant team-a."""
    pod = make_pod(
        name,
        uid=uid,
        cap=None,
        threads=None,
        container_ids={cid: "main"},
        extra_annotations={
            "gpuwarden.io/profile": "gpu-1",
            "gpuwarden.io/backend": "nvidia",
            "gpuwarden.io/gpu-shared": "false",
        },
        **kwargs,
    )
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return pod


def slice_(name: str, uid: str, cid: str, threads: int, backend: str = "nvidia") -> dict[str, Any]:
    """A shared slice (profile shared-small): an MPS client on the nvidia backend."""
    return make_pod(
        name,
        uid=uid,
        cap="8Gi",
        threads=threads,
        container_ids={cid: "main"},
        extra_annotations={"gpuwarden.io/backend": backend, "gpuwarden.io/gpu-shared": "true"},
    )


def series(agent: Any, name: str, pod: str) -> dict[str, str] | None:
    """The labels of the one series of ``name`` for ``pod``, with its value as "value"."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpuwarden.node.metrics import agent_registry

    text = generate_latest(agent_registry(agent)).decode()
    found = [
        {**item.labels, "value": f"{item.value:g}"}
        for family in text_string_to_metric_families(text)
        for item in family.samples
        if item.name == name and item.labels.get("pod") == pod
    ]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_a_whole_gpu_is_measured_from_its_processes_samples(nvml: FakeNvml, proc: FakeProc) -> None:
    agent = agent_for(nvml, None, proc)
    proc.add_pod_process(4001, UID_A, CID_A)
    nvml.run(0, 4001, 6 * GiB, mps_client=False)
    nvml.set_utilization(0, 35, 20)
    nvml.sample(0, 4001, 30, 10)
    nvml.sample(0, 4001, 40, 30)
    agent.tick([whole("nb-a", UID_A, CID_A)])

    use = series(agent, "gpuwarden_node_pod_gpu_sm_utilization", "nb-a")
    assert use == {
        "node": "gpu-node-1",
        "namespace": "team-a",
        "pod": "nb-a",
        "container": "main",
        "tenant": "team-a",
        "profile": "gpu-1",
        "gpu": "0",
        "estimated": "false",
        "value": "0.35",
    }
    bandwidth = series(agent, "gpuwarden_node_pod_gpu_memory_bandwidth_utilization", "nb-a")
    assert bandwidth is not None and bandwidth["value"] == "0.2"
    allocated = series(agent, "gpuwarden_node_container_gpus_allocated", "nb-a")
    assert allocated is not None and (allocated["value"], allocated["basis"]) == ("1", "whole")
    busy = series(agent, "gpuwarden_node_container_gpus_busy", "nb-a")
    assert busy is not None and (busy["value"], busy["estimated"]) == ("0.35", "false")
    memory = series(agent, "gpuwarden_node_container_gpu_memory_used_bytes", "nb-a")
    assert memory is not None and memory["value"] == f"{6 * GiB:g}"

    # no sample since the last pass: the process did not use the GPU, busy 0 (not the old 0.35)
    agent.tick([whole("nb-a", UID_A, CID_A)])
    assert sample(agent, "gpuwarden_node_container_gpus_busy", pod="nb-a") == 0


def test_an_allocated_gpu_with_no_process_on_it_is_idle(nvml: FakeNvml, proc: FakeProc) -> None:
    agent = agent_for(nvml, None, proc)
    nvml.set_utilization(0, 0)
    agent.tick([whole("nb-idle", UID_A, CID_A)])
    assert sample(agent, "gpuwarden_node_container_gpus_allocated", pod="nb-idle") == 1
    assert sample(agent, "gpuwarden_node_container_gpus_busy", pod="nb-idle") == 0
    assert series(agent, "gpuwarden_node_pod_gpu_sm_utilization", "nb-idle") is None


def mps_clients(nvml: FakeNvml, proc: FakeProc, fake_mps: FakeMps) -> None:
    """Pods A and B each run one MPS client on GPU 0; NVML samples only the server's PID."""
    fake_mps.add_server(SERVER, uid=1000)
    proc.add_mps_server(SERVER, 1000)
    nvml.run(0, SERVER, 300 * 2**20, mps_client=False)
    for pid, uid, cid in ((9001, UID_A, CID_A), (9002, UID_B, CID_B)):
        fake_mps.add_client(SERVER, pid)
        proc.add_pod_process(pid, uid, cid)
        nvml.run(0, pid, 2 * GiB)
    nvml.set_utilization(0, 60, 30)
    nvml.sample(0, SERVER, 60, 30)


def test_mps_clients_share_the_device_figure_by_their_slices_and_say_it_is_estimated(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    mps_clients(nvml, proc, fake_mps)
    agent.tick([slice_("a", UID_A, CID_A, threads=50), slice_("b", UID_B, CID_B, threads=25)])
    a = series(agent, "gpuwarden_node_pod_gpu_sm_utilization", "a")
    b = series(agent, "gpuwarden_node_pod_gpu_sm_utilization", "b")
    assert a is not None and b is not None
    # 60% of the device, split 50:25 (their thread percentages, as no replicas are known)
    assert (a["value"], a["estimated"], b["value"], b["estimated"]) == (
        "0.4",
        "true",
        "0.2",
        "true",
    )
    allocated = series(agent, "gpuwarden_node_container_gpus_allocated", "a")
    assert allocated is not None and (allocated["value"], allocated["basis"]) == (
        "0.5",
        "mps-threads",
    )
    busy = series(agent, "gpuwarden_node_container_gpus_busy", "b")
    assert busy is not None and (busy["value"], busy["estimated"]) == ("0.2", "true")


def test_with_the_device_plugins_replicas_a_slice_is_one_replica(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc, mps_replicas=4)
    mps_clients(nvml, proc, fake_mps)
    agent.tick([slice_("a", UID_A, CID_A, threads=50), slice_("b", UID_B, CID_B, threads=25)])
    allocated = series(agent, "gpuwarden_node_container_gpus_allocated", "a")
    assert allocated is not None and (allocated["value"], allocated["basis"]) == (
        "0.25",
        "mps-replicas",
    )
    # equal slices: equal parts of the device's 60%
    assert sample(agent, "gpuwarden_node_container_gpus_busy", pod="b") == 0.3


def test_a_client_the_driver_samples_itself_is_measured(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    mps_clients(nvml, proc, fake_mps)
    nvml.sample(0, 9001, 45, 20)
    agent.tick([slice_("a", UID_A, CID_A, threads=50), slice_("b", UID_B, CID_B, threads=25)])
    a = series(agent, "gpuwarden_node_pod_gpu_sm_utilization", "a")
    b = series(agent, "gpuwarden_node_pod_gpu_sm_utilization", "b")
    assert a is not None and (a["value"], a["estimated"]) == ("0.45", "false")
    # b gets what the device did beyond the measured client: 60% - 45%
    assert b is not None and (b["value"], b["estimated"]) == ("0.15", "true")


def test_without_per_process_samples_every_container_is_estimated(
    nvml: FakeNvml, proc: FakeProc
) -> None:
    agent = agent_for(nvml, None, proc)
    nvml.no_process_samples.add(0)
    proc.add_pod_process(4001, UID_A, CID_A)
    nvml.run(0, 4001, GiB, mps_client=False)
    nvml.set_utilization(0, 70, 10)
    agent.tick([whole("nb-a", UID_A, CID_A)])
    use = series(agent, "gpuwarden_node_pod_gpu_sm_utilization", "nb-a")
    assert use is not None and (use["value"], use["estimated"]) == ("0.7", "true")


def test_vgpu_shares_come_from_cores_or_memory(nvml: FakeNvml, proc: FakeProc) -> None:
    agent = agent_for(nvml, None, proc)
    cores = slice_("volcano-cores", UID_A, CID_A, threads=30, backend="volcano")
    memory_only = make_pod(
        "hami-memory",
        uid=UID_B,
        cap="20Gi",  # half of the 40 GiB GPU
        threads=None,
        extra_annotations={"gpuwarden.io/backend": "hami", "gpuwarden.io/gpu-shared": "true"},
    )
    agent.tick([cores, memory_only])
    a = series(agent, "gpuwarden_node_container_gpus_allocated", "volcano-cores")
    b = series(agent, "gpuwarden_node_container_gpus_allocated", "hami-memory")
    assert a is not None and (a["value"], a["basis"]) == ("0.3", "vgpu-cores")
    assert b is not None and (b["value"], b["basis"]) == ("0.5", "vgpu-memory")


def test_a_dra_claim_counts_the_larger_of_its_cores_and_memory(
    nvml: FakeNvml, proc: FakeProc
) -> None:
    agent = agent_for(nvml, None, proc)
    # The claim reserves 20 of the device's 100 cores and 15Gi of its 40 GiB: memory is more.
    claimed = make_pod(
        "dra-notebook",
        uid=UID_A,
        cap="15Gi",
        threads=20,
        extra_annotations={"gpuwarden.io/backend": "dra", "gpuwarden.io/gpu-shared": "true"},
    )
    agent.tick([claimed])
    a = series(agent, "gpuwarden_node_container_gpus_allocated", "dra-notebook")
    assert a is not None and (a["value"], a["basis"]) == ("0.375", "vgpu-memory")


def test_finished_pods_hold_nothing(nvml: FakeNvml, proc: FakeProc) -> None:
    agent = agent_for(nvml, None, proc)
    agent.tick([whole("done", UID_A, CID_A, phase="Succeeded")])
    assert series(agent, "gpuwarden_node_container_gpus_allocated", "done") is None


def test_an_ungoverned_pod_holds_its_gpu_count_and_mig_instances_are_not_sized(
    nvml: FakeNvml, proc: FakeProc
) -> None:
    agent = agent_for(nvml, None, proc)
    plain = whole("plain", UID_A, CID_A)
    plain["metadata"]["annotations"] = {}
    plain["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    mig = whole("mig", UID_B, CID_B)
    mig["metadata"]["annotations"] = {}
    mig["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    agent.tick([plain, mig])
    held = series(agent, "gpuwarden_node_container_gpus_allocated", "plain")
    assert held is not None and (held["value"], held["basis"]) == ("2", "whole")
    assert "tenant" not in held or held["tenant"] == ""
    assert series(agent, "gpuwarden_node_container_gpus_allocated", "mig") is None
