"""The validating decision, judged on the final (mutated) pod. Validation never mutates.

Each check is a small function returning the violations it finds; the first violation denies, and
its message names the field and says what to change. Which checks apply is the tenant's
``enforcement`` setting (all on by default). The mutator and the validator agree by construction:
the scheduling check re-runs the mutation on the final pod and reports any field it would still
change, so a pod the mutator produced is never denied for something the mutator did.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from pydantic.alias_generators import to_camel

from gpuwarden.policy.admission.decision import AdmissionRequest, ClusterView, Decision, warning
from gpuwarden.policy.admission.mutate import (
    admitted_gpu_memory,
    apply_placement,
    context_of,
    plan,
    size_problems,
)
from gpuwarden.policy.admission.placement import Placement, place
from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import (
    QuantityError,
    format_bytes,
    parse_count,
    parse_non_negative,
    parse_quantity,
)
from gpuwarden.policy.pod.resources import (
    GPU_COUNT_RESOURCES,
    ContainerRef,
    annotations_of,
    containers,
    is_gpu_resource,
    labels_of,
    requests_gpu,
    spec_of,
)
from gpuwarden.policy.render import kueue
from gpuwarden.policy.spec.backends import VOLCANO_PREEMPTABLE_ANNOTATION
from gpuwarden.policy.spec.model import HamiBackend, Tenant, VolcanoBackend
from gpuwarden.policy.spec.policyset import PolicySet

_MAX_SHOWN = 5
# A denial's message stays within the 1 KiB an Event's note keeps (NoteLengthLimit in kubernetes
# pkg/apis/core/validation/events.go, which the scheduler also cuts its messages to): controllers
# report a pod they could not create in an Event. The first violations, then a count of the rest.
MAX_MESSAGE = 1024
# Variables HAMi-core's limiter (libvgpu.so, preloaded on Volcano vGPU and HAMi nodes) reads: a
# container that sets them switches the limiter off or moves its caps. CUDA_DISABLE_CONTROL makes
# both device plugins skip /etc/ld.so.preload (Allocate in Project-HAMi/volcano-vgpu-device-plugin
# pkg/plugin/server.go and Project-HAMi/HAMi pkg/device-plugin/nvidiadevice/nvinternal/plugin/
# server.go); the others are read by Project-HAMi/HAMi-core src/multiprocess/
# multiprocess_memory_limit.c, and a pod's own env comes after the device plugin's, so it wins.
_LIMITER_ENV = re.compile(
    r"^(CUDA_DISABLE_CONTROL|GPU_CORE_UTILIZATION_POLICY|CUDA_DEVICE_MEMORY_LIMIT(_\d+)?"
    r"|CUDA_DEVICE_SM_LIMIT(_\d+)?|CUDA_DEVICE_MEMORY_SHARED_CACHE|CUDA_OVERSUBSCRIBE"
    r"|CUDA_TASK_PRIORITY)$"
)
# NVIDIA's container toolkit also reads (internal/config/image/envvars.go in
# NVIDIA/nvidia-container-toolkit): NVIDIA_MIG_CONFIG_DEVICES and NVIDIA_MIG_MONITOR_DEVICES, MIG
# configuration and monitoring of the node's GPUs (the runtime hook refuses them outside privileged
# containers, cmd/nvidia-container-runtime-hook/container_config.go), and NVIDIA_IMEX_CHANNELS,
# the IMEX channels through which jobs share GPU memory across nodes (honoured unless the
# toolkit's ignore-imex-channel-requests feature is on).
_FORBIDDEN_ENV = re.compile(
    r"^(NVIDIA_VISIBLE_DEVICES|NVIDIA_DRIVER_CAPABILITIES|NVIDIA_MIG_CONFIG_DEVICES"
    r"|NVIDIA_MIG_MONITOR_DEVICES|NVIDIA_IMEX_CHANNELS|CUDA_MPS_.*)$|" + _LIMITER_ENV.pattern
)
# One name of each shape _FORBIDDEN_ENV matches: what an envFrom prefix may be the start of.
_FORBIDDEN_SHAPES = (
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
    "CUDA_MPS_",
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_SM_LIMIT_0",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_TASK_PRIORITY",
)


def _escape_effect(name: str) -> str:
    if _LIMITER_ENV.match(name):
        return "can lift the GPU caps HAMi-core's limiter holds the pod to"
    if name.startswith("NVIDIA_MIG_"):
        return "asks NVIDIA's container toolkit to configure or monitor MIG on the node's GPUs"
    if name == "NVIDIA_IMEX_CHANNELS":
        return "asks NVIDIA's container toolkit for IMEX channels, where jobs share GPU memory"
    return "can escape GPU isolation"


def _prefix_reaches(prefix: str) -> bool:
    """Whether some key makes ``prefix + key`` a variable the environment check denies (the
    empty prefix reaches them all)."""
    if any(len(shape) > len(prefix) and shape.startswith(prefix) for shape in _FORBIDDEN_SHAPES):
        return True
    # A prefix that already holds the start of an open name: CUDA_MPS_X, CUDA_DEVICE_SM_LIMIT_1.
    return any(_FORBIDDEN_ENV.match(prefix + tail) for tail in ("X", "0"))


def _reached_name(prefix: str) -> str:
    """A denied variable that ``prefix`` and some key make (for a prefix that reaches one)."""
    for shape in _FORBIDDEN_SHAPES:
        if len(shape) > len(prefix) and shape.startswith(prefix):
            return shape if shape != "CUDA_MPS_" else "CUDA_MPS_PIPE_DIRECTORY"
    return prefix + ("X" if _FORBIDDEN_ENV.match(prefix + "X") else "0")


def _listed(items: Sequence[str], limit: int = _MAX_SHOWN) -> str:
    """Items for a message: the first few, then how many more."""
    if len(items) <= limit:
        return ", ".join(items)
    return f"{', '.join(items[:limit])} and {len(items) - limit} more"


@dataclass(frozen=True)
class Violation:
    check: str  # the enforcement switch that governs it
    reason: str  # machine-readable, for status.reason and metrics
    message: str


def _where(ref: ContainerRef) -> str:
    return f"spec.{ref.field}[{ref.name}]"


# --- quantities ----------------------------------------------------------------------------


def _quantity_violations(pod: Mapping[str, Any]) -> Iterator[Violation]:
    """Invalid quantities are denied, never silently read as zero; so is a request above its
    limit (a profile's cpu or hostMemory can make one), with the fix rather than the API
    server's later rejection."""
    for ref in containers(pod):
        values: dict[str, dict[str, Decimal]] = {"limits": {}, "requests": {}}
        for section in ("limits", "requests"):
            for name, value in ref.resources(section).items():
                try:
                    if is_gpu_resource(str(name)):
                        parse_count(value)
                    else:
                        values[section][str(name)] = parse_non_negative(value)
                except QuantityError as exc:
                    yield Violation(
                        "quantities",
                        "InvalidQuantity",
                        f"{_where(ref)}.resources.{section}[{name}]: {exc}",
                    )
        for name, requested in sorted(values["requests"].items()):
            limit = values["limits"].get(name)
            if limit is not None and requested > limit:
                yield Violation(
                    "quantities",
                    "RequestAboveLimit",
                    f"{_where(ref)}.resources.requests[{name}] "
                    f"{ref.resources('requests')[name]} is more than its limit "
                    f"{ref.resources('limits')[name]}; raise limits[{name}] to at least the "
                    "request or remove it",
                )


# --- isolation escapes ---------------------------------------------------------------------


def _owned_env(placement: Placement) -> Mapping[str, str]:
    backend_plan = plan(placement) if placement.governed else None
    return backend_plan.env if backend_plan is not None else {}


def _written_by_hamis_webhook(
    name: str, entry: Mapping[str, Any], ref: ContainerRef, placement: Placement
) -> bool:
    """The two limiter variables HAMi's own webhook writes (it runs before any validating
    webhook): CUDA_TASK_PRIORITY from the container's nvidia.com/priority limit, and
    GPU_CORE_UTILIZATION_POLICY from HAMi's gpuCorePolicy (MutateAdmission in Project-HAMi/HAMi
    pkg/device/nvidia/device.go). Only those exact values pass."""
    value = entry.get("value")
    if "valueFrom" in entry or not isinstance(value, str):
        return False
    if name == "CUDA_TASK_PRIORITY":
        priority = ref.resources("limits").get("nvidia.com/priority")
        return priority is not None and str(priority) == value
    if name == "GPU_CORE_UTILIZATION_POLICY":
        profile = placement.profile
        backend = profile.backend if profile is not None else None
        if value == "force":  # stricter than the default: never an escape
            return True
        return isinstance(backend, HamiBackend) and backend.gpu_core_policy == value != "default"
    return False


def _env_violations(
    pod: Mapping[str, Any],
    placement: Placement,
    cluster: ClusterView,
    namespace: str,
    fields: tuple[str, ...] = (),
) -> Iterator[Violation]:
    owned = _owned_env(placement)
    targets = set(placement.containers)
    for ref in containers(pod, *fields):
        mine = owned if ref.field == "containers" and ref.name in targets else {}
        gpus = _container_gpu_count(ref)
        for entry in ref.env():
            name = str(entry.get("name", ""))
            if _FORBIDDEN_ENV.match(name):
                if name in mine and entry.get("value") == mine[name] and "valueFrom" not in entry:
                    continue
                if _written_by_hamis_webhook(name, entry, ref, placement):
                    continue
                yield Violation(
                    "environment",
                    "GPUIsolationEscape",
                    f"{_where(ref)}.env[{name}]: setting {name} {_escape_effect(name)}; "
                    "remove it (gpuwarden and the device plugin set what is needed)",
                )
            elif name == "CUDA_VISIBLE_DEVICES":
                problem = _visible_devices_problem(str(entry.get("value", "")), gpus)
                if problem:
                    yield Violation(
                        "environment",
                        "GPUIsolationEscape",
                        f"{_where(ref)}.env[CUDA_VISIBLE_DEVICES]: {problem}; remove it",
                    )
        yield from _env_from_violations(ref, cluster, namespace)


def _container_gpu_count(ref: ContainerRef) -> int:
    total = 0
    for name, value in ref.gpu_resources().items():
        if name in GPU_COUNT_RESOURCES:
            try:
                total += parse_count(value)
            except QuantityError:
                continue
    return total


def _visible_devices_problem(value: str, gpus: int) -> str | None:
    devices = [d for d in value.replace(" ", "").split(",") if d]
    if value.strip().lower() in ("all", ""):
        return "it asks for every GPU on the node" if value.strip() else None
    if gpus == 0:
        return "the container requests no GPU, so it must not select GPUs"
    if len(devices) > gpus:
        return f"it lists {len(devices)} devices but the container was given {gpus}"
    return None


def _env_sources(ref: ContainerRef) -> Iterator[tuple[str, str, str]]:
    """(kind, name, prefix) of each ConfigMap and Secret the container's envFrom names."""
    sources = ref.body.get("envFrom")
    for source in sources if isinstance(sources, list) else []:
        if not isinstance(source, dict):
            continue
        prefix = str(source.get("prefix") or "")
        for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            target = source.get(field)
            if isinstance(target, dict) and target.get("name"):
                yield kind, str(target["name"]), prefix


def _env_from_violations(
    ref: ContainerRef, cluster: ClusterView, namespace: str
) -> Iterator[Violation]:
    """envFrom makes a source's keys into variables at every container start, so a source is
    judged by what it could hold, not only by what it holds now:

    * a known ConfigMap's keys that make denied variables are denied by name;
    * a prefix that some key would turn into a denied variable (NVIDIA_, CUDA_MPS_, C) is denied
      whatever the source holds now: gpuwarden judges a ConfigMap's own keys when it changes,
      without the prefix of each pod that reads it;
    * without such a prefix, a source whose keys gpuwarden cannot read is denied: Secrets (the
      webhook never reads them) and ConfigMaps it does not know (not created yet). A prefix that
      reaches no denied variable (APP_) makes any source safe, whatever its keys.
    """
    for kind, name, prefix in _env_sources(ref):
        where = f"{_where(ref)}.envFrom[{name}]"
        known = cluster.env_source_keys.get((kind, namespace, name))
        formed = [key for key in sorted(known or ()) if _FORBIDDEN_ENV.match(prefix + key)]
        for key in formed:
            yield Violation(
                "environment",
                "GPUIsolationEscape",
                f"{where}: {kind} key {key} sets {prefix + key}, which "
                f"{_escape_effect(prefix + key)}; remove that key",
            )
        if formed or not _prefix_reaches(prefix):
            continue
        if prefix:
            variable = _reached_name(prefix)
            yield Violation(
                "environment",
                "GPUIsolationEscape",
                f"{where}: prefix {prefix} makes {kind} keys into {prefix}* variables: a key "
                f"{variable[len(prefix) :]}, now or added later, would set {variable}, which "
                f"{_escape_effect(variable)}; use another prefix (APP_, say)",
            )
        elif known is None and kind == "Secret":
            yield Violation(
                "environment",
                "GPUIsolationEscape",
                f"{where}: gpuwarden does not read Secrets, so a key NVIDIA_VISIBLE_DEVICES or "
                "CUDA_MPS_* in it would escape GPU isolation unchecked; set a prefix (APP_, say) "
                "or name each key under env with valueFrom.secretKeyRef",
            )
        elif known is None:
            yield Violation(
                "environment",
                "GPUIsolationEscape",
                f"{where}: gpuwarden does not know ConfigMap {name} yet, so it cannot check its "
                "keys for NVIDIA_VISIBLE_DEVICES or CUDA_MPS_*; create the ConfigMap before the "
                "pod, or set a prefix (APP_, say)",
            )


def _runtime_class_violations(pod: Mapping[str, Any]) -> Iterator[Violation]:
    """NVIDIA's runtime on a pod without GPUs: CUDA images set NVIDIA_VISIBLE_DEVICES=all in
    their own environment, which the runtime then honours. The RuntimeClasses are the GPU
    Operator's nvidia and the toolkit's per-mode nvidia-cdi and nvidia-legacy (modeRuntime in
    NVIDIA/nvidia-container-toolkit cmd/nvidia-ctk-installer/container/operator/operator.go)."""
    name = spec_of(pod).get("runtimeClassName")
    if not isinstance(name, str) or not (name == "nvidia" or name.startswith("nvidia-")):
        return
    if requests_gpu(pod):
        return
    yield Violation(
        "environment",
        "GPUIsolationEscape",
        f"spec.runtimeClassName {name}: the pod asks for no GPU, and under NVIDIA's runtime a "
        "CUDA image's own NVIDIA_VISIBLE_DEVICES=all exposes every GPU on the node; remove "
        "runtimeClassName, or ask for a GPU in resources.limits",
    )


#: Where NVIDIA's container toolkit reads the GPUs to expose when the device plugin uses its
#: volume-mounts device list strategy: a mount there selects devices.
DEVICE_LIST_MOUNTS = "/var/run/nvidia-container-devices"


def _host_path(raw: str) -> str:
    """A host path as the host resolves it: normalised, with /var/run as /run (a symlink on
    every systemd host)."""
    path = posixpath.normpath("/" + raw.lstrip("/")) if raw else "/"
    if path == "/var/run" or path.startswith("/var/run/"):
        path = "/run" + path[len("/var/run") :]
    return path


def _protected_paths(mps_dirs: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_host_path(p) for p in mps_dirs)


def _device_list_mount_violations(pod: Mapping[str, Any]) -> Iterator[Violation]:
    for ref in containers(pod):
        for index, mount in enumerate(ref.body.get("volumeMounts") or []):
            if not isinstance(mount, Mapping):
                continue
            target = _host_path(str(mount.get("mountPath", "")))
            device_list = _host_path(DEVICE_LIST_MOUNTS)
            if target == device_list or target.startswith(device_list + "/"):
                yield Violation(
                    "host_paths",
                    "GPUIsolationEscape",
                    f"{_where(ref)}.volumeMounts[{index}].mountPath {mount.get('mountPath')}: "
                    "mounts there select GPUs for NVIDIA's container toolkit (volume-mounts "
                    "device list); remove this mount",
                )


def _host_path_violations(pod: Mapping[str, Any], mps_dirs: tuple[str, ...]) -> Iterator[Violation]:
    yield from _device_list_mount_violations(pod)
    volumes = spec_of(pod).get("volumes")
    if not isinstance(volumes, list):
        return
    protected = _protected_paths(mps_dirs)
    for volume in volumes:
        if not isinstance(volume, dict) or not isinstance(volume.get("hostPath"), Mapping):
            continue
        raw = str(volume["hostPath"].get("path", ""))
        path = _host_path(raw)
        name = str(volume.get("name", "?"))
        # The path itself, a parent (it holds the directory) or a child (the device plugin keeps
        # each daemon's pipes in <root>/<resource>/pipe) all reach the daemons.
        reached = [
            p
            for p in protected
            if path == p or p.startswith(path.rstrip("/") + "/") or path.startswith(p + "/")
        ]
        if path.startswith("/dev/nvidia") or path in ("/", "/dev"):
            reached.append("/dev/nvidia*")
        if reached:
            yield Violation(
                "host_paths",
                "GPUIsolationEscape",
                f"spec.volumes[{name}].hostPath {raw}: reaches {', '.join(reached)} "
                "(other tenants' MPS daemons or GPU devices); remove this volume",
            )


# Added capabilities that reach every GPU like privileged does; names as the runtimes read them
# (containerd and CRI-O upper-case a name and add CAP_ where it is missing; ALL adds every one).
_ESCAPING_CAPABILITIES = {
    "SYS_ADMIN": "SYS_ADMIN, like privileged, can reach every GPU on the node (it mounts "
    "filesystems and changes device access)",
    "ALL": "ALL adds every capability, SYS_ADMIN included, so the container can reach every GPU "
    "on the node",
}


def _capability_violations(ref: ContainerRef, context: Mapping[str, Any]) -> Iterator[Violation]:
    capabilities = context.get("capabilities")
    added = capabilities.get("add") if isinstance(capabilities, dict) else None
    for raw in added if isinstance(added, list) else []:
        name = str(raw).strip().upper()
        why = _ESCAPING_CAPABILITIES.get(name[4:] if name.startswith("CAP_") else name)
        if why is not None:
            yield Violation(
                "privileged",
                "GPUIsolationEscape",
                f"{_where(ref)}.securityContext.capabilities.add[{raw}]: {why}; remove it",
            )


def _privilege_violations(pod: Mapping[str, Any]) -> Iterator[Violation]:
    for ref in containers(pod):
        context = ref.body.get("securityContext")
        if not isinstance(context, dict):
            continue
        if context.get("privileged") is True:
            yield Violation(
                "privileged",
                "GPUIsolationEscape",
                f"{_where(ref)}.securityContext.privileged: privileged containers see every GPU "
                "on the node; remove privileged: true",
            )
        yield from _capability_violations(ref, context)


def _host_namespace_violations(pod: Mapping[str, Any]) -> Iterator[Violation]:
    spec = spec_of(pod)
    for field in ("hostIPC", "hostPID"):
        if spec.get(field) is True:
            yield Violation(
                "host_namespaces",
                "GPUIsolationEscape",
                f"spec.{field}: sharing the node's {field[4:]} namespace reaches other tenants' "
                f"GPU processes; remove {field}: true",
            )


# --- policy consistency --------------------------------------------------------------------


def _readable(path: str) -> str:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    out = ""
    for part in parts:
        out += f"[{part}]" if ("/" in part or "." in part or part.isdigit()) else f".{part}"
    return out.lstrip(".")


def _scheduling_violations(
    pod: Mapping[str, Any], placement: Placement, cluster: ClusterView
) -> Iterator[Violation]:
    if not placement.governed:
        if placement.tenant is not None and placement.source != "skip" and requests_gpu(pod):
            yield Violation(
                "scheduling",
                "NoGPUProfile",
                "the pod requests a GPU but no gpuwarden rule gives it a profile; set the label "
                f"{keys.PROFILE_LABEL} to one of: {', '.join(_allowed(placement.tenant, cluster))}",
            )
        return
    if size_problems(placement):
        return  # not mutated, and denied for its size: nothing to compare
    desired, _ = apply_placement(pod, placement, cluster)
    if desired.ops:
        first = desired.ops[0]
        field = _readable(str(first["path"]))
        wanted = first.get("value")
        profile = placement.profile.name if placement.profile else "?"
        verb = "must not be set" if first["op"] == "remove" else f"must be {wanted!r}"
        yield Violation(
            "scheduling",
            "PolicyMismatch",
            f"{field} contradicts profile {profile} ({placement.origin}): it {verb}; "
            "remove your change and let gpuwarden set it",
        )
    targets = set(placement.containers)
    for ref in containers(pod):
        if ref.field == "containers" and ref.name in targets:
            continue
        if ref.asks_for_gpu():
            yield Violation(
                "scheduling",
                "PolicyMismatch",
                f"{_where(ref)} requests {', '.join(sorted(ref.gpu_resources()))} but profile "
                f"{placement.profile.name if placement.profile else '?'} gives GPUs only to "
                f"{_listed(placement.containers)}; remove those resources",
            )


def _node_name_violations(pod: Mapping[str, Any]) -> Iterator[Violation]:
    """A GPU pod bound to a node by name never meets the scheduler: no device assignment (Volcano
    and HAMi write it), no queue, no packing, and no check that the node has the GPUs free."""
    node = spec_of(pod).get("nodeName")
    if not node or not requests_gpu(pod):
        return
    yield Violation(
        "scheduling",
        "PolicyMismatch",
        f"spec.nodeName {node}: a GPU pod bound to a node by name skips the scheduler and the GPU "
        "accounting it does; remove nodeName and pick the node with a nodeSelector or node "
        "affinity on kubernetes.io/hostname",
    )


def _scheduler_bound_resources(placement: Placement) -> list[str]:
    """The profile's GPU resources that only its backend's scheduler can place: Volcano's vGPU
    resources and everything HAMi's device plugin serves, whose device plugins read the device
    the scheduler assigned from the pod's annotations."""
    profile, backend_plan = placement.profile, plan(placement)
    if profile is None or backend_plan is None:
        return []
    if isinstance(profile.backend, HamiBackend):
        return sorted(backend_plan.resources)
    if isinstance(profile.backend, VolcanoBackend):
        return sorted(r for r in backend_plan.resources if r.startswith("volcano.sh/"))
    return []


def _foreign_scheduler_violations(
    pod: Mapping[str, Any], placement: Placement
) -> Iterator[Violation]:
    """foreignScheduler: keep leaves another controller's schedulerName (and warns), which is
    sound where any scheduler counts the pod's GPUs (nvidia.com/gpu and the device plugin's
    replicas: the kubelet refuses a pod past the node's devices). Where only the backend's own
    scheduler can assign the device, another scheduler would start a pod with no device, or
    none at all, outside the tenant's queue: denied."""
    profile, backend_plan = placement.profile, plan(placement)
    if not placement.governed or profile is None or backend_plan is None:
        return
    wanted, current = backend_plan.scheduler_name, spec_of(pod).get("schedulerName")
    if (
        wanted is None
        or current in (None, "", wanted)
        or profile.backend.foreign_scheduler != "keep"
    ):
        return
    bound = _scheduler_bound_resources(placement)
    if bound:
        yield Violation(
            "scheduling",
            "PolicyMismatch",
            f"spec.schedulerName {current}: profile {profile.name} ({placement.origin}) gives "
            f"{_listed(bound)}, which only scheduler {wanted} assigns to a device, so "
            f"foreignScheduler: keep cannot keep another scheduler; remove schedulerName or set "
            f"it to {wanted}",
        )


def _allowed(tenant: Tenant | None, cluster: ClusterView) -> list[str]:
    del cluster
    if tenant is None or tenant.limits.allowed_profiles is None:
        return ["<any profile>"]
    return list(tenant.limits.allowed_profiles)


def _too_many_gpus(placement: Placement, tenant: str, limit: int) -> str:
    """The denial for a pod over maxGpusPerPod: which containers, what set their counts, what
    to change."""
    granted = placement.container_grants
    profile = placement.profile.name if placement.profile else "?"
    total = placement.total_gpus
    allows = f"tenant {tenant} allows at most {limit} per pod"
    set_by = sorted({c.grant.profile.gpus_set_by or "" for c in granted} - {""})
    if len(granted) == 1 and not set_by:
        name = granted[0].name
        return (
            f"container {name} asks for {total} GPUs (profile {profile}, {placement.origin}) "
            f"but {allows}; ask for at most {limit} in spec.containers[{name}].resources"
        )
    counts = _listed([f"{c.name} {c.gpus}" for c in granted])
    fix = (
        f"{' and '.join(set_by)} sets the count, so use a profile with fewer GPUs "
        f"(label {keys.PROFILE_LABEL})"
        if set_by
        else "ask for fewer GPUs per container"
    )
    return (
        f"the pod would get {total} GPUs ({counts}; profile {profile}, {placement.origin}) "
        f"but {allows}; {fix}"
    )


def _skipped_gpu_violations(placement: Placement, pod: Mapping[str, Any]) -> Iterator[Violation]:
    """A pod a skip rule leaves untouched still keeps to its tenant's GPUs per pod."""
    tenant, rule = placement.tenant, placement.rule
    if tenant is None or rule is None or tenant.limits.max_gpus_per_pod is None:
        return
    limit = tenant.limits.max_gpus_per_pod
    try:
        asked = sum(ref.asked_gpus() or 0 for ref in containers(pod))
    except QuantityError:
        return  # the quantities check names the field
    if asked > limit:
        yield Violation(
            "tenant_limits",
            "TenantLimit",
            f"rule {rule.name} leaves the pod untouched, but it asks for {asked} GPUs and tenant "
            f"{tenant.name} allows at most {limit} per pod; ask for at most {limit}",
        )


def _tenant_limit_violations(placement: Placement, pod: Mapping[str, Any]) -> Iterator[Violation]:
    tenant, profile = placement.tenant, placement.profile
    if placement.source == "skip":
        yield from _skipped_gpu_violations(placement, pod)
        return
    if tenant is None or profile is None:
        return
    limits = tenant.limits
    if limits.allowed_profiles is not None and profile.name not in limits.allowed_profiles:
        yield Violation(
            "tenant_limits",
            "TenantLimit",
            f"profile {profile.name} ({placement.origin}) is not allowed for tenant {tenant.name}; "
            f"use one of: {', '.join(limits.allowed_profiles)} "
            f"(label {keys.PROFILE_LABEL})",
        )
    granted = placement.container_grants
    gpus = placement.total_gpus
    if limits.max_gpus_per_pod is not None and gpus > limits.max_gpus_per_pod:
        yield Violation(
            "tenant_limits",
            "TenantLimit",
            _too_many_gpus(placement, tenant.name, limits.max_gpus_per_pod),
        )
    if limits.max_gpu_memory_per_pod is not None and profile.max_memory is not None:
        cap = parse_non_negative(limits.max_gpu_memory_per_pod)
        memory = profile.max_memory * sum(max(c.gpus, 1) for c in granted)
        if gpus and memory > cap:
            yield Violation(
                "tenant_limits",
                "TenantLimit",
                f"the pod would get {format_bytes(memory)} of GPU memory (profile "
                f"{profile.name}) but tenant {tenant.name} allows at most "
                f"{limits.max_gpu_memory_per_pod} per pod; use a smaller profile",
            )
    if limits.require_shared and profile.gpus and not profile.gpu_share:
        yield Violation(
            "tenant_limits",
            "TenantLimit",
            f"profile {profile.name} gives whole GPUs but tenant {tenant.name} must share GPUs; "
            f"use a shared profile (label {keys.PROFILE_LABEL})",
        )


def _resource_claim_violations(pod: Mapping[str, Any], placement: Placement) -> Iterator[Violation]:
    """Dynamic Resource Allocation: a claim's devices are chosen by its ResourceClaim, which
    gpuwarden does not see, so no profile, limit or quota would apply. A tenant's pods get GPUs
    through device plugins unless its limits allow claims. Namespaces of no tenant have no
    limits or quota for a claim to bypass (a claim escapes no isolation the device plugins keep)."""
    tenant = placement.tenant
    if tenant is None or tenant.limits.allow_resource_claims:
        return
    claims = spec_of(pod).get("resourceClaims")
    fields = [
        f"spec.resourceClaims[{c.get('name', index) if isinstance(c, dict) else index}]"
        for index, c in enumerate(claims if isinstance(claims, list) else [])
    ]
    for ref in containers(pod):
        resources = ref.body.get("resources")
        if isinstance(resources, dict) and resources.get("claims"):
            fields.append(f"{_where(ref)}.resources.claims")
    if fields:
        yield Violation(
            "tenant_limits",
            "TenantLimit",
            f"{_listed(fields)}: tenant {tenant.name} gets GPUs through device plugins, where its "
            "profiles, limits and quota apply, not through Dynamic Resource Allocation; remove "
            "the resource claims, or have an admin set limits.allowResourceClaims: true for the "
            "tenant",
        )


def tenant_gpu_memory(policies: PolicySet, cluster: ClusterView, tenant: Tenant) -> Decimal:
    """GPU memory admitted to the tenant's live pods: the namespaces the policies give it."""
    return sum(
        (
            amount
            for namespace, amount in cluster.namespace_gpu_memory.items()
            if policies.tenant_for(namespace, cluster.labels_for(namespace)) is tenant
        ),
        Decimal(0),
    )


def _quota_violations(
    pod: Mapping[str, Any], placement: Placement, cluster: ClusterView, policies: PolicySet
) -> Iterator[Violation]:
    tenant, profile = placement.tenant, placement.profile
    if tenant is None or profile is None or tenant.limits.gpu_memory_quota is None:
        return
    wanted = admitted_gpu_memory(pod)
    if wanted == 0:
        return
    quota = parse_non_negative(tenant.limits.gpu_memory_quota)
    ceiling = quota * Decimal(str(profile.overcommit_ratio))
    used = tenant_gpu_memory(policies, cluster, tenant)
    if used + wanted > ceiling:
        yield Violation(
            "gpu_memory_quota",
            "TenantGPUMemoryQuota",
            f"tenant {tenant.name} has {format_bytes(used)} of GPU memory admitted; this pod adds "
            f"{format_bytes(wanted)}, past its quota {tenant.limits.gpu_memory_quota} x "
            f"overcommit {profile.overcommit_ratio:g} = {format_bytes(ceiling)}; "
            "delete idle GPU pods or use a smaller profile",
        )


# --- updates -------------------------------------------------------------------------------


def _update_violations(request: AdmissionRequest) -> Iterator[Violation]:
    """On UPDATE, gpuwarden's own annotations are read by the node agent and charge quota, and
    volcano.sh/preemptable (written from the profile's preemptible) decides whether Volcano may
    preempt the pod: nobody may change them, in any namespace."""
    old = annotations_of(request.old_pod or {})
    new = annotations_of(request.pod)
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key):
            continue
        if key.startswith(keys.API_GROUP + "/"):
            yield Violation(
                "annotations",
                "PolicyMismatch",
                f"metadata.annotations[{key}]: gpuwarden's decision annotations cannot be "
                "changed after admission; revert the change",
            )
        elif key == VOLCANO_PREEMPTABLE_ANNOTATION:
            yield Violation(
                "annotations",
                "PolicyMismatch",
                f"metadata.annotations[{key}]: gpuwarden sets it from the profile's "
                "preemptible, and Volcano reads it to preempt; it cannot be changed after "
                "admission; revert the change",
            )


