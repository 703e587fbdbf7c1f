"""Scheduler backends: each turns a resolved profile into that project's real names."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.policy import ClusterView, PolicySet, mutate
from gpuwarden.policy.lint import lint_warnings
from gpuwarden.policy.pod.resources import GPU_RESOURCES
from gpuwarden.policy.spec.backends import plan_for
from gpuwarden.policy.spec.loader import PolicyError

from .support import apply_ops, container, create, gpu_pod, policies_from

SPEC = """
backend: {type: volcano, queue: default-queue}
profiles:
  - {name: vol-shared, maxMemory: 16Gi, overcommitRatio: 1.5, threadPercentage: 50}
  - {name: vol-whole, gpuShare: false, gpus: 4, maxMemory: 80Gi}
  - {name: vol-batch, gpuShare: false, preemptible: true, priority: 10}
  - {name: vol-nocap-cores, maxMemory: 8Gi, gpus: 2}
  - name: vol-whole-vgpu
    gpuShare: false
    gpus: 2
    backend: {type: volcano, wholeGpus: vgpu}
  - {name: hami-shared, maxMemory: 8Gi, overcommitRatio: 2.0, threadPercentage: 30, backend: hami}
  - {name: hami-whole, gpuShare: false, gpus: 2, backend: {type: hami}}
  - {name: mps-shared, maxMemory: 8Gi, threadPercentage: 25, backend: nvidia}
  - {name: mps-two, maxMemory: 10Gi, gpus: 2, backend: nvidia}
  - name: mps-renamed
    maxMemory: 4Gi
    backend: {type: nvidia, sharedResourceName: nvidia.com/gpu.shared}
  - {name: mps-whole, gpuShare: false, gpus: 2, backend: nvidia}
  - {name: native-whole, gpuShare: false, gpus: 2, backend: native}
  - {name: native-shared, maxMemory: 8Gi, backend: native}
tenants:
  - {name: team, namespaces: [team], queue: team-queue}
  - {name: other, namespaces: [other]}
"""


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return policies_from(SPEC)


def governed(policies: PolicySet, profile: str, namespace: str = "team") -> dict[str, Any]:
    pod = gpu_pod(namespace=namespace, labels={"gpuwarden.io/profile": profile})
    decision = mutate(create(pod), policies, ClusterView())
    assert decision.allowed and decision.patch
    return apply_ops(pod, decision)


@pytest.mark.parametrize(
    ("profile", "resources", "scheduler"),
    [
        (
            # On nodes where only the volcano-vgpu device plugin runs, whole GPUs are vGPUs that
            # take all of a device's cores; naming no memory gives all of its memory, and the
            # plugin advertises no vgpu-memory-percentage that a request for one could fit.
            "vol-whole-vgpu",
            {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-cores": "100"},
            "volcano",
        ),
        (
            "vol-shared",
            {
                "volcano.sh/vgpu-number": "1",
                # The request is HAMi-core's enforced cap: maxMemory, whatever the ratio.
                "volcano.sh/vgpu-memory": str(16 * 1024),
                "volcano.sh/vgpu-cores": "50",
            },
            "volcano",
        ),
        ("vol-whole", {"nvidia.com/gpu": "4"}, "volcano"),
        (
            "vol-nocap-cores",
            {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "8192"},
            "volcano",
        ),
        (
            "hami-shared",
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "30"},
            "hami-scheduler",
        ),
        (
            "hami-whole",
            {
                "nvidia.com/gpu": "2",
                "nvidia.com/gpumem-percentage": "100",
                "nvidia.com/gpucores": "100",
            },
            "hami-scheduler",
        ),
        ("mps-shared", {"nvidia.com/gpu": "1"}, None),
        ("mps-renamed", {"nvidia.com/gpu.shared": "1"}, None),
        ("mps-whole", {"nvidia.com/gpu": "2"}, None),
        ("native-whole", {"nvidia.com/gpu": "2"}, None),
        ("native-shared", {"nvidia.com/gpu": "1"}, None),
    ],
)
def test_backend_resources_and_scheduler(
    policies: PolicySet, profile: str, resources: dict[str, str], scheduler: str | None
) -> None:
    pod = governed(policies, profile)
    main = container(pod, "main")
    gpu = {k: v for k, v in main["resources"]["limits"].items() if k in GPU_RESOURCES}
    assert gpu == resources
    # Extended resources cannot be overcommitted: the request equals the limit.
    assert {k: main["resources"]["requests"][k] for k in gpu} == resources
    assert pod["spec"].get("schedulerName") == scheduler


def test_volcano_queue_comes_from_the_tenant_then_the_backend(policies: PolicySet) -> None:
    queue = "scheduling.volcano.sh/queue-name"
    assert governed(policies, "vol-shared")["metadata"]["annotations"][queue] == "team-queue"
    assert governed(policies, "vol-shared", "other")["metadata"]["annotations"][queue] == (
        "default-queue"
    )


def test_volcano_preemptable_annotation(policies: PolicySet) -> None:
    batch = governed(policies, "vol-batch")
    assert batch["metadata"]["annotations"]["volcano.sh/preemptable"] == "true"
    assert batch["spec"]["preemptionPolicy"] == "Never"
    # Volcano reads a pod without the annotation as preemptable, so "false" is written.
    whole = governed(policies, "vol-whole")["metadata"]["annotations"]
    assert whole["volcano.sh/preemptable"] == "false"


def test_volcano_preemptable_annotation_set_by_the_user_is_replaced(policies: PolicySet) -> None:
    pod = gpu_pod(
        namespace="team",
        labels={"gpuwarden.io/profile": "vol-whole"},
        annotations={"volcano.sh/preemptable": "true"},
    )
    decision = mutate(create(pod), policies, ClusterView())
    assert apply_ops(pod, decision)["metadata"]["annotations"]["volcano.sh/preemptable"] == (
        "false"
    )


def test_a_gang_scheduled_pod_is_told_where_its_queue_is_set(policies: PolicySet) -> None:
    """Volcano takes a gang member's queue from its PodGroup, which the job controller made."""
    pod = gpu_pod(
        namespace="team",
        labels={"gpuwarden.io/profile": "vol-whole"},
        annotations={"scheduling.k8s.io/group-name": "resnet"},
    )
    decision = mutate(create(pod), policies, ClusterView())
    assert (
        "gpuwarden: Volcano queues this pod by its PodGroup resnet: set the job's "
        "runPolicy.schedulingPolicy.queue to team-queue"
    ) in decision.warnings
    alone = mutate(
        create(gpu_pod(labels={"gpuwarden.io/profile": "vol-whole"})), policies, ClusterView()
    )
    assert not [w for w in alone.warnings if "PodGroup" in w]


