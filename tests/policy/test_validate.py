"""The validating decision: one denial test per rule, each naming the field, and the switches.

Pods go through `admit` (mutate, apply, validate) as the API server runs them, unless a test
tampers with an already-mutated pod to show what a later change would meet.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    Decision,
    PolicySet,
    admit,
    validate,
)

from .support import EXAMPLE_PODS, container, create, example, gpu_pod, policies_from, read_yaml

GI = 2**30
SPEC = """
profiles:
  - {name: shared, maxMemory: 8Gi, overcommitRatio: 2.0}
  - {name: shared-big, maxMemory: 40Gi, gpus: 2}
  - {name: whole, gpuShare: false, gpus: 4, maxMemory: 80Gi}
  - {name: single, gpuShare: false, maxMemory: 80Gi}
  - {name: mps, maxMemory: 8Gi, threadPercentage: 50, backend: nvidia}
workloads:
  - {name: notebooks, match: {kind: notebook}, profile: whole}
tenants:
  - name: team
    namespaces: [team]
    limits: {maxGpusPerPod: 2, maxGpuMemoryPerPod: 64Gi, gpuMemoryQuota: 32Gi}
  - name: sharers
    namespaces: [sharers]
    limits: {requireShared: true}
  - name: picky
    namespaces: [picky]
    limits: {allowedProfiles: [shared]}
