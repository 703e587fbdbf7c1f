"""Checks of what a pod may ask for: quantities Kubernetes would accept, its tenant's limits,
resource claims (which bypass both) and the tenant's GPU-memory quota."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from gpuwarden.policy.admission.checks.base import (
    CREATE,
    Check,
    CheckContext,
    Violation,
    container_path,
    listed,
)
from gpuwarden.policy.admission.decision import ClusterView
from gpuwarden.policy.admission.mutate import is_own_claim_entry, own_claim
from gpuwarden.policy.admission.placement import Placement
from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import (
    QuantityError,
    format_bytes,
    parse_count,
    parse_non_negative,
)
from gpuwarden.policy.pod.resources import ContainerRef, is_gpu_resource
from gpuwarden.policy.pod.view import PodView
from gpuwarden.policy.spec.backends import DRA_CLAIM_NAME
from gpuwarden.policy.spec.model import Tenant
from gpuwarden.policy.spec.policyset import PolicySet


def _quantities(context: CheckContext) -> Iterator[Violation]:
    """Invalid quantities are denied, never silently read as zero; so is a request above its
    limit (a profile's cpu or hostMemory can make one), with the fix rather than the API
    server's later rejection."""
    for ref in context.view.all_containers:
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
                        f"{container_path(ref)}.resources.{section}[{name}]: {exc}",
                    )
        for name, requested in sorted(values["requests"].items()):
            limit = values["limits"].get(name)
            if limit is not None and requested > limit:
                yield Violation(
                    "quantities",
                    "RequestAboveLimit",
                    f"{container_path(ref)}.resources.requests[{name}] "
                    f"{ref.resources('requests')[name]} is more than its limit "
                    f"{ref.resources('limits')[name]}; raise limits[{name}] to at least the "
                    "request or remove it",
                )


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
    counts = listed([f"{c.name} {c.gpus}" for c in granted])
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


def _skipped_gpu_violations(placement: Placement, view: PodView) -> Iterator[Violation]:
    """A pod a skip rule leaves untouched still keeps to its tenant's GPUs per pod."""
    tenant, rule = placement.tenant, placement.rule
    if tenant is None or rule is None or tenant.limits.max_gpus_per_pod is None:
        return
    limit = tenant.limits.max_gpus_per_pod
    try:
        asked = sum(view.asked_gpus(ref) or 0 for ref in view.all_containers)
    except QuantityError:
        return  # the quantities check names the field
    if asked > limit:
        yield Violation(
            "tenant_limits",
            "TenantLimit",
            f"rule {rule.name} leaves the pod untouched, but it asks for {asked} GPUs and tenant "
            f"{tenant.name} allows at most {limit} per pod; ask for at most {limit}",
        )


def _tenant_limits(context: CheckContext) -> Iterator[Violation]:
    placement = context.placement
    tenant, profile = placement.tenant, placement.profile
    if placement.source == "skip":
        yield from _skipped_gpu_violations(placement, context.view)
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


def _claims_used(ref: ContainerRef) -> list[Any]:
    """The container's resources.claims entries (none where it lists none)."""
    resources = ref.body.get("resources")
    used = resources.get("claims") if isinstance(resources, dict) else None
    if isinstance(used, list):
        return used
    return [used] if used else []  # malformed, but still a claim the pod brings


def _resource_claims(context: CheckContext) -> Iterator[Violation]:
    """Dynamic Resource Allocation: a claim's devices are chosen by its ResourceClaim, which
    gpuwarden does not see, so no profile, limit or quota would apply. A tenant's pods get GPUs
    through device plugins unless its limits allow claims. Namespaces of no tenant have no
    limits or quota for a claim to bypass (a claim escapes no isolation the device plugins keep)."""
    view, tenant = context.view, context.tenant
    if tenant is None or tenant.limits.allow_resource_claims:
        return
    claims = view.spec.get("resourceClaims")
    claims = claims if isinstance(claims, list) else []
    users = [(ref, used) for ref in view.all_containers if (used := _claims_used(ref))]
    if not claims and not users:
        return  # the common pod: no claim at all
    # gpuwarden's own claim (dra backend) is a profile's grant, not a claim the pod brings.
    own = own_claim(context.placement)
    targets = set(context.placement.containers) if own is not None else set()
    fields = [
        f"spec.resourceClaims[{c.get('name', index) if isinstance(c, dict) else index}]"
        for index, c in enumerate(claims)
        if not is_own_claim_entry(c, own)
    ]
    for ref, used in users:
        if ref.field == "containers" and ref.name in targets:
            used = [c for c in used if c != {"name": DRA_CLAIM_NAME}]
        if used:
            fields.append(f"{container_path(ref)}.resources.claims")
    if fields:
        yield Violation(
            "tenant_limits",
            "TenantLimit",
            f"{listed(fields)}: tenant {tenant.name} gets GPUs through device plugins, where its "
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


def _quota(context: CheckContext) -> Iterator[Violation]:
    tenant, profile = context.tenant, context.placement.profile
    if tenant is None or profile is None or tenant.limits.gpu_memory_quota is None:
        return
    wanted = context.view.record.admitted_gpu_memory(context.view.main_containers)
    if wanted == 0:
        return
    quota = parse_non_negative(tenant.limits.gpu_memory_quota)
    ceiling = quota * Decimal(str(profile.overcommit_ratio))
    used = tenant_gpu_memory(context.policies, context.cluster, tenant)
    if used + wanted > ceiling:
        yield Violation(
            "gpu_memory_quota",
            "TenantGPUMemoryQuota",
            f"tenant {tenant.name} has {format_bytes(used)} of GPU memory admitted; this pod adds "
            f"{format_bytes(wanted)}, past its quota {tenant.limits.gpu_memory_quota} x "
            f"overcommit {profile.overcommit_ratio:g} = {format_bytes(ceiling)}; "
            "delete idle GPU pods or use a smaller profile",
        )


QUANTITIES = Check("quantities", "quantities", frozenset({CREATE}), _quantities)
TENANT_LIMITS = Check("tenant limits", "tenant_limits", frozenset({CREATE}), _tenant_limits)
RESOURCE_CLAIMS = Check("resource claims", "tenant_limits", frozenset({CREATE}), _resource_claims)
GPU_MEMORY_QUOTA = Check("GPU memory quota", "gpu_memory_quota", frozenset({CREATE}), _quota)