def test_only_volcano_writes_volcano_annotations(policies: PolicySet) -> None:
    for profile in ("hami-shared", "mps-shared", "native-whole"):
        annotations = governed(policies, profile)["metadata"]["annotations"]
        assert not [key for key in annotations if "volcano" in key], profile


@pytest.mark.parametrize(
    ("profile", "env"),
    [
        (
            "mps-shared",
            {
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
            },
        ),
        ("mps-two", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M,1=10240M"}),
        ("mps-renamed", {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}),
        ("mps-whole", {}),
        ("vol-shared", {}),
        ("hami-shared", {}),
        ("native-shared", {}),
    ],
)
def test_mps_client_environment(policies: PolicySet, profile: str, env: dict[str, str]) -> None:
    main = container(governed(policies, profile), "main")
    assert {e["name"]: e["value"] for e in main.get("env", [])} == env


def test_mps_env_overwrites_a_user_value_in_place(policies: PolicySet) -> None:
    pod = gpu_pod(
        namespace="team",
        labels={"gpuwarden.io/profile": "mps-shared"},
        extra={
            "env": [
                {"name": "A", "value": "1"},
                {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
            ]
        },
    )
    out = apply_ops(pod, mutate(create(pod), policies, ClusterView()))
    assert container(out, "main")["env"] == [
        {"name": "A", "value": "1"},
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "25"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=8192M"},
    ]


def test_native_backend_warns_that_it_cannot_share(policies: PolicySet) -> None:
    pod = gpu_pod(namespace="team", labels={"gpuwarden.io/profile": "native-shared"})
    decision = mutate(create(pod), policies, ClusterView())
    assert "gpuwarden: the native backend cannot share GPUs, so the pod gets whole GPUs" in (
        decision.warnings
    )


@pytest.mark.parametrize(
    "profile",
    [
        "vol-shared",
        "vol-whole",
        "hami-shared",
        "hami-whole",
        "mps-shared",
        "mps-renamed",
        "native-whole",
    ],
)
def test_backend_replaces_every_foreign_gpu_resource(policies: PolicySet, profile: str) -> None:
    """Whatever GPU resources the pod asked for, the container keeps only its backend's."""
    pod = gpu_pod(namespace="team", labels={"gpuwarden.io/profile": profile})
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "1", "volcano.sh/vgpu-memory": "1", "cpu": "2"},
        "requests": {"nvidia.com/gpumem": "99", "nvidia.com/mig-1g.5gb": "1", "cpu": "1"},
    }
    out = apply_ops(pod, mutate(create(pod), policies, ClusterView()))
    resources = container(out, "main")["resources"]
    expected = container(governed(policies, profile), "main")["resources"]
    for section in ("limits", "requests"):
        mine = {k: v for k, v in resources[section].items() if k != "cpu"}
        assert mine == expected[section]
    assert (resources["limits"]["cpu"], resources["requests"]["cpu"]) == ("2", "1")


