"""The agent's Kubernetes side against a real kube-apiserver (no kubelet, no scheduler).

Pods are created with spec.nodeName already set, as the scheduler would leave them. With no kubelet
nothing runs them, so the tests set pod status through the status subresource where they need it,
and an eviction leaves the pod terminating (deletionTimestamp set) rather than gone: that is what
the API server does on its own.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s_client

from gpuwarden.kube.node_pods import NodeCluster
from gpuwarden.node.agent import (
    REASON_CAP_EXCEEDED,
    REASON_UNGRANTED,
    AgentConfig,
    NodeAgent,
    run_loop,
    run_once,
)
from gpuwarden.node.fake import FakeNvml
from gpuwarden.node.mps import ProcessMpsControl
from gpuwarden.node.procfs import ProcFs

from .conftest import FakeProc, GiB, container_id, make_pod
from .mps_fake import FakeMps

pytestmark = pytest.mark.e2e

T = TypeVar("T")


def eventually(probe: Callable[[], T], what: str, timeout: float = 15.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} (last: {value!r})")
        time.sleep(0.05)


@pytest.fixture
def core(api_client: k8s_client.ApiClient) -> k8s_client.CoreV1Api:
    return k8s_client.CoreV1Api(api_client)


@pytest.fixture
def node() -> str:
    return f"gpu-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def cluster(api_client: k8s_client.ApiClient, node: str) -> Iterator[NodeCluster]:
    watched = NodeCluster(api_client, node, watch_timeout=5)
    yield watched
    watched.stop()


def create(
    core: k8s_client.CoreV1Api, namespace: str, pod: dict[str, Any], node: str
) -> dict[str, Any]:
    body = json.loads(json.dumps(pod))
    for key in ("uid", "creationTimestamp"):
        body["metadata"].pop(key, None)
    body["metadata"]["namespace"] = namespace
    body.pop("status", None)
    body["spec"]["nodeName"] = node
    response = core.create_namespaced_pod(namespace, body, _preload_content=False)
    created: dict[str, Any] = json.loads(response.data)
    return created


def names(cluster: NodeCluster) -> set[str]:
    return {p["metadata"]["name"] for p in cluster.pods()}


def running_status(cid: str) -> dict[str, Any]:
    """A pod's status with its container ``main`` running as ``cid``, as a kubelet writes it."""
    return {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "main",
                "containerID": f"containerd://{cid}",
                "image": "registry.invalid/train:1",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {"running": {}},
            }
        ],
    }


def running(
    core: k8s_client.CoreV1Api, namespace: str, name: str, cid: str, cluster: NodeCluster
) -> None:
    """Report the pod's container ``main`` running as ``cid``, as a kubelet would, and wait
    until the node's pod watch has it."""
    core.patch_namespaced_pod_status(name, namespace, {"status": running_status(cid)})
    assert cluster.start(timeout=15)
    eventually(
        lambda: any(p["status"].get("containerStatuses") for p in cluster.pods()),
        "the pod's container status",
    )


def evicting_agent(
    node: str,
    control: ProcessMpsControl,
    fake_mps: FakeMps,
    proc: FakeProc,
    *,
    uid: str,
    cid: str,
    pid: int,
) -> NodeAgent:
    """An agent set to evict, on one 40 GiB GPU, where the pod's MPS client ``pid`` uses 6 GiB."""
    nvml = FakeNvml()
    nvml.add_gpu(40 * GiB)
    agent = NodeAgent(
        AgentConfig(node_name=node, on_violation="evict"), nvml, control, ProcFs(proc.root)
    )
    agent.start()
    fake_mps.add_server(700, uid=1000)
    proc.add_mps_server(700, 1000)
    fake_mps.add_client(700, pid)
    proc.add_pod_process(pid, uid, cid)
    nvml.run(0, pid, 6 * GiB)
    return agent


def test_the_watch_holds_exactly_this_nodes_pods(
    core: k8s_client.CoreV1Api, namespace: str, node: str, cluster: NodeCluster
) -> None:
    create(core, namespace, make_pod("here", uid="-"), node)
    create(core, namespace, make_pod("elsewhere", uid="-"), f"{node}-other")
    assert cluster.start(timeout=15)
    assert names(cluster) == {"here"}
    # added after the list: arrives through the watch
    create(core, namespace, make_pod("later", uid="-"), node)
    eventually(lambda: names(cluster) == {"here", "later"}, "the watched pod")
    # a change to a pod's annotations is seen
    core.patch_namespaced_pod(
        "later", namespace, {"metadata": {"annotations": {"gpuwarden.io/gpu-memory-limit": "2Gi"}}}
    )
    eventually(
        lambda: any(
            p["metadata"]["annotations"].get("gpuwarden.io/gpu-memory-limit") == "2Gi"
            for p in cluster.pods()
        ),
        "the new annotation",
    )
    core.delete_namespaced_pod("here", namespace, grace_period_seconds=0)
    eventually(lambda: names(cluster) == {"later"}, "the deleted pod to go")


