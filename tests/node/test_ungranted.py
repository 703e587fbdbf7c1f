"""GPU processes in containers nothing granted a GPU (issue 29, item 7): an image's
``ENV NVIDIA_VISIBLE_DEVICES=all`` gets a CPU pod every GPU of the node where the NVIDIA runtime
accepts the variable from unprivileged containers, and admission never sees it. The agent reports
them as it reports containers over their cap: an Event, a log line, metrics, and the
``--on-violation`` action. Driven through the fake NVML, the fake MPS tool and a fake /proc."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpuwarden.node.agent import (
    REASON_UNGRANTED,
    Eviction,
    PodEvent,
)
from gpuwarden.node.fake import FakeNvml
from gpuwarden.node.mps import ProcessMpsControl

from .conftest import FakeProc, GiB, agent_for, container_id, make_pod, sample
from .mps_fake import FakeMps

UID_CPU = "eeeeeeee-0000-4000-8000-000000000005"
UID_GPU = "aaaaaaaa-0000-4000-8000-000000000001"
CID_MAIN = container_id(0xE1)
CID_SIDE = container_id(0xE2)
SERVER = 700


def plain_pod(
    name: str = "sneaky",
    *,
    uid: str = UID_CPU,
    resources: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod as the API server returns it, with no gpuwarden.io annotation: a CPU pod in a
    namespace gpuwarden does not govern, or one it admitted without a GPU."""
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/env-all:1"}
    if resources is not None:
        container["resources"] = resources
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-b", "uid": uid},
        "spec": {"nodeName": "gpu-node-1", "containers": [container], **(spec or {})},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{CID_MAIN}"}],
        },
    }


