"""Recognise Kubeflow workloads from the labels and annotations their controllers really set.

Sources (upstream constants; the comment above each constant below names its upstream file):
- Kubeflow Pipelines v2 on Argo: every pod of a v2 run carries ``pipelines.kubeflow.org/v2_component``
  (label and annotation, from the workflow's podMetadata) and Argo's ``workflows.argoproj.io/workflow``
  label and ``workflows.argoproj.io/node-name`` annotation. From KFP 2.17 each pod also carries the
  ``pipelines.kubeflow.org/runtime-role`` annotation: ``driver`` on drivers, ``launcher`` on both the
  executor that runs user code and the importer. User code runs in the Argo template
  ``system-container-impl`` (pod name ``<wf>-system-container-impl-<hash>``, or a ``retry-`` /
  ``metadata-N-M-`` variant) in the container ``main``; its node name is
  ``<wf>.root[.<sub-dag>...].<task>.executor``. Drivers (``system-container-driver``,
  ``system-dag-driver``, node ``...<task>-driver``) and importers (``system-importer``) are not user code.
- Training Operator v1: ``training.kubeflow.org/job-name``, ``/replica-type`` (lower case), ``/replica-index``,
  ``/operator-name`` (e.g. ``pytorchjob-controller``).
- Trainer v2: JobSet's ``jobset.sigs.k8s.io/jobset-name`` and ``jobset.sigs.k8s.io/replicatedjob-name``
  (``node``, ``dataset-initializer``, ``model-initializer``, ``launcher``); trainer container ``node``.
  The runtimes' ``trainer.kubeflow.org/trainjob-ancestor-step`` label never reaches a pod: it sits on
  the replicated job's Job template, which JobSet copies onto the Job only. The MPI launcher
  (DeepSpeed, MLX runtimes) trains too when the runtime sets ``runLauncherAsNode``; its container
  is then named ``node``.
- Katib: ``katib.kubeflow.org/trial`` and ``katib.kubeflow.org/experiment``, which Katib's own pod webhook
  copies onto trial pods. That webhook may run after ours: the chart sets ``reinvocationPolicy:
  IfNeeded``, so the API server calls gpuwarden again once the labels are there. Katib runs that
  webhook only in namespaces labelled for metrics-collector injection (see ``KATIB_INJECTION``).
- Notebooks: ``notebook-name`` and ``statefulset`` labels (pod owned by the Notebook's StatefulSet).
  Notebooks 2.0 Workspaces: ``notebooks.kubeflow.org/workspace-name`` and ``statefulset``; container ``main``.
- KServe: ``serving.kserve.io/inferenceservice`` and ``component: predictor``; container ``kserve-container``.
  LLMInferenceService model-server pods: ``app.kubernetes.io/part-of: llminferenceservice``, the
  service in ``app.kubernetes.io/name`` and an ``llminferenceservice-workload...`` component;
  container ``main``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuwarden.policy.pod.resources import annotations_of, containers, labels_of, metadata_of

# kubeflow/pipelines backend/src/v2/compiler/argocompiler/argo.go: the workflow's podMetadata.
KFP_V2_COMPONENT = "pipelines.kubeflow.org/v2_component"
# kubeflow/pipelines backend/src/common/util/consts.go (AnnotationKeyRuntimeRole), stamped on each
# compiled Argo template by backend/src/v2/compiler/argocompiler/common.go (setRuntimeRole); Argo
# copies template annotations onto the pod (argo-workflows workflow/controller/workflowpod.go,
# addMetadata). Present from KFP 2.17; older runs are told apart by node and pod names alone.
KFP_RUNTIME_ROLE = "pipelines.kubeflow.org/runtime-role"
# kubeflow/pipelines backend/src/common/util/execution_spec.go (ExecutionRuntimeRole): "driver" on
# the container and DAG drivers (argocompiler/container.go, dag.go), "launcher" on the executor
# that runs user code (system-container-impl, container.go) and on the importer (importer.go).
KFP_ROLE_DRIVER = "driver"
KFP_ROLE_LAUNCHER = "launcher"
# argo-workflows workflow/common/common.go: LabelKeyWorkflow, AnnotationKeyNodeName.
ARGO_WORKFLOW = "workflows.argoproj.io/workflow"
ARGO_NODE_NAME = "workflows.argoproj.io/node-name"
# kubeflow/trainer (branch release-1.9, the Training Operator v1)
# pkg/apis/kubeflow.org/v1/common_types.go: JobNameLabel, ReplicaTypeLabel, OperatorNameLabel.
TRAINING_JOB_NAME = "training.kubeflow.org/job-name"
TRAINING_REPLICA_TYPE = "training.kubeflow.org/replica-type"
TRAINING_OPERATOR_NAME = "training.kubeflow.org/operator-name"
# kubernetes-sigs/jobset pkg/controllers/jobset_controller.go (labelAndAnnotateObject): the only
# labels JobSet adds to a pod template; a replicated job's own Job template labels stay on the Job
# (constructJob), so Trainer's trainjob-ancestor-step label is not among a pod's labels.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
# kubeflow/trainer pkg/constants/constants.go: Node names the trainer's Job and container;
# Launcher names the MPI launcher Job, whose container is named Node when runLauncherAsNode is
# set, and then trains like a node (pkg/runtime/framework/plugins/mpi/mpi.go, isNode).
TRAINER_NODE = "node"
TRAINER_LAUNCHER = "launcher"
# kubeflow/katib pkg/controller.v1beta1/consts/const.go: LabelTrialName, LabelExperimentName.
KATIB_TRIAL = "katib.kubeflow.org/trial"
KATIB_EXPERIMENT = "katib.kubeflow.org/experiment"
# kubeflow/katib pkg/webhook/v1beta1/common/const.go (KatibMetricsCollectorInjection, value
# KatibMetricsCollectorInjectionEnabled): the namespaceSelector of Katib's pod webhook
# (manifests/v1beta1/components/webhook/webhooks.yaml), the webhook that copies the trial labels
# onto pods (pkg/webhook/v1beta1/pod/utils.go, mutatePodMetadata).
KATIB_INJECTION = "katib.kubeflow.org/metrics-collector-injection"
KATIB_INJECTION_ENABLED = "enabled"
# kubeflow/notebooks (branch notebooks-v1)
# components/notebook-controller/controllers/notebook_controller.go: the StatefulSet's pod labels.
NOTEBOOK_NAME = "notebook-name"
# kubeflow/notebooks (branch notebooks-v2) workspaces/controller/internal/controller/
# workspace_controller.go: workspaceNameLabel on the Workspace's StatefulSet pods, whose one
# container is workspacePodTemplateContainerName.
WORKSPACE_NAME = "notebooks.kubeflow.org/workspace-name"
WORKSPACE_CONTAINER = "main"
# kserve/kserve pkg/constants/constants.go: InferenceServiceLabel, KServiceComponentLabel.
KSERVE_ISVC = "serving.kserve.io/inferenceservice"
KSERVE_COMPONENT = "component"
# kserve/kserve pkg/constants/constants.go (KubernetesPartOfLabelKey, KubernetesAppNameLabelKey,
# KubernetesComponentLabelKey, LLMInferenceServicePartOfValue, LLMComponentWorkload...), set on
# the model-server pods by pkg/controller/v1alpha2/llmisvc/workload_single_node.go and
# workload_multi_node.go. Every model-server component starts with LLMComponentWorkload
# (-prefill, -worker, -leader, -worker-prefill, -leader-prefill); the router's scheduler and
# the tokenizer are other components. The model server's container is "main" in KServe's
# LLMInferenceServiceConfig templates (config/llmisvcconfig/config-llm-template.yaml).
K8S_PART_OF = "app.kubernetes.io/part-of"
K8S_NAME = "app.kubernetes.io/name"
K8S_COMPONENT = "app.kubernetes.io/component"
LLMISVC_PART_OF = "llminferenceservice"
LLMISVC_WORKLOAD_COMPONENT = "llminferenceservice-workload"
LLMISVC_CONTAINER = "main"

WorkloadKind = Literal[
    "kfp-step",
    "kfp-system",
    "training-job",
    "trainjob",
    "katib-trial",
    "notebook",
    "kserve-predictor",
]

# Default container per Training Operator job kind (upstream *DefaultContainerName constants).
_TRAINING_CONTAINERS = {
    "pytorchjob": "pytorch",
    "tfjob": "tensorflow",
    "mpijob": "mpi",
    "xgboostjob": "xgboost",
    "paddlejob": "paddle",
    "jaxjob": "jax",
}
# Sidecars that never get a GPU by default.
SIDECARS = frozenset(
    {"istio-proxy", "metrics-logger-and-collector", "metrics-collector", "wait", "queue-proxy"}
)
_KFP_SYSTEM_TEMPLATE = re.compile(r"-system-(container-driver|dag-driver|importer)(-|$)")
_KFP_IMPL_TEMPLATE = re.compile(r"-system-container-impl-")
_EXECUTOR_NODE = re.compile(r"^executor(\(\d+\))?$")


@dataclass(frozen=True)
class Workload:
    """What a pod is, as far as its own metadata tells."""

    kind: WorkloadKind
    name: str | None  # task, job, trainjob, trial, notebook or inference service name
    # replica type, replicated job, experiment, component, importer, or workspace (Notebooks 2.0)
    detail: str | None = None
    container: str | None = None  # the controller's main container, when it has a fixed name
    evidence: str = ""

    def describe(self) -> str:
        parts: list[str] = [self.kind]
        if self.name:
            parts.append(self.name)
        if self.detail:
            parts.append(f"({self.detail})")
        return " ".join(parts)


def _kfp(
    meta_labels: Mapping[str, str], annotations: Mapping[str, str], pod_name: str
) -> Workload | None:
    role = annotations.get(KFP_RUNTIME_ROLE)
    if KFP_V2_COMPONENT not in meta_labels and KFP_V2_COMPONENT not in annotations and not role:
        return None
    node_name = annotations.get(ARGO_NODE_NAME, "")
    segments = node_name.split(".") if node_name else []
    last = segments[-1] if segments else ""
    if role == KFP_ROLE_DRIVER:
        # The compiler's own word wins over any name. A step that claims it gains nothing: the
        # kfp-system matcher refuses every pod that asks for a GPU.
        evidence = f"{KFP_RUNTIME_ROLE}: {role} annotation, node {node_name or '?'}"
        return Workload("kfp-system", last or None, evidence=evidence)
    evidence = f"{KFP_V2_COMPONENT} label, node {node_name or '?'}"
    if role:
        evidence = f"{KFP_RUNTIME_ROLE}: {role} annotation, node {node_name or '?'}"
    if _EXECUTOR_NODE.match(last) or _KFP_IMPL_TEMPLATE.search(pod_name):
        task = segments[-2] if _EXECUTOR_NODE.match(last) and len(segments) >= 2 else None
        return Workload("kfp-step", task, container="main", evidence=evidence)
    if role == KFP_ROLE_LAUNCHER:
        # The launcher role without an executor node or pod name: the importer.
        return Workload("kfp-system", last or None, detail="importer", evidence=evidence)
    if last.endswith("-driver") or last == "root" or _KFP_SYSTEM_TEMPLATE.search(pod_name):
        return Workload("kfp-system", last or None, evidence=evidence)
    # An importer's node is named after its task; it has no executor segment either.
    return Workload("kfp-system", last or None, detail="importer or unknown", evidence=evidence)


def _trainjob(labels: Mapping[str, str], container_names: frozenset[str]) -> Workload:
    replicated = labels[JOBSET_REPLICATED_JOB]
    evidence = f"{JOBSET_REPLICATED_JOB} label"
    container = replicated
    if replicated == TRAINER_NODE:
        container = TRAINER_NODE
    elif replicated == TRAINER_LAUNCHER:
        if TRAINER_NODE in container_names:
            container = TRAINER_NODE
            evidence += f", container {TRAINER_NODE}: the launcher trains (runLauncherAsNode)"
        else:
            evidence += f", no container {TRAINER_NODE}: the launcher only starts mpirun"
    return Workload(
        "trainjob", labels.get(JOBSET_NAME), replicated, container=container, evidence=evidence
    )


def _llm_inference_service(labels: Mapping[str, str]) -> Workload | None:
    """A model-server pod of an LLMInferenceService; None for its router scheduler or tokenizer."""
    component = labels.get(K8S_COMPONENT, "")
    if not component.startswith(LLMISVC_WORKLOAD_COMPONENT):
        return None
    return Workload(
        "kserve-predictor",
        labels.get(K8S_NAME),
        component,
        container=LLMISVC_CONTAINER,
        evidence=f"{K8S_PART_OF}: {LLMISVC_PART_OF} label",
    )


def identify(
    pod: Mapping[str, Any],
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Workload | None:
    """The Kubeflow workload this pod belongs to, or None for any other pod.

    ``labels`` and ``annotations`` save reading them again where the caller already has them.
    """
    labels = labels_of(pod) if labels is None else labels
    annotations = annotations_of(pod) if annotations is None else annotations
    pod_name = str(metadata_of(pod).get("name") or metadata_of(pod).get("generateName") or "")
    if KATIB_TRIAL in labels:
        # Trial pods are also Jobs, PyTorchJobs or KFP runs underneath: the trial wins.
        return Workload(
            "katib-trial",
            labels[KATIB_TRIAL],
            labels.get(KATIB_EXPERIMENT),
            evidence=f"{KATIB_TRIAL} label",
        )
    kfp = _kfp(labels, annotations, pod_name)
    if kfp is not None:
        return kfp
    if TRAINING_JOB_NAME in labels:
        operator = labels.get(TRAINING_OPERATOR_NAME, "")
        job_kind = operator.removesuffix("-controller")
        return Workload(
            "training-job",
            labels[TRAINING_JOB_NAME],
            labels.get(TRAINING_REPLICA_TYPE),
            container=_TRAINING_CONTAINERS.get(job_kind),
            evidence=f"{TRAINING_JOB_NAME} label",
        )
    if JOBSET_REPLICATED_JOB in labels:
        return _trainjob(labels, frozenset(ref.name for ref in containers(pod, "containers")))
    if KSERVE_ISVC in labels:
        component = labels.get(KSERVE_COMPONENT)
        if component in (None, "predictor"):
            return Workload(
                "kserve-predictor",
                labels[KSERVE_ISVC],
                "predictor",
                container="kserve-container",
                evidence=f"{KSERVE_ISVC} label",
            )
        return None
    if labels.get(K8S_PART_OF) == LLMISVC_PART_OF:
        return _llm_inference_service(labels)
    if WORKSPACE_NAME in labels:
        return Workload(
            "notebook",
            labels[WORKSPACE_NAME],
            "workspace",
            container=WORKSPACE_CONTAINER,
            evidence=f"{WORKSPACE_NAME} label",
        )
    if NOTEBOOK_NAME in labels:
        return Workload(
            "notebook",
            labels[NOTEBOOK_NAME],
            container=labels[NOTEBOOK_NAME],
            evidence=f"{NOTEBOOK_NAME} label",
        )
    return None
