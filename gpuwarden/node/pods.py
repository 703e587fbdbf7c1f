"""The pods on this node as the agent sees them: the limits the webhook recorded in annotations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import QuantityError, parse_non_negative

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


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

    @property
    def governed(self) -> bool:
        """The webhook set limits on this pod."""
        return self.cap is not None or self.thread_percentage is not None

    @property
    def active(self) -> bool:
        return self.phase not in TERMINAL_PHASES

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


def pod_info(pod: Mapping[str, Any]) -> PodInfo | None:
    """Read one pod (Kubernetes JSON, camelCase); None for an object with no name or UID."""
    meta = _mapping(pod.get("metadata"))
    uid, name = meta.get("uid"), meta.get("name")
    if not isinstance(uid, str) or not isinstance(name, str) or not uid or not name:
        return None
    namespace = meta.get("namespace")
    ref = PodRef(
        namespace=namespace if isinstance(namespace, str) else "default", name=name, uid=uid
    )
    annotations = {
        str(k): str(v) for k, v in _mapping(meta.get("annotations")).items() if v is not None
    }
    spec = _mapping(pod.get("spec"))
    status = _mapping(pod.get("status"))
    problems: list[str] = []

    cap: int | None = None
    raw_cap = annotations.get(keys.ANNOTATION_GPU_MEMORY_LIMIT)
    if raw_cap is not None:
        try:
            cap = int(parse_non_negative(raw_cap).to_integral_value())
        except QuantityError as exc:
            problems.append(f"annotation {keys.ANNOTATION_GPU_MEMORY_LIMIT}={raw_cap!r}: {exc}")

    threads: int | None = None
    raw_threads = annotations.get(keys.ANNOTATION_THREAD_PERCENTAGE)
    if raw_threads is not None:
        if raw_threads.strip().isdigit() and 1 <= int(raw_threads) <= 100:
            threads = int(raw_threads)
        else:
            problems.append(
                f"annotation {keys.ANNOTATION_THREAD_PERCENTAGE}={raw_threads!r}: "
                "must be a whole number from 1 to 100"
            )

    gpus: int | None = None
    raw_gpus = annotations.get(keys.ANNOTATION_GPU_COUNT)
    if raw_gpus is not None:
        if raw_gpus.strip().isdigit():
            gpus = int(raw_gpus)
        else:
            problems.append(
                f"annotation {keys.ANNOTATION_GPU_COUNT}={raw_gpus!r}: must be a whole number"
            )

    ratio = Decimal(1)
    raw_ratio = annotations.get(keys.ANNOTATION_OVERCOMMIT_RATIO)
    if raw_ratio is not None:
        try:
            ratio = Decimal(raw_ratio.strip())
            if not ratio.is_finite() or ratio < 1:
                raise InvalidOperation
        except InvalidOperation:
            problems.append(
                f"annotation {keys.ANNOTATION_OVERCOMMIT_RATIO}={raw_ratio!r}: "
                "must be a number of at least 1"
            )
            ratio = Decimal(1)

    named = tuple(
        n.strip() for n in annotations.get(keys.ANNOTATION_CONTAINERS, "").split(",") if n.strip()
    )
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

    phase = status.get("phase")
    created = meta.get("creationTimestamp")
    return PodInfo(
        ref=ref,
        phase=phase if isinstance(phase, str) else "Pending",
        created=created if isinstance(created, str) else "",
        tenant=annotations.get(keys.ANNOTATION_TENANT),
        profile=annotations.get(keys.ANNOTATION_PROFILE),
        cap=cap,
        thread_percentage=threads,
        containers=named,
        gpu_count=gpus,
        overcommit_ratio=ratio,
        run_as_users=frozenset(users),
        container_ids=_container_ids(status),
        problems=tuple(problems),
    )
