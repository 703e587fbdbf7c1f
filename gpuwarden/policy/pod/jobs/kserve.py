"""KServe: InferenceServices (``serving.kserve.io/v1beta1``) and LLMInferenceServices
(``serving.kserve.io/v1alpha1`` and ``v1alpha2``), read as the pods their controllers create.

Neither holds a pod template at a fixed path: a component's pod is built from the object's own
fields, and each replica says where the pod's fields sit in it (:attr:`ReplicaTemplate.twins`),
so the admission layer writes a pod's patch back onto those fields.

Sources: kserve/kserve at v0.20.0-rc0-104 (commit aaac4e2).

InferenceService
- A component (``spec.predictor``, ``spec.transformer``, ``spec.explainer``) is a PodSpec inline
  with KServe's own fields beside it (pkg/apis/serving/v1beta1/predictor.go PredictorSpec,
  transformer.go, explainer.go, component.go ComponentExtensionSpec). The predictor's model
  shorthand ``model`` (predictor_model.go ModelSpec) and the framework shorthands ``sklearn``,
  ``pytorch``, ... (which KServe's defaulter turns into ``model``:
  inference_service_defaults.go, setPredictorModelDefaults) hold one container's fields inline
  (PredictorExtensionSpec) beside ``modelFormat``, ``runtime``, ``storageUri`` and the like.
- The predictor's pod (pkg/controller/v1beta1/inferenceservice/components/predictor.go,
  buildPredictorResources, buildPodSpec): with a model, its container ``kserve-container`` is the
  ServingRuntime's merged with the model's fields (utils.MergeServingRuntimeAndInferenceServiceSpecs,
  the model's fields winning), followed by the predictor's ``transformer-container`` and its
  other containers; without one, the predictor's containers as written. The pod's labels are the
  ServingRuntime's, the object's, the predictor's ``labels``, then
  ``serving.kserve.io/inferenceservice: <name>`` and ``component: predictor`` (buildObjectMeta);
  its annotations the object's (less the configured disallowed list), then the predictor's
  ``annotations``. In Standard (raw deployment) mode a Deployment ``<name>-predictor`` makes the
  pods, labelled ``app: isvc.<name>-predictor`` too; in Knative mode a Knative Service does.
  ``spec.predictor.workerSpec`` (multi-node, Standard mode) is the worker pods' PodSpec
  (reconcileWorker: the same labels).
- What the ServingRuntime adds (its image, args, and resources the model container does not set),
  what KServe's pod webhook adds (pkg/webhook/admission/pod/: the storage initializer, the agent,
  the logger) and the ``isvc.generation`` label are not read here: they are cluster lookups or ask
  no GPU. The pod webhook decides each pod with them.
- Knative mode copies the component's PodSpec into a Knative Service, whose webhook refuses pod
  fields such as ``schedulerName``, ``priorityClassName``, ``nodeSelector`` and ``tolerations``
  unless the cluster turned on Knative's feature flags (knative/serving pkg/apis/serving/
  fieldmask.go, PodSpecMask): an InferenceService in Knative mode is therefore judged but kept
  as written, and the pod webhook gives each pod what it gets. ModelMesh mode's pods are shared
  by many InferenceServices and are decided as pods only.

LLMInferenceService (pkg/apis/serving/v1alpha2/llm_inference_service_types.go; v1alpha1 has the
same fields)
- ``spec.template`` and ``spec.worker`` are PodSpecs (WorkloadSpec), as are
  ``spec.prefill.template`` and ``spec.prefill.worker``; ``spec.labels`` and ``spec.annotations``
  (``spec.prefill.*`` for the prefill pods) go onto their pods.
- pkg/controller/v1alpha2/llmisvc/workload_single_node.go: without a worker, ``spec.template``
  becomes the Deployment ``<name>-kserve`` (``<name>-kserve-prefill`` for the prefill), its pods
  labelled ``app.kubernetes.io/component: llminferenceservice-workload`` (``-prefill``),
  ``app.kubernetes.io/name: <name>``, ``app.kubernetes.io/part-of: llminferenceservice``,
  ``kserve.io/component: workload`` and ``llm-d.ai/role`` (``both`` without a prefill, else
  ``decode``; ``prefill``); propagateDeploymentMetadata copies the object's labels and
  annotations with approved prefixes (Kueue's, ``prometheus.io``, ...).
  workload_multi_node.go: with a worker, a LeaderWorkerSet ``<name>-kserve-mn``
  (``-mn-prefill``) whose leader is ``spec.template`` (component ``...-workload-leader``) and
  whose workers are ``spec.worker`` (``...-workload-worker``; the InferencePool's labels too when
  there is no leader template).
- The LLMInferenceServiceConfig templates the controller merges underneath (``baseRefs`` and the
  well-known configs: the image, the ``main`` container's command) are cluster lookups and not
  read: a workload without a template of its own is decided pod by pod.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.policy.pod.jobs.base import (
    JobKind,
    JobShapeError,
    ReplicaTemplate,
    TemplateSite,
    metadata_of,
    name_of,
    object_at,
    string_map,
    whole_number,
)
from gpuwarden.policy.pod.pointer import pointer

GROUP = "serving.kserve.io"
# pkg/constants/constants.go
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # InferenceServicePodLabelKey
COMPONENT_LABEL = "component"  # KServiceComponentLabel
RAW_APP_LABEL = "app"  # RawDeploymentAppLabel
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
#: Deployment modes whose pods a Deployment makes from the component as written (Standard, and
#: its deprecated name); Knative and the default (no annotation) are Knative's.
STANDARD_MODES = frozenset({"Standard", "RawDeployment"})
MODEL_MESH = "ModelMesh"
MODEL_CONTAINER = "kserve-container"  # InferenceServiceContainerName
TRANSFORMER_CONTAINER = "transformer-container"  # TransformerContainerName
#: The predictor's shorthands that each hold one container's fields (predictor.go).
MODEL_FIELDS = (
    "model",
    "sklearn",
    "xgboost",
    "tensorflow",
    "pytorch",
    "triton",
    "onnx",
    "huggingface",
    "pmml",
    "lightgbm",
    "paddle",
)
#: A shorthand's fields that are not its container's (ModelSpec, PredictorExtensionSpec).
_MODEL_OWN_FIELDS = frozenset(
    {
        "modelFormat",
        "runtime",
        "storageUri",
        "runtimeVersion",
        "protocolVersion",
        "storage",
        "confidential",
        "config",  # ARTExplainerSpec
        "type",
    }
)
#: A component's fields beside its inline PodSpec (component.go ComponentExtensionSpec,
#: predictor.go PredictorSpec, explainer.go ExplainerSpec, WorkerSpec).
_COMPONENT_OWN_FIELDS = frozenset(
    {
        *MODEL_FIELDS,
        "name",
        "art",
        "storageUris",
        "storageContainerName",
        "workerSpec",
        "minReplicas",
        "maxReplicas",
        "scaleTarget",
        "scaleMetric",
        "scaleMetricType",
        "autoScaling",
        "containerConcurrency",
        "timeout",
        "canaryTrafficPercent",
        "logger",
        "batcher",
        "labels",
        "annotations",
        "deploymentStrategy",
        "pipelineParallelSize",
        "tensorParallelSize",
    }
)
COMPONENTS = ("predictor", "transformer", "explainer")
#: Each component's shorthands that hold its server container's fields (the explainer's ART
#: spec, explainer.go ARTExplainerSpec, is one too).
SHORTHANDS: Mapping[str, tuple[str, ...]] = {
    "predictor": MODEL_FIELDS,
    "transformer": (),
    "explainer": ("art",),
}
WORKER = "worker"

# LLMInferenceService pod labels (pkg/constants/constants.go).
K8S_COMPONENT = "app.kubernetes.io/component"
K8S_NAME = "app.kubernetes.io/name"
K8S_PART_OF = "app.kubernetes.io/part-of"
LLMISVC_PART_OF = "llminferenceservice"
KSERVE_COMPONENT = "kserve.io/component"
KSERVE_WORKLOAD = "workload"
LLMD_ROLE = "llm-d.ai/role"
_WORKLOAD = "llminferenceservice-workload"
#: The object's labels and annotations the LLMInferenceService controller copies onto its pods,
#: by prefix (propagateDeploymentMetadata; KueueAPIGroupName, LocalModelLabel).
_LLM_LABEL_PREFIXES = ("kueue.x-k8s.io", "internal.serving.kserve.io/localmodel")
_LLM_ANNOTATION_PREFIXES = ("k8s.v1.cni.cncf.io", "prometheus.io", *_LLM_LABEL_PREFIXES)
#: Annotations spec.annotations does not carry onto the pods (AnnotationModelBasedRoutingEnabled).
_LLM_ROUTING_ANNOTATION = "serving.kserve.io/model-based-routing-enabled"

#: Every label the KServe controllers write on a pod themselves.
CONTROLLER_LABELS = (
    ISVC_LABEL,
    COMPONENT_LABEL,
    RAW_APP_LABEL,
    K8S_COMPONENT,
    K8S_NAME,
    K8S_PART_OF,
    KSERVE_COMPONENT,
    LLMD_ROLE,
)


def _containers(where: str, value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise JobShapeError(f"{where} must be a list")
    return value


def deployment_mode(job: Mapping[str, Any]) -> str:
    """The InferenceService's deployment mode annotation, empty where it has none."""
    mode = string_map(metadata_of(job).get("annotations")).get(DEPLOYMENT_MODE, "")
    return mode