def test_plan_for_every_backend_sets_equal_requests_and_limits(policies: PolicySet) -> None:
    for name in policies.profiles:
        plan = plan_for(policies.resolve(name, policies.tenants[0]))
        assert plan.resources, name
        assert all(isinstance(value, str) and value.isdigit() for value in plan.resources.values())


def test_profile_backend_shorthand_is_accepted() -> None:
    policies = policies_from("profiles: [{name: a, maxMemory: 1Gi, backend: hami}]")
    assert policies.resolve("a", None).backend.type == "hami"


def test_every_backend_records_the_decision_for_the_node_agent(policies: PolicySet) -> None:
    for profile, shared in (("vol-shared", "true"), ("hami-whole", "false"), ("mps-two", "true")):
        annotations = governed(policies, profile)["metadata"]["annotations"]
        assert annotations["gpuwarden.io/profile"] == profile
        assert annotations["gpuwarden.io/tenant"] == "team"
        assert annotations["gpuwarden.io/gpu-shared"] == shared
        assert annotations["gpuwarden.io/containers"] == "main"
    mps = governed(policies, "mps-shared")["metadata"]["annotations"]
    assert mps["gpuwarden.io/gpu-memory-limit"] == "8Gi"
    assert mps["gpuwarden.io/mps-thread-percentage"] == "25"
    assert mps["gpuwarden.io/backend"] == "nvidia"
    hami = governed(policies, "hami-shared")["metadata"]["annotations"]
    assert (hami["gpuwarden.io/gpu-memory-reserved"], hami["gpuwarden.io/overcommit-ratio"]) == (
        "4Gi",
        "2",
    )


GPU_TYPES_SPEC = """
profiles:
  - {name: vol-a100, maxMemory: 8Gi, gpuTypes: [A100, H100]}
  - {name: vol-whole-a100, gpuShare: false, gpuTypes: [A100]}
  - {name: hami-h100, gpuShare: false, gpuTypes: [H100], backend: hami}
  - {name: mps-h100, maxMemory: 8Gi, gpuTypes: [H100], backend: nvidia}
tenants: [{name: team, namespaces: [team]}]
"""


def test_gpu_types_become_use_gputype_where_the_scheduler_reads_it() -> None:
    policies = policies_from(GPU_TYPES_SPEC)
    use = "nvidia.com/use-gputype"
    assert governed(policies, "vol-a100")["metadata"]["annotations"][use] == "A100,H100"
    assert governed(policies, "hami-h100")["metadata"]["annotations"][use] == "H100"
    # Whole GPUs through NVIDIA's device plugin and MPS replicas: nothing reads it.
    for profile in ("vol-whole-a100", "mps-h100"):
        assert use not in governed(policies, profile)["metadata"]["annotations"], profile
    warnings = lint_warnings(policies)
    for profile in ("vol-whole-a100", "mps-h100"):
        assert any(
            w.startswith(f"profile {profile}: gpuTypes has no effect")
            and "nvidia.com/gpu.product" in w
            for w in warnings
        ), profile
    assert not [w for w in warnings if w.startswith("profile vol-a100: gpuTypes")]


def test_a_gpu_type_the_user_chose_is_replaced_with_a_warning() -> None:
    policies = policies_from(GPU_TYPES_SPEC)
    pod = gpu_pod(
        labels={"gpuwarden.io/profile": "hami-h100"},
        annotations={"nvidia.com/use-gputype": "T4"},
    )
    decision = mutate(create(pod), policies, ClusterView())
    assert apply_ops(pod, decision)["metadata"]["annotations"]["nvidia.com/use-gputype"] == "H100"
    assert "gpuwarden: nvidia.com/use-gputype: T4 replaced by H100 (profile hami-h100)" in (
        decision.warnings
    )


def test_a_gpu_type_with_a_comma_is_refused_at_load() -> None:
    with pytest.raises(PolicyError, match="gpuTypes"):
        policies_from("profiles: [{name: a, gpuTypes: ['A100,H100']}]")