"""
CLUSTER = ClusterView()


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return policies_from(SPEC)


def pod_with(profile: str = "shared", namespace: str = "team", **spec: Any) -> dict[str, Any]:
    pod = gpu_pod(namespace=namespace, labels={"gpuwarden.io/profile": profile})
    pod["spec"].update(spec)
    return pod


def main(pod: dict[str, Any]) -> dict[str, Any]:
    return container(pod, "main")


def admitted(
    pod: dict[str, Any], policies: PolicySet, cluster: ClusterView = CLUSTER
) -> tuple[bool, str]:
    result = admit(create(pod), policies, cluster)
    return result.allowed, result.validation.message


def denial(pod: dict[str, Any], policies: PolicySet, cluster: ClusterView = CLUSTER) -> Decision:
    result = admit(create(pod), policies, cluster)
    assert not result.allowed, "expected a denial"
    assert result.mutation.allowed  # the mutator never denies; the validator does
    decision = result.validation
    assert decision.code == 403
    assert decision.message.startswith("gpuwarden denied the pod: ")
    return decision


def test_a_plain_shared_pod_is_allowed(policies: PolicySet) -> None:
    assert admitted(pod_with(), policies) == (True, "")


# --- tenant limits -------------------------------------------------------------------------


def test_more_gpus_than_the_tenant_allows(policies: PolicySet) -> None:
    decision = denial(pod_with("whole"), policies)
    assert decision.reason == "TenantLimit"
    assert (
        "the pod would get 4 GPUs (main 4; profile whole, label) but tenant team allows at most 2 "
        "per pod; profile whole sets the count, so use a profile with fewer GPUs "
        "(label gpuwarden.io/profile)" in decision.message
    )
    assert decision.message.endswith("[policy test, check tenantLimits, label]")


def test_gpus_count_per_container(policies: PolicySet) -> None:
    spec = SPEC.replace(
        "workloads:\n",
        "workloads:\n  - {name: two, match: {kind: selector, labels: {matchLabels: {app: two}}}, "
        "profile: shared-big, containers: [main, side]}\n",
    )
    pod = gpu_pod(namespace="team", labels={"app": "two"})
    pod["spec"]["containers"].append({"name": "side", "image": "x"})
    decision = denial(pod, policies_from(spec))
    assert "the pod would get 4 GPUs (main 2, side 2; profile shared-big, rule/two)" in (
        decision.message
    )


def test_more_gpu_memory_than_the_tenant_allows(policies: PolicySet) -> None:
    decision = denial(pod_with("shared-big"), policies)
    assert (
        "the pod would get 80Gi of GPU memory (profile shared-big) but tenant team allows at "
        "most 64Gi per pod" in decision.message
    )


def test_profile_the_tenant_may_not_use_by_rule(policies: PolicySet) -> None:
    pod = example("notebook")
    pod["metadata"]["namespace"] = "picky"
    decision = denial(pod, policies)
    assert "profile whole (rule/notebooks) is not allowed for tenant picky; use one of: shared" in (
        decision.message
    )


def test_profile_the_tenant_may_not_use_by_label(policies: PolicySet) -> None:
    decision = denial(pod_with("whole", "picky"), policies)
    assert decision.reason == "ProfileSelection"
    assert (
        "profile whole is not allowed for tenant picky; set gpuwarden.io/profile to one of: "
        "shared" in decision.message
    )


def test_whole_gpus_where_the_tenant_must_share(policies: PolicySet) -> None:
    decision = denial(pod_with("single", "sharers"), policies)
    assert "profile single gives whole GPUs but tenant sharers must share GPUs" in decision.message
    assert admitted(pod_with("shared", "sharers"), policies) == (True, "")


def test_gpu_pod_without_profile_in_a_tenant(policies: PolicySet) -> None:
    pod = gpu_pod(namespace="team")  # no rule, no default profile
    decision = denial(pod, policies)
    assert decision.reason == "NoGPUProfile"
    assert "requests a GPU but no gpuwarden rule gives it a profile" in decision.message


# --- isolation escapes: environment --------------------------------------------------------

OWNED_BY_GPUWARDEN = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
FORBIDDEN = [
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING",
]


@pytest.mark.parametrize("name", FORBIDDEN)
@pytest.mark.parametrize("field", ["containers", "initContainers", "ephemeralContainers"])
def test_forbidden_env_in_any_container(policies: PolicySet, name: str, field: str) -> None:
    pod = pod_with()
    entry = {"name": name, "value": "all"}
    if field == "containers":
        main(pod)["env"] = [entry]
    else:
        pod["spec"][field] = [{"name": "helper", "image": "busybox", "env": [entry]}]
    if field == "containers" and name in OWNED_BY_GPUWARDEN:
        # On the governed container these are gpuwarden's own: the mutator removes them.
        result = admit(create(pod), policies, ClusterView())
        assert result.allowed, result.validation.message
        env = result.pod["spec"]["containers"][0].get("env", [])
        assert all(e["name"] != name for e in env)
        assert any(f"removed {name} from main" in w for w in result.warnings)
        return
    decision = denial(pod, policies)
    where = "main" if field == "containers" else "helper"
    assert f"spec.{field}[{where}].env[{name}]: setting {name} can escape GPU isolation" in (
        decision.message
    )
    assert decision.reason == "GPUIsolationEscape"


# What HAMi-core's limiter reads on Volcano vGPU and HAMi nodes (issue 18, item 5).
LIMITER_SWITCHES = [
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_TASK_PRIORITY",
]


@pytest.mark.parametrize("name", LIMITER_SWITCHES)
def test_a_tenant_cannot_switch_off_hami_core(policies: PolicySet, name: str) -> None:
    pod = pod_with()
    main(pod)["env"] = [{"name": name, "value": "1"}]
    decision = denial(pod, policies)
    assert (
        f"spec.containers[main].env[{name}]: setting {name} can lift the GPU caps HAMi-core's "
        "limiter holds the pod to; remove it"
    ) in decision.message
    assert decision.reason == "GPUIsolationEscape"


def test_hami_core_switches_from_a_config_map_are_denied(policies: PolicySet) -> None:
    pod = pod_with()
    main(pod)["envFrom"] = [{"configMapRef": {"name": "tuning"}, "prefix": "CUDA_"}]
    cluster = ClusterView(
        env_source_keys={("ConfigMap", "team", "tuning"): frozenset({"DISABLE_CONTROL", "X"})}
    )
    decision = denial(pod, policies, cluster)
    assert (
        "spec.containers[main].envFrom[tuning]: ConfigMap key DISABLE_CONTROL sets "
        "CUDA_DISABLE_CONTROL, which can lift the GPU caps"
    ) in decision.message


def test_what_hamis_own_webhook_writes_is_admitted(policies: PolicySet) -> None:
    """HAMi's webhook runs before validation and writes these from the pod and its config."""
    pod = pod_with()
    main(pod)["resources"]["limits"]["nvidia.com/priority"] = "0"
    main(pod)["env"] = [
        {"name": "CUDA_TASK_PRIORITY", "value": "0"},
        {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
    ]
    assert admit(create(pod), policies, ClusterView()).allowed
    main(pod)["env"][0]["value"] = "-5"  # not what the container's priority says
    assert "env[CUDA_TASK_PRIORITY]" in denial(pod, policies).message


def test_a_disabled_core_limit_passes_only_where_hami_is_configured_so() -> None:
    spec = """
profiles:
  - {name: unlimited, maxMemory: 4Gi, backend: {type: hami, gpuCorePolicy: disable}}
  - {name: limited, maxMemory: 4Gi, backend: hami}
tenants: [{name: team, namespaces: [team]}]
"""
    policies = policies_from(spec)
    for profile, allowed in (("unlimited", True), ("limited", False)):
        pod = gpu_pod(namespace="team", labels={"gpuwarden.io/profile": profile})
        main(pod)["env"] = [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}]
        assert admit(create(pod), policies, ClusterView()).allowed is allowed, profile


def test_variables_that_only_look_like_limiter_switches_are_allowed(policies: PolicySet) -> None:
    pod = pod_with()
    main(pod)["env"] = [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_GB", "value": "1"},
        {"name": "LIBCUDA_LOG_LEVEL", "value": "0"},
    ]
    assert admit(create(pod), policies, ClusterView()).allowed