def _same_quantity(old: Any, new: Any) -> bool:
    if old is None or new is None:
        return old is new
    try:
        return parse_quantity(old) == parse_quantity(new)
    except QuantityError:
        return str(old) == str(new)


def _resize_violations(request: AdmissionRequest, placement: Placement) -> Iterator[Violation]:
    """pods/resize may change the cpu and memory of running containers: not those the profile
    set (hostMemory, cpu), or a pod would keep its profile and outgrow it."""
    old_pod = request.old_pod
    if old_pod is None or not placement.governed:
        return
    profile = placement.profile.name if placement.profile else "?"
    before = {ref.name: ref for ref in containers(old_pod, "containers")}
    after = {ref.name: ref for ref in containers(request.pod, "containers")}
    for granted in placement.container_grants:
        old, new = before.get(granted.name), after.get(granted.name)
        if old is None or new is None:
            continue
        for section, values in (
            ("limits", granted.grant.limits),
            ("requests", granted.grant.requests),
        ):
            for name in sorted(values):
                was, now = old.resources(section).get(name), new.resources(section).get(name)
                if _same_quantity(was, now):
                    continue
                yield Violation(
                    "scheduling",
                    "PolicyMismatch",
                    f"{_where(new)}.resources.{section}[{name}]: profile {profile} "
                    f"({placement.origin}) sets it to {values[name]}, and a resize may not change "
                    f"what gpuwarden set; resize only what the profile leaves to the pod",
                )


