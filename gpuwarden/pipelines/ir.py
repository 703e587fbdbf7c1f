"""The steps of a compiled KFP v2 pipeline (its IR YAML), and the pod KFP would run for each.

The IR is the PipelineSpec document, then (where any task has Kubernetes settings) the
PlatformSpec document: ``platforms.kubernetes.deploymentSpec.executors.<executor>`` holds, among
others, ``podMetadata.labels`` (what ``kfp.kubernetes.add_pod_label`` writes).

The pod is built as KFP 2.17 on Argo builds a step's user-code pod (kubeflow/pipelines):
- ``backend/src/v2/compiler/argocompiler/argo.go``: the Workflow's ``podMetadata`` puts the label
  and annotation ``pipelines.kubeflow.org/v2_component: "true"`` on every pod of the run;
- ``backend/src/v2/compiler/argocompiler/container.go``: the executor template
  (``system-container-impl``) gets the annotation ``pipelines.kubeflow.org/runtime-role:
  launcher`` (``setRuntimeRole``) and the platform spec's pod labels and annotations
  (``extendPodMetadata``);
- ``backend/src/v2/driver/driver.go``, ``initPodSpecPatch``: the container ``main`` with the
  component's image and, as limits, ``resourceMemoryLimit`` / ``resourceCpuLimit`` and
  ``{accelerator.resourceType: accelerator.resourceCount}`` (the older ``type``/``count`` where
  those are unset), the requests from ``resourceMemoryRequest`` / ``resourceCpuRequest``;
- Argo names the executor's node ``<workflow>.root.<task>.executor`` (annotation
  ``workflows.argoproj.io/node-name``), by which the policies' ``taskNames`` match.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.policy.pod.keys import PROFILE_LABEL
from gpuwarden.policy.pod.workloads import (
    ARGO_NODE_NAME,
    ARGO_WORKFLOW,
    KFP_ROLE_LAUNCHER,
    KFP_RUNTIME_ROLE,
    KFP_V2_COMPONENT,
)

# A parameter the driver resolves at run time (``{{$.inputs.parameters['pipelinechannel--n']}}``).
_RUNTIME_VALUE = re.compile(r"\{\{.*\}\}")
# The suffix Argo adds to a run's generateName; any will do for a pod decided offline.
_RUN_SUFFIX = "run00"


class IRError(Exception):
    """A document that is not a compiled KFP v2 pipeline: the message names the field."""


@dataclass(frozen=True)
class Step:
    """One container task of the pipeline, as the policies see its pod."""

    path: tuple[str, ...]  # the task's name in each enclosing DAG, root first
    display_name: str
    executor: str
    image: str
    labels: Mapping[str, str]  # the platform spec's pod labels
    annotations: Mapping[str, str]  # the platform spec's pod annotations
    limits: Mapping[str, str]
    requests: Mapping[str, str]
    unresolved: tuple[str, ...] = field(default=())  # resources set only at run time
    # An accelerator count without a type, which KFP's driver drops: the step gets no GPU.
    dropped_gpus: str | None = None

    @property
    def name(self) -> str:
        """The task's name, as Argo's node name (and the policies' ``taskNames``) carry it."""
        return self.path[-1]

    @property
    def label(self) -> str:
        """How a message names the step: its path, and its display name where it differs."""
        where = "/".join(self.path)
        shown = f" ({self.display_name})" if self.display_name not in ("", self.name) else ""
        return f"step {where}{shown}"

    @property
    def profile(self) -> str | None:
        return self.labels.get(PROFILE_LABEL)


@dataclass(frozen=True)
class PipelineIR:
    source: str  # the file, for messages
    name: str
    spec: Mapping[str, Any]
    kubernetes: Mapping[str, Any]  # platforms.kubernetes, or empty


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise IRError(f"{where} is not a mapping")
    return value


def read_ir(documents: Sequence[Any], source: str) -> PipelineIR:
    """The pipeline in a compiled IR file's documents (what ``compiler.Compiler().compile``
    writes)."""
    spec: Mapping[str, Any] | None = None
    kubernetes: Mapping[str, Any] = {}
    for index, doc in enumerate(documents, start=1):
        if not isinstance(doc, Mapping):
            raise IRError(f"{source}: document {index} is not a mapping")
        if "platforms" in doc:
            platforms = _mapping(doc["platforms"], f"{source}: platforms")
            kubernetes = _mapping(platforms.get("kubernetes"), f"{source}: platforms.kubernetes")
        elif "pipelineInfo" in doc or "root" in doc:
            spec = doc
    if spec is None:
        raise IRError(
            f"{source}: not a compiled KFP v2 pipeline (no document with pipelineInfo and root); "
            "compile it with kfp's compiler.Compiler().compile(pipeline, 'pipeline.yaml')"
        )
    if "root" not in spec:
        raise IRError(f"{source}: a component, not a pipeline (no root DAG)")
    info = _mapping(spec.get("pipelineInfo"), f"{source}: pipelineInfo")
    return PipelineIR(source, str(info.get("name") or "pipeline"), spec, kubernetes)


def _quantity(value: object, unit: str = "") -> str:
    """A quantity the IR holds as a number (``memoryLimit: 16.0``) the way the driver formats
    it (``%vG``: Go prints 16 for 16.0)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value}{unit}"


def _resources(
    resources: Mapping[str, Any], where: str
) -> tuple[dict[str, str], dict[str, str], tuple[str, ...]]:
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    unresolved: list[str] = []

    def put(into: dict[str, str], key: str, new: str, old: str, unit: str) -> None:
        value = resources.get(new)
        if value in (None, "") and resources.get(old) not in (None, "", 0):
            value = _quantity(resources[old], unit)
        if value in (None, ""):
            return
        if _RUNTIME_VALUE.search(str(value)):
            unresolved.append(f"{new}={value}")
            return
        into[key] = str(value)

    put(limits, "memory", "resourceMemoryLimit", "memoryLimit", "G")
    put(requests, "memory", "resourceMemoryRequest", "memoryRequest", "G")
    put(limits, "cpu", "resourceCpuLimit", "cpuLimit", "")
    put(requests, "cpu", "resourceCpuRequest", "cpuRequest", "")
    accelerator = _mapping(resources.get("accelerator"), f"{where}.accelerator")
    kind = str(accelerator.get("resourceType") or accelerator.get("type") or "")
    count = accelerator.get("resourceCount") or accelerator.get("count") or ""
    if kind and count:
        if _RUNTIME_VALUE.search(kind) or _RUNTIME_VALUE.search(str(count)):
            unresolved.append(f"accelerator {kind}: {count}")
        else:
            limits[kind] = _quantity(count)
    return limits, requests, tuple(unresolved)


def _dropped_accelerator(resources: Mapping[str, Any]) -> str | None:
    """The accelerator count KFP's driver drops: it sets a limit only with a type too."""
    accelerator = resources.get("accelerator")
    if not isinstance(accelerator, Mapping):
        return None
    count = accelerator.get("resourceCount") or accelerator.get("count")
    if count and not (accelerator.get("resourceType") or accelerator.get("type")):
        return str(count)
    return None


def _tasks(
    ir: PipelineIR, dag_owner: Mapping[str, Any], prefix: tuple[str, ...], where: str
) -> Iterator[Step]:
    components = _mapping(ir.spec.get("components"), "components")
    deployment = _mapping(ir.spec.get("deploymentSpec"), "deploymentSpec")
    executors = _mapping(deployment.get("executors"), "deploymentSpec.executors")
    platform = _mapping(ir.kubernetes.get("deploymentSpec"), "platforms.kubernetes.deploymentSpec")
    platform_executors = _mapping(
        platform.get("executors"), "platforms.kubernetes.deploymentSpec.executors"
    )
    dag = _mapping(dag_owner.get("dag"), f"{where}.dag")
    tasks = _mapping(dag.get("tasks"), f"{where}.dag.tasks")
    for task_name, task in tasks.items():
        task_where = f"{where}.dag.tasks.{task_name}"
        task = _mapping(task, task_where)
        ref = str(_mapping(task.get("componentRef"), f"{task_where}.componentRef").get("name", ""))
        component = _mapping(components.get(ref), f"components.{ref}")
        if not component:
            raise IRError(f"{task_where}.componentRef names no component: {ref!r}")
        path = (*prefix, str(task_name))
        if "dag" in component:
            # A pipeline used as a step (or a ParallelFor, a Condition): its tasks, nested.
            yield from _tasks(ir, component, path, f"components.{ref}")
            continue
        executor_name = str(component.get("executorLabel") or "")
        executor = _mapping(
            executors.get(executor_name), f"deploymentSpec.executors.{executor_name}"
        )
        container = _mapping(
            executor.get("container"), f"deploymentSpec.executors.{executor_name}.container"
        )
        if not container:
            continue  # an importer or a custom job: KFP's launcher, no user container
        resources = _mapping(
            container.get("resources"),
            f"deploymentSpec.executors.{executor_name}.container.resources",
        )
        limits, requests, unresolved = _resources(
            resources, f"deploymentSpec.executors.{executor_name}.container.resources"
        )
        k8s = _mapping(
            platform_executors.get(executor_name),
            f"platforms.kubernetes.deploymentSpec.executors.{executor_name}",
        )
        metadata = _mapping(k8s.get("podMetadata"), "podMetadata")
        info = _mapping(task.get("taskInfo"), f"{task_where}.taskInfo")
        yield Step(
            path=path,
            display_name=str(info.get("name") or ""),
            executor=executor_name,
            image=str(container.get("image") or ""),
            labels={str(k): str(v) for k, v in _mapping(metadata.get("labels"), "labels").items()},
            annotations={
                str(k): str(v)
                for k, v in _mapping(metadata.get("annotations"), "annotations").items()
            },
            limits=limits,
            requests=requests,
            unresolved=unresolved,
            dropped_gpus=_dropped_accelerator(resources),
        )


def steps_of(ir: PipelineIR) -> tuple[Step, ...]:
    """Every container step, nested DAGs' steps under their path."""
    try:
        return tuple(_tasks(ir, _mapping(ir.spec.get("root"), "root"), (), "root"))
    except IRError as exc:
        raise IRError(f"{ir.source}: {exc}") from None


def _workflow_name(pipeline: str) -> str:
    """What Argo names the run: the pipeline's name as a DNS label, and a suffix."""
    base = re.sub(r"[^a-z0-9-]+", "-", pipeline.lower()).strip("-")[:40] or "pipeline"
    return f"{base}-{_RUN_SUFFIX}"


def step_pod(ir: PipelineIR, step: Step, namespace: str) -> dict[str, Any]:
    """The pod KFP runs for the step's user code (its launcher and Argo's containers aside):
    the labels, annotations and ``main`` container the compiler and driver give it."""
    workflow = _workflow_name(ir.name)
    labels = {**step.labels, KFP_V2_COMPONENT: "true", ARGO_WORKFLOW: workflow}
    annotations = {
        **step.annotations,
        KFP_V2_COMPONENT: "true",
        KFP_RUNTIME_ROLE: KFP_ROLE_LAUNCHER,
        ARGO_NODE_NAME: ".".join((workflow, "root", *step.path, "executor")),
    }
    resources: dict[str, dict[str, str]] = {}
    if step.limits:
        resources["limits"] = dict(step.limits)
    if step.requests:
        resources["requests"] = dict(step.requests)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{workflow}-system-container-impl-{zlib.crc32('/'.join(step.path).encode())}",
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": step.image or "busybox",
                    "command": ["/kfp-launcher/launch"],
                    "resources": resources,
                }
            ],
        },
    }