def test_visible_devices_on_a_pod_without_gpu(policies: PolicySet) -> None:
    """The hole NVIDIA's runtime leaves open: no GPU requested, every GPU visible."""
    pod = gpu_pod(
        "sneaky",
        "team",
        gpus=None,
        extra={"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
    )
    assert "spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]" in denial(pod, policies).message


def test_forbidden_env_from_value_from(policies: PolicySet) -> None:
    pod = pod_with()
    main(pod)["env"] = [
        {
            "name": "CUDA_MPS_PIPE_DIRECTORY",
            "valueFrom": {"configMapKeyRef": {"name": "x", "key": "pipe"}},
        }
    ]
    assert "env[CUDA_MPS_PIPE_DIRECTORY]" in denial(pod, policies).message


def test_mps_env_the_mutator_owns_is_overwritten_not_denied(policies: PolicySet) -> None:
    pod = pod_with("mps")
    main(pod)["env"] = [
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
    ]
    result = admit(create(pod), policies, CLUSTER)
    assert result.allowed, result.validation.message
    assert main(dict(result.pod))["env"] == [
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "50"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=8192M"},
    ]


def test_a_second_copy_of_an_owned_variable_is_denied(policies: PolicySet) -> None:
    pod = pod_with("mps")
    main(pod)["env"] = [
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
    ]
    assert "env[CUDA_MPS_ACTIVE_THREAD_PERCENTAGE]" in denial(pod, policies).message


def test_mps_env_on_a_container_that_is_not_governed(policies: PolicySet) -> None:
    pod = pod_with("mps")
    pod["spec"]["containers"].append(
        {
            "name": "side",
            "image": "x",
            "env": [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "50"}],
        }
    )
    assert "spec.containers[side].env[CUDA_MPS_ACTIVE_THREAD_PERCENTAGE]" in (
        denial(pod, policies).message
    )


@pytest.mark.parametrize(
    ("kind", "ref", "prefix", "keys", "variable"),
    [
        (
            "ConfigMap",
            "configMapRef",
            "",
            {"NVIDIA_VISIBLE_DEVICES", "OTHER"},
            "NVIDIA_VISIBLE_DEVICES",
        ),
        ("Secret", "secretRef", "", {"CUDA_MPS_PIPE_DIRECTORY"}, "CUDA_MPS_PIPE_DIRECTORY"),
        ("ConfigMap", "configMapRef", "CUDA_", {"MPS_LOG_DIRECTORY"}, "CUDA_MPS_LOG_DIRECTORY"),
        ("Secret", "secretRef", "NVIDIA_", {"DRIVER_CAPABILITIES"}, "NVIDIA_DRIVER_CAPABILITIES"),
    ],
)
def test_env_from_with_known_keys(
    policies: PolicySet, kind: str, ref: str, prefix: str, keys: set[str], variable: str
) -> None:
    pod = pod_with()
    source: dict[str, Any] = {ref: {"name": "gpu-env"}}
    if prefix:
        source["prefix"] = prefix
    main(pod)["envFrom"] = [source]
    cluster = ClusterView(env_source_keys={(kind, "team", "gpu-env"): frozenset(keys)})
    decision = denial(pod, policies, cluster)
    assert f"spec.containers[main].envFrom[gpu-env]: {kind} key " in decision.message
    assert f"sets {variable}, which can escape GPU isolation" in decision.message


def test_env_from_known_harmless_keys_is_allowed(policies: PolicySet) -> None:
    pod = pod_with()
    main(pod)["envFrom"] = [{"configMapRef": {"name": "app"}}, {"secretRef": {"name": "app"}}]
    cluster = ClusterView(
        env_source_keys={
            ("ConfigMap", "team", "app"): frozenset({"LOG_LEVEL"}),
            ("Secret", "team", "app"): frozenset({"TOKEN"}),
            # The same name in another namespace is another object.
            ("ConfigMap", "elsewhere", "app"): frozenset({"NVIDIA_VISIBLE_DEVICES"}),
        }
    )
    assert admitted(pod, policies, cluster) == (True, "")


def test_env_from_unknown_source_with_an_mps_prefix(policies: PolicySet) -> None:
    pod = pod_with()
    main(pod)["envFrom"] = [{"prefix": "CUDA_MPS_", "secretRef": {"name": "unknown"}}]
    assert (
        "spec.containers[main].envFrom[unknown]: prefix CUDA_MPS_ makes Secret keys into "
        "CUDA_MPS_* variables" in denial(pod, policies).message
    )


