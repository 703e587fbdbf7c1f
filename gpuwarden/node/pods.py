"""The pods on this node as the agent sees them: the limits the webhook recorded in annotations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpuwarden.policy.pod.quantity import QuantityError
from gpuwarden.policy.pod.record import IdleRecord, PodRecord
from gpuwarden.policy.pod.resources import (
    DEVICE_CLASS_RESOURCE_PREFIX,
    FINISHED_PHASES,
    annotations_of,
    containers,
)
from gpuwarden.policy.pod.workloads import NOTEBOOK_NAME


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class OwnerRef:
    """The pod's controller (its ownerReference with ``controller: true``)."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class PodInfo:
    ref: PodRef
    phase: str = "Pending"
    created: str = ""
    tenant: str | None = None
    profile: str | None = None
    # GPU-memory cap per GPU container per GPU, in bytes (gpuwarden.io/gpu-memory-limit).
    cap: int | None = None
    thread_percentage: int | None = None
    containers: tuple[str, ...] = ()
    gpu_count: int | None = None
    overcommit_ratio: Decimal = Decimal(1)
    # UIDs the pod's GPU containers declare (securityContext.runAsUser), where they declare one.
    run_as_users: frozenset[int] = frozenset()
    # Container ID (the 64 hex digits of containerStatuses[].containerID) -> container name.
    container_ids: Mapping[str, str] = field(default_factory=dict)
    # Annotations the agent could not read, as messages naming the annotation.
    problems: tuple[str, ...] = ()
    # The containers (any kind) that ask for a GPU resource of a device plugin.
    gpu_resource_containers: frozenset[str] = frozenset()
    # DRA claims or DRA-backed extended resources: devices the agent cannot see, so any
    # container of the pod may hold a GPU through them.
    device_claims: bool = False
    # The scheduler backend (gpuwarden.io/backend) and whether the GPUs are shared slices.
    backend: str | None = None
    gpu_shared: bool | None = None
    # Container -> the GPUs it asks for by a GPU count resource (nvidia.com/gpu and friends).
    container_gpus: Mapping[str, int] = field(default_factory=dict)
    # The profile's idle rule (gpuwarden.io/idle), the pod's controller, and the Kubeflow
    # Notebook it runs (the notebook controller's ``notebook-name`` label on a pod owned by the
    # Notebook's StatefulSet); None where the pod has none.
    idle: IdleRecord | None = None
    owner: OwnerRef | None = None
    notebook: str | None = None

    @property
    def governed(self) -> bool:
        """The webhook set limits on this pod."""
        return self.cap is not None or self.thread_percentage is not None

    @property
    def active(self) -> bool:
        return self.phase not in FINISHED_PHASES

    @property
    def uses_gpu(self) -> bool:
        if self.gpu_count is None:
            return self.governed
        return self.gpu_count > 0

    @property
    def gpu_containers(self) -> int:
        return max(len(self.containers), 1)

    def reserved_per_gpu(self) -> Decimal:
        """GPU memory the pod holds on one GPU it uses: its caps divided by its overcommit ratio."""
        if self.cap is None:
            return Decimal(0)
        return Decimal(self.cap) * self.gpu_containers / self.overcommit_ratio

    def granted_gpu(self, container: str | None) -> bool:
        """Whether the container (the pod's, when it is not known) was given a GPU: by a GPU
        resource, a DRA claim, or gpuwarden's record of a GPU for it."""
        if self.device_claims:
            return True
        if container is None:
            return self.uses_gpu or bool(self.gpu_resource_containers)
        if container in self.gpu_resource_containers:
            return True
        return self.uses_gpu and (not self.containers or container in self.containers)

    def container_name(self, container_id: str | None) -> str | None:
        if container_id is None:
            return None
        return self.container_ids.get(container_id)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _run_as_user(context: object) -> int | None:
    value = _mapping(context).get("runAsUser")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _container_ids(status: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        entries = status.get(key)
        if not isinstance(entries, list):
            continue
        for entry in entries:
            entry = _mapping(entry)
            raw = entry.get("containerID")
            name = entry.get("name")
            if isinstance(raw, str) and isinstance(name, str) and raw:
                # "containerd://<id>", "cri-o://<id>", "docker://<id>"
                out[raw.rpartition("://")[2]] = name
    return out


def _run_as_users(spec: Mapping[str, Any], named: tuple[str, ...]) -> frozenset[int]:
    """The UIDs the named containers (every container where none is named) run as."""
    pod_user = _run_as_user(spec.get("securityContext"))
    users: set[int] = set()
    containers = spec.get("containers")
    for container in containers if isinstance(containers, list) else []:
        container = _mapping(container)
        if named and container.get("name") not in named:
            continue
        user = _run_as_user(container.get("securityContext"))
        if user is None:
            user = pod_user
        if user is not None:
            users.add(user)
    return frozenset(users)


def _device_claims(pod: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Whether the pod holds devices through DRA, which the agent cannot size: a
    ResourceClaim, or an extended resource backed by a DeviceClass (DRAExtendedResource)."""
    if spec.get("resourceClaims"):
        return True
    for ref in containers(pod):
        resources = _mapping(ref.body.get("resources"))
        if resources.get("claims"):
            return True
        for section in (ref.resources("limits"), ref.resources("requests")):
            if any(str(name).startswith(DEVICE_CLASS_RESOURCE_PREFIX) for name in section):
                return True
    return False


def _controller(meta: Mapping[str, Any]) -> OwnerRef | None:
    refs = meta.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        ref = _mapping(ref)
        fields = [ref.get(key) for key in ("apiVersion", "kind", "name", "uid")]
        if ref.get("controller") is True and all(isinstance(f, str) and f for f in fields):
            return OwnerRef(*(str(f) for f in fields))
    return None


def _notebook(meta: Mapping[str, Any], owner: OwnerRef | None) -> str | None:
    name = _mapping(meta.get("labels")).get(NOTEBOOK_NAME)
    if not isinstance(name, str) or not name or owner is None or owner.kind != "StatefulSet":
        return None
    return name


def _container_gpus(pod: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    # Regular containers: an init container's devices go back before the pod's containers run.
    for ref in containers(pod, "containers"):
        try:
            asked = ref.asked_gpus()
        except QuantityError:
            continue  # the API server refuses such a count; nothing to size
        if asked:
            out[ref.name] = asked
    return out


def pod_info(pod: Mapping[str, Any]) -> PodInfo | None:
    """Read one pod (Kubernetes JSON, camelCase); None for an object with no name or UID."""
    meta = _mapping(pod.get("metadata"))
    uid, name, namespace = meta.get("uid"), meta.get("name"), meta.get("namespace")
    if not isinstance(uid, str) or not isinstance(name, str) or not uid or not name:
        return None
    ref = PodRef(namespace if isinstance(namespace, str) else "default", name, uid)
    record = PodRecord.from_annotations(annotations_of(pod))
    named = record.containers or ()
    status = _mapping(pod.get("status"))
    spec = _mapping(pod.get("spec"))
    phase, created = status.get("phase"), meta.get("creationTimestamp")
    return PodInfo(
        ref=ref,
        phase=phase if isinstance(phase, str) else "Pending",
        created=created if isinstance(created, str) else "",
        tenant=record.tenant,
        profile=record.profile,
        cap=record.gpu_memory_limit,
        thread_percentage=record.thread_percentage,
        containers=named,
        gpu_count=record.gpu_count,
        overcommit_ratio=record.overcommit_ratio or Decimal(1),
        run_as_users=_run_as_users(spec, named),
        container_ids=_container_ids(status),
        problems=record.problems,
        gpu_resource_containers=frozenset(
            ref.name for ref in containers(pod) if ref.asks_for_gpu()
        ),
        device_claims=_device_claims(pod, spec),
        backend=record.backend,
        gpu_shared=record.gpu_shared,
        container_gpus=_container_gpus(pod),
        idle=record.idle,
        owner=(owner := _controller(meta)),
        notebook=_notebook(meta, owner),
    )
