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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from gpuwarden.policy import keys
from gpuwarden.policy.decision import AdmissionRequest, ClusterView, Decision, warning
from gpuwarden.policy.model import HamiBackend, Tenant
from gpuwarden.policy.mutate import admitted_gpu_memory, apply_placement, context_of, plan
from gpuwarden.policy.placement import Placement, place
from gpuwarden.policy.policyset import PolicySet
from gpuwarden.policy.quantity import QuantityError, format_bytes, parse_count, parse_non_negative
from gpuwarden.policy.resources import (
    GPU_COUNT_RESOURCES,
    ContainerRef,
    annotations_of,
    containers,
    is_gpu_resource,
    requests_gpu,
    spec_of,
)

_MAX_SHOWN = 5
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
_FORBIDDEN_ENV = re.compile(
    r"^(NVIDIA_VISIBLE_DEVICES|NVIDIA_DRIVER_CAPABILITIES|CUDA_MPS_.*)$|" + _LIMITER_ENV.pattern
)


def _escape_effect(name: str) -> str:
    if _LIMITER_ENV.match(name):
        return "can lift the GPU caps HAMi-core's limiter holds the pod to"
    return "can escape GPU isolation"


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
    pod: Mapping[str, Any], placement: Placement, cluster: ClusterView, namespace: str
) -> Iterator[Violation]:
    owned = _owned_env(placement)
    targets = set(placement.containers)
    for ref in containers(pod):
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
    for kind, name, prefix in _env_sources(ref):
        known = cluster.env_source_keys.get((kind, namespace, name))
        if known is None:
            if prefix and (
                _FORBIDDEN_ENV.match(prefix + "X") or _FORBIDDEN_ENV.match(prefix + "0")
            ):
                yield Violation(
                    "environment",
                    "GPUIsolationEscape",
                    f"{_where(ref)}.envFrom[{name}]: prefix {prefix} makes "
                    f"{kind} keys into {prefix}* variables; remove the prefix",
                )
            continue
        for key in sorted(known):
            if _FORBIDDEN_ENV.match(prefix + key):
                yield Violation(
                    "environment",
                    "GPUIsolationEscape",
                    f"{_where(ref)}.envFrom[{name}]: {kind} key {key} sets "
                    f"{prefix + key}, which {_escape_effect(prefix + key)}; remove that key",
                )


def _unchecked_env_sources(
    request: AdmissionRequest, placement: Placement, cluster: ClusterView
) -> tuple[str, ...]:
    """Warnings for envFrom sources whose keys gpuwarden cannot see (Secrets, unknown ConfigMaps)."""
    tenant = placement.tenant
    if tenant is None or not tenant.enforcement.environment or request.operation != "CREATE":
        return ()
    unknown = [
        f"{kind} {name}"
        for ref in containers(request.pod)
        for kind, name, _ in _env_sources(ref)
        if (kind, request.namespace, name) not in cluster.env_source_keys
    ]
    if not unknown:
        return ()
    return (
        warning(
            f"gpuwarden: envFrom {', '.join(sorted(set(unknown)))} not checked for "
            "NVIDIA_*/CUDA_MPS_* keys"
        ),
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


def _privilege_violations(pod: Mapping[str, Any]) -> Iterator[Violation]:
    for ref in containers(pod):
        context = ref.body.get("securityContext")
        if isinstance(context, dict) and context.get("privileged") is True:
            yield Violation(
                "privileged",
                "GPUIsolationEscape",
                f"{_where(ref)}.securityContext.privileged: privileged containers see every GPU "
                "on the node; remove privileged: true",
            )


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
                f"{', '.join(placement.containers)}; remove those resources",
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
    counts = ", ".join(f"{c.name} {c.gpus}" for c in granted)
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
    """On UPDATE, gpuwarden's own annotations are read by the node agent: nobody may change them."""
    old = annotations_of(request.old_pod or {})
    new = annotations_of(request.pod)
    for key in sorted(set(old) | set(new)):
        if key.startswith(keys.API_GROUP + "/") and old.get(key) != new.get(key):
            yield Violation(
                "scheduling",
                "PolicyMismatch",
                f"metadata.annotations[{key}]: gpuwarden's decision annotations cannot be "
                "changed after admission; revert the change",
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
        return [
            ("environment", lambda: _env_violations(pod, placement, cluster, request.namespace)),
            ("host_paths", lambda: _device_list_mount_violations(pod)),
            ("privileged", lambda: _privilege_violations(pod)),
        ]
    if request.operation == "UPDATE":
        return [("scheduling", lambda: _update_violations(request))]
    return [
        ("quantities", lambda: _quantity_violations(pod)),
        ("annotations", lambda: _forged_annotation_violations(pod, placement)),
        ("tenant_limits", lambda: _tenant_limit_violations(placement, pod)),
        ("environment", lambda: _env_violations(pod, placement, cluster, request.namespace)),
        ("host_paths", lambda: _host_path_violations(pod, mps_dirs)),
        ("privileged", lambda: _privilege_violations(pod)),
        ("host_namespaces", lambda: _host_namespace_violations(pod)),
        ("scheduling", lambda: _scheduling_violations(pod, placement, cluster)),
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


def validate(request: AdmissionRequest, policies: PolicySet, cluster: ClusterView) -> Decision:
    pod = request.pod
    if request.operation not in ("CREATE", "UPDATE") or not isinstance(pod.get("spec"), Mapping):
        return Decision()
    if pod.get("kind", "Pod") != "Pod":
        return Decision()
    if request.sub_resource not in ("", "ephemeralcontainers"):
        return Decision()
    placement, found = violations(request, policies, cluster)
    base = context_of(placement)
    if not found:
        unchecked = _unchecked_env_sources(request, placement, cluster)
        return replace(base, warnings=unchecked) if unchecked else base
    first = found[0]
    policy = placement.profile.policy if placement.profile else ",".join(policies.names)
    shown = "; ".join(v.message for v in found[:_MAX_SHOWN])
    more = f"; and {len(found) - _MAX_SHOWN} more" if len(found) > _MAX_SHOWN else ""
    return replace(
        base,
        allowed=False,
        code=403,
        reason=first.reason,
        message=f"gpuwarden denied the pod: {shown}{more} "
        f"[policy {policy}, check {first.check}, {placement.origin}]",
        audit_annotations={"denied-by": first.check, "reason": first.reason},
    )