def test_env_from_unknown_source_without_prefix_is_denied(policies: PolicySet) -> None:
    """Keys gpuwarden cannot read could be NVIDIA_VISIBLE_DEVICES (tests/policy/test_hardening.py
    has the whole envFrom rule)."""
    pod = pod_with()
    main(pod)["envFrom"] = [{"configMapRef": {"name": "unknown"}}, {"secretRef": {"name": "s"}}]
    message = denial(pod, policies).message
    assert "spec.containers[main].envFrom[unknown]: gpuwarden does not know ConfigMap" in message
    assert "spec.containers[main].envFrom[s]: gpuwarden does not read Secrets" in message


def test_env_from_known_source_gets_no_unchecked_warning(policies: PolicySet) -> None:
    pod = pod_with()
    main(pod)["envFrom"] = [{"configMapRef": {"name": "app"}}]
    cluster = ClusterView(env_source_keys={("ConfigMap", "team", "app"): frozenset({"LOG"})})
    assert admit(create(pod), policies, cluster).validation.warnings == ()


@pytest.mark.parametrize(
    ("value", "gpus", "problem"),
    [
        ("all", "1", "it asks for every GPU on the node"),
        ("0,1", "1", "it lists 2 devices but the container was given 1"),
        ("0,1,2", None, "the container requests no GPU, so it must not select GPUs"),
    ],
)
def test_cuda_visible_devices_widening(
    policies: PolicySet, value: str, gpus: str | None, problem: str
) -> None:
    pod = gpu_pod(namespace="team", gpus=None) if gpus is None else pod_with()
    main(pod)["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": value}]
    assert f"spec.containers[main].env[CUDA_VISIBLE_DEVICES]: {problem}" in (
        denial(pod, policies).message
    )


@pytest.mark.parametrize("value", ["0", "", "GPU-6f1c3a0e-1b2c-4d3e-8f9a-0b1c2d3e4f5a"])
def test_cuda_visible_devices_within_the_grant_is_allowed(policies: PolicySet, value: str) -> None:
    pod = pod_with()
    main(pod)["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": value}]
    assert admitted(pod, policies) == (True, "")


# --- isolation escapes: host paths, privilege, host namespaces -----------------------------


@pytest.mark.parametrize(
    ("path", "reached"),
    [
        ("/run/nvidia/mps", "/run/nvidia/mps"),
        ("/run/nvidia/mps/", "/run/nvidia/mps"),
        ("/run/nvidia/../nvidia/mps", "/run/nvidia/mps"),
        ("/run/nvidia/mps/shm", "/run/nvidia/mps"),
        ("/run/nvidia/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps"),  # the device plugin's layout
        ("/run", "/run/nvidia/mps"),
        ("/run/nvidia", "/run/nvidia/mps"),
        ("/var/log/nvidia-mps", "/var/log/nvidia-mps"),
        ("/var/log", "/var/log/nvidia-mps"),
        ("/", "/run/nvidia/mps, /var/log/nvidia-mps, /dev/nvidia*"),
        ("/dev", "/dev/nvidia*"),
        ("/dev/nvidia0", "/dev/nvidia*"),
        ("/dev/nvidiactl", "/dev/nvidia*"),
        ("/dev/nvidia-caps", "/dev/nvidia*"),
        # /var/run is a symlink to /run on the hosts: the same directories by another name.
        ("/var/run/nvidia/mps", "/run/nvidia/mps"),
        ("/var/run", "/run/nvidia/mps"),
        ("/var/run/nvidia", "/run/nvidia/mps"),
    ],
)
def test_host_paths_to_mps_and_devices(policies: PolicySet, path: str, reached: str) -> None:
    pod = pod_with(volumes=[{"name": "host", "hostPath": {"path": path}}])
    decision = denial(pod, policies)
    assert f"spec.volumes[host].hostPath {path}: reaches {reached} " in decision.message
    assert "check hostPaths" in decision.message


@pytest.mark.parametrize("path", ["/data", "/dev/shm", "/run/nvidia/mps-old", "/var/log/app"])
def test_other_host_paths_are_left_to_other_policies(policies: PolicySet, path: str) -> None:
    pod = pod_with(volumes=[{"name": "host", "hostPath": {"path": path}}])
    assert admitted(pod, policies) == (True, "")