def _checks(
    request: AdmissionRequest, placement: Placement, policies: PolicySet, cluster: ClusterView
) -> list[tuple[str, Callable[[], Iterator[Violation]]]]:
    pod = request.pod
    mps_dirs = tuple(
        dir_
        for policy in policies.policies
        for dir_ in (policy.spec.mps.pipe_directory, policy.spec.mps.log_directory)
    )
    if request.operation == "UPDATE" and request.sub_resource == "ephemeralcontainers":
        # kubectl debug: only the new ephemeral containers can open a hole.
        debug = ("ephemeralContainers",)
        return [
            (
                "environment",
                lambda: _env_violations(pod, placement, cluster, request.namespace, debug),
            ),
            ("host_paths", lambda: _device_list_mount_violations(pod)),
            ("privileged", lambda: _privilege_violations(pod)),
        ]
    if request.operation == "UPDATE" and request.sub_resource == "resize":
        return [("scheduling", lambda: _resize_violations(request, placement))]
    if request.operation == "UPDATE":
        return [("annotations", lambda: _update_violations(request))]
    return [
        ("quantities", lambda: _quantity_violations(pod)),
        ("annotations", lambda: _forged_annotation_violations(pod, placement)),
        ("tenant_limits", lambda: _tenant_limit_violations(placement, pod)),
        ("tenant_limits", lambda: _resource_claim_violations(pod, placement)),
        ("environment", lambda: _env_violations(pod, placement, cluster, request.namespace)),
        ("environment", lambda: _runtime_class_violations(pod)),
        ("host_paths", lambda: _host_path_violations(pod, mps_dirs)),
        ("privileged", lambda: _privilege_violations(pod)),
        ("host_namespaces", lambda: _host_namespace_violations(pod)),
        ("scheduling", lambda: _scheduling_violations(pod, placement, cluster)),
        ("scheduling", lambda: _node_name_violations(pod)),
        ("scheduling", lambda: _foreign_scheduler_violations(pod, placement)),
        ("gpu_memory_quota", lambda: _quota_violations(pod, placement, cluster, policies)),
    ]


