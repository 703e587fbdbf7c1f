"""Checks of the routes to an accelerator that pass by a tenant's profiles, limits and quota:
DRA's extended resources (deviceclass.resource.kubernetes.io/<DeviceClass>), other vendors' GPUs,
CDI's device annotations and runtime classes gpuwarden cannot see into. They apply to tenants'
namespaces only: elsewhere there are no limits or quota to pass by (DRA claims are judged the same
way, checks/limits.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress

from gpuwarden.policy.admission.checks.base import (
    CREATE,
    Check,
    CheckContext,
    Violation,
    container_path,
    listed,
)
from gpuwarden.policy.pod.quantity import QuantityError, parse_count
from gpuwarden.policy.pod.resources import (
    CDI_ANNOTATION_PREFIX,
    DEVICE_CLASS_RESOURCE_PREFIX,
    ContainerRef,
    device_class_of,
)
from gpuwarden.policy.render.objects import gpu_device_classes
from gpuwarden.policy.spec.model import Tenant, TenantLimits


def denied_by(name: str, limits: TenantLimits) -> str | None:
    """The limits.deniedResources entry that denies a resource name, if one does."""
    for pattern in limits.denied_resources:
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return pattern
    return None


def _named(ref: ContainerRef) -> Iterator[tuple[str, str, object]]:
    """(section, name, value) of every resource the container names, limits first, each name
    once."""
    limits = ref.resources("limits")
    for name, value in limits.items():
        yield "limits", str(name), value
    for name, value in ref.resources("requests").items():
        if name not in limits:
            yield "requests", str(name), value


def _device_class_denial(
    where: str, device_class: str, value: object, tenant: Tenant, gpu: bool
) -> str:
    how = (
        f"asks for {value} GPUs of DeviceClass {device_class} through Dynamic Resource "
        f"Allocation, where tenant {tenant.name}'s profiles, limits and quota do not apply; ask "
        f"for nvidia.com/gpu: {value} instead (the tenant's profile then sets how)"
        if gpu
        else f"asks for devices of DeviceClass {device_class} through Dynamic Resource "
        f"Allocation, which tenant {tenant.name}'s profiles, limits and quota cannot see; "
        "remove it"
    )
    return f"{where}: {how}, or have an admin set limits.allowResourceClaims: true for the tenant"


def _resources(context: CheckContext, tenant: Tenant) -> Iterator[Violation]:
    limits = tenant.limits
    denied = limits.denied_resources
    # One startswith for every name: the prefixes of denied patterns, device classes' and exact
    # names alike (a hit is then told apart).
    watched = (DEVICE_CLASS_RESOURCE_PREFIX, *(p.removesuffix("*") for p in denied))
    gpu_classes: frozenset[str] | None = None  # read from the policies at the first DRA name
    dra_gpus: list[tuple[str, int]] = []
    for ref in context.view.all_containers:
        if not ref.body.get("resources"):
            continue
        for section, name, value in _named(ref):
            if not name.startswith(watched):
                continue
            device_class = device_class_of(name)
            pattern = denied_by(name, limits) if device_class is None else None
            if device_class is None and pattern is None:
                continue
            where = f"{container_path(ref)}.resources.{section}[{name}]"
            if device_class is None:
                yield Violation(
                    "tenant_limits",
                    "TenantLimit",
                    f"{where}: no profile of tenant {tenant.name} governs {name} (it is in "
                    f"limits.deniedResources as {pattern}); ask for nvidia.com/gpu, or have an "
                    "admin take it out of limits.deniedResources for the tenant",
                )
                continue
            if gpu_classes is None:
                gpu_classes = frozenset(gpu_device_classes(context.policies))
            gpu = device_class in gpu_classes
            if not limits.allow_resource_claims:
                message = _device_class_denial(where, device_class, value, tenant, gpu)
                yield Violation("tenant_limits", "TenantLimit", message)
            elif gpu:
                with suppress(QuantityError):  # the quantities check names it
                    dra_gpus.append((f"{ref.name} {value}", parse_count(value)))
    most = limits.max_gpus_per_pod
    asked = context.placement.total_gpus + sum(count for _, count in dra_gpus)
    if dra_gpus and most is not None and asked > most:
        yield Violation(
            "tenant_limits",
            "TenantLimit",
            f"the pod would get {asked} GPUs ({listed([what for what, _ in dra_gpus])} through "
            f"DeviceClasses of spec.gpuDeviceClasses) but tenant {tenant.name} allows at most "
            f"{most} per pod; ask for at most {most}",
        )


def _runtime_class(context: CheckContext, tenant: Tenant) -> Iterator[Violation]:
    allowed = tenant.limits.allowed_runtime_classes
    name = context.view.spec.get("runtimeClassName")
    if allowed is None or not isinstance(name, str) or name in allowed:
        return
    which = f"only {', '.join(allowed)}" if allowed else "none"
    yield Violation(
        "tenant_limits",
        "TenantLimit",
        f"spec.runtimeClassName {name}: tenant {tenant.name} allows {which} (gpuwarden cannot "
        "see a RuntimeClass's handler, and NVIDIA's runtime under another name exposes GPUs no "
        "profile gave); remove runtimeClassName, or have an admin add it to "
        "limits.allowedRuntimeClasses for the tenant",
    )


def _cdi_annotations(context: CheckContext, tenant: Tenant) -> Iterator[Violation]:
    if tenant.limits.allow_cdi_annotations:
        return
    found = sorted(k for k in context.view.annotations if k.startswith(CDI_ANNOTATION_PREFIX))
    if found:
        yield Violation(
            "tenant_limits",
            "TenantLimit",
            f"metadata.annotations {listed(found)}: a CDI-aware container runtime injects the "
            f"devices they name, past tenant {tenant.name}'s profiles, limits and quota; remove "
            "them and ask for nvidia.com/gpu in resources.limits, or have an admin set "
            "limits.allowCdiAnnotations: true for the tenant",
        )


def _routes(context: CheckContext) -> Iterator[Violation]:
    tenant = context.tenant
    if tenant is None:
        return
    yield from _resources(context, tenant)
    yield from _runtime_class(context, tenant)
    yield from _cdi_annotations(context, tenant)


GPU_ROUTES = Check("GPU routes", "tenant_limits", frozenset({CREATE}), _routes)
