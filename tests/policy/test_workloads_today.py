"""Kubeflow workloads as today's controllers create them: KFP 2.17's runtime-role annotation,
Trainer v2's MPI launcher, Notebooks 2.0 Workspaces and KServe LLMInferenceServices."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.policy import ClusterView, PolicySet, admit, mutate
from gpuwarden.policy.pod.resources import annotations_of, labels_of
from gpuwarden.policy.pod.workloads import identify
from gpuwarden.policy.spec.matchers import PodFacts, match
from gpuwarden.policy.spec.model import KservePredictorMatch, TrainJobMatch

from .support import apply_ops, container, create, example, gpu_pod

WF = "gpu-aware-training-x7k2p"
IMPL_POD = f"{WF}-system-container-impl-2277833670"


def kfp_pod(
    role: str | None, node_name: str | None, pod_name: str, *, gpus: str | None = None
) -> dict[str, Any]:
    """A KFP 2.17 pod: the template's runtime role beside the v2_component label and node name."""
    annotations = {"pipelines.kubeflow.org/v2_component": "true"}
    if role is not None:
        annotations["pipelines.kubeflow.org/runtime-role"] = role
    if node_name is not None:
        annotations["workflows.argoproj.io/node-name"] = node_name
    labels = {"pipelines.kubeflow.org/v2_component": "true", "workflows.argoproj.io/workflow": WF}
    return gpu_pod(pod_name, "tenant-a", labels=labels, annotations=annotations, gpus=gpus)


def kind_and_name(pod: dict[str, Any]) -> tuple[str, str | None] | None:
    workload = identify(pod)
    return None if workload is None else (workload.kind, workload.name)


# --- Kubeflow Pipelines: pipelines.kubeflow.org/runtime-role ------------------------------


@pytest.mark.parametrize(
    ("node_name", "pod_name"),
    [
        (f"{WF}.root.train-driver", f"{WF}-system-container-driver-1876543210"),
        (f"{WF}.root-driver", f"{WF}-system-dag-driver-123"),
        (None, "anything"),
        # The role is read before any name: a pod named like user code is still a driver.
        (f"{WF}.root.train.executor", IMPL_POD),
    ],
)
def test_driver_role_is_a_system_pod_whatever_its_names(
    node_name: str | None, pod_name: str
) -> None:
    workload = identify(kfp_pod("driver", node_name, pod_name))
    assert workload is not None
    assert workload.kind == "kfp-system"
    assert workload.container is None
    assert "pipelines.kubeflow.org/runtime-role: driver" in workload.evidence


def test_driver_role_alone_marks_a_kfp_pod() -> None:
    pod = gpu_pod(annotations={"pipelines.kubeflow.org/runtime-role": "driver"}, gpus=None)
    assert kind_and_name(pod) == ("kfp-system", None)


def test_launcher_role_with_an_executor_node_is_the_users_step() -> None:
    pod = kfp_pod("launcher", f"{WF}.root.train.executor", IMPL_POD)
    workload = identify(pod)
    assert workload is not None
    assert (workload.kind, workload.name, workload.container) == ("kfp-step", "train", "main")


@pytest.mark.parametrize(
    ("node_name", "pod_name"),
    [
        (f"{WF}.root.importer", f"{WF}-system-importer-789"),
        (f"{WF}.root.importer", f"{WF}-system-importer-workspace-789"),
        (None, f"{WF}-2468"),  # Argo's v1 pod names carry no template name
    ],
)
def test_launcher_role_without_executor_is_the_importer(
    node_name: str | None, pod_name: str
) -> None:
    workload = identify(kfp_pod("launcher", node_name, pod_name))
    assert workload is not None
    assert (workload.kind, workload.detail) == ("kfp-system", "importer")


def test_an_unknown_role_falls_back_to_names() -> None:
    assert kind_and_name(kfp_pod("someday", f"{WF}.root.train.executor", IMPL_POD)) == (
        "kfp-step",
        "train",
    )


def test_a_real_driver_is_left_untouched(default_policies: PolicySet, cluster: ClusterView) -> None:
    pod = kfp_pod("driver", f"{WF}.root.train-driver", f"{WF}-system-container-driver-1")
    decision = mutate(create(pod), default_policies, cluster)
    assert (decision.allowed, decision.patch, decision.profile) == (True, (), None)


