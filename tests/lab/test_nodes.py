"""The lab's simulated GPU nodes and KWOK stages, as objects (the lab suite runs them)."""

from __future__ import annotations

from gpuwarden.lab.cluster.nodes import GpuNodePool, Taint
from gpuwarden.lab.cluster.stages import COMPLETE_AFTER, WORK_DONE, go_duration, lab_stages
from gpuwarden.lab.inputs.workloads import WORKLOAD_KINDS, workload_pod
from gpuwarden.policy.pod.workloads import identify


def test_an_mps_node_advertises_its_replicas_as_the_device_plugin_does() -> None:
    pool = GpuNodePool("mps", count=2, gpus_per_node=8, mps_replicas=4, rename_shared=True)
    node = pool.manifests()[1]
    assert node["metadata"]["name"] == "mps-1"
    assert node["status"]["allocatable"]["nvidia.com/gpu.shared"] == "32"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    labels = node["metadata"]["labels"]
    # GFD appends -SHARED only where the replicas keep the name nvidia.com/gpu.
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.count"]) == ("4", "8")
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}


def test_gfd_marks_the_product_shared_only_where_replicas_keep_the_gpu_name() -> None:
    """internal/lm/resource.go (getProductName) in NVIDIA/k8s-device-plugin."""
    renamed = GpuNodePool("renamed", 1, 8, mps_replicas=4, rename_shared=True)
    unrenamed = GpuNodePool("unrenamed", 1, 8, mps_replicas=4)
    whole = GpuNodePool("whole", 1, 8)
    products = {
        pool.name: pool.manifests()[0]["metadata"]["labels"]["nvidia.com/gpu.product"]
        for pool in (renamed, unrenamed, whole)
    }
    assert products == {
        "renamed": "NVIDIA-H100-80GB-HBM3",
        "unrenamed": "NVIDIA-H100-80GB-HBM3-SHARED",
        "whole": "NVIDIA-H100-80GB-HBM3",
    }
    assert unrenamed.manifests()[0]["status"]["allocatable"]["nvidia.com/gpu"] == "32"
    # A workload that names its product may land on every one of them, as on a real cluster.
    pod = workload_pod(
        "katib-trial",
        name="t",
        namespace="n",
        workload="hpo",
        gpus=1,
        products=["NVIDIA-H100-80GB-HBM3"],
    )
    required = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    ((expression,),) = [term["matchExpressions"] for term in required["nodeSelectorTerms"]]
    assert expression["key"] == "nvidia.com/gpu.product" and expression["operator"] == "In"
    assert set(products.values()) <= set(expression["values"])


def test_a_whole_gpu_node_with_a_tenant_taint() -> None:
    pool = GpuNodePool(
        "team", 1, 4, labels={"pool": "team-a"}, taints=(Taint("dedicated", "team-a"),)
    )
    (node,) = pool.manifests()
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "none"
    assert node["spec"]["taints"] == [
        {"key": "dedicated", "value": "team-a", "effect": "NoSchedule"}
    ]


def test_pods_complete_after_their_duration_only_when_they_have_one() -> None:
    complete = next(s for s in lab_stages() if s["metadata"]["name"] == "lab-pod-complete")
    keys = [e["key"] for e in complete["spec"]["selector"]["matchExpressions"]]
    assert f'.metadata.annotations["{COMPLETE_AFTER}"]' in keys
    assert go_duration(1.25) == "1250ms"
    timed = workload_pod(
        "katib-trial", name="t", namespace="n", workload="hpo", gpus=1, runs_for=90
    )
    assert timed["metadata"]["annotations"][COMPLETE_AFTER] == "90000ms"
    server = workload_pod("kserve-predictor", name="p", namespace="n", workload="chat", gpus=1)
    assert COMPLETE_AFTER not in server["metadata"]["annotations"]


def test_each_workload_kind_is_recognised_as_that_kind_by_the_policy_core() -> None:
    for kind in WORKLOAD_KINDS:
        pod = workload_pod(kind, name="x-1", namespace="n", workload="train", gpus=2)
        found = identify(pod)
        assert found is not None and found.kind == kind, kind
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        if found.container is not None:
            assert container["name"] == found.container, kind


def test_a_running_pod_the_replay_marks_done_turns_succeeded() -> None:
    (stage,) = [s for s in lab_stages() if s["metadata"]["name"] == "lab-pod-work-done"]
    selector = {e["key"]: e for e in stage["spec"]["selector"]["matchExpressions"]}
    assert selector[".status.phase"]["values"] == ["Running"]
    assert selector[f'.metadata.annotations["{WORK_DONE}"]']["operator"] == "Exists"
    assert "phase: Succeeded" in stage["spec"]["next"]["statusTemplate"]