@pytest.mark.parametrize(
    "mount", ["/var/run/nvidia-container-devices", "/var/run/nvidia-container-devices/all",
              "/run/nvidia-container-devices/GPU-0"],
)  # fmt: skip
def test_mounts_at_the_device_list_path_are_escapes(policies: PolicySet, mount: str) -> None:
    """NVIDIA's container toolkit takes mount points there as the GPUs to expose."""
    pod = pod_with(volumes=[{"name": "scratch", "emptyDir": {}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": mount}]
    decision = denial(pod, policies)
    assert f"volumeMounts[0].mountPath {mount}: mounts there select GPUs" in decision.message
    assert "check hostPaths" in decision.message


def test_host_paths_follow_the_policy_mps_directories() -> None:
    policies = policies_from(
        SPEC + "mps: {pipeDirectory: /var/lib/mps/pipe, logDirectory: /var/lib/mps/log}\n"
    )
    assert admitted(
        pod_with(volumes=[{"name": "h", "hostPath": {"path": "/run/nvidia/mps"}}]), policies
    ) == (True, "")
    pod = pod_with(volumes=[{"name": "h", "hostPath": {"path": "/var/lib/mps"}}])
    assert "reaches /var/lib/mps/pipe, /var/lib/mps/log" in denial(pod, policies).message


@pytest.mark.parametrize("field", ["containers", "initContainers", "ephemeralContainers"])
def test_privileged_containers(policies: PolicySet, field: str) -> None:
    pod = pod_with()
    privileged = {"securityContext": {"privileged": True}}
    if field == "containers":
        main(pod).update(privileged)
        where = "main"
    else:
        pod["spec"][field] = [{"name": "helper", "image": "busybox", **privileged}]
        where = "helper"
    assert (
        f"spec.{field}[{where}].securityContext.privileged: privileged containers see every "
        "GPU" in denial(pod, policies).message
    )


def test_unprivileged_security_context_is_allowed(policies: PolicySet) -> None:
    pod = pod_with()
    main(pod)["securityContext"] = {"privileged": False, "runAsNonRoot": True}
    assert admitted(pod, policies) == (True, "")


@pytest.mark.parametrize("field", ["hostIPC", "hostPID"])
def test_host_namespaces(policies: PolicySet, field: str) -> None:
    pod = pod_with()
    pod["spec"][field] = True
    decision = denial(pod, policies)
    assert f"spec.{field}: sharing the node's {field[4:]} namespace" in decision.message
    pod["spec"][field] = False
    assert admitted(pod, policies) == (True, "")


def test_every_violation_is_listed(policies: PolicySet) -> None:
    pod = pod_with(hostPID=True, hostIPC=True)
    main(pod)["securityContext"] = {"privileged": True}
    message = denial(pod, policies).message
    for field in ("securityContext.privileged", "spec.hostIPC", "spec.hostPID"):
        assert field in message


def test_escapes_are_denied_outside_tenant_namespaces_too(policies: PolicySet) -> None:
    """A namespace the webhook sees but no tenant matches has no limits, but no escapes either."""
    assert admitted(pod_with(namespace="not-a-tenant"), policies) == (True, "")
    many = gpu_pod(namespace="not-a-tenant", gpus="16")
    assert admitted(many, policies)[0]
    decision = denial(pod_with(namespace="not-a-tenant", hostPID=True), policies)
    assert "check hostNamespaces" in decision.message
    escape = pod_with(
        namespace="not-a-tenant", volumes=[{"name": "h", "hostPath": {"path": "/dev"}}]
    )
    assert "reaches /dev/nvidia*" in denial(escape, policies).message


# --- contradicting the policy --------------------------------------------------------------


def mutated_pod(policies: PolicySet, pod: dict[str, Any] | None = None) -> dict[str, Any]:
    result = admit(create(pod or pod_with()), policies, CLUSTER)
    assert result.allowed, result.validation.message
    return copy.deepcopy(dict(result.pod))


def validated(pod: dict[str, Any], policies: PolicySet, **kwargs: Any) -> Decision:
    return validate(create(pod, **kwargs), policies, CLUSTER)


@pytest.mark.parametrize(
    ("tamper", "field"),
    [
        (lambda p: p["spec"].update(schedulerName="default-scheduler"), "spec.schedulerName"),
        (lambda p: p["spec"].pop("schedulerName"), "spec.schedulerName"),
        (
            lambda p: p["metadata"]["annotations"].update(
                {"gpuwarden.io/gpu-memory-limit": "80Gi"}
            ),
            "metadata.annotations[gpuwarden.io/gpu-memory-limit]",
        ),
        (
            lambda p: p["metadata"]["annotations"].update({"gpuwarden.io/gpu-shared": "false"}),
            "metadata.annotations[gpuwarden.io/gpu-shared]",
        ),
        (
            lambda p: p["metadata"]["annotations"].update(
                {"gpuwarden.io/mps-thread-percentage": "100"}
            ),
            "metadata.annotations[gpuwarden.io/mps-thread-percentage]",
        ),
        (
            lambda p: main(p)["resources"]["limits"].update({"volcano.sh/vgpu-memory": "81920"}),
            "spec.containers[0].resources.limits[volcano.sh/vgpu-memory]",
        ),
        (
            lambda p: main(p)["resources"]["limits"].update({"nvidia.com/gpu": "1"}),
            "spec.containers[0].resources.limits[nvidia.com/gpu]",
        ),
        (lambda p: p["spec"].update(priority=1_000_000), "spec.priority"),
    ],
)
def test_scheduling_fields_that_contradict_the_policy(
    policies: PolicySet, tamper: Callable[[dict[str, Any]], Any], field: str
) -> None:
    pod = mutated_pod(policies)
    tamper(pod)
    decision = validated(pod, policies)
    assert not decision.allowed
    assert decision.reason == "PolicyMismatch"
    assert f"{field} contradicts profile shared (label)" in decision.message


def test_gpu_resources_on_a_container_without_the_grant() -> None:
    policies = policies_from(
        SPEC.replace(
            "workloads:\n",
            "workloads:\n  - {name: main-only, match: {kind: selector, "
            "labels: {matchLabels: {app: x}}}, profile: shared, containers: [main]}\n",
        )
    )
    pod = gpu_pod(namespace="team", labels={"app": "x"})
    pod["spec"]["containers"].append(
        {"name": "side", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    )
    decision = denial(pod, policies)
    assert (
        "spec.containers[side] requests nvidia.com/gpu but profile shared gives GPUs only to "
        "main; remove those resources" in decision.message
    )
    assert decision.message.endswith("[policy test, check scheduling, rule/main-only]")


# --- UPDATE and ephemeral containers -------------------------------------------------------


def update(
    old: dict[str, Any], new: dict[str, Any], policies: PolicySet, sub_resource: str = ""
) -> Decision:
    request = AdmissionRequest("UPDATE", "team", new, old_pod=old, sub_resource=sub_resource)
    return validate(request, policies, CLUSTER)


@pytest.mark.parametrize(
    "change",
    [
        lambda a: a.update({"gpuwarden.io/profile": "whole"}),
        lambda a: a.pop("gpuwarden.io/gpu-memory-limit"),
        lambda a: a.update({"gpuwarden.io/extra": "x"}),
    ],
)
def test_gpuwarden_annotations_cannot_change_on_update(
    policies: PolicySet, change: Callable[[dict[str, str]], Any]
) -> None:
    old = mutated_pod(policies)
    new = copy.deepcopy(old)
    change(new["metadata"]["annotations"])
    decision = update(old, new, policies)
    assert not decision.allowed
    assert "metadata.annotations[gpuwarden.io/" in decision.message
    assert "cannot be changed after admission" in decision.message


def test_harmless_update_is_allowed(policies: PolicySet) -> None:
    old = mutated_pod(policies)
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["release"] = "canary"
    new["metadata"]["annotations"]["example.com/note"] = "hi"
    assert update(old, new, policies).allowed


def with_debug_container(pod: dict[str, Any], **body: Any) -> dict[str, Any]:
    new = copy.deepcopy(pod)
    new["spec"]["ephemeralContainers"] = [
        {"name": "debugger-x7k2p", "image": "busybox", "targetContainerName": "main", **body}
    ]
    return new


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
            "env[NVIDIA_VISIBLE_DEVICES]",
        ),
        (
            {"env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/x"}]},
            "env[CUDA_MPS_PIPE_DIRECTORY]",
        ),
        ({"securityContext": {"privileged": True}}, "securityContext.privileged"),
    ],
)
def test_kubectl_debug_escapes_are_denied(
    policies: PolicySet, body: dict[str, Any], field: str
) -> None:
    old = mutated_pod(policies)
    decision = update(old, with_debug_container(old, **body), policies, "ephemeralcontainers")
    assert not decision.allowed
    assert f"spec.ephemeralContainers[debugger-x7k2p].{field}" in decision.message


