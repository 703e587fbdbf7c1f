"""Idle GPUs given back (issue 31, item 4): the node agent on the fake NVML, against a real
kube-apiserver holding Kubeflow's Notebook CRD, acting with only the chart's node-agent rules.

The agent's clock is injected: hours pass between ticks without waiting for them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.node_pods import NodeCluster
from gpuwarden.node.agent import (
    REASON_IDLE,
    REASON_IDLE_STOPPED,
    AgentConfig,
    NodeAgent,
    run_once,
)
from gpuwarden.node.fake import FakeNvml
from gpuwarden.node.procfs import ProcFs

from .conftest import FakeProc, GiB, container_id, make_pod, sample
from .test_kube_e2e import create, eventually, running_status

pytestmark = pytest.mark.e2e

STOPPED = "kubeflow-resource-stopped"
# A minimal kubeflow.org/v1 Notebook CRD: the group, version and names Kubeflow's
# notebook-controller serves (kubeflow/kubeflow components/notebook-controller/config/crd).
NOTEBOOK_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "notebooks.kubeflow.org"},
    "spec": {
        "group": "kubeflow.org",
        "scope": "Namespaced",
        "names": {
            "kind": "Notebook",
            "plural": "notebooks",
            "singular": "notebook",
            "listKind": "NotebookList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}
# The chart's node-agent ClusterRole (charts/gpuwarden/templates/rbac.yaml).
AGENT_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": ["kubeflow.org"], "resources": ["notebooks"], "verbs": ["patch"]},
]
HOUR = 3600.0


@pytest.fixture
def node() -> str:
    return f"gpu-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def core(api_client: k8s_client.ApiClient) -> k8s_client.CoreV1Api:
    return k8s_client.CoreV1Api(api_client)


@pytest.fixture
def custom(api_client: k8s_client.ApiClient) -> k8s_client.CustomObjectsApi:
    ext: Any = k8s_client.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(NOTEBOOK_CRD)
    except ApiException as exc:
        if exc.status != 409:  # another test of this session installed it
            raise
    objects = k8s_client.CustomObjectsApi(api_client)

    def served() -> bool:
        try:
            objects.list_cluster_custom_object("kubeflow.org", "v1", "notebooks")
        except ApiException:
            return False
        return True

    eventually(served, "the Notebook CRD served")
    return objects


@pytest.fixture
def agent_cluster(control_plane: Any, node: str) -> Iterator[NodeCluster]:
    with control_plane.client_as(f"agent-{node}", AGENT_RULES) as as_agent:
        watched = NodeCluster(as_agent, node, watch_timeout=5)
        try:
            yield watched
        finally:
            watched.stop()


def notebook(custom: k8s_client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    body = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": {"containers": [{"name": name, "image": "jupyter"}]}}},
    }
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "notebooks", body
    )
    return created


def read_notebook(custom: k8s_client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = custom.get_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "notebooks", name
    )
    return found


def idle_pod(
    core: k8s_client.CoreV1Api,
    namespace: str,
    node: str,
    name: str,
    cid: str,
    *,
    owner: tuple[str, str, str],  # apiVersion, kind, name
    labels: dict[str, str],
    action: str,
) -> dict[str, Any]:
    """A pod as the webhook leaves it for a profile with ``idle: {after: 1h, below: 5%}``,
    running its container ``main`` as ``cid``."""
    pod = make_pod(
        name,
        uid="-",
        cap=None,
        threads=None,
        extra_annotations={"gpuwarden.io/idle": f"action={action},after=3600s,below=5%"},
    )
    pod["metadata"]["labels"] = labels
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner[0],
            "kind": owner[1],
            "name": owner[2],
            "uid": str(uuid.uuid4()),
            "controller": True,
        }
    ]
    created = create(core, namespace, pod, node)
    core.patch_namespaced_pod_status(name, namespace, {"status": running_status(cid)})
    return created


def events(core: k8s_client.CoreV1Api, namespace: str, uid: str) -> list[Any]:
    items: list[Any] = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.uid={uid}"
    ).items
    return items


def test_an_idle_notebook_is_stopped_once_and_busy_or_recent_ones_are_left_alone(
    core: k8s_client.CoreV1Api,
    custom: k8s_client.CustomObjectsApi,
    namespace: str,
    node: str,
    agent_cluster: NodeCluster,
    proc: FakeProc,
) -> None:
    nvml = FakeNvml()
    for _ in range(4):
        nvml.add_gpu(40 * GiB)
    now = [1_790_000_000.0]
    agent = NodeAgent(
        AgentConfig(node_name=node), nvml, None, ProcFs(proc.root), clock=lambda: now[0]
    )
    agent.start()
    pods: dict[str, dict[str, Any]] = {}
    for gpu, name in enumerate(("nb-idle", "nb-busy", "nb-recent")):
        notebook(custom, namespace, name)
        cid = container_id(0x1D0 + gpu)
        pods[name] = idle_pod(
            core,
            namespace,
            node,
            name,
            cid,
            owner=("apps/v1", "StatefulSet", name),
            labels={"notebook-name": name, "statefulset": name},
            action="stop",
        )
        proc.add_pod_process(7000 + gpu, pods[name]["metadata"]["uid"], cid)
        nvml.run(gpu, 7000 + gpu, GiB, mps_client=False)
    # A training pod of a profile whose idle action is stop: notified, never stopped.
    cid = container_id(0x1D9)
    pods["train"] = idle_pod(
        core,
        namespace,
        node,
        "train",
        cid,
        owner=("batch/v1", "Job", "train"),
        labels={"job-name": "train"},
        action="stop",
    )
    proc.add_pod_process(7009, pods["train"]["metadata"]["uid"], cid)
    nvml.run(3, 7009, GiB, mps_client=False)
    assert agent_cluster.start(timeout=15)
    eventually(lambda: len(agent_cluster.pods()) == 4, "the four pods watched")
    eventually(
        lambda: all(p["status"].get("containerStatuses") for p in agent_cluster.pods()),
        "the pods' container statuses",
    )

    def tick(at: float, busy: tuple[int, ...]) -> None:
        now[0] = at
        for gpu in busy:
            nvml.sample(gpu, 7000 + gpu, sm=60.0)
        run_once(agent, agent_cluster)

    start = now[0]
    tick(start, busy=(1, 2))  # nb-idle's and train's episodes start; nb-recent is still busy
    tick(start + 0.5 * HOUR, busy=(1,))  # nb-recent's episode starts
    assert sample(agent, "gpuwarden_node_pod_gpu_idle_seconds", pod="nb-recent") == 0
    assert sample(agent, "gpuwarden_node_pod_gpu_idle_seconds", pod="nb-idle") == 0.5 * HOUR
    for name in ("nb-idle", "nb-busy", "nb-recent"):
        assert STOPPED not in read_notebook(custom, namespace, name)["metadata"].get(
            "annotations", {}
        )

    tick(start + HOUR, busy=(1,))  # nb-idle and train reach `after`
    stopped = read_notebook(custom, namespace, "nb-idle")
    assert stopped["metadata"]["annotations"][STOPPED] == "2026-09-21T15:13:20Z"
    [told] = events(core, namespace, pods["nb-idle"]["metadata"]["uid"])
    assert told.reason == REASON_IDLE_STOPPED
    assert "has kept 0.00 of its 1.00 GPUs busy, below 5%, for 1h" in told.message
    assert "the agent stops Notebook nb-idle" in told.message
    # The training pod and its Job are told; nothing stops it.
    [on_pod] = events(core, namespace, pods["train"]["metadata"]["uid"])
    job_uid = pods["train"]["metadata"]["ownerReferences"][0]["uid"]
    [on_job] = events(core, namespace, job_uid)
    for event in (on_pod, on_job):
        assert event.reason == REASON_IDLE
        assert "idle.action stop stops only Kubeflow Notebooks, so the agent notifies" in (
            event.message
        )
    assert on_job.involved_object.kind == "Job"

    # Later ticks: the idle notebook is not patched again (exactly once), the busy one and the
    # one idle for less than an hour are left alone.
    version = stopped["metadata"]["resourceVersion"]
    tick(start + 1.4 * HOUR, busy=(1,))
    tick(start + 1.45 * HOUR, busy=(1,))
    assert read_notebook(custom, namespace, "nb-idle")["metadata"]["resourceVersion"] == version
    for name in ("nb-busy", "nb-recent"):
        assert STOPPED not in read_notebook(custom, namespace, name)["metadata"].get(
            "annotations", {}
        )
        assert events(core, namespace, pods[name]["metadata"]["uid"]) == []
    assert len(events(core, namespace, pods["train"]["metadata"]["uid"])) == 1
    assert sample(agent, "gpuwarden_node_idle_actions_total", action="stop") == 1
    assert sample(agent, "gpuwarden_node_idle_actions_total", action="notify") == 1
