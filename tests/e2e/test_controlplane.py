"""Smoke tests proving the e2e control plane is a real, working kube-apiserver."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from .controlplane import ControlPlane

pytestmark = pytest.mark.e2e


def _pod(name: str, **spec: object) -> k8s_client.V1Pod:
    container = k8s_client.V1Container(
        name="main",
        # Never pulled: there is no kubelet.
        image="registry.invalid/gpuwarden/pause:3.10",
        resources=spec.pop("resources", None),
    )
    return k8s_client.V1Pod(
        metadata=k8s_client.V1ObjectMeta(name=name, labels={"app": "smoke"}),
        spec=k8s_client.V1PodSpec(containers=[container], **spec),
    )


@pytest.fixture
def core(api_client: k8s_client.ApiClient) -> k8s_client.CoreV1Api:
    return k8s_client.CoreV1Api(api_client)


@pytest.fixture
def priority_class(api_client: k8s_client.ApiClient) -> Iterator[k8s_client.V1PriorityClass]:
    scheduling = k8s_client.SchedulingV1Api(api_client)
    created = scheduling.create_priority_class(
        k8s_client.V1PriorityClass(
            metadata=k8s_client.V1ObjectMeta(name=f"e2e-high-{uuid.uuid4().hex[:8]}"),
            value=100_000,
            global_default=False,
            description="e2e smoke test",
        )
    )
    try:
        yield created
    finally:
        scheduling.delete_priority_class(created.metadata.name)


def test_namespace_and_pod_round_trip(core: k8s_client.CoreV1Api, namespace: str) -> None:
    ns = core.read_namespace(namespace)
    assert ns.status.phase == "Active"

    resources = k8s_client.V1ResourceRequirements(
        requests={"cpu": "100m", "memory": "64Mi"}, limits={"memory": "64Mi"}
    )
    created = core.create_namespaced_pod(namespace, _pod("smoke", resources=resources))
    stored = core.read_namespaced_pod("smoke", namespace)

    assert stored.metadata.uid == created.metadata.uid
    assert stored.metadata.resource_version == created.metadata.resource_version
    assert stored.metadata.namespace == namespace
    assert stored.metadata.labels == {"app": "smoke"}
    assert stored.spec.containers[0].image == "registry.invalid/gpuwarden/pause:3.10"
    assert stored.spec.containers[0].resources.requests == {"cpu": "100m", "memory": "64Mi"}
    # Defaults filled in by the API server's pod strategy, not by us.
    assert stored.spec.restart_policy == "Always"
    assert stored.spec.dns_policy == "ClusterFirst"
    assert stored.spec.scheduler_name == "default-scheduler"
    assert stored.spec.termination_grace_period_seconds == 30
    assert stored.status.qos_class == "Burstable"
    # No scheduler, no kubelet: the pod is stored but never placed or started.
    assert stored.status.phase == "Pending"
    assert stored.spec.node_name is None
    # The ServiceAccount admission plugin is disabled (no controller creates "default").
    assert stored.spec.service_account_name is None

    listed = core.list_namespaced_pod(namespace, label_selector="app=smoke")
    assert [pod.metadata.name for pod in listed.items] == ["smoke"]


def test_priority_admission_resolves_priority_class(
    core: k8s_client.CoreV1Api,
    namespace: str,
    priority_class: k8s_client.V1PriorityClass,
) -> None:
    name = priority_class.metadata.name
    pod = core.create_namespaced_pod(namespace, _pod("prioritized", priority_class_name=name))
    assert pod.spec.priority == 100_000
    assert pod.spec.preemption_policy == "PreemptLowerPriority"
    assert core.read_namespaced_pod("prioritized", namespace).spec.priority == 100_000

    # No class named and no global default: the plugin sets priority 0.
    assert core.create_namespaced_pod(namespace, _pod("plain")).spec.priority == 0

    # The built-in classes exist (created by the API server's bootstrap hook).
    builtin = core.create_namespaced_pod(
        namespace, _pod("critical", priority_class_name="system-cluster-critical")
    )
    assert builtin.spec.priority == 2_000_000_000

    with pytest.raises(ApiException) as rejected:
        core.create_namespaced_pod(namespace, _pod("orphan", priority_class_name="no-such-class"))
    assert rejected.value.status == 403
    assert "no PriorityClass with name no-such-class was found" in rejected.value.body


def test_resource_quota_admission_counts_gpus(core: k8s_client.CoreV1Api, namespace: str) -> None:
    quota = core.create_namespaced_resource_quota(
        namespace,
        k8s_client.V1ResourceQuota(
            metadata=k8s_client.V1ObjectMeta(name="gpus"),
            spec=k8s_client.V1ResourceQuotaSpec(hard={"requests.nvidia.com/gpu": "1"}),
        ),
    )

    def gpu_pod(name: str) -> k8s_client.V1Pod:
        gpus = k8s_client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"})
        return _pod(name, resources=gpus)

    # With no quota controller running, status stays empty until someone writes it, and the
    # admission plugin only enforces what status.hard names: this pod is not even counted.
    core.create_namespaced_pod(namespace, gpu_pod("before-status"))

    quota.status = k8s_client.V1ResourceQuotaStatus(
        hard={"requests.nvidia.com/gpu": "1"}, used={"requests.nvidia.com/gpu": "0"}
    )
    core.replace_namespaced_resource_quota_status("gpus", namespace, quota)

    # The quota plugin reads quotas through an informer, which sees the new status a moment
    # later: until a pod is charged, remove the uncharged one and try again, up to a deadline.
    deadline = time.monotonic() + 30
    attempt = 0
    while True:
        attempt += 1
        core.create_namespaced_pod(namespace, gpu_pod(f"first-{attempt}"))
        used = core.read_namespaced_resource_quota("gpus", namespace).status.used
        if used == {"requests.nvidia.com/gpu": "1"}:
            break
        assert time.monotonic() < deadline, f"the quota never charged a pod (used={used})"
        core.delete_namespaced_pod(f"first-{attempt}", namespace, grace_period_seconds=0)
        time.sleep(0.1)

    with pytest.raises(ApiException) as rejected:
        core.create_namespaced_pod(namespace, gpu_pod("second"))
    assert rejected.value.status == 403
    assert "exceeded quota: gpus" in rejected.value.body


def test_built_kubectl_talks_to_the_api_server(control_plane: ControlPlane, namespace: str) -> None:
    assert control_plane.kubectl_path.name == "kubectl"
    assert control_plane.kubectl_path.parent.name.startswith("kubectl-v1.")

    listed = json.loads(control_plane.kubectl("get", "ns", "-o", "json").stdout)
    assert listed["kind"] == "List"
    names = {item["metadata"]["name"] for item in listed["items"]}
    assert {"default", "kube-system", "kube-public", namespace} <= names

    whoami = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["username"] == "admin"
    assert "system:masters" in whoami["status"]["userInfo"]["groups"]

    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == version["clientVersion"]["gitVersion"]