def test_kubectl_debug_env_from_known_keys_is_denied(policies: PolicySet) -> None:
    old = mutated_pod(policies)
    new = with_debug_container(old, envFrom=[{"configMapRef": {"name": "gpu-env"}}])
    cluster = ClusterView(
        env_source_keys={("ConfigMap", "team", "gpu-env"): frozenset({"NVIDIA_VISIBLE_DEVICES"})}
    )
    request = AdmissionRequest(
        "UPDATE", "team", new, old_pod=old, sub_resource="ephemeralcontainers"
    )
    decision = validate(request, policies, cluster)
    assert "spec.ephemeralContainers[debugger-x7k2p].envFrom[gpu-env]" in decision.message


def test_harmless_kubectl_debug_is_allowed(policies: PolicySet) -> None:
    old = mutated_pod(policies)
    new = with_debug_container(old, env=[{"name": "TERM", "value": "xterm"}])
    assert update(old, new, policies, "ephemeralcontainers").allowed


@pytest.mark.parametrize("sub_resource", ["status", "binding", "eviction"])
def test_other_subresources_are_not_judged(policies: PolicySet, sub_resource: str) -> None:
    old = mutated_pod(policies)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["gpuwarden.io/profile"] = "whole"
    assert update(old, new, policies, sub_resource).allowed