def test_pod_and_node_events_are_written_as_kubelet_writes_them(
    core: k8s_client.CoreV1Api, namespace: str, node: str, cluster: NodeCluster
) -> None:
    pod = create(core, namespace, make_pod("train", uid="-"), node)
    uid = pod["metadata"]["uid"]
    cluster.pod_event(namespace, "train", uid, REASON_CAP_EXCEEDED, "x" * 2000, "Warning")
    [event] = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.uid={uid}"
    ).items
    assert event.reason == REASON_CAP_EXCEEDED and event.type == "Warning"
    assert event.involved_object.kind == "Pod" and event.involved_object.name == "train"
    assert event.source.component == "gpuwarden-node-agent" and event.source.host == node
    assert event.count == 1 and len(event.message) == 1024
    cluster.node_event("UnknownGPUProcess", "PID 5555 belongs to no pod", "Warning")
    [node_event] = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node}"
    ).items
    assert node_event.involved_object.kind == "Node"
    assert node_event.message == "PID 5555 belongs to no pod"


def test_eviction_goes_through_the_subresource(
    core: k8s_client.CoreV1Api, namespace: str, node: str, cluster: NodeCluster
) -> None:
    # (A UID precondition that does not match is refused with 409, but only after the API server
    # has retried for about ten seconds, too slow for this suite.)
    pod = create(core, namespace, make_pod("victim", uid="-"), node)
    # As the agent does: Events first, then the eviction, on the same client's connections
    # (an Event's unread response body once came back as the eviction's status line).
    for n in range(3):
        cluster.pod_event(namespace, "victim", pod["metadata"]["uid"], "Test", f"#{n}", "Normal")
    assert cluster.evict(namespace, "victim", pod["metadata"]["uid"]) == "evicted (HTTP 201)"
    # no kubelet confirms the deletion: the pod stays, terminating
    evicted = core.read_namespaced_pod("victim", namespace)
    assert evicted.metadata.deletion_timestamp is not None
    assert cluster.evict(namespace, "nobody", "x") == "the pod is already gone"


def test_a_disruption_budget_refusal_is_reported_not_raised(
    api_client: k8s_client.ApiClient,
    core: k8s_client.CoreV1Api,
    namespace: str,
    node: str,
    cluster: NodeCluster,
) -> None:
    pod = make_pod("guarded", uid="-")
    pod["metadata"]["labels"] = {"app": "guarded"}
    created = create(core, namespace, pod, node)
    # A running, ready pod (Pending pods are evicted whatever the budget says).
    core.patch_namespaced_pod_status(
        "guarded",
        namespace,
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
    )
    policy = k8s_client.PolicyV1Api(api_client)
    budget = policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    # No disruption controller runs: write the status it would write.
    policy.patch_namespaced_pod_disruption_budget_status(
        "guarded",
        namespace,
        {
            "status": {
                "observedGeneration": budget.metadata.generation,
                "disruptionsAllowed": 0,
                "currentHealthy": 1,
                "desiredHealthy": 1,
                "expectedPods": 1,
            }
        },
    )
    outcome = cluster.evict(namespace, "guarded", created["metadata"]["uid"])
    assert outcome.startswith("refused for now (429): Cannot evict pod as it would violate")
    assert "needs 1 healthy pods" in outcome
    assert core.read_namespaced_pod("guarded", namespace).metadata.deletion_timestamp is None


def test_a_full_pass_reports_and_evicts_a_pod_over_its_cap(
    core: k8s_client.CoreV1Api,
    namespace: str,
    node: str,
    cluster: NodeCluster,
    control: ProcessMpsControl,
    fake_mps: FakeMps,
    proc: FakeProc,
) -> None:
    cid = container_id(0xE2E)
    pod = create(core, namespace, make_pod("notebook", uid="-", cap="4Gi", threads=25), node)
    uid = pod["metadata"]["uid"]
    running(core, namespace, "notebook", cid, cluster)
    agent = evicting_agent(node, control, fake_mps, proc, uid=uid, cid=cid, pid=9001)

    report = run_once(agent, cluster)
    assert "set_default_device_pinned_mem_limit 0 4096M" in report.commands
    assert "set_default_active_thread_percentage 25" in report.commands
    [event] = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.uid={uid},reason={REASON_CAP_EXCEEDED}"
    ).items
    assert "container main uses 6.00 GiB of GPU memory on GPU 0" in event.message
    assert "the agent evicts the pod" in event.message
    assert core.read_namespaced_pod("notebook", namespace).metadata.deletion_timestamp is not None


