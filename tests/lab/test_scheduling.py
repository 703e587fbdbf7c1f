"""gpuwarden's pods placed by the real kube-scheduler on KWOK's simulated GPU nodes.

Every pod goes through the real API server and gpuwarden's webhooks (tests/lab/policies); where
it lands, whom it preempts and why it stays Pending is the scheduler's own doing, read back from
the pod (spec.nodeName, its PodScheduled condition) and its Events.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from e2e.webhook import pod_exists, read_pod
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.node_pods import NodeCluster
from gpuwarden.lab.cluster.gpuwardenserver import (
    wait_for,
)
from gpuwarden.lab.cluster.nodes import GpuNodePool, Taint
from gpuwarden.lab.cluster.schedulinglab import pod_scheduled_condition
from gpuwarden.lab.cluster.webhookstack import (
    create_pod,
)
from gpuwarden.lab.inputs.workloads import workload_pod
from gpuwarden.node.pods import pod_info
from gpuwarden.policy.pod.resources import DEVICE_CLASS_RESOURCE_PREFIX, GPU_COUNT_RESOURCES
from gpuwarden.policy.render.objects import render

from .conftest import Lab

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
_SCHEDULED = 30.0


def _pod(kind: str, namespace: str, gpus: int = 1, **kwargs: Any) -> Obj:
    workload = kwargs.pop("workload", kind)
    name = f"{workload}-{uuid.uuid4().hex[:6]}"
    return workload_pod(
        kind, name=name, namespace=namespace, workload=workload, gpus=gpus, **kwargs
    )


def _create(lab: Lab, pod: Mapping[str, Any]) -> Obj:
    return create_pod(lab.api, pod).pod


def _name(pod: Mapping[str, Any]) -> tuple[str, str]:
    return str(pod["metadata"]["namespace"]), str(pod["metadata"]["name"])


def _running(lab: Lab, pod: Mapping[str, Any]) -> Obj:
    """The pod once KWOK reports it Running on the node the scheduler bound it to."""
    namespace, name = _name(pod)

    def probe() -> Obj | None:
        found = read_pod(lab.api, namespace, name)
        return found if (found.get("status") or {}).get("phase") == "Running" else None

    return wait_for(f"pod {namespace}/{name} to run", probe, _SCHEDULED)


def _unschedulable(lab: Lab, pod: Mapping[str, Any]) -> str:
    """The scheduler's message on a pod it could not place (PodScheduled=False, Unschedulable)."""
    namespace, name = _name(pod)

    def probe() -> str | None:
        condition = pod_scheduled_condition(read_pod(lab.api, namespace, name))
        if condition and condition.get("status") == "False":
            assert condition.get("reason") == "Unschedulable"
            return str(condition.get("message"))
        return None

    return wait_for(f"the scheduler to give up on {namespace}/{name} for now", probe, _SCHEDULED)


def _node(pod: Mapping[str, Any]) -> str:
    return str(pod["spec"].get("nodeName") or "")