# --- quantities ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "field", "problem"),
    [
        ({"limits": {"memory": "1GiB"}}, "limits[memory]", "'1GiB' is not a Kubernetes quantity"),
        ({"requests": {"cpu": "-1"}}, "requests[cpu]", "must not be negative"),
        ({"requests": {"cpu": "1e100"}}, "requests[cpu]", "out of range"),
        ({"limits": {"memory": True}}, "limits[memory]", "must be a string or number"),
    ],
)
def test_invalid_quantities_are_denied_with_the_field(
    policies: PolicySet, resources: dict[str, Any], field: str, problem: str
) -> None:
    pod = pod_with()
    main(pod)["resources"] = {
        **resources,
        "limits": {**resources.get("limits", {}), "nvidia.com/gpu": "1"},
    }
    decision = denial(pod, policies)
    assert decision.reason == "InvalidQuantity"
    assert f"spec.containers[main].resources.{field}: " in decision.message
    assert problem in decision.message


@pytest.mark.parametrize("value", ["0.5", "500m", "1.5", "one", "-1"])
def test_fractional_gpu_counts_are_denied_where_the_mutator_does_not_replace_them(
    policies: PolicySet, value: str
) -> None:
    pod = pod_with(
        initContainers=[
            {"name": "warmup", "image": "x", "resources": {"limits": {"nvidia.com/gpu": value}}}
        ]
    )
    decision = denial(pod, policies)
    assert "spec.initContainers[warmup].resources.limits[nvidia.com/gpu]: " in decision.message


# --- per-tenant enforcement switches -------------------------------------------------------