#: The checks that keep a pod inside its GPUs, run in namespaces of no tenant too.
ESCAPE_CHECKS = frozenset(
    {"environment", "host_paths", "privileged", "host_namespaces", "annotations"}
)
#: Checks no tenant can turn off.
_ALWAYS = frozenset({"quantities", "annotations"})


def _forged_annotation_violations(
    pod: Mapping[str, Any], placement: Placement
) -> Iterator[Violation]:
    """gpuwarden's decision annotations on a pod it did not decide: they would charge another
    tenant's GPU memory or steer the node agent."""
    if placement.governed:
        return  # the mutation wrote them, and the scheduling check compares them
    forged = sorted(k for k in annotations_of(pod) if k in keys.DECISION_ANNOTATIONS)
    if forged:
        yield Violation(
            "annotations",
            "ForgedDecision",
            f"metadata.annotations {', '.join(forged)}: only gpuwarden writes these, and it "
            "gives this pod no profile; remove them",
        )


def violations(
    request: AdmissionRequest, policies: PolicySet, cluster: ClusterView
) -> tuple[Placement, list[Violation]]:
    """Every violation of the pod, in check order (for `explain` and tests)."""
    placement = place(
        request.pod, request.namespace, cluster.labels_for(request.namespace), policies
    )
    found: list[Violation] = []
    if placement.problems and request.operation == "CREATE":
        found += [Violation("placement", "ProfileSelection", p) for p in placement.problems]
    if request.operation == "CREATE":
        found += [
            Violation("placement", "TooManyGPUContainers", p) for p in size_problems(placement)
        ]
    tenant = placement.tenant
    # Escapes are denied in every namespace the webhook sees, tenant or not; a namespace of no
    # tenant has no limits, quota or profile to check.
    enforcement = tenant.enforcement if tenant is not None else None
    for check, run in _checks(request, placement, policies, cluster):
        if enforcement is None and check not in ESCAPE_CHECKS:
            continue
        if enforcement is not None and check not in _ALWAYS and not getattr(enforcement, check):
            continue
        # A count the placement could not read is also an invalid quantity: say it once.
        found += [v for v in run() if v.message not in placement.problems]
    return placement, found


