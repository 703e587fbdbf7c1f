"""What every Kubeflow job kind answers: where its pod templates are, and what its controller
adds to the pods it creates from them.

A kind is one :class:`JobKind`; its family's module (``trainingoperator``, ``batch``, ``katib``)
cites the controller's source for each label and name. ``gpuwarden.policy.pod.jobs`` holds the
registry and the functions the admission layer calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


class JobShapeError(ValueError):
    """A job object whose replicas cannot be read; the message names the field."""


@dataclass(frozen=True)
class ReplicaTemplate:
    """One replica type of a job: its name (``Worker``), its template and where it sits."""

    name: str
    path: tuple[str, ...]  # of the pod template (or of ``resources_of``'s resources), from the root
    template: Mapping[str, Any]
    restart_policy: str | None
    replicas: int = 1
    #: Where the object keeps the pod's metadata when the template's is not used (a Notebook's
    #: controller copies the Notebook's own labels and annotations): the template's
    #: ``metadata`` then stands for it, and its patch goes there.
    metadata_path: tuple[str, ...] | None = None
    #: Where the pod's fields sit in the job when ``template`` is not a pod template held at
    #: ``path`` but built from the job's own fields (a KServe component): pairs of a JSON
    #: pointer into the pod and the pointer of its twin in the job, the longest pod prefix
    #: winning. A pod field under none has no twin; empty: the template at ``path``.
    twins: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TemplateSite:
    """Where a kind keeps pod templates, for the job webhooks' CEL scope and its Python twin.

    ``path`` (from the object's root) names the pod template itself, or, with ``per_replica``, a
    map of replica specs that each hold one at ``.template``; with ``resources``, a container's
    resource requirements (a TrainJob's resourcesPerNode). ``when`` lists fields (paths from
    the root) that must hold the given string for the site to count (an Experiment's trialSpec
    must be of the kind the site is for). Other shapes than a pod template are described by
    ``shape``."""

    path: tuple[str, ...]
    per_replica: bool = False
    when: tuple[tuple[tuple[str, ...], str], ...] = ()
    #: What ``path`` names: a pod template (``metadata`` and ``spec``), a PodSpec (a KServe
    #: component), one container (KServe's model shorthand), or one container's resource
    #: requirements (a TrainJob's resourcesPerNode).
    shape: Literal["template", "podSpec", "container", "resources"] = "template"
    #: Where the pods' labels and annotations are kept in the object when not in the template
    #: (a Notebook's own metadata, a KServe component's): empty, the template's.
    meta: tuple[str, ...] = ()


def metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's metadata, empty where it has none (or it is not a map)."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def string_map(value: Any) -> dict[str, str]:
    """A map of labels or annotations with its keys and values as strings, empty where
    ``value`` is not a map."""
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def name_of(obj: Mapping[str, Any]) -> str:
    name = metadata_of(obj).get("name")
    return name if isinstance(name, str) else ""


def whole_number(value: Any, default: int = 1) -> int:
    """A replica count as the API server would have it, ``default`` where it is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def object_at(where: str, value: Any) -> Mapping[str, Any]:
    """``value`` checked to be an object, the error naming ``where``."""
    if not isinstance(value, Mapping):
        raise JobShapeError(f"{where} must be an object")
    return value


def pod_template(where: str, template: Any) -> Mapping[str, Any]:
    """``template`` checked to be a pod template object, the error naming ``where``."""
    found = object_at(where, template)
    if not isinstance(found.get("spec", {}), Mapping):
        raise JobShapeError(f"{where}.spec must be an object")
    return found


class JobKind(ABC):
    """One kind of job object gpuwarden admits: its API identity, its pod templates, and the
    pods its controller creates from them."""

    group: str
    version: str
    kind: str
    plural: str
    #: The controller names its pods by generateName (the batch Job controller) rather than name.
    generate_name: bool = False
    #: Other versions the API server serves the kind at with the same schema (the webhooks'
    #: rules name :attr:`version`; ``matchPolicy: Equivalent`` sends the others converted).
    also_served: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    @abstractmethod
    def sites(self) -> tuple[TemplateSite, ...]:
        """Where the kind's pod templates are, for the webhooks' scope."""

    @abstractmethod
    def templates(self, job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
        """The replicas in document order; JobShapeError names a field no such object has."""

    @abstractmethod
    def labels(self, job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
        """The labels the controller adds to the pod of ``replica`` number ``index``."""

    @abstractmethod
    def pod_name(self, job: Mapping[str, Any], replica: str, index: int) -> str:
        """The pod's name, or its generateName where :attr:`generate_name`."""

    def finish_pod(self, job: Mapping[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
        """The pod with what else its controllers set that asks no GPU (defaults, a hostname):
        as built, unless a kind says otherwise."""
        return pod

    def pod_job(self, job: Mapping[str, Any]) -> Mapping[str, Any]:
        """The object whose controller creates the pods (an Experiment's trial Job): the job."""
        return job

    def generates_names(self, job: Mapping[str, Any]) -> bool:
        """Whether the pods of ``job`` are named by generateName (an Experiment's depend on its
        trial's kind)."""
        return self.generate_name

    def kept_as_written(self, job: Mapping[str, Any]) -> str | None:
        """Why this object cannot carry what its pods will get (it is then judged but kept as
        written, as under a tenant's ``jobTemplates: keep``), or None: it can."""
        return None