def test_a_cpu_pod_on_a_gpu_is_reported_with_an_event_a_log_line_and_metrics(
    nvml: FakeNvml,
    control: ProcessMpsControl,
    proc: FakeProc,
    fake_mps: FakeMps,
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = agent_for(nvml, control, proc)
    proc.add_pod_process(9100, UID_CPU, CID_MAIN)
    nvml.run(0, 9100, 3 * GiB, mps_client=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpuwarden.node"):
        report = agent.tick([plain_pod()])
    [event] = report.actions
    assert isinstance(event, PodEvent)
    assert (event.reason, event.pod.name, event.pod.namespace) == (
        REASON_UNGRANTED,
        "sneaky",
        "team-b",
    )
    assert event.message.startswith(
        "container main of pod team-b/sneaky uses GPU 0 (GPU-00000000-fake-0000-0000-000000000000) "
        "of node gpu-node-1, 3.00 GiB of GPU memory (PIDs 9100), but was granted no GPU"
    )
    assert [r.getMessage() for r in caplog.records] == [event.message]
    assert report.unknown == ()  # its pod is known: not an unknown process
    series = {"node": "gpu-node-1", "namespace": "team-b", "pod": "sneaky"}
    container = series | {"container": "main", "gpu": "0"}
    assert sample(agent, "gpuwarden_node_pod_gpu_ungranted", **container) == 1
    assert sample(agent, "gpuwarden_node_pod_gpu_memory_used_bytes", **container) == 3 * GiB
    assert sample(agent, "gpuwarden_node_ungranted_gpu_use_total", action="event", **series) == 1
    assert sample(agent, "gpuwarden_node_violations_total", **series) is None
    # still there next tick: no second Event, no second log line
    caplog.clear()
    assert agent.tick([plain_pod()]).actions == ()
    assert caplog.records == []
    # the process ends: the gauge goes, the count stays while the pod is on the node
    nvml.exit(9100)
    agent.tick([plain_pod()])
    assert sample(agent, "gpuwarden_node_pod_gpu_ungranted", pod="sneaky") is None
    assert sample(agent, "gpuwarden_node_ungranted_gpu_use_total", pod="sneaky") == 1
    agent.tick([])
    assert sample(agent, "gpuwarden_node_ungranted_gpu_use_total", pod="sneaky") is None


def test_evict_evicts_a_pod_that_uses_a_gpu_it_was_not_granted(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc, on_violation="evict")
    proc.add_pod_process(9100, UID_CPU, CID_MAIN)
    nvml.run(0, 9100, GiB, mps_client=False)
    event, eviction = agent.tick([plain_pod()]).actions
    assert isinstance(event, PodEvent) and isinstance(eviction, Eviction)
    assert eviction.pod.uid == UID_CPU
    assert event.message.endswith("; the agent evicts the pod")
    # a refused eviction (a disruption budget) is asked again while the process runs
    agent.eviction_refused(eviction.pod)
    [again] = agent.tick([plain_pod()]).actions
    assert isinstance(again, Eviction) and again.message == "still using a GPU it was not granted"
    series = {"namespace": "team-b", "pod": "sneaky", "action": "evict"}
    assert sample(agent, "gpuwarden_node_ungranted_gpu_use_total", **series) == 1


def test_terminate_ends_the_mps_clients_of_a_container_granted_no_gpu(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc, on_violation="terminate")
    fake_mps.add_server(SERVER, uid=1000)
    proc.add_mps_server(SERVER, 1000)
    fake_mps.add_client(SERVER, 9100)
    proc.add_pod_process(9100, UID_CPU, CID_MAIN)
    nvml.run(0, 9100, GiB)
    report = agent.tick([plain_pod()])
    assert "terminate_client 700 9100" in report.commands
    assert fake_mps.state()["terminated"] == [[SERVER, 9100]]
    [event] = report.actions
    assert isinstance(event, PodEvent) and event.reason == REASON_UNGRANTED
    assert event.message.endswith("; the agent terminated its MPS client(s) 9100")


def test_a_tenant_process_named_like_an_mps_server_is_still_reported(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    """The daemon lists its servers: a name is a tenant's choice, so it exempts nothing."""
    agent = agent_for(nvml, control, proc)
    proc.add_pod_process(9100, UID_CPU, CID_MAIN)
    (proc.root / "9100" / "comm").write_text("nvidia-cuda-mps\n")
    nvml.run(0, 9100, GiB, mps_client=False)
    report = agent.tick([plain_pod()])
    assert [(u.pod.name, u.pids) for u in report.ungranted] == [("sneaky", (9100,))]


def test_a_sidecar_of_a_gpu_pod_is_reported_but_its_gpu_container_is_not(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    """gpuwarden recorded the GPU for container main; a sidecar whose image sets the variable
    is granted nothing."""
    agent = agent_for(nvml, control, proc)
    pod = make_pod(
        "train-a",
        uid=UID_GPU,
        containers=("main",),
        container_ids={CID_MAIN: "main", CID_SIDE: "logger"},
    )
    pod["spec"]["containers"].append({"name": "logger", "image": "registry.invalid/env-all:1"})
    proc.add_pod_process(9200, UID_GPU, CID_MAIN)
    nvml.run(0, 9200, 2 * GiB, mps_client=False)
    proc.add_pod_process(9201, UID_GPU, CID_SIDE)
    nvml.run(0, 9201, GiB, mps_client=False)
    report = agent.tick([pod])
    assert [(u.container, u.pids) for u in report.ungranted] == [("logger", (9201,))]
    [event] = report.actions
    assert isinstance(event, PodEvent)
    assert event.message.startswith("container logger of pod team-a/train-a uses GPU 0")


@pytest.mark.parametrize(
    "pod",
    [
        # a device plugin's GPU, in a namespace gpuwarden does not govern (no record)
        plain_pod(resources={"limits": {"nvidia.com/gpu": "1"}}),
        # a MIG slice
        plain_pod(resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}}),
        # a DRA claim: the agent cannot see which devices it holds
        plain_pod(spec={"resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}]}),
        # an extended resource backed by a DRA DeviceClass
        plain_pod(resources={"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}}),
    ],
    ids=["device-plugin", "mig", "dra-claim", "dra-extended-resource"],
)
def test_pods_granted_a_gpu_outside_gpuwarden_are_not_reported(
    nvml: FakeNvml,
    control: ProcessMpsControl,
    proc: FakeProc,
    fake_mps: FakeMps,
    pod: dict[str, Any],
) -> None:
    agent = agent_for(nvml, control, proc)
    proc.add_pod_process(9100, UID_CPU, CID_MAIN)
    nvml.run(0, 9100, 3 * GiB, mps_client=False)
    report = agent.tick([pod])
    assert report.ungranted == () and report.actions == ()


def test_a_pod_asking_zero_gpus_was_granted_none(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    agent = agent_for(nvml, control, proc)
    proc.add_pod_process(9100, UID_CPU, CID_MAIN)
    nvml.run(0, 9100, GiB, mps_client=False)
    report = agent.tick([plain_pod(resources={"limits": {"nvidia.com/gpu": "0"}})])
    assert [u.container for u in report.ungranted] == ["main"]


def test_the_mps_servers_the_daemon_lists_are_not_reported_from_the_pod_that_runs_them(
    nvml: FakeNvml, control: ProcessMpsControl, proc: FakeProc, fake_mps: FakeMps
) -> None:
    """The agent's own pod (or the device plugin's) asks for no GPU and runs the MPS servers."""
    agent = agent_for(nvml, control, proc)
    fake_mps.add_server(SERVER, uid=1000)
    proc.add_pod_process(SERVER, UID_CPU, CID_MAIN)
    (proc.root / str(SERVER) / "comm").write_text("nvidia-cuda-mps\n")
    nvml.run(0, SERVER, 300 * 2**20, mps_client=False)
    report = agent.tick([plain_pod("gpuwarden-node-agent")])
    assert report.ungranted == () and report.actions == ()