def test_a_step_claiming_the_driver_role_gets_no_skip(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """Within its tenant's limits it is governed like any pod asking for a GPU, never skipped."""
    pod = kfp_pod("driver", f"{WF}.root.train.executor", IMPL_POD, gpus="1")
    result = admit(create(pod), default_policies, cluster)
    assert result.allowed
    assert result.mutation.profile == "light-training"
    limits = container(dict(result.pod), "main")["resources"]["limits"]
    assert (limits.get("nvidia.com/gpu"), limits["volcano.sh/vgpu-number"]) == (None, "1")


def test_a_step_claiming_the_driver_role_is_held_to_its_tenants_limit(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = kfp_pod("driver", f"{WF}.root.train.executor", IMPL_POD, gpus="8")
    result = admit(create(pod, "tenant-b"), default_policies, cluster)
    assert not result.allowed
    assert "tenant tenant-b allows at most 2 per pod" in result.validation.message


def test_a_launcher_role_step_gets_its_task_profile(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = kfp_pod("launcher", f"{WF}.root.train.executor", IMPL_POD, gpus="1")
    decision = mutate(create(pod), default_policies, cluster)
    assert decision.profile == "kfp-training"
    limits = container(apply_ops(pod, decision), "main")["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8"  # tenant-a's kfp-training override


# --- Trainer v2: the MPI launcher ----------------------------------------------------------


def launcher_pod(container_name: str, gpus: str | None) -> dict[str, Any]:
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "gpt-ds",
        "jobset.sigs.k8s.io/replicatedjob-name": "launcher",
    }
    return gpu_pod(
        "gpt-ds-launcher-0-0-7hq4c", "tenant-b", labels=labels, gpus=gpus, container=container_name
    )


def test_launcher_that_trains_names_the_node_container() -> None:
    workload = identify(example("trainjob-launcher"))
    assert workload is not None
    assert (workload.kind, workload.name, workload.detail, workload.container) == (
        "trainjob",
        "gpt-ds",
        "launcher",
        "node",
    )
    assert "runLauncherAsNode" in workload.evidence


def test_launcher_that_only_starts_mpirun_names_its_own_container() -> None:
    workload = identify(launcher_pod("launcher", gpus=None))
    assert workload is not None
    assert (workload.detail, workload.container) == ("launcher", "launcher")


def test_the_default_policy_gives_a_training_launcher_what_nodes_get(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    node = mutate(create(example("trainjob-node")), default_policies, cluster)
    launcher = mutate(create(example("trainjob-launcher")), default_policies, cluster)
    assert (launcher.profile, launcher.rule) == (node.profile, node.rule)
    assert launcher.profile == "heavy-training"
    limits = container(apply_ops(example("trainjob-launcher"), launcher), "node")["resources"]
    assert limits["limits"] == {"nvidia.com/gpu": "1"}


def test_a_launcher_without_gpu_is_left_untouched(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    decision = mutate(create(launcher_pod("launcher", gpus=None)), default_policies, cluster)
    assert (decision.allowed, decision.patch, decision.profile) == (True, (), None)


def test_the_trainjob_matcher_default_still_wants_node_only() -> None:
    pod = example("trainjob-launcher")
    facts = PodFacts("tenant-b", {}, labels_of(pod), annotations_of(pod), identify(pod))
    result = match(TrainJobMatch(), facts)
    assert not result.matched
    assert result.reason == "replicated job launcher is not in ['node']"


# --- Notebooks 2.0 Workspaces --------------------------------------------------------------


def test_workspace_is_a_notebook() -> None:
    workload = identify(example("workspace"))
    assert workload is not None
    assert (workload.kind, workload.name, workload.detail, workload.container) == (
        "notebook",
        "alice-lab",
        "workspace",
        "main",
    )
    assert workload.describe() == "notebook alice-lab (workspace)"


def test_workspace_shares_a_gpu_like_a_notebook(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    decision = mutate(create(example("workspace")), default_policies, cluster)
    assert (decision.profile, decision.rule) == ("notebook", "rule/notebooks")
    limits = container(apply_ops(example("workspace"), decision), "main")["resources"]["limits"]
    assert (limits.get("nvidia.com/gpu"), limits["volcano.sh/vgpu-number"]) == (None, "1")
    assert limits["volcano.sh/vgpu-cores"] == "20"


def test_a_cpu_only_workspace_keeps_no_gpu(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("workspace")
    del pod["spec"]["containers"][0]["resources"]["limits"]
    decision = mutate(create(pod), default_policies, cluster)
    assert (decision.allowed, decision.patch, decision.profile) == (True, (), None)


# --- KServe LLMInferenceService ------------------------------------------------------------


def llmisvc_pod(component: str) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/name": "qwen-chat",
        "app.kubernetes.io/part-of": "llminferenceservice",
    }
    return gpu_pod("qwen-chat-kserve-0", "tenant-b", labels=labels)


@pytest.mark.parametrize(
    "component",
    [
        "llminferenceservice-workload",
        "llminferenceservice-workload-prefill",
        "llminferenceservice-workload-worker",
        "llminferenceservice-workload-leader",
        "llminferenceservice-workload-worker-prefill",
        "llminferenceservice-workload-leader-prefill",
    ],
)
def test_llm_inference_service_model_servers_are_predictors(component: str) -> None:
    workload = identify(llmisvc_pod(component))
    assert workload is not None
    assert (workload.kind, workload.name, workload.detail, workload.container) == (
        "kserve-predictor",
        "qwen-chat",
        component,
        "main",
    )


@pytest.mark.parametrize(
    "component", ["llminferenceservice-router-scheduler", "tokenizer", "inference", None]
)
def test_llm_inference_service_scheduler_and_tokenizer_are_not_predictors(
    component: str | None,
) -> None:
    pod = llmisvc_pod(component or "")
    if component is None:
        del pod["metadata"]["labels"]["app.kubernetes.io/component"]
    assert identify(pod) is None


def test_part_of_label_of_another_app_is_not_kubeflow() -> None:
    labels = {
        "app.kubernetes.io/component": "llminferenceservice-workload",
        "app.kubernetes.io/part-of": "my-shop",
    }
    assert identify(gpu_pod(labels=labels)) is None


@pytest.mark.parametrize(
    ("services", "expected"), [([], True), (["qwen-*"], True), (["llama"], False)]
)
def test_inference_service_names_match_llm_inference_services(
    services: list[str], expected: bool
) -> None:
    pod = example("llminferenceservice")
    facts = PodFacts("tenant-b", {}, labels_of(pod), annotations_of(pod), identify(pod))
    rule = KservePredictorMatch(inference_services=tuple(services))
    assert match(rule, facts).matched is expected


def test_llm_inference_service_keeps_whole_gpus_at_serving_priority(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("llminferenceservice")
    result = admit(create(pod), default_policies, cluster)
    assert result.allowed
    assert (result.mutation.profile, result.mutation.rule) == (
        "inference-whole",
        "rule/llm-model-servers",
    )
    patched = dict(result.pod)
    assert patched["spec"]["priority"] == 300
    assert container(patched, "main")["resources"]["limits"]["nvidia.com/gpu"] == "1"
