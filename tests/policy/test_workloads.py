"""Recognising Kubeflow workloads from the labels and annotations their controllers set."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.policy.pod.workloads import Workload, identify

from .support import example, gpu_pod

WF = "gpu-aware-training-x7k2p"


def kfp_pod(node_name: str | None, pod_name: str, *, label: bool = True) -> dict[str, Any]:
    """A KFP v2 pod as Argo creates it: the v2_component label/annotation and the node name."""
    annotations = {"pipelines.kubeflow.org/v2_component": "true"}
    if node_name is not None:
        annotations["workflows.argoproj.io/node-name"] = node_name
    labels = {"workflows.argoproj.io/workflow": WF}
    if label:
        labels["pipelines.kubeflow.org/v2_component"] = "true"
    return gpu_pod(pod_name, labels=labels, annotations=annotations)


@pytest.mark.parametrize(
    ("node_name", "task"),
    [
        (f"{WF}.root.train.executor", "train"),
        (f"{WF}.root.train.executor(1)", "train"),  # a retry of the executor
        (f"{WF}.root.train.executor(12)", "train"),
        (f"{WF}.root.outer-dag.inner-dag.train-model.executor", "train-model"),
        (f"{WF}.root.for-loop-2.iteration-item(0:1).evaluate.executor", "evaluate"),
    ],
)
def test_kfp_user_code_step_by_task_name(node_name: str, task: str) -> None:
    workload = identify(kfp_pod(node_name, f"{WF}-system-container-impl-2277833670"))
    assert workload == Workload(
        "kfp-step", task, container="main", evidence=workload.evidence if workload else ""
    )


def test_kfp_step_recognised_from_the_annotation_alone() -> None:
    pod = kfp_pod(f"{WF}.root.train.executor", f"{WF}-system-container-impl-1", label=False)
    workload = identify(pod)
    assert workload is not None
    assert (workload.kind, workload.name) == ("kfp-step", "train")


def test_kfp_impl_pod_without_node_name_is_a_step_of_unknown_task() -> None:
    workload = identify(kfp_pod(None, f"{WF}-system-container-impl-2277833670"))
    assert workload is not None
    assert (workload.kind, workload.name, workload.container) == ("kfp-step", None, "main")


@pytest.mark.parametrize(
    ("node_name", "pod_name"),
    [
        (f"{WF}.root.train-driver", f"{WF}-system-container-driver-1876543210"),
        (f"{WF}.root-driver", f"{WF}-system-dag-driver-123"),
        (f"{WF}.root.outer-dag-driver", f"{WF}-system-dag-driver-456"),
        (f"{WF}.root.importer", f"{WF}-system-importer-789"),
        (None, f"{WF}-system-importer-789"),
    ],
)
def test_kfp_drivers_and_importers_are_system_pods(node_name: str | None, pod_name: str) -> None:
    workload = identify(kfp_pod(node_name, pod_name))
    assert workload is not None
    assert workload.kind == "kfp-system"
    assert workload.container is None


def test_kfp_driver_example() -> None:
    workload = identify(example("kfp-driver"))
    assert workload is not None
    assert (workload.kind, workload.name) == ("kfp-system", "train-driver")


def test_kfp_step_example() -> None:
    workload = identify(example("kfp-train-step"))
    assert workload is not None
    assert (workload.kind, workload.name, workload.container) == ("kfp-step", "train", "main")


def test_argo_pod_without_kfp_labels_is_not_kubeflow() -> None:
    pod = gpu_pod(
        f"{WF}-system-container-impl-1",
        labels={"workflows.argoproj.io/workflow": WF},
        annotations={"workflows.argoproj.io/node-name": f"{WF}.root.train.executor"},
    )
    assert identify(pod) is None


@pytest.mark.parametrize(
    ("operator", "replica", "container"),
    [
        ("pytorchjob-controller", "master", "pytorch"),
        ("pytorchjob-controller", "worker", "pytorch"),
        ("tfjob-controller", "chief", "tensorflow"),
        ("tfjob-controller", "ps", "tensorflow"),
        ("mpijob-controller", "launcher", "mpi"),
        ("xgboostjob-controller", "worker", "xgboost"),
        ("paddlejob-controller", "worker", "paddle"),
        ("jaxjob-controller", "worker", "jax"),
        ("someday-controller", "worker", None),
    ],
)
def test_training_operator_replicas(operator: str, replica: str, container: str | None) -> None:
    pod = gpu_pod(
        "bert-finetune-worker-0",
        labels={
            "training.kubeflow.org/job-name": "bert-finetune",
            "training.kubeflow.org/operator-name": operator,
            "training.kubeflow.org/replica-index": "0",
            "training.kubeflow.org/replica-type": replica,
        },
    )
    workload = identify(pod)
    assert workload is not None
    assert (workload.kind, workload.name, workload.detail, workload.container) == (
        "training-job",
        "bert-finetune",
        replica,
        container,
    )


@pytest.mark.parametrize(
    ("replicated", "container"),
    [
        ("node", "node"),
        ("launcher", "node"),
        ("dataset-initializer", "dataset-initializer"),
        ("model-initializer", "model-initializer"),
    ],
)
def test_trainer_v2_replicated_jobs(replicated: str, container: str) -> None:
    pod = gpu_pod(
        "llama-sft-node-0-0-9xk2l",
        labels={
            "jobset.sigs.k8s.io/jobset-name": "llama-sft",
            "jobset.sigs.k8s.io/replicatedjob-name": replicated,
        },
        container=container,
    )
    workload = identify(pod)
    assert workload is not None
    assert (workload.kind, workload.name, workload.detail, workload.container) == (
        "trainjob",
        "llama-sft",
        replicated,
        container,
    )


def test_katib_trial_wins_over_the_job_underneath() -> None:
    """A trial running a PyTorchJob carries both label sets; it is governed as a trial."""
    pod = gpu_pod(
        "random-search-x9z4m2kt-master-0",
        labels={
            "katib.kubeflow.org/experiment": "random-search",
            "katib.kubeflow.org/trial": "random-search-x9z4m2kt",
            "training.kubeflow.org/job-name": "random-search-x9z4m2kt",
            "training.kubeflow.org/replica-type": "master",
        },
    )
    workload = identify(pod)
    assert workload is not None
    assert (workload.kind, workload.name, workload.detail) == (
        "katib-trial",
        "random-search-x9z4m2kt",
        "random-search",
    )


def test_katib_example_trial() -> None:
    workload = identify(example("katib-trial"))
    assert workload is not None
    assert (workload.kind, workload.detail) == ("katib-trial", "random-search")


def test_notebook() -> None:
    workload = identify(example("notebook"))
    assert workload is not None
    assert (workload.kind, workload.name, workload.container) == (
        "notebook",
        "alice-jupyter",
        "alice-jupyter",
    )


@pytest.mark.parametrize("component", ["predictor", None])
def test_kserve_predictor(component: str | None) -> None:
    labels = {"serving.kserve.io/inferenceservice": "llama-chat"}
    if component:
        labels["component"] = component
    workload = identify(gpu_pod("llama-chat-predictor-0", labels=labels))
    assert workload is not None
    assert (workload.kind, workload.name, workload.detail, workload.container) == (
        "kserve-predictor",
        "llama-chat",
        "predictor",
        "kserve-container",
    )


@pytest.mark.parametrize("component", ["transformer", "explainer"])
def test_kserve_transformer_and_explainer_are_not_predictors(component: str) -> None:
    labels = {"serving.kserve.io/inferenceservice": "llama-chat", "component": component}
    assert identify(gpu_pod("llama-chat-transformer-0", labels=labels)) is None


def test_plain_pod_is_not_kubeflow() -> None:
    assert identify(gpu_pod(labels={"app": "web"})) is None
    assert identify({"metadata": None, "spec": []}) is None


def test_describe_is_readable() -> None:
    assert Workload("training-job", "bert", "worker").describe() == "training-job bert (worker)"
    assert Workload("kfp-step", None).describe() == "kfp-step"
