"""Issue 29 items 3, 4, 9 and 11: routes to a GPU that pass by the profiles, limits and quota (DRA's
extended resources, other vendors' GPUs, CDI annotations, runtime classes), host paths that reach
the MPS pipes or /dev/nvidia* by another name, and backend annotations changed after admission.

Pods go through `admit` (mutate, apply, validate) as the API server runs them; each test checks
what the user sees: the denial message, the stored pod, the rendered ResourceQuota.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuwarden.policy import AdmissionRequest, ClusterView, PolicyError, PolicySet, admit, validate
from gpuwarden.policy.render.objects import quota_key_warnings, render
from gpuwarden.policy.render.scope import review_scope

from .support import NO_DRA_GPUS, container, create, gpu_pod, policies_from

SPEC = """
profiles:
  - {name: shared, maxMemory: 8Gi}
  - {name: typed, maxMemory: 8Gi, backend: hami, gpuTypes: [A100]}
tenants:
  - {name: team, namespaces: [team], queue: team-queue}
  - {name: open, namespaces: [open], limits: {allowResourceClaims: true, maxGpusPerPod: 4}}
  - name: relaxed
    namespaces: [relaxed]
    limits: {deniedResources: [], allowedRuntimeClasses: null, allowCdiAnnotations: true}
  - {name: kata, namespaces: [kata], limits: {allowedRuntimeClasses: [nvidia, kata-qemu]}}