def test_a_full_pass_reports_and_evicts_a_cpu_pod_on_a_gpu(
    core: k8s_client.CoreV1Api,
    namespace: str,
    node: str,
    cluster: NodeCluster,
    control: ProcessMpsControl,
    fake_mps: FakeMps,
    proc: FakeProc,
) -> None:
    """A pod that asks for no GPU and that gpuwarden gave none (an image with
    ENV NVIDIA_VISIBLE_DEVICES=all) is found by its process, told in an Event and evicted."""
    cid = container_id(0xC9)
    cpu_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "env-all"},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/env-all:1"}]},
    }
    uid = create(core, namespace, cpu_pod, node)["metadata"]["uid"]
    running(core, namespace, "env-all", cid, cluster)
    agent = evicting_agent(node, control, fake_mps, proc, uid=uid, cid=cid, pid=9002)

    run_once(agent, cluster)
    [event] = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.uid={uid},reason={REASON_UNGRANTED}"
    ).items
    assert event.message.startswith(f"container main of pod {namespace}/env-all uses GPU 0")
    assert "but was granted no GPU" in event.message
    assert event.message.endswith("; the agent evicts the pod")
    assert core.read_namespaced_pod("env-all", namespace).metadata.deletion_timestamp is not None


def test_the_loop_keeps_ticking_until_stopped(
    core: k8s_client.CoreV1Api,
    namespace: str,
    node: str,
    cluster: NodeCluster,
    control: ProcessMpsControl,
    fake_mps: FakeMps,
) -> None:
    nvml = FakeNvml()
    nvml.add_gpu(40 * GiB)
    agent = NodeAgent(AgentConfig(node_name=node), nvml, control, ProcFs(Path("/nonexistent")))
    agent.start()
    assert cluster.start(timeout=15)
    stop = threading.Event()
    loop = threading.Thread(target=run_loop, args=(agent, cluster, 0.05, stop), daemon=True)
    loop.start()
    try:
        # a pod scheduled while the loop runs moves the daemon's ceiling
        create(core, namespace, make_pod("late", uid="-", cap="6Gi"), node)
        eventually(lambda: fake_mps.state()["default_mem"] == {"0": "6144M"}, "the new ceiling")
        # a GPU process nobody owns is reported on the node
        nvml.run(0, 31337, GiB, mps_client=False)
        eventually(
            lambda: (
                core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={node},reason=UnknownGPUProcess"
                ).items
            ),
            "the UnknownGPUProcess event",
        )
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive()


def test_an_eviction_that_failed_is_asked_again(
    control_plane: Any,
    core: k8s_client.CoreV1Api,
    namespace: str,
    node: str,
    control: ProcessMpsControl,
    fake_mps: FakeMps,
    proc: FakeProc,
) -> None:
    """An eviction that errors (here 403: the agent's role lacks pods/eviction) is not
    forgotten: once it can succeed, a later pass evicts the pod still over its cap."""
    user = f"agent-{node}"
    reads = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    events = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
    with control_plane.client_as(user, [reads, events]) as as_agent:
        cluster = NodeCluster(as_agent, node, watch_timeout=5)
        try:
            cid = container_id(0xE2F)
            pod = create(core, namespace, make_pod("greedy", uid="-", cap="4Gi"), node)
            uid = pod["metadata"]["uid"]
            running(core, namespace, "greedy", cid, cluster)
            agent = evicting_agent(node, control, fake_mps, proc, uid=uid, cid=cid, pid=9002)

            def terminating() -> bool:
                pod = core.read_namespaced_pod("greedy", namespace)
                return pod.metadata.deletion_timestamp is not None

            run_once(agent, cluster)  # the eviction is refused: 403
            assert not terminating()
            evictions = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
            rbac = k8s_client.RbacAuthorizationV1Api(core.api_client)
            rbac.patch_cluster_role(user, {"rules": [reads, events, evictions]})
            eventually(
                lambda: run_once(agent, cluster) and terminating(), "the eviction, asked again"
            )
        finally:
            cluster.stop()
