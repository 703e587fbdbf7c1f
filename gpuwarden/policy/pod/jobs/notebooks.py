"""Kubeflow Notebooks (``kubeflow.org/v1``, served as v1beta1 and v1alpha1 with the same schema).

Sources: kubeflow/notebooks v1.11.0 (the notebook controller moved there from kubeflow/kubeflow
``components/notebook-controller``, whose v1.9 and v1.10 lines read the same).
- api/v1/notebook_types.go: ``spec.template`` holds only ``spec`` (a PodSpec), so the CRD
  (config/crd/bases/kubeflow.org_notebooks.yaml: v1 stored, v1alpha1 and v1beta1 served,
  conversion ``None``) prunes any ``spec.template.metadata``.
- controllers/notebook_controller.go, generateStatefulSet: one StatefulSet named as the Notebook,
  one replica, or none while the Notebook carries the ``kubeflow-resource-stopped`` annotation
  (which its culler, culling_controller.go, and gpuwarden's node agent set). Its pod template
  is the Notebook's ``spec.template.spec`` with the labels ``statefulset`` and ``notebook-name``
  (the Notebook's name) under the Notebook's own labels, and the Notebook's own annotations
  but those whose key contains ``kubectl`` or ``notebook``. The first container gets
  ``workingDir: /home/jovyan`` and the port ``notebook-port`` 8888/TCP where it has none, and
  ``NB_PREFIX=/notebook/<namespace>/<name>`` unless it has that variable (setPrefixEnvVar); the
  pod gets ``securityContext: {fsGroup: 100}`` where it has none (unless the controller runs
  with ``ADD_FSGROUP=false``, as on OpenShift, which is not foretold). None of it asks a GPU.
- kubernetes v1.37 pkg/controller/statefulset/stateful_set_utils.go (initIdentity,
  updateIdentity): the pod is named ``<statefulset>-<ordinal>`` (``<notebook>-0``), labelled
  ``statefulset.kubernetes.io/pod-name`` with its name and ``apps.kubernetes.io/pod-index`` with
  its ordinal, and its hostname is its name. ``controller-revision-hash`` (a hash of the
  StatefulSet's revision) is not foretold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.policy.pod.jobs.base import (
    JobKind,
    JobShapeError,
    ReplicaTemplate,
    TemplateSite,
    metadata_of,
    name_of,
    pod_template,
)

GROUP = "kubeflow.org"
VERSION = "v1"
#: The one replica of a Notebook, as messages name it.
REPLICA = "Notebook"
NOTEBOOK_NAME_LABEL = "notebook-name"
STATEFULSET_LABEL = "statefulset"
# kubernetes staging/src/k8s.io/api/apps/v1/types.go: StatefulSetPodNameLabel, PodIndexLabel.
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
#: Labels the notebook and StatefulSet controllers write on the pod.
LABELS = (STATEFULSET_LABEL, NOTEBOOK_NAME_LABEL, POD_NAME_LABEL, POD_INDEX_LABEL)
#: The culler's (and gpuwarden's idle rule's) stop: the StatefulSet has no pod while it is set.
STOP_ANNOTATION = "kubeflow-resource-stopped"
PREFIX_ENV = "NB_PREFIX"
WORKING_DIR = "/home/jovyan"
PORT = {"containerPort": 8888, "name": "notebook-port", "protocol": "TCP"}
FS_GROUP = 100
_TEMPLATE = ("spec", "template")


def _own(job: Mapping[str, Any], part: str) -> Mapping[str, Any] | None:
    found = metadata_of(job).get(part)
    return found if isinstance(found, Mapping) else None


def pod_metadata(job: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's labels and annotations as the controller copies them from the Notebook's own:
    every label, the annotations but those it skips, and never the stop annotation (while it
    is set there is no pod). Each map is there where the Notebook has one, so that a patch of
    the pod's is a patch of the Notebook's."""
    meta: dict[str, Any] = {}
    labels = _own(job, "labels")
    if labels is not None:
        meta["labels"] = dict(labels)
    annotations = _own(job, "annotations")
    if annotations is not None:
        meta["annotations"] = {
            k: v
            for k, v in annotations.items()
            if "kubectl" not in str(k) and "notebook" not in str(k) and k != STOP_ANNOTATION
        }
    return meta


@dataclass(frozen=True)
class NotebookKind(JobKind):
    """A Kubeflow Notebook: one pod, ``<name>-0``, from ``spec.template.spec``."""

    group: str = GROUP
    version: str = VERSION
    kind: str = "Notebook"
    plural: str = "notebooks"
    also_served: tuple[str, ...] = ("v1beta1", "v1alpha1")

    @property
    def sites(self) -> tuple[TemplateSite, ...]:
        return (TemplateSite(_TEMPLATE, meta=("metadata",)),)

    def templates(self, job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
        spec = job.get("spec")
        if not isinstance(spec, Mapping):
            raise JobShapeError(f"{self.kind} has no spec")
        template = pod_template("spec.template", spec.get("template"))
        containers = (template.get("spec") or {}).get("containers")
        if not isinstance(containers, list) or not containers:
            raise JobShapeError("spec.template.spec.containers must list at least one container")
        stands_for = {"metadata": pod_metadata(job), "spec": template.get("spec") or {}}
        return (ReplicaTemplate(REPLICA, _TEMPLATE, stands_for, None, 1, ("metadata",)),)

    def labels(self, job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
        name = name_of(job)
        labels = {STATEFULSET_LABEL: name, NOTEBOOK_NAME_LABEL: name}
        # The Notebook's own labels are copied over the controller's two.
        own = _own(job, "labels") or {}
        labels |= {k: str(own[k]) for k in labels if k in own}
        pod = self.pod_name(job, replica, index)
        return labels | {POD_NAME_LABEL: pod, POD_INDEX_LABEL: str(index)}

    def pod_name(self, job: Mapping[str, Any], replica: str, index: int) -> str:
        return f"{name_of(job)}-{index}"

    def finish_pod(self, job: Mapping[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
        spec = dict(pod["spec"])
        containers = list(spec["containers"])
        first = containers[0]
        if isinstance(first, Mapping):
            first = dict(first)
            if not first.get("workingDir"):
                first["workingDir"] = WORKING_DIR
            if first.get("ports") is None:
                first["ports"] = [dict(PORT)]
            env = first.get("env")
            env = list(env) if isinstance(env, list) else []
            if not any(isinstance(e, Mapping) and e.get("name") == PREFIX_ENV for e in env):
                meta = pod["metadata"]
                prefix = f"/notebook/{meta['namespace']}/{name_of(job)}"
                first["env"] = [*env, {"name": PREFIX_ENV, "value": prefix}]
            containers[0] = first
        spec["containers"] = containers
        if spec.get("securityContext") is None:
            spec["securityContext"] = {"fsGroup": FS_GROUP}
        spec["hostname"] = pod["metadata"]["name"]
        return {**pod, "spec": spec}


NOTEBOOK = NotebookKind()
