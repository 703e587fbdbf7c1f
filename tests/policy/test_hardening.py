"""Issue 19 items 6, 7, 8 and 11: what reaches GPUs from elsewhere (envFrom, ConfigMaps changed
later, DRA claims, capabilities, NVIDIA's runtime, nodeName, another scheduler, a resize, an
annotation changed later), and answers that stay bounded for pods with thousands of containers.

Pods go through `admit` (mutate, apply, validate) as the API server runs them; each test checks
what the user sees: the denial message, the warnings, the patched pod.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuwarden.policy import Admission, AdmissionRequest, ClusterView, PolicySet, admit, validate
from gpuwarden.policy.admission.decision import MAX_WARNINGS
from gpuwarden.policy.admission.validate import validate_config_map

from .support import container, create, gpu_pod, policies_from

SPEC = """
profiles:
  - {name: shared, maxMemory: 8Gi}
  - {name: whole, gpuShare: false, maxMemory: 80Gi, hostMemory: 16Gi, cpu: "4"}
  - {name: hami-shared, maxMemory: 8Gi, backend: hami}
  - {name: mps, maxMemory: 8Gi, backend: nvidia}
  - {name: replaced, maxMemory: 8Gi, backend: {type: volcano, foreignScheduler: replace}}
tenants:
  - {name: team, namespaces: [team]}
  - {name: small, namespaces: [small], limits: {maxGpusPerPod: 2}}
  - {name: open, namespaces: [open], limits: {allowResourceClaims: true}}
  - name: relaxed
    namespaces: [relaxed]
    enforcement: {environment: false, tenantLimits: false, scheduling: false}