def _notebook(pod: dict[str, Any]) -> dict[str, Any]:
    notebook = example("notebook")
    notebook["metadata"]["namespace"] = pod["metadata"]["namespace"]
    return notebook


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    main(pod)["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return pod


def _host_path(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": "/dev"}}]
    return pod


def _privileged(pod: dict[str, Any]) -> dict[str, Any]:
    main(pod)["securityContext"] = {"privileged": True}
    return pod


def _host_ipc(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["hostIPC"] = True
    return pod


# (switch, tenant, how to break that one rule)
SWITCHES: list[tuple[str, str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("tenantLimits", "picky", _notebook),  # the notebook rule gives a profile picky may not use
    ("environment", "team", _env),
    ("hostPaths", "team", _host_path),
    ("privileged", "team", _privileged),
    ("hostNamespaces", "team", _host_ipc),
]


def switched_off(switches: str, tenant: str = "team") -> PolicySet:
    scope = f"    namespaces: [{tenant}]\n"
    return policies_from(SPEC.replace(scope, f"{scope}    enforcement: {switches}\n"))


@pytest.mark.parametrize(("switch", "tenant", "make"), SWITCHES, ids=[s[0] for s in SWITCHES])
def test_enforcement_switch_turns_its_check_off(
    switch: str, tenant: str, make: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    pod = make(pod_with(namespace=tenant))
    on = policies_from(SPEC)
    off = switched_off(f"{{{switch}: false}}", tenant)
    assert not admit(create(pod), on, CLUSTER).allowed
    assert admitted(pod, off) == (True, "")
    # The other checks stay on.
    if switch == "hostNamespaces":
        assert "securityContext.privileged" in denial(_privileged(pod), off).message
    else:
        assert "spec.hostPID" in denial(pod_with(namespace=tenant, hostPID=True), off).message


def test_scheduling_switch(policies: PolicySet) -> None:
    off = policies_from(
        SPEC.replace(
            "    namespaces: [team]\n",
            "    namespaces: [team]\n    enforcement: {scheduling: false}\n",
        )
    )
    pod = mutated_pod(policies)
    pod["spec"]["schedulerName"] = "default-scheduler"
    assert not validated(pod, policies).allowed
    assert validated(pod, off).allowed


def test_quota_switch() -> None:
    off = policies_from(
        SPEC.replace(
            "    namespaces: [team]\n",
            "    namespaces: [team]\n    enforcement: {gpuMemoryQuota: false}\n",
        )
    )
    full = ClusterView(namespace_gpu_memory={"team": Decimal(1000 * GI)})
    assert admitted(pod_with(), off, full) == (True, "")


def test_invalid_quantities_are_denied_whatever_the_switches() -> None:
    switches = (
        "{tenantLimits: false, environment: false, hostPaths: false, privileged: false, "
        "hostNamespaces: false, scheduling: false, gpuMemoryQuota: false}"
    )
    off = policies_from(
        SPEC.replace(
            "    namespaces: [team]\n", f"    namespaces: [team]\n    enforcement: {switches}\n"
        )
    )
    pod = pod_with()
    main(pod)["resources"]["limits"]["memory"] = "lots"
    assert denial(pod, off).reason == "InvalidQuantity"


# --- quota with overcommit -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("used_gi", "used_text"),
    [(0, None), (55, None), (56, None), (56.5, "57856Mi"), (60, "60Gi"), (1000, "1000Gi")],
)
def test_tenant_gpu_memory_quota_times_overcommit(
    policies: PolicySet, used_gi: float, used_text: str | None
) -> None:
    """team: quota 32Gi; profile shared: 8Gi cap, overcommit 2 -> 64Gi of caps may be admitted."""
    cluster = ClusterView(namespace_gpu_memory={"team": Decimal(str(used_gi)) * GI})
    ok, message = admitted(pod_with(), policies, cluster)
    assert ok is (used_text is None)
    if used_text is not None:
        assert (
            f"tenant team has {used_text} of GPU memory admitted; this pod adds 8Gi, past its "
            "quota 32Gi x overcommit 2 = 64Gi" in message
        )
        assert "check gpuMemoryQuota" in message


def test_quota_counts_every_gpu_of_every_container(policies: PolicySet) -> None:
    """shared-big gives 2 GPUs with a 40Gi cap each: 80Gi against 32Gi x 1 in a roomy tenant."""
    spec = SPEC.replace("maxGpuMemoryPerPod: 64Gi, ", "")
    cluster = ClusterView(namespace_gpu_memory={"team": Decimal(0)})
    ok, message = admitted(pod_with("shared-big"), policies_from(spec), cluster)
    assert not ok
    assert "this pod adds 80Gi, past its quota 32Gi x overcommit 1 = 32Gi" in message


def test_quota_is_per_tenant(policies: PolicySet) -> None:
    """What the pods of another tenant's namespaces hold never counts, whatever they claim."""
    cluster = ClusterView(
        namespace_gpu_memory={"sharers": Decimal(1000 * GI), "picky": Decimal(1000 * GI)}
    )
    assert admitted(pod_with(), policies, cluster) == (True, "")


def test_quota_sums_every_namespace_of_the_tenant() -> None:
    spec = SPEC.replace("    namespaces: [team]\n", "    namespaces: [team, team-dev]\n")
    cluster = ClusterView(
        namespace_gpu_memory={"team": Decimal(30 * GI), "team-dev": Decimal(30 * GI)}
    )
    ok, message = admitted(pod_with(), policies_from(spec), cluster)
    assert not ok
    assert "tenant team has 60Gi of GPU memory admitted; this pod adds 8Gi" in message


# --- the mutator and validator agree -------------------------------------------------------


@pytest.mark.parametrize("namespace", [None, "tenant-a", "tenant-b", "carol", "no-tenant"])
@pytest.mark.parametrize("path", EXAMPLE_PODS, ids=[p.stem for p in EXAMPLE_PODS])
def test_validator_allows_what_the_mutator_produced(
    path: Any, namespace: str | None, default_policies: PolicySet
) -> None:
    cluster = ClusterView(
        namespace_labels={
            "tenant-a": {"app.kubernetes.io/part-of": "kubeflow-profile"},
            "tenant-b": {"app.kubernetes.io/part-of": "kubeflow-profile"},
            "carol": {"app.kubernetes.io/part-of": "kubeflow-profile"},
        }
    )
    result = admit(create(read_yaml(path), namespace), default_policies, cluster)
    assert result.allowed, result.validation.message
    # And the mutated pod, admitted again (reinvocation), is still allowed and unchanged.
    again = admit(create(dict(result.pod), namespace), default_policies, cluster)
    assert again.allowed and again.mutation.patch == ()


def test_validator_allows_mutated_pods_of_every_backend() -> None:
    from .test_backends import SPEC as BACKENDS

    policies = policies_from(BACKENDS)
    for profile in policies.profiles:
        pod = gpu_pod(namespace="team", labels={"gpuwarden.io/profile": profile})
        result = admit(create(pod), policies, CLUSTER)
        assert result.allowed, (profile, result.validation.message)


@pytest.mark.parametrize("namespace", ["team", "not-a-tenant"])
def test_forged_decision_annotations_on_an_ungoverned_pod_are_denied(
    policies: PolicySet, namespace: str
) -> None:
    """A CPU pod carrying another tenant's charge (issue: one tenant blocking another's GPUs)."""
    pod = gpu_pod(namespace=namespace, gpus=None)
    pod["metadata"]["annotations"] = {
        "gpuwarden.io/tenant": "other",
        "gpuwarden.io/gpu-memory-limit": "1Pi",
        "gpuwarden.io/containers": "main",
        "example.com/note": "kept",
    }
    decision = denial(pod, policies)
    assert (
        "metadata.annotations gpuwarden.io/containers, gpuwarden.io/gpu-memory-limit, "
        "gpuwarden.io/tenant: only gpuwarden writes these" in decision.message
    )
    assert "check annotations" in decision.message
    del pod["metadata"]["annotations"]["gpuwarden.io/tenant"]
    del pod["metadata"]["annotations"]["gpuwarden.io/gpu-memory-limit"]
    del pod["metadata"]["annotations"]["gpuwarden.io/containers"]
    assert admitted(pod, policies) == (True, "")
