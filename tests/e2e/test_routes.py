"""Issue 29 through the real kube-apiserver 1.37.2 and the chart's webhooks: a GPU asked through
DRA's extended resource of NVIDIA's DeviceClass, a hostPath to the MPS pipes or /dev/nvidia* by
another name, and a backend annotation changed after admission are all refused with gpuwarden's
message; the rendered ResourceQuota's DRA key is the one the API server charges.

The API server runs with its default feature gates, as every e2e suite does.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.gpuwardenserver import wait_for
from gpuwarden.lab.cluster.webhookstack import Obj, WebhookStack, create_pod
from gpuwarden.policy import load_texts
from gpuwarden.policy.render.objects import tenant_quota_hard

from .webhook import POLICY_TEST_PODS, api_error, load_pod, place_pod, pod_exists

DRA_GPU = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


def dra_pod(namespace: str, count: str = "8") -> Obj:
    """The attack's pod: GPUs of NVIDIA's DRA DeviceClass as an extended resource."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"dra-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {DRA_GPU: count}}}
            ]
        },
    }


def refused(api: k8s_client.ApiClient, pod: Obj) -> str:
    with pytest.raises(ApiException) as raised:
        create_pod(api, pod)
    status, text = api_error(raised.value)
    assert status == 403, text
    assert not pod_exists(api, pod["metadata"]["namespace"], pod["metadata"]["name"])
    return text


def test_a_tenant_pod_asking_gpus_through_dra_is_refused(gpuwarden: WebhookStack) -> None:
    """kube-apiserver 1.37.2 takes the name as it is (the pod outside every tenant is created);
    in tenant-b's namespace gpuwarden refuses it and says what to ask instead."""
    outside = create_pod(gpuwarden.api, dra_pod("default"))
    assert outside.pod["spec"]["containers"][0]["resources"]["requests"] == {DRA_GPU: "8"}

    ns = gpuwarden.tenant_namespace(name="tenant-b")
    text = refused(gpuwarden.api, dra_pod(ns))
    assert (
        f"spec.containers[main].resources.limits[{DRA_GPU}]: asks for 8 GPUs of DeviceClass "
        "gpu.nvidia.com through Dynamic Resource Allocation, where tenant tenant-b's profiles, "
        "limits and quota do not apply; ask for nvidia.com/gpu: 8 instead (the tenant's profile "
        "then sets how), or have an admin set limits.allowResourceClaims: true for the tenant"
    ) in text


def _write_quota(api: k8s_client.ApiClient, ns: str, hard: dict[str, str]) -> None:
    """A ResourceQuota with its status, as the (absent) controller-manager would write it."""
    core = k8s_client.CoreV1Api(api)
    core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "gpus"}, "spec": {"hard": hard}}
    )
    quota: Any = core.read_namespaced_resource_quota("gpus", ns)
    quota.status = k8s_client.V1ResourceQuotaStatus(hard=hard, used=dict.fromkeys(hard, "0"))
    core.replace_namespaced_resource_quota_status("gpus", ns, quota)


def test_the_rendered_quota_key_is_the_one_the_api_server_charges(
    gpuwarden: WebhookStack, namespace: str
) -> None:
    """The quota gpuwarden renders for a tenant with 2 GPUs that may use DRA, in a namespace of
    no tenant (so only the quota stands in the way): 8 DRA GPUs exceed it by its
    requests.deviceclass.resource.kubernetes.io/gpu.nvidia.com key."""
    policies = load_texts(
        [
            (
                "q.yaml",
                "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: q}\n"
                "spec:\n  profiles: [{name: whole, gpuShare: false}]\n"
                "  tenants: [{name: t, namespaces: [t], quota: {gpus: 2}, "
                "limits: {allowResourceClaims: true}}]\n",
            )
        ]
    )
    hard = tenant_quota_hard(policies, policies.tenants[0])
    assert hard[f"requests.{DRA_GPU}"] == "2"
    _write_quota(gpuwarden.api, namespace, hard)

    def refused_for_quota() -> str | None:
        try:
            create_pod(gpuwarden.api, dra_pod(namespace), dry_run=True)
        except ApiException as exc:
            status, text = api_error(exc)
            return text if status == 403 and "exceeded quota" in text else None
        return None

    text = wait_for("the ResourceQuota to be enforced", refused_for_quota)
    assert f"requested: requests.{DRA_GPU}=8" in text
    assert f"limited: requests.{DRA_GPU}=2" in text
    create_pod(gpuwarden.api, dra_pod(namespace, "2"))


@pytest.mark.parametrize(
    ("path", "reached"),
    [
        ("/proc/1/root/run/nvidia/mps", "/run/nvidia/mps"),
        ("/dev/char/195:0", "/dev/nvidia* (by major:minor)"),
        ("/proc/1/root/dev", "/dev/nvidia*"),
    ],
)
def test_host_paths_by_another_name_are_refused(
    gpuwarden: WebhookStack, path: str, reached: str
) -> None:
    ns = gpuwarden.tenant_namespace(name="tenant-b")
    pod = place_pod(load_pod(POLICY_TEST_PODS / "plain-web.yaml"), ns)
    pod["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
    text = refused(gpuwarden.api, pod)
    assert f"spec.volumes[host].hostPath {path}: reaches {reached} " in text


def test_the_volcano_queue_cannot_change_after_admission(gpuwarden: WebhookStack) -> None:
    """tenant-b's pods go to its Volcano queue; a patch moving one to another queue is refused."""
    ns = gpuwarden.tenant_namespace(name="tenant-b")
    pod = place_pod(load_pod(POLICY_TEST_PODS / "plain-web.yaml"), ns)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    created = create_pod(gpuwarden.api, pod)
    key = "scheduling.volcano.sh/queue-name"
    assert created.pod["metadata"]["annotations"][key] == "tenant-b"
    core = k8s_client.CoreV1Api(gpuwarden.api)
    with pytest.raises(ApiException) as raised:
        core.patch_namespaced_pod(
            pod["metadata"]["name"], ns, {"metadata": {"annotations": {key: "default"}}}
        )
    status, text = api_error(raised.value)
    assert status == 403
    assert (
        f"metadata.annotations[{key}]: gpuwarden sets it to the tenant's queue, and Volcano "
        "charges the pod to that queue; it cannot be changed after admission; revert the change"
    ) in text