defaultProfile: shared
"""
NO_TENANT = "elsewhere"
GANG = "scheduler-plugins-scheduler"
SECRET_DENIAL = (
    "gpuwarden does not read Secrets, so a key NVIDIA_VISIBLE_DEVICES or CUDA_MPS_* in it would "
    "escape GPU isolation unchecked; set a prefix (APP_, say) or name each key under env with "
    "valueFrom.secretKeyRef"
)


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return policies_from(SPEC)


def pod(profile: str | None = "shared", namespace: str = "team", **spec: Any) -> dict[str, Any]:
    """A one-container pod asking for one GPU (none when ``profile`` is None)."""
    labels = {"gpuwarden.io/profile": profile} if profile else None
    made = gpu_pod(namespace=namespace, labels=labels, gpus="1" if profile else None)
    made["spec"].update(spec)
    return made


def main(made: dict[str, Any]) -> dict[str, Any]:
    return container(made, "main")


def admitted(
    made: dict[str, Any], policies: PolicySet, cluster: ClusterView | None = None
) -> Admission:
    result = admit(create(made), policies, cluster or ClusterView())
    assert result.allowed, result.validation.message
    return result


def admitted_pod(
    made: dict[str, Any], policies: PolicySet, cluster: ClusterView | None = None
) -> dict[str, Any]:
    """The pod as the API server stores it after admission."""
    return copy.deepcopy(dict(admitted(made, policies, cluster).pod))


def denied(made: dict[str, Any], policies: PolicySet, cluster: ClusterView | None = None) -> str:
    result = admit(create(made), policies, cluster or ClusterView())
    assert not result.allowed, "expected a denial"
    assert result.mutation.allowed  # the mutator never denies
    assert result.validation.code == 403
    assert len(result.validation.message) <= 1024
    return result.validation.message


def known(*names: str, namespace: str = "team", name: str = "settings") -> ClusterView:
    return ClusterView(env_source_keys={("ConfigMap", namespace, name): frozenset(names)})


def update(old: dict[str, Any], new: dict[str, Any], sub_resource: str = "") -> AdmissionRequest:
    namespace = old["metadata"]["namespace"]
    return AdmissionRequest("UPDATE", namespace, new, old_pod=old, sub_resource=sub_resource)


# --- item 6: environment from elsewhere ----------------------------------------------------


@pytest.mark.parametrize("field", ["containers", "initContainers"])
def test_a_secret_without_prefix_is_denied_in_every_container(
    policies: PolicySet, field: str
) -> None:
    """A CPU container sees every GPU too when NVIDIA's runtime reads its
    NVIDIA_VISIBLE_DEVICES (the GPU Operator makes that runtime the node's default)."""
    made = pod()
    made["spec"][field] = [
        *made["spec"].get(field, []),
        {"name": "helper", "image": "busybox", "envFrom": [{"secretRef": {"name": "creds"}}]},
    ]
    assert f"spec.{field}[helper].envFrom[creds]: {SECRET_DENIAL}" in denied(made, policies)


def test_a_prefix_that_makes_no_checked_variable_admits_any_source(policies: PolicySet) -> None:
    made = pod()
    main(made)["envFrom"] = [
        {"prefix": "APP_", "secretRef": {"name": "creds"}},
        {"prefix": "APP_", "configMapRef": {"name": "not-created-yet"}},
    ]
    assert admitted(made, policies).validation.warnings == ()


def test_a_config_map_gpuwarden_does_not_know_yet_is_denied_until_it_exists(
    policies: PolicySet,
) -> None:
    made = pod()
    main(made)["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    assert (
        "spec.containers[main].envFrom[settings]: gpuwarden does not know ConfigMap settings yet, "
        "so it cannot check its keys for NVIDIA_VISIBLE_DEVICES or CUDA_MPS_*; create the "
        "ConfigMap before the pod, or set a prefix (APP_, say)" in denied(made, policies)
    )
    admitted(made, policies, known("LOG_LEVEL"))


@pytest.mark.parametrize(
    ("prefix", "key", "variable"),
    [
        ("NVIDIA_", "VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
        ("CUDA_MPS", "_PIPE_DIRECTORY", "CUDA_MPS_PIPE_DIRECTORY"),
        ("C", "UDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PIPE_DIRECTORY"),
        ("CUDA_DEVICE_SM_LIMIT", "_0", "CUDA_DEVICE_SM_LIMIT_0"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "0", "CUDA_DEVICE_MEMORY_LIMIT_10"),
    ],
)
def test_a_prefix_that_could_make_a_denied_variable_is_denied_whatever_the_keys_are_now(
    policies: PolicySet, prefix: str, key: str, variable: str
) -> None:
    """gpuwarden judges a ConfigMap's own keys when it changes, not with each pod's prefix: a key
    added later would pass that check and become the variable at the next container start."""
    made = pod()
    main(made)["envFrom"] = [{"prefix": prefix, "configMapRef": {"name": "settings"}}]
    message = denied(made, policies, known("LOG_LEVEL"))
    assert (
        f"spec.containers[main].envFrom[settings]: prefix {prefix} makes ConfigMap keys into "
        f"{prefix}* variables: a key {key}, now or added later, would set {variable}, which "
    ) in message
    assert "; use another prefix (APP_, say)" in message


DENIED_NAMES = [
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_12",
    "CUDA_DEVICE_SM_LIMIT_3",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_TASK_PRIORITY",
]


def test_every_prefix_of_a_denied_variable_is_denied(policies: PolicySet) -> None:
    for name in DENIED_NAMES:
        for cut in range(1, len(name)):
            prefix, key = name[:cut], name[cut:]
            made = pod()
            main(made)["envFrom"] = [{"prefix": prefix, "configMapRef": {"name": "settings"}}]
            # Whatever the ConfigMap holds now...
            assert not admit(create(made), policies, known("LOG_LEVEL")).allowed, prefix
            # ...and the key that completes the name is named.
            message = admit(create(made), policies, known(key)).validation.message
            assert f"ConfigMap key {key} sets {name}, which " in message


@pytest.mark.parametrize(
    "prefix", ["APP_", "NV_", "CUDA_HOME_", "GPU_TYPE_", "NVIDIA_VISIBLE_DEVICES", "MY_CUDA_"]
)
def test_prefixes_that_reach_no_denied_variable_are_admitted(
    policies: PolicySet, prefix: str
) -> None:
    made = pod()
    main(made)["envFrom"] = [{"prefix": prefix, "secretRef": {"name": "creds"}}]
    admitted(made, policies)


def test_env_sources_are_escapes_in_every_namespace_unless_the_tenant_turns_them_off(
    policies: PolicySet,
) -> None:
    for namespace in (NO_TENANT, "team"):
        made = pod(namespace=namespace)
        main(made)["envFrom"] = [{"secretRef": {"name": "creds"}}]
        assert SECRET_DENIAL in denied(made, policies)
    made = pod(namespace="relaxed")
    main(made)["envFrom"] = [{"secretRef": {"name": "creds"}}]
    admitted(made, policies)


def config_map(data: dict[str, str], namespace: str = "team") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": namespace},
        "data": data,
    }


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_config_map_that_would_set_a_denied_variable_is_denied_when_it_changes(
    policies: PolicySet, operation: Any
) -> None:
    """A pod admitted with a harmless ConfigMap reads it again at each container start."""
    old = config_map({"LOG_LEVEL": "info"})
    new = config_map({"LOG_LEVEL": "info", "NVIDIA_VISIBLE_DEVICES": "all"})
    request = AdmissionRequest(operation, "team", new, old_pod=old)
    decision = validate_config_map(request, policies, ClusterView())
    assert not decision.allowed
    assert decision.code == 403
    assert decision.reason == "GPUIsolationEscape"
    assert decision.message == (
        "gpuwarden denied the ConfigMap: data[NVIDIA_VISIBLE_DEVICES]: a pod's envFrom would set "
        "NVIDIA_VISIBLE_DEVICES, which can escape GPU isolation; rename or remove the key "
        "[policy test, check environment]"
    )


def test_config_maps_that_set_no_denied_variable_go_ahead(policies: PolicySet) -> None:
    harmless = config_map({"LOG_LEVEL": "info", "CUDA_HOME": "/usr/local/cuda"})
    assert validate_config_map(create(harmless), policies, ClusterView()).allowed
    # Removing the key is always allowed; so is anything in a tenant without the check.
    bad = config_map({"CUDA_MPS_PIPE_DIRECTORY": "/x"})
    removal = AdmissionRequest("DELETE", "team", bad)
    assert validate_config_map(removal, policies, ClusterView()).allowed
    relaxed = config_map({"CUDA_MPS_PIPE_DIRECTORY": "/x"}, "relaxed")
    assert validate_config_map(create(relaxed), policies, ClusterView()).allowed
    # Namespaces of no tenant keep every escape check.
    stray = config_map({"CUDA_MPS_PIPE_DIRECTORY": "/x"}, NO_TENANT)
    assert not validate_config_map(create(stray), policies, ClusterView()).allowed


def test_kubectl_debug_is_judged_by_its_own_env_sources(policies: PolicySet) -> None:
    made = pod()
    main(made)["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    old = admitted_pod(made, policies, known("LOG_LEVEL"))
    # The ConfigMap was deleted since: it does not stand in the way of a debug container...
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox"}]
    assert validate(update(old, new, "ephemeralcontainers"), policies, ClusterView()).allowed
    # ...but a debug container's own unreadable source does.
    new["spec"]["ephemeralContainers"][0]["envFrom"] = [{"secretRef": {"name": "creds"}}]
    decision = validate(update(old, new, "ephemeralcontainers"), policies, ClusterView())
    assert not decision.allowed
    assert f"spec.ephemeralContainers[debugger].envFrom[creds]: {SECRET_DENIAL}" in (
        decision.message
    )


# --- item 7: Dynamic Resource Allocation ---------------------------------------------------


def claiming_pod(namespace: str) -> dict[str, Any]:
    made = pod(None, namespace)
    made["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    main(made)["resources"] = {"claims": [{"name": "gpu"}]}
    return made


def test_resource_claims_are_denied_where_gpus_go_through_device_plugins(
    policies: PolicySet,
) -> None:
    result = admit(create(claiming_pod("team")), policies, ClusterView())
    assert not result.allowed
    assert result.validation.reason == "TenantLimit"
    assert result.validation.message == (
        "gpuwarden denied the pod: spec.resourceClaims[gpu], spec.containers[main].resources."
        "claims: tenant team gets GPUs through device plugins, where its profiles, limits and "
        "quota apply, not through Dynamic Resource Allocation; remove the resource claims, or "
        "have an admin set limits.allowResourceClaims: true for the tenant "
        "[policy test, check tenantLimits, none]"
    )


@pytest.mark.parametrize("namespace", ["open", "relaxed", NO_TENANT])
def test_resource_claims_where_the_tenant_allows_them_or_no_tenant_limits_apply(
    policies: PolicySet, namespace: str
) -> None:
    admitted(claiming_pod(namespace), policies)


# --- item 8: capabilities, NVIDIA's runtime, variables, nodeName, schedulers ------------------


@pytest.mark.parametrize(
    ("added", "why"),
    [
        ("SYS_ADMIN", "SYS_ADMIN, like privileged, can reach every GPU on the node"),
        ("CAP_SYS_ADMIN", "SYS_ADMIN, like privileged, can reach every GPU on the node"),
        ("sys_admin", "SYS_ADMIN, like privileged, can reach every GPU on the node"),
        ("ALL", "ALL adds every capability, SYS_ADMIN included"),
        ("all", "ALL adds every capability, SYS_ADMIN included"),
    ],
)
def test_capabilities_that_reach_every_gpu_are_denied(
    policies: PolicySet, added: str, why: str
) -> None:
    for namespace in ("team", NO_TENANT):
        made = pod(namespace=namespace)
        main(made)["securityContext"] = {"capabilities": {"add": ["NET_BIND_SERVICE", added]}}
        message = denied(made, policies)
        assert f"spec.containers[main].securityContext.capabilities.add[{added}]: {why}" in message
        assert message.endswith("; remove it [policy test, check privileged, label]")


def test_other_capabilities_are_admitted(policies: PolicySet) -> None:
    made = pod()
    main(made)["securityContext"] = {"capabilities": {"add": ["NET_ADMIN", "SYS_PTRACE"]}}
    admitted(made, policies)


def test_kubectl_debug_with_sys_admin_is_denied(policies: PolicySet) -> None:
    old = admitted_pod(pod(), policies)
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [
        {
            "name": "debugger",
            "image": "busybox",
            "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
        }
    ]
    decision = validate(update(old, new, "ephemeralcontainers"), policies, ClusterView())
    assert "spec.ephemeralContainers[debugger].securityContext.capabilities.add[SYS_ADMIN]" in (
        decision.message
    )


@pytest.mark.parametrize("runtime", ["nvidia", "nvidia-cdi", "nvidia-legacy"])
def test_nvidias_runtime_on_a_pod_without_gpus_is_denied(policies: PolicySet, runtime: str) -> None:
    for namespace in ("team", NO_TENANT):
        message = denied(pod(None, namespace, runtimeClassName=runtime), policies)
        assert (
            f"spec.runtimeClassName {runtime}: the pod asks for no GPU, and under NVIDIA's "
            "runtime a CUDA image's own NVIDIA_VISIBLE_DEVICES=all exposes every GPU on the "
            "node; remove runtimeClassName, or ask for a GPU in resources.limits"
        ) in message


def test_nvidias_runtime_with_a_gpu_and_other_runtimes_are_admitted(policies: PolicySet) -> None:
    admitted(pod(runtimeClassName="nvidia"), policies)
    # Another runtime class outside a tenant's namespaces (in them, issue 29 item 11 denies it
    # unless the tenant lists it: tests/policy/test_routes.py).
    admitted(pod(None, NO_TENANT, runtimeClassName="kata-qemu"), policies)


@pytest.mark.parametrize(
    ("name", "effect"),
    [
        (
            "NVIDIA_MIG_CONFIG_DEVICES",
            "asks NVIDIA's container toolkit to configure or monitor MIG on the node's GPUs",
        ),
        (
            "NVIDIA_MIG_MONITOR_DEVICES",
            "asks NVIDIA's container toolkit to configure or monitor MIG on the node's GPUs",
        ),
        (
            "NVIDIA_IMEX_CHANNELS",
            "asks NVIDIA's container toolkit for IMEX channels, where jobs share GPU memory",
        ),
    ],
)
def test_nvidia_toolkit_variables_for_mig_and_imex_are_denied(
    policies: PolicySet, name: str, effect: str
) -> None:
    made = pod(None, NO_TENANT)
    main(made)["env"] = [{"name": name, "value": "all"}]
    assert f"spec.containers[main].env[{name}]: setting {name} {effect}; remove it" in denied(
        made, policies
    )


def test_a_gpu_pod_bound_to_a_node_by_name_is_denied_in_tenant_namespaces(
    policies: PolicySet,
) -> None:
    message = denied(pod(nodeName="gpu-node-7"), policies)
    assert message.startswith(
        "gpuwarden denied the pod: spec.nodeName gpu-node-7: a GPU pod bound to a node by name "
        "skips the scheduler and the GPU accounting it does; remove nodeName and pick the node "
        "with a nodeSelector or node affinity on kubernetes.io/hostname"
    )
    admitted(pod(None, nodeName="cpu-node-1"), policies)
    # Scheduling is a tenant's check: namespaces of no tenant have no GPU accounting.
    admitted(pod(namespace=NO_TENANT, nodeName="gpu-node-7"), policies)


@pytest.mark.parametrize(
    ("profile", "resources", "scheduler"),
    [
        ("shared", "volcano.sh/vgpu-memory, volcano.sh/vgpu-number", "volcano"),
        ("hami-shared", "nvidia.com/gpu, nvidia.com/gpumem", "hami-scheduler"),
    ],
)
def test_keep_cannot_keep_another_scheduler_for_gpus_only_the_backend_assigns(
    policies: PolicySet, profile: str, resources: str, scheduler: str
) -> None:
    result = admit(create(pod(profile, schedulerName=GANG)), policies, ClusterView())
    assert result.mutation.allowed
    assert f"gpuwarden: kept schedulerName {GANG} set by another controller (policy: keep)" in (
        result.mutation.warnings
    )
    assert not result.allowed
    assert (
        f"spec.schedulerName {GANG}: profile {profile} (label) gives {resources}, which only "
        f"scheduler {scheduler} assigns to a device, so foreignScheduler: keep cannot keep "
        f"another scheduler; remove schedulerName or set it to {scheduler}"
    ) in result.validation.message


@pytest.mark.parametrize("profile", ["whole", "mps", "replaced"])
def test_another_scheduler_where_any_scheduler_counts_the_gpus(
    policies: PolicySet, profile: str
) -> None:
    """nvidia.com/gpu (and the device plugin's replicas) are counted by every kube-scheduler and
    refused by the kubelet past the node's devices; replace puts the backend's own back."""
    result = admitted(pod(profile, schedulerName=GANG), policies)
    expected = "volcano" if profile == "replaced" else GANG
    assert result.pod["spec"]["schedulerName"] == expected


def test_a_resize_of_what_the_profile_set_is_denied(policies: PolicySet) -> None:
    old = admitted_pod(pod("whole"), policies)
    assert main(old)["resources"]["limits"]["memory"] == "16Gi"
    new = copy.deepcopy(old)
    main(new)["resources"]["limits"]["memory"] = "64Gi"
    main(new)["resources"]["requests"]["memory"] = "64Gi"
    decision = validate(update(old, new, "resize"), policies, ClusterView())
    assert not decision.allowed
    assert decision.reason == "PolicyMismatch"
    assert decision.message.startswith(
        "gpuwarden denied the pod: spec.containers[main].resources.limits[memory]: profile whole "
        "(label) sets it to 16Gi, and a resize may not change what gpuwarden set; resize only "
        "what the profile leaves to the pod; spec.containers[main].resources.requests[memory]: "
    )


def test_a_resize_of_what_the_profile_leaves_is_admitted(policies: PolicySet) -> None:
    old = admitted_pod(pod("whole"), policies)
    new = copy.deepcopy(old)
    main(new)["resources"]["limits"]["cpu"] = "8"  # the profile sets only the cpu request
    main(new)["resources"]["limits"]["memory"] = "16384Mi"  # the same quantity
    assert validate(update(old, new, "resize"), policies, ClusterView()).allowed
    cpu = admitted_pod(pod(None), policies)
    bigger = copy.deepcopy(cpu)
    main(bigger)["resources"] = {"limits": {"memory": "64Gi"}}
    assert validate(update(cpu, bigger, "resize"), policies, ClusterView()).allowed


@pytest.mark.parametrize("namespace", ["team", "relaxed", NO_TENANT])
def test_volcano_preemptable_cannot_change_after_admission(
    policies: PolicySet, namespace: str
) -> None:
    old = admitted_pod(pod(namespace=namespace), policies)
    assert old["metadata"]["annotations"]["volcano.sh/preemptable"] == "false"
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["volcano.sh/preemptable"] = "true"
    decision = validate(update(old, new), policies, ClusterView())
    assert not decision.allowed
    assert (
        "metadata.annotations[volcano.sh/preemptable]: gpuwarden sets it from the profile's "
        "preemptible, and Volcano reads it to preempt; it cannot be changed after admission; "
        "revert the change" in decision.message
    )
    harmless = copy.deepcopy(old)
    harmless["metadata"]["annotations"]["example.com/note"] = "hi"
    assert validate(update(old, harmless), policies, ClusterView()).allowed


# --- item 11: bounded answers --------------------------------------------------------------


def wide_pod(count: int, namespace: str = "team", profile: str | None = "shared") -> dict[str, Any]:
    made = pod(profile, namespace)
    made["spec"]["containers"] = [
        {"name": f"c{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        for i in range(count)
    ]
    return made


@pytest.mark.parametrize("namespace", ["team", NO_TENANT])
def test_a_pod_with_thousands_of_gpu_containers_is_denied_not_patched(
    policies: PolicySet, namespace: str
) -> None:
    profile = "shared" if namespace == "team" else None  # the default profile elsewhere
    result = admit(create(wide_pod(2000, namespace, profile)), policies, ClusterView())
    assert result.mutation.patch == ()
    assert len(result.mutation.warnings) <= MAX_WARNINGS
    assert not result.allowed
    assert result.validation.reason == "TooManyGPUContainers"
    origin = "label" if profile else "default"
    assert result.validation.message.startswith(
        f"gpuwarden denied the pod: spec.containers: 2000 containers would get GPUs (profile "
        f"shared, {origin}) but gpuwarden governs at most 64 per pod; give GPUs to fewer "
        "containers or split the work over several pods"
    )
    assert len(result.validation.message) <= 1024


def test_a_pod_at_the_limit_is_governed_with_bounded_warnings(policies: PolicySet) -> None:
    result = admitted(wide_pod(64), policies)
    assert result.mutation.patch
    assert all(
        c["resources"]["limits"]["volcano.sh/vgpu-memory"] == "8192"
        for c in result.pod["spec"]["containers"]
    )
    warnings = result.mutation.warnings
    assert len(warnings) == MAX_WARNINGS
    assert warnings[0] == "gpuwarden: profile shared via label (tenant team)"
    assert warnings[-1].startswith("gpuwarden: and ")
    assert warnings[-1].endswith(" more warnings like these")


def test_a_denial_keeps_the_first_violations_and_counts_the_rest(policies: PolicySet) -> None:
    made = pod(None)
    made["spec"]["containers"] = [
        {"name": f"worker-{i}", "image": "x", "securityContext": {"privileged": True}}
        for i in range(300)
    ]
    message = denied(made, policies)
    assert message.startswith(
        "gpuwarden denied the pod: spec.containers[worker-0].securityContext.privileged: "
    )
    assert "; and 295 more [policy test, check privileged, none]" in message


def test_a_denial_lists_a_few_containers_and_counts_the_rest(policies: PolicySet) -> None:
    message = denied(wide_pod(30, "small"), policies)
    assert (
        "the pod would get 30 GPUs (c0 1, c1 1, c2 1, c3 1, c4 1 and 25 more; profile shared, "
        "label) but tenant small allows at most 2 per pod" in message
    )


def test_one_long_violation_is_cut_to_fit(policies: PolicySet) -> None:
    made = pod(None)
    main(made)["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    main(made)["name"] = "m" * 5000
    message = denied(made, policies)
    assert message.startswith(f"gpuwarden denied the pod: spec.containers[{'m' * 900}")
    assert message.endswith("... [policy test, check privileged, none]")