def _metadata_twins(meta: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return (
        ("/metadata/labels", pointer((*meta, "labels"))),
        ("/metadata/annotations", pointer((*meta, "annotations"))),
    )


@dataclass(frozen=True)
class InferenceServiceKind(JobKind):
    """KServe's InferenceService: the predictor (its model shorthand or containers), its
    multi-node workers, the transformer and the explainer, each a replica."""

    group: str = GROUP
    version: str = "v1beta1"
    kind: str = "InferenceService"
    plural: str = "inferenceservices"
    # Deployments (and Knative's) name their pods by generateName.
    generate_name: bool = True

    @property
    def sites(self) -> tuple[TemplateSite, ...]:
        components = tuple(
            TemplateSite(("spec", c), shape="podSpec", meta=("spec", c)) for c in COMPONENTS
        )
        return (
            *components,
            TemplateSite(("spec", "predictor", "workerSpec"), shape="podSpec"),
            *(
                TemplateSite(("spec", c, m), shape="container")
                for c, fields in SHORTHANDS.items()
                for m in fields
            ),
        )

    def templates(self, job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
        spec = job.get("spec")
        if not isinstance(spec, Mapping):
            raise JobShapeError(f"{self.kind} has no spec")
        if deployment_mode(job) == MODEL_MESH:
            return ()
        object_at("spec.predictor", spec.get("predictor"))
        return tuple(self._replicas(job, spec))

    def _replicas(
        self, job: Mapping[str, Any], spec: Mapping[str, Any]
    ) -> Iterator[ReplicaTemplate]:
        for name in COMPONENTS:
            if spec.get(name) is None:
                continue
            component = object_at(f"spec.{name}", spec[name])
            yield self._component(job, name, component)
            worker = component.get("workerSpec") if name == "predictor" else None
            if worker is not None:
                yield self._worker(job, object_at("spec.predictor.workerSpec", worker))

    def _labels_and_annotations(
        self, job: Mapping[str, Any], component: Mapping[str, Any]
    ) -> dict[str, Any]:
        meta = metadata_of(job)
        annotations = {
            **string_map(meta.get("annotations")),
            **string_map(component.get("annotations")),
        }
        labels = {**string_map(meta.get("labels")), **string_map(component.get("labels"))}
        found: dict[str, Any] = {"labels": labels}
        if annotations:
            found["annotations"] = annotations
        return found

    def _component(
        self, job: Mapping[str, Any], name: str, component: Mapping[str, Any]
    ) -> ReplicaTemplate:
        where = f"spec.{name}"
        base = ("spec", name)
        pod_spec = {k: v for k, v in component.items() if k not in _COMPONENT_OWN_FIELDS}
        inline = _containers(f"{where}.containers", component.get("containers"))
        twins: list[tuple[str, str]] = [*_metadata_twins(base)]
        model = next((m for m in SHORTHANDS[name] if component.get(m) is not None), None)
        if model is not None:
            fields = object_at(f"{where}.{model}", component[model])
            container = {k: v for k, v in fields.items() if k not in _MODEL_OWN_FIELDS}
            container["name"] = MODEL_CONTAINER
            # buildPodSpec: the model's container, the predictor's transformer-container, then
            # the predictor's other containers.
            order = sorted(
                range(len(inline)),
                key=lambda i: (
                    not (
                        isinstance(inline[i], Mapping)
                        and inline[i].get("name") == TRANSFORMER_CONTAINER
                    )
                ),
            )
            pod_spec["containers"] = [container, *(inline[i] for i in order)]
            twins.append(("/spec/containers/0", pointer((*base, model))))
            twins += [
                (f"/spec/containers/{k + 1}", pointer((*base, "containers", str(i))))
                for k, i in enumerate(order)
            ]
        elif inline and isinstance(inline[0], Mapping):
            pod_spec["containers"] = [_default_name(name, inline), *inline[1:]]
        twins.append(("/spec", pointer(base)))
        labels = self._labels_and_annotations(job, component)
        template = {"metadata": labels, "spec": pod_spec}
        return ReplicaTemplate(
            name, base, template, None, _min_replicas(component), twins=tuple(twins)
        )

    def _worker(self, job: Mapping[str, Any], worker: Mapping[str, Any]) -> ReplicaTemplate:
        base = ("spec", "predictor", "workerSpec")
        predictor = job["spec"]["predictor"]
        pod_spec = {k: v for k, v in worker.items() if k not in _COMPONENT_OWN_FIELDS}
        template = {"metadata": self._labels_and_annotations(job, predictor), "spec": pod_spec}
        twins = (*_metadata_twins(("spec", "predictor")), ("/spec", pointer(base)))
        return ReplicaTemplate(WORKER, base, template, None, 1, twins=twins)

    def labels(self, job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
        component = "predictor" if replica == WORKER else replica
        labels = {ISVC_LABEL: name_of(job), COMPONENT_LABEL: component}
        if deployment_mode(job) in STANDARD_MODES:
            labels[RAW_APP_LABEL] = f"isvc.{self.pod_name(job, replica, index).rstrip('-')}"
        return labels

    def pod_name(self, job: Mapping[str, Any], replica: str, index: int) -> str:
        if replica == WORKER:
            return f"{name_of(job)}-predictor-worker-"
        spec = job.get("spec")
        component = spec.get(replica) if isinstance(spec, Mapping) else None
        own = component.get("name") if isinstance(component, Mapping) else None
        # PredictorServiceName: <name>-<predictor name>-predictor where the predictor is named.
        middle = f"{own}-" if replica == "predictor" and isinstance(own, str) and own else ""
        return f"{name_of(job)}-{middle}{replica}-"

    def kept_as_written(self, job: Mapping[str, Any]) -> str | None:
        if deployment_mode(job) in STANDARD_MODES:
            return None
        # The whole story is in docs/jobs.md: a warning line holds 120 characters.
        return (
            f"the {self.kind} is kept as written: Knative mode refuses pod fields like "
            "schedulerName (docs/jobs.md)"
        )


def _default_name(component: str, inline: list[Any]) -> Mapping[str, Any]:
    """The first container as KServe's defaulter leaves it: named kserve-container when it is
    a transformer's or explainer's, or the predictor's only or unnamed one
    (predictor_custom.go, transformer_custom.go, explainer_custom.go: Default)."""
    first: Mapping[str, Any] = inline[0]
    if component != "predictor" or len(inline) == 1 or not first.get("name"):
        return {**first, "name": MODEL_CONTAINER}
    return first


def _min_replicas(component: Mapping[str, Any]) -> int:
    return max(1, whole_number(component.get("minReplicas", 1)))


@dataclass(frozen=True)
class LLMInferenceServiceKind(JobKind):
    """KServe's LLMInferenceService: the decode (or only) workload's template and worker, and
    the prefill workload's, each a replica."""

    version: str
    group: str = GROUP
    kind: str = "LLMInferenceService"
    plural: str = "llminferenceservices"
    generate_name: bool = True

    @property
    def sites(self) -> tuple[TemplateSite, ...]:
        return (
            TemplateSite(("spec", "template"), shape="podSpec", meta=("spec",)),
            TemplateSite(("spec", "worker"), shape="podSpec", meta=("spec",)),
            TemplateSite(
                ("spec", "prefill", "template"), shape="podSpec", meta=("spec", "prefill")
            ),
            TemplateSite(("spec", "prefill", "worker"), shape="podSpec", meta=("spec", "prefill")),
        )

    def templates(self, job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
        spec = job.get("spec")
        if not isinstance(spec, Mapping):
            raise JobShapeError(f"{self.kind} has no spec")
        found: list[ReplicaTemplate] = []
        prefill = spec.get("prefill")
        workloads: list[tuple[tuple[str, ...], Mapping[str, Any], str]] = [(("spec",), spec, "")]
        if prefill is not None:
            workloads.append((("spec", "prefill"), object_at("spec.prefill", prefill), "prefill"))
        for base, workload, prefix in workloads:
            multi = workload.get("worker") is not None
            for field, name in (("template", "leader" if multi else "main"), ("worker", WORKER)):
                if workload.get(field) is None:
                    continue
                where = ".".join((*base, field))
                pod_spec = object_at(where, workload[field])
                template = {"metadata": self._metadata(job, workload), "spec": dict(pod_spec)}
                twins = (*_metadata_twins(base), ("/spec", pointer((*base, field))))
                replicas = whole_number(workload.get("replicas", 1))
                # main, leader, worker; prefill, prefill-leader, prefill-worker
                replica = name if not prefix else prefix if name == "main" else f"{prefix}-{name}"
                found.append(
                    ReplicaTemplate(replica, (*base, field), template, None, replicas, twins=twins)
                )
        return tuple(found)

    def _metadata(self, job: Mapping[str, Any], workload: Mapping[str, Any]) -> dict[str, Any]:
        meta = metadata_of(job)
        labels = {
            k: v
            for k, v in string_map(meta.get("labels")).items()
            if k.startswith(_LLM_LABEL_PREFIXES)
        }
        annotations = {
            k: v
            for k, v in string_map(meta.get("annotations")).items()
            if k.startswith(_LLM_ANNOTATION_PREFIXES)
        }
        labels |= string_map(workload.get("labels"))
        annotations |= {
            k: v
            for k, v in string_map(workload.get("annotations")).items()
            if k != _LLM_ROUTING_ANNOTATION
        }
        found: dict[str, Any] = {"labels": labels}
        if annotations:
            found["annotations"] = annotations
        return found

    def labels(self, job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
        spec = job.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        prefill = replica.startswith("prefill")
        workload = spec.get("prefill") if prefill else spec
        workload = workload if isinstance(workload, Mapping) else {}
        role = "prefill" if prefill else ("decode" if spec.get("prefill") is not None else "both")
        kind = replica.removeprefix("prefill").removeprefix("-") or "main"
        component = {
            "main": _WORKLOAD,
            "leader": f"{_WORKLOAD}-leader",
            WORKER: f"{_WORKLOAD}-worker",
        }[kind]
        if prefill:
            component += "-prefill"
        labels = {
            K8S_COMPONENT: component,
            K8S_NAME: name_of(job),
            K8S_PART_OF: LLMISVC_PART_OF,
        }
        # Workers join the InferencePool (and take the workload labels) only without a leader.
        if kind != WORKER or workload.get("template") is None:
            labels[KSERVE_COMPONENT] = KSERVE_WORKLOAD
            labels[LLMD_ROLE] = "decode" if kind == WORKER and not prefill else role
        return labels

    def pod_name(self, job: Mapping[str, Any], replica: str, index: int) -> str:
        prefill = "-prefill" if replica.startswith("prefill") else ""
        multi = "" if replica in ("main", "prefill") else "-mn"
        return f"{name_of(job)}-kserve{multi}{prefill}-"


INFERENCE_SERVICE = InferenceServiceKind()
#: v1alpha2 is the storage version; v1alpha1 is served with the same fields.
LLM_INFERENCE_SERVICES = (
    LLMInferenceServiceKind(version="v1alpha2"),
    LLMInferenceServiceKind(version="v1alpha1"),
)
KINDS: tuple[JobKind, ...] = (INFERENCE_SERVICE, *LLM_INFERENCE_SERVICES)