def kueue_template_warnings(request: AdmissionRequest, placement: Placement) -> tuple[str, ...]:
    """A new pod of a job Kueue admitted whole (Kueue's podset label, which it puts on the job's
    pod templates when it admits the job): Kueue charged what the template asks, and a profile
    that decides the GPU request itself makes the pod ask for something else (kueue.py). The
    final pod no longer shows what the template asked, so the warning names what the profile
    does to it."""
    if request.operation != "CREATE" or request.sub_resource or not placement.governed:
        return ()
    if kueue.PODSET_LABEL not in labels_of(request.pod) or placement.profile is None:
        return ()
    rewrite = kueue.template_rewrite(placement.profile, plan(placement))
    if rewrite is None:
        return ()
    return (warning(f"gpuwarden: Kueue charged the job's template, but {rewrite.why}"),)


def validate(request: AdmissionRequest, policies: PolicySet, cluster: ClusterView) -> Decision:
    pod = request.pod
    if request.operation not in ("CREATE", "UPDATE") or not isinstance(pod.get("spec"), Mapping):
        return Decision()
    if pod.get("kind", "Pod") != "Pod":
        return Decision()
    if request.sub_resource not in ("", "ephemeralcontainers", "resize"):
        return Decision()
    placement, found = violations(request, policies, cluster)
    base = context_of(placement, warnings=kueue_template_warnings(request, placement))
    if not found:
        return base
    first = found[0]
    policy = placement.profile.policy if placement.profile else ",".join(policies.names)
    return replace(
        base,
        allowed=False,
        code=403,
        reason=first.reason,
        message=_denial(
            "pod",
            found,
            f"[policy {_cut(policy, 80)}, check {to_camel(first.check)}, {placement.origin}]",
        ),
        audit_annotations={"denied-by": first.check, "reason": first.reason},
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def _denial(subject: str, found: Sequence[Violation], tail: str) -> str:
    """The denial's message within MAX_MESSAGE: as many of the first _MAX_SHOWN violations as
    fit (the first always, cut if it must be), then how many more there are, then ``tail``."""
    head = f"gpuwarden denied the {subject}: "
    room = MAX_MESSAGE - len(head) - len(tail) - len("; and 1000000 more ")
    shown = [_cut(found[0].message, room)]
    used = len(shown[0])
    for violation in found[1:_MAX_SHOWN]:
        used += len(violation.message) + 2
        if used > room:
            break
        shown.append(violation.message)
    more = f"; and {len(found) - len(shown)} more" if len(found) > len(shown) else ""
    return f"{head}{'; '.join(shown)}{more} {tail}"


def validate_config_map(
    request: AdmissionRequest, policies: PolicySet, cluster: ClusterView
) -> Decision:
    """A ConfigMap's keys become variables in every container whose envFrom names it (without a
    prefix), at each container start, so a ConfigMap changed after its pods were admitted is
    judged itself: keys named as the variables the environment check denies are denied, in
    every namespace the webhook sees unless its tenant turns that check off. (A prefix that could
    make a denied variable is denied on the pod, whatever the ConfigMap holds.)"""
    config_map = request.pod
    if request.operation not in ("CREATE", "UPDATE"):
        return Decision()
    tenant = policies.tenant_for(request.namespace, cluster.labels_for(request.namespace))
    base = Decision(tenant=tenant.name if tenant is not None else None)
    if tenant is not None and not tenant.enforcement.environment:
        return base
    data = config_map.get("data")
    found = [
        Violation(
            "environment",
            "GPUIsolationEscape",
            f"data[{key}]: a pod's envFrom would set {key}, which {_escape_effect(key)}; rename "
            "or remove the key",
        )
        for key in sorted(str(k) for k in (data if isinstance(data, Mapping) else {}))
        if _FORBIDDEN_ENV.match(key)
    ]
    if not found:
        return base
    return replace(
        base,
        allowed=False,
        code=403,
        reason=found[0].reason,
        message=_denial(
            "ConfigMap", found, f"[policy {_cut(','.join(policies.names), 80)}, check environment]"
        ),
        audit_annotations={"denied-by": "environment", "reason": found[0].reason},
    )