defaultProfile: shared
"""
NO_TENANT = "elsewhere"
DRA_GPU = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return policies_from(SPEC)


def asking(namespace: str, resources: dict[str, str]) -> dict[str, Any]:
    made = gpu_pod(namespace=namespace, gpus=None)
    container(made, "main")["resources"] = {"limits": dict(resources)}
    return made


def denied(made: dict[str, Any], policies: PolicySet) -> str:
    result = admit(create(made), policies, ClusterView())
    assert not result.allowed, "expected a denial"
    assert result.validation.code == 403
    return result.validation.message


def allowed(made: dict[str, Any], policies: PolicySet) -> dict[str, Any]:
    result = admit(create(made), policies, ClusterView())
    assert result.allowed, result.validation.message
    return copy.deepcopy(dict(result.pod))


# --- item 3: DRA's extended resources ------------------------------------------------------


def test_a_dra_gpu_extended_resource_is_denied_with_what_to_ask_instead(
    policies: PolicySet,
) -> None:
    """The attack's pod: 8 GPUs of NVIDIA's DRA DeviceClass, past every profile and quota."""
    message = denied(asking("team", {DRA_GPU: "8"}), policies)
    assert message == (
        "gpuwarden denied the pod: spec.containers[main].resources.limits["
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com]: asks for 8 GPUs of DeviceClass "
        "gpu.nvidia.com through Dynamic Resource Allocation, where tenant team's profiles, "
        "limits and quota do not apply; ask for nvidia.com/gpu: 8 instead (the tenant's profile "
        "then sets how), or have an admin set limits.allowResourceClaims: true for the tenant "
        "[policy test, check tenantLimits, none]"
    )


@pytest.mark.parametrize("section", ["limits", "requests"])
@pytest.mark.parametrize("field", ["containers", "initContainers"])
def test_dra_gpus_are_denied_in_requests_and_init_containers(
    policies: PolicySet, section: str, field: str
) -> None:
    made = gpu_pod(namespace="team", gpus=None)
    made["spec"][field] = [
        *made["spec"].get(field, []),
        {
            "name": "dra",
            "image": "x",
            "resources": {section: {DRA_GPU.replace("gpu.", "mig."): "2"}},
        },
    ]
    message = denied(made, policies)
    assert (
        f"spec.{field}[dra].resources.{section}[deviceclass.resource.kubernetes.io/"
        "mig.nvidia.com]: asks for 2 GPUs of DeviceClass mig.nvidia.com" in message
    )


def test_a_device_class_not_known_for_gpus_is_denied_as_a_claim(policies: PolicySet) -> None:
    message = denied(asking("team", {"deviceclass.resource.kubernetes.io/dranet": "1"}), policies)
    assert (
        "spec.containers[main].resources.limits[deviceclass.resource.kubernetes.io/dranet]: asks "
        "for devices of DeviceClass dranet through Dynamic Resource Allocation, which tenant "
        "team's profiles, limits and quota cannot see; remove it, or have an admin set "
        "limits.allowResourceClaims: true for the tenant" in message
    )


def test_where_claims_are_allowed_dra_gpus_count_against_max_gpus_per_pod(
    policies: PolicySet,
) -> None:
    allowed(asking("open", {DRA_GPU: "4"}), policies)
    allowed(asking("open", {"deviceclass.resource.kubernetes.io/dranet": "9"}), policies)
    message = denied(asking("open", {DRA_GPU: "8"}), policies)
    assert (
        "the pod would get 8 GPUs (main 8 through DeviceClasses of spec.gpuDeviceClasses) but "
        "tenant open allows at most 4 per pod; ask for at most 4" in message
    )


def test_the_policy_names_which_device_classes_are_gpus() -> None:
    policies = policies_from(
        "gpuDeviceClasses: [gpu.example.com]\n"
        "tenants: [{name: open, namespaces: [open], limits: {allowResourceClaims: true, "
        "maxGpusPerPod: 1}}]"
    )
    allowed(asking("open", {DRA_GPU: "8"}), policies)  # not a GPU class in this policy
    message = denied(
        asking("open", {"deviceclass.resource.kubernetes.io/gpu.example.com": "2"}), policies
    )
    assert "the pod would get 2 GPUs" in message


def test_dra_extended_resources_outside_tenants_are_left_alone(policies: PolicySet) -> None:
    allowed(asking(NO_TENANT, {DRA_GPU: "8"}), policies)


def test_the_webhooks_are_called_for_dra_extended_resources(policies: PolicySet) -> None:
    scope = review_scope(policies)
    assert scope.needs_review(asking("team", {DRA_GPU: "8"}))
    assert scope.needs_review(asking("team", {"deviceclass.resource.kubernetes.io/x": "1"}))
    assert 'k.startsWith("deviceclass.resource.kubernetes.io/")' in scope.cel()


def quota(spec: str) -> dict[str, str]:
    (rendered,) = render(policies_from(spec)).of_kind("ResourceQuota")
    hard: dict[str, str] = rendered["spec"]["hard"]
    return hard


def test_the_rendered_quota_covers_dra_gpus() -> None:
    """kube-apiserver 1.37.2 charges a pod's deviceclass.resource.kubernetes.io/<class> to
    requests.<that name> alone (tests/e2e/test_routes.py shows it): 0 where the tenant may not
    use DRA, the GPU quota where it may."""
    profiles = "profiles: [{name: whole, gpuShare: false}]\n"
    closed = quota(profiles + "tenants: [{name: t, namespaces: [t], quota: {gpus: 3}}]")
    assert closed == {"requests.nvidia.com/gpu": "3", **NO_DRA_GPUS}
    opened = quota(
        profiles + "gpuDeviceClasses: [gpu.nvidia.com]\n"
        "tenants: [{name: t, namespaces: [t], quota: {gpus: 3}, "
        "limits: {allowResourceClaims: true}}]"
    )
    assert opened == {
        "requests.nvidia.com/gpu": "3",
        "requests.deviceclass.resource.kubernetes.io/gpu.nvidia.com": "3",
    }


def test_quota_keys_for_dra_extended_resources_that_are_never_charged_are_flagged() -> None:
    hard = {f"limits.{DRA_GPU}": "1", DRA_GPU: "1", f"requests.{DRA_GPU}": "1"}
    warnings = quota_key_warnings(hard, "q")
    assert warnings == [
        f"q: quota key {DRA_GPU} is accepted but never charged (quota counts only "
        f"requests.{DRA_GPU} for extended resources); use requests.{DRA_GPU}",
        f"q: quota key limits.{DRA_GPU} is accepted but never charged (quota counts only "
        f"requests.{DRA_GPU} for extended resources); use requests.{DRA_GPU}",
    ]


# --- item 4: host paths by another name ----------------------------------------------------


@pytest.mark.parametrize(
    ("path", "reached"),
    [
        ("/proc/1/root/run/nvidia/mps", "/run/nvidia/mps"),  # the attack's MPS pipes
        ("/proc/1/root/var/run/nvidia/mps", "/run/nvidia/mps"),
        ("/proc/self/root/run/nvidia/mps/pipe", "/run/nvidia/mps"),
        ("/proc/thread-self/root/var/log", "/var/log/nvidia-mps"),
        ("/proc/1/task/1/root/run", "/run/nvidia/mps"),
        ("/proc/1/root/proc/1/root/run/nvidia", "/run/nvidia/mps"),
        # .. at a process's root stays there, as the kernel walks it (not /proc/dev).
        ("/proc/1/root/../../dev", "/dev/nvidia*"),
        ("/proc/1/root/./run/../dev/nvidia0", "/dev/nvidia*"),
        ("proc/1/root/dev", "/dev/nvidia*"),
        ("/proc/1/root/dev", "/dev/nvidia*"),  # the attack's
        ("/proc/1/root/dev/nvidia0", "/dev/nvidia*"),
        ("/proc/1/root", "/run/nvidia/mps, /var/log/nvidia-mps, /dev/nvidia*"),
        ("/dev/char/195:0", "/dev/nvidia* (by major:minor)"),  # the attack's
        ("/dev/char/195:255", "/dev/nvidia* (by major:minor)"),  # nvidiactl
        ("/dev/char/508:0", "/dev/nvidia* (by major:minor)"),  # nvidia-uvm's major varies
        ("/dev/char", "/dev/nvidia* (by major:minor)"),
        ("/dev/block", "/dev/nvidia* (by major:minor)"),
        ("/proc", "every host path (through /proc/<pid>/root, cwd and fd)"),
        ("/proc/1", "every host path (through /proc/<pid>/root, cwd and fd)"),
        ("/proc/1/cwd", "every host path (through /proc/<pid>/root, cwd and fd)"),
        ("/proc/self/fd/3", "every host path (through /proc/<pid>/root, cwd and fd)"),
    ],
)
def test_host_paths_that_reach_mps_or_devices_by_another_name(
    policies: PolicySet, path: str, reached: str
) -> None:
    made = gpu_pod(namespace=NO_TENANT)
    made["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
    message = denied(made, policies)
    assert (
        f"spec.volumes[host].hostPath {path}: reaches {reached} (other tenants' MPS daemons or "
        "GPU devices); remove this volume" in message
    )


@pytest.mark.parametrize(
    "path", ["/proc/1/root/data", "/proc/self/root/tmp", "/proc/driver/nvidia", "/proc/sys/vm"]
)
def test_host_paths_that_resolve_elsewhere_are_left_to_other_policies(
    policies: PolicySet, path: str
) -> None:
    made = gpu_pod(namespace=NO_TENANT)
    made["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
    allowed(made, policies)


# --- item 9: backend annotations after admission -------------------------------------------


def update(old: dict[str, Any], new: dict[str, Any]) -> AdmissionRequest:
    return AdmissionRequest("UPDATE", old["metadata"]["namespace"], new, old_pod=old)


@pytest.mark.parametrize(
    ("profile", "key", "value", "why"),
    [
        (
            "shared",
            "scheduling.volcano.sh/queue-name",
            "default",
            "gpuwarden sets it to the tenant's queue, and Volcano charges the pod to that queue",
        ),
        (
            "typed",
            "nvidia.com/use-gputype",
            "H100",
            "gpuwarden sets it from the profile's gpuTypes, and Volcano's vGPU device and HAMi "
            "place the pod by it",
        ),
    ],
)
def test_backend_annotations_cannot_change_after_admission(
    policies: PolicySet, profile: str, key: str, value: str, why: str
) -> None:
    old = allowed(gpu_pod(namespace="team", labels={"gpuwarden.io/profile": profile}), policies)
    assert key in old["metadata"]["annotations"]
    for new_value in (value, None):
        new = copy.deepcopy(old)
        if new_value is None:
            del new["metadata"]["annotations"][key]
        else:
            new["metadata"]["annotations"][key] = new_value
        decision = validate(update(old, new), policies, ClusterView())
        assert not decision.allowed
        assert (
            f"metadata.annotations[{key}]: {why}; it cannot be changed after admission; revert "
            "the change" in decision.message
        )
        # The API server sends the update: the CEL's update part names the annotation.
        assert review_scope(policies).needs_review(new, operation="UPDATE", old_pod=old)
    assert f'k == "{key}"' in review_scope(policies).cel()


def test_backend_annotations_added_later_are_sent_and_denied(policies: PolicySet) -> None:
    old = allowed(gpu_pod(NO_TENANT, NO_TENANT, gpus=None), policies)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"scheduling.volcano.sh/queue-name": "vip"}
    assert review_scope(policies).needs_review(new, operation="UPDATE", old_pod=old)
    assert not validate(update(old, new), policies, ClusterView()).allowed


# --- item 11: other vendors' GPUs, CDI annotations, runtime classes --------------------------


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("amd.com/gpu", "amd.com/*"),
        ("amd.com/cpx_nps4", "amd.com/*"),
        ("gpu.intel.com/i915", "gpu.intel.com/*"),
        ("gpu.intel.com/xe", "gpu.intel.com/*"),
    ],
)
def test_other_vendors_gpus_are_denied_to_tenants(
    policies: PolicySet, name: str, pattern: str
) -> None:
    message = denied(asking("team", {name: "1"}), policies)
    assert (
        f"spec.containers[main].resources.limits[{name}]: no profile of tenant team governs "
        f"{name} (it is in limits.deniedResources as {pattern}); ask for nvidia.com/gpu, or "
        "have an admin take it out of limits.deniedResources for the tenant" in message
    )
    assert review_scope(policies).needs_review(asking("team", {name: "1"}))
    allowed(asking("relaxed", {name: "1"}), policies)
    allowed(asking(NO_TENANT, {name: "1"}), policies)


def test_denied_resources_name_exact_names_or_prefixes() -> None:
    policies = policies_from(
        "tenants: [{name: t, namespaces: [t], limits: {deniedResources: [example.com/gpu]}}]"
    )
    assert "example.com/gpu (it is in limits.deniedResources as example.com/gpu)" in denied(
        asking("t", {"example.com/gpu": "1"}), policies
    )
    allowed(asking("t", {"example.com/gpu-x": "1", "amd.com/gpu": "1"}), policies)
    with pytest.raises(PolicyError, match=r"deniedResources.*a resource name, or a prefix"):
        policies_from("tenants: [{name: t, namespaces: [t], limits: {deniedResources: ['a*b']}}]")


def test_cdi_annotations_are_denied_to_tenants(policies: PolicySet) -> None:
    made = gpu_pod(namespace="team", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})
    assert review_scope(policies).needs_review(
        gpu_pod(namespace="team", gpus=None, annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})
    )
    message = denied(made, policies)
    assert (
        "metadata.annotations cdi.k8s.io/gpu: a CDI-aware container runtime injects the devices "
        "they name, past tenant team's profiles, limits and quota; remove them and ask for "
        "nvidia.com/gpu in resources.limits, or have an admin set limits.allowCdiAnnotations: "
        "true for the tenant" in message
    )
    for namespace in ("relaxed", NO_TENANT):
        made["metadata"]["namespace"] = namespace
        allowed(made, policies)


def test_runtime_classes_outside_the_tenants_list_are_denied(policies: PolicySet) -> None:
    made = gpu_pod(namespace="team")
    made["spec"]["runtimeClassName"] = "kata-qemu"
    message = denied(made, policies)
    assert (
        "spec.runtimeClassName kata-qemu: tenant team allows only nvidia, nvidia-cdi, "
        "nvidia-legacy (gpuwarden cannot see a RuntimeClass's handler, and NVIDIA's runtime "
        "under another name exposes GPUs no profile gave); remove runtimeClassName, or have an "
        "admin add it to limits.allowedRuntimeClasses for the tenant" in message
    )
    for namespace in ("kata", "relaxed", NO_TENANT):
        made["metadata"]["namespace"] = namespace
        allowed(made, policies)
    made["metadata"]["namespace"] = "team"
    made["spec"]["runtimeClassName"] = "nvidia-cdi"
    allowed(made, policies)