def _limits(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict(pod["spec"]["containers"][0]["resources"].get("limits") or {})


def _events(lab: Lab, namespace: str, name: str, reason: str) -> list[Any]:
    core = k8s_client.CoreV1Api(lab.api)
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return [e for e in events.items if e.reason == reason]


WHOLE = GpuNodePool("whole", count=1, gpus_per_node=4)
MPS = GpuNodePool("mps", count=1, gpus_per_node=1, mps_replicas=4, rename_shared=True)


def test_exclusive_profile_lands_on_whole_gpus(lab: Lab) -> None:
    """Training jobs (heavy-training: 2 whole GPUs) fill the 4-GPU node, never the MPS node."""
    lab.add_pools([WHOLE, MPS])
    ns = lab.tenant_namespace()
    first, second, third = (
        _create(lab, _pod("training-job", ns, workload="resnet")) for _ in range(3)
    )
    for pod in (first, second):
        placed = _running(lab, pod)
        assert _node(placed) == "whole-0"
        assert _limits(placed) == {"nvidia.com/gpu": "2"}
    # Full on the 4-GPU node; the MPS node is kept out by the node affinity exclusive profiles
    # get (GFD's nvidia.com/gpu.sharing-strategy), whatever it advertises.
    message = _unschedulable(lab, third)
    assert message.startswith(
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, "
        "1 node(s) didn't match Pod's node affinity/selector."
    )
    assert _node(read_pod(lab.api, *_name(third))) == ""


PAIR = GpuNodePool("pair", count=2, gpus_per_node=4)
PACKED = {"lab.gpuwarden.io/packed": "true"}


def _with_cpus(pod: Obj, cpus: int) -> Obj:
    """The pod asking for ``cpus`` CPUs per GPU, as a real training or serving pod does."""
    container = pod["spec"]["containers"][0]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    container["resources"]["requests"] = {"cpu": str(cpus * gpus)}
    return pod


def _one_gpu_pods_then_four(lab: Lab, kind: str, **kwargs: Any) -> tuple[list[Obj], Obj]:
    """Four one-GPU pods of ``kind`` placed one after another on two 4-GPU nodes, then a pod
    asking for four GPUs (on the packing profile either way)."""
    lab.add_pools([PAIR])
    ns = lab.tenant_namespace()
    small = []
    for i in range(4):
        pod = _with_cpus(_pod(kind, ns, workload=f"small{i}", **kwargs), 8)
        small.append(_running(lab, _create(lab, pod)))
    big = _with_cpus(_pod("training-job", ns, 4, labels=PACKED, workload="big"), 8)
    return small, _create(lab, big)


def test_default_scoring_spreads_one_gpu_pods_and_a_four_gpu_pod_finds_no_node(lab: Lab) -> None:
    """Predictors (inference: 1 whole GPU) on the default profile: LeastAllocated spreads them
    two per node (by the CPUs they ask), and no node keeps four GPUs free."""
    small, big = _one_gpu_pods_then_four(lab, "kserve-predictor")
    assert all(p["spec"]["schedulerName"] == "default-scheduler" for p in small)
    assert sorted(_node(p) for p in small) == ["pair-0", "pair-0", "pair-1", "pair-1"]
    assert "Insufficient nvidia.com/gpu" in _unschedulable(lab, big)


def test_packing_profile_keeps_a_whole_node_free_for_a_four_gpu_pod(lab: Lab) -> None:
    """The same pods on the packing profile fill one node; the 4-GPU pod gets the other."""
    small, big = _one_gpu_pods_then_four(lab, "training-job", labels=PACKED)
    assert all(p["spec"]["schedulerName"] == "gpuwarden-binpack" for p in small)
    assert all(_limits(p) == {"nvidia.com/gpu": "1"} for p in small)
    assert len({_node(p) for p in small}) == 1
    placed = _running(lab, big)
    assert _limits(placed) == {"nvidia.com/gpu": "4"}
    assert _node(placed) not in {_node(p) for p in small}


def test_shared_profile_packs_pods_onto_one_gpu_up_to_the_replica_count(lab: Lab) -> None:
    """Four notebooks (light-training, shared) on one GPU with four MPS replicas; the fifth waits."""
    lab.add_pools([MPS, WHOLE])
    ns = lab.tenant_namespace()
    pods = [_create(lab, _pod("notebook", ns, workload=f"nb{i}")) for i in range(5)]
    placed = [_running(lab, pod) for pod in pods[:4]]
    assert {_node(pod) for pod in placed} == {"mps-0"}
    assert all(_limits(pod) == {"nvidia.com/gpu.shared": "1"} for pod in placed)
    message = _unschedulable(lab, pods[4])
    assert "Insufficient nvidia.com/gpu.shared" in message


def test_pod_asking_more_than_any_node_has_stays_pending_with_the_schedulers_reason(
    lab: Lab,
) -> None:
    lab.add_pools([GpuNodePool("gpu8", count=2, gpus_per_node=8)])
    ns = lab.tenant_namespace()
    pod = _create(lab, _pod("training-job", ns, 16, labels={"gpuwarden.io/profile": "whole-node"}))
    assert _limits(pod) == {"nvidia.com/gpu": "16"}
    message = _unschedulable(lab, pod)
    assert message.startswith("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    namespace, name = _name(pod)
    failed = wait_for(
        "a FailedScheduling event",
        lambda: _events(lab, namespace, name, "FailedScheduling") or None,
    )
    assert "Insufficient nvidia.com/gpu" in failed[0].message


def test_inference_preempts_a_batch_hpo_trial_when_the_cluster_is_full(lab: Lab) -> None:
    lab.add_pools([GpuNodePool("small", count=1, gpus_per_node=2)])
    ns = lab.tenant_namespace()
    trials = [_create(lab, _pod("katib-trial", ns, workload="hpo")) for _ in range(2)]
    for trial in trials:
        assert _running(lab, trial)["spec"]["priority"] == 10
    predictor = _create(lab, _pod("kserve-predictor", ns, workload="llama"))
    assert predictor["spec"]["priority"] == 300
    assert _node(_running(lab, predictor)) == "small-0"
    remaining = [t for t in trials if pod_exists(lab.api, *_name(t))]
    assert len(remaining) == 1, "exactly one trial makes room for the one GPU asked"
    (victim,) = [t for t in trials if t not in remaining]
    preempted = _events(lab, ns, victim["metadata"]["name"], "Preempted")
    assert preempted, "the scheduler records the preemption on the victim"
    assert read_pod(lab.api, *_name(remaining[0]))["status"]["phase"] == "Running"


def test_preemptible_profile_never_preempts_anything(lab: Lab) -> None:
    """A Katib trial (priority 10, preemptionPolicy Never) waits behind priority-0 pods (in a
    namespace that is no Kubeflow Profile, so the webhook is not called for them)."""
    lab.add_pools([GpuNodePool("small", count=1, gpus_per_node=2)])
    ungoverned = f"lab-free-{uuid.uuid4().hex[:6]}"
    k8s_client.CoreV1Api(lab.api).create_namespace({"metadata": {"name": ungoverned}})
    squatters = [_create(lab, _pod("training-job", ungoverned)) for _ in range(2)]
    for squatter in squatters:
        running = _running(lab, squatter)
        assert running["spec"].get("priority", 0) == 0, "no tenant: gpuwarden left it alone"
    ns = lab.tenant_namespace()
    trial = _create(lab, _pod("katib-trial", ns, workload="hpo"))
    assert trial["spec"]["preemptionPolicy"] == "Never"
    message = _unschedulable(lab, trial)
    assert "preemptionPolicy=Never" in message
    for squatter in squatters:
        assert read_pod(lab.api, *_name(squatter))["status"]["phase"] == "Running"
    assert not (read_pod(lab.api, *_name(trial))["status"].get("nominatedNodeName"))


def test_equal_priorities_do_not_preempt_each_other(lab: Lab) -> None:
    lab.add_pools([GpuNodePool("small", count=1, gpus_per_node=2)])
    ns = lab.tenant_namespace()
    first = _create(lab, _pod("training-job", ns, workload="bert"))
    assert _node(_running(lab, first)) == "small-0"
    second = _create(lab, _pod("training-job", ns, workload="gpt"))
    assert second["spec"]["priority"] == first["spec"]["priority"] == 200
    message = _unschedulable(lab, second)
    assert "Insufficient nvidia.com/gpu" in message
    assert "preemption: 0/1 nodes are available" in message
    assert read_pod(lab.api, *_name(first))["status"]["phase"] == "Running"


def _write_rendered_quotas(lab: Lab, namespace: str) -> dict[str, str]:
    """The ResourceQuota `gpuwarden render` writes for the namespace, with the status the
    (absent) kube-controller-manager would give it, so the quota admission plugin enforces it."""
    quotas = [
        obj
        for obj in render(lab.gpuwarden.policies).objects
        if obj["kind"] == "ResourceQuota" and obj["metadata"]["namespace"] == namespace
    ]
    assert len(quotas) == 1, quotas
    (quota,) = quotas
    core: Any = k8s_client.CoreV1Api(lab.api)
    core.create_namespaced_resource_quota(namespace, quota)
    hard = dict(quota["spec"]["hard"])
    stored = core.read_namespaced_resource_quota(quota["metadata"]["name"], namespace)
    stored.status = k8s_client.V1ResourceQuotaStatus(hard=hard, used=dict.fromkeys(hard, "0"))
    core.replace_namespaced_resource_quota_status(quota["metadata"]["name"], namespace, stored)
    return hard


def test_rendered_resource_quota_stops_a_tenant_at_its_gpu_quota(lab: Lab) -> None:
    lab.add_pools([GpuNodePool("gpu8", count=1, gpus_per_node=8)])
    ns = lab.tenant_namespace(name="lab-quota")
    hard = _write_rendered_quotas(lab, ns)
    assert hard["requests.nvidia.com/gpu"] == "2"
    # Only keys the quota plugin charges GPU pods under: requests of a count resource (a
    # limits.nvidia.com/gpu, as the seed writes it, is accepted but never charged), and of DRA's
    # GPU device classes (issue 29: 0 here, the tenant may not use DRA).
    counts = {f"requests.{name}" for name in GPU_COUNT_RESOURCES}
    dra = f"requests.{DEVICE_CLASS_RESOURCE_PREFIX}"
    assert all(key in counts or key.startswith(dra) for key in hard), hard

    def enforced() -> bool:
        try:
            probe = _pod("training-job", ns, 16, labels={"gpuwarden.io/profile": "whole-node"})
            create_pod(lab.api, probe, dry_run=True)
        except ApiException as exc:
            return exc.status == 403 and "exceeded quota" in str(exc.body)
        return False

    # The quota admission plugin reads quotas from its own cache: wait until it has ours.
    wait_for("the ResourceQuota to be enforced", enforced)
    admitted = [_create(lab, _pod("katib-trial", ns, workload="hpo")) for _ in range(2)]
    with pytest.raises(ApiException) as refused:
        _create(lab, _pod("katib-trial", ns, workload="hpo"))
    assert refused.value.status == 403
    assert "exceeded quota: gpuwarden-lab-quota" in str(refused.value.body)
    assert "limited: requests.nvidia.com/gpu=2" in str(refused.value.body)
    for pod in admitted:
        assert _node(_running(lab, pod)) == "gpu8-0"


def test_profile_node_pool_and_tolerations_are_honoured(lab: Lab) -> None:
    """team-a-training goes to team A's tainted pool; other work never does."""
    team_pool = GpuNodePool(
        "team-a",
        count=1,
        gpus_per_node=2,
        labels={"lab.gpuwarden.io/team": "team-a"},
        taints=(Taint("lab.gpuwarden.io/dedicated", "team-a"),),
    )
    lab.add_pools([team_pool, GpuNodePool("general", count=1, gpus_per_node=2)])
    ns = lab.tenant_namespace()
    team = _create(
        lab, _pod("training-job", ns, labels={"gpuwarden.io/profile": "team-a-training"})
    )
    assert team["spec"]["nodeSelector"] == {"lab.gpuwarden.io/team": "team-a"}
    assert _node(_running(lab, team)) == "team-a-0"
    general = _create(lab, _pod("training-job", ns, workload="general"))
    assert _node(_running(lab, general)) == "general-0"
    # team-a-0 has a free GPU, but it is not this pod's to take.
    overflow = _create(lab, _pod("training-job", ns, workload="overflow"))
    message = _unschedulable(lab, overflow)
    assert "untolerated taint" in message
    assert "Insufficient nvidia.com/gpu" in message


def test_node_agent_sees_each_pod_on_the_node_it_landed_on(lab: Lab) -> None:
    lab.add_pools([MPS, WHOLE])
    ns = lab.tenant_namespace()
    notebook = _running(lab, _create(lab, _pod("notebook", ns, workload="alice")))
    job = _running(lab, _create(lab, _pod("training-job", ns, workload="resnet")))
    assert (_node(notebook), _node(job)) == ("mps-0", "whole-0")
    views: dict[str, dict[str, Any]] = {}
    for node in ("mps-0", "whole-0"):
        agent = NodeCluster(lab.api, node)
        try:
            assert agent.start(timeout=15), f"the node agent's watch on {node} synced"
            infos = [pod_info(pod) for pod in agent.pods()]
        finally:
            agent.stop()
        views[node] = {info.ref.name: info for info in infos if info is not None}
    assert set(views["mps-0"]) == {notebook["metadata"]["name"]}
    assert set(views["whole-0"]) == {job["metadata"]["name"]}
    seen_notebook = views["mps-0"][notebook["metadata"]["name"]]
    assert (seen_notebook.tenant, seen_notebook.profile) == ("lab", "light-training")
    assert seen_notebook.cap == 16 * 2**30 and seen_notebook.thread_percentage == 25
    seen_job = views["whole-0"][job["metadata"]["name"]]
    assert (seen_job.profile, seen_job.gpu_count) == ("heavy-training", 2)
    assert seen_job.phase == "Running"
