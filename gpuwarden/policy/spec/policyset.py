"""A loaded, cross-checked set of GPUPolicy documents and the lookups the engine needs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from pydantic.alias_generators import to_camel

from gpuwarden.policy.pod.quantity import format_bytes, format_mebibytes, to_mebibytes
from gpuwarden.policy.pod.record import IdleRecord, PodRecord
from gpuwarden.policy.spec.backends import BackendPlan, plan_for
from gpuwarden.policy.spec.matchers import bound_kind
from gpuwarden.policy.spec.model import (
    DraBackend,
    EnforcementAction,
    GPUPolicy,
    IdleRule,
    Profile,
    Tenant,
    WorkloadRule,
    parse_duration,
    parse_percent,
    quantity_value,
)
from gpuwarden.policy.spec.precedence import narrower_rules, selector_order
from gpuwarden.policy.spec.resolved import ResolvedProfile
from gpuwarden.policy.spec.selectors import selector_matches

# Pod-sized grants for 2..this many GPUs per container are computed at load; larger counts (rare,
# and usually denied by a tenant limit) are computed per decision.
PRECOMPUTED_GPU_COUNTS = 16


@dataclass(frozen=True)
class Grant:
    """What a (tenant, profile) pair puts on a pod, computed once at load."""

    profile: ResolvedProfile
    plan: BackendPlan | None  # None for a profile that gives no GPU
    annotations: Mapping[str, str]  # the decision annotations that depend on nothing else
    # A target container's resources.limits and resources.requests entries (request == limit
    # for extended resources, which cannot be overcommitted).
    limits: Mapping[str, str] = field(default_factory=dict)
    requests: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)  # sorted by key
    tolerations: tuple[Mapping[str, Any], ...] = ()  # as the pod spec writes them
    # The warning text of a target container that depends only on the grant: what follows its
    # GPU count ("" without a plan), and the overcommit caveat ("" where there is none).
    gpus_text: str = ""
    overcommit_text: str = ""


def _grant(profile: ResolvedProfile, tenant: Tenant | None) -> Grant:
    record = PodRecord(
        profile=profile.name,
        policy=profile.policy,
        tenant=tenant.name if tenant is not None else None,
    )
    if profile.gpus == 0:
        record = replace(record, gpu_count=0)
        return _with_pod_fields(Grant(profile, None, record.to_annotations()))
    plan = plan_for(profile, queue=tenant.queue if tenant is not None else None)
    record = replace(
        record,
        backend=profile.backend.type,
        gpu_count=profile.gpus,
        gpu_shared=plan.shared,
        preemptible=profile.preemptible,
        thread_percentage=profile.thread_percentage,
        idle=_idle_record(profile.idle),
    )
    reserved = profile.reserved_memory
    if profile.max_memory is not None and reserved is not None:
        record = replace(
            record,
            gpu_memory_limit=math.ceil(profile.max_memory),
            # Whole MiB, the unit of Volcano's and HAMi's GPU-memory resources.
            gpu_memory_reserved=to_mebibytes(reserved) * 2**20,
            overcommit_ratio=Decimal(f"{profile.overcommit_ratio:g}"),
        )
    return _with_pod_fields(
        Grant(
            profile,
            plan,
            record.to_annotations() | dict(plan.annotations),
            gpus_text=_gpus_text(profile, plan),
            overcommit_text=_overcommit_text(profile) if plan.shared else "",
        )
    )


def _idle_record(rule: IdleRule | None) -> IdleRecord | None:
    if rule is None:
        return None
    return IdleRecord(
        action=rule.action, after=parse_duration(rule.after), below=parse_percent(rule.below)
    )


def _cap_detail(profile: ResolvedProfile) -> str:
    """Who enforces the cap and what the overcommit ratio means, on the profile's backend."""
    backend, reserved = profile.backend.type, profile.reserved_memory
    if backend in ("volcano", "hami") and reserved is not None:
        # The request is HAMi-core's cap; overcommit is the node's deviceMemoryScaling.
        return f" on {backend}, requested and enforced by HAMi-core"
    if backend == "nvidia":
        # Scheduling reserves one replica per GPU, whatever the cap and overcommit ratio.
        return " on nvidia, one replica reserved per GPU"
    if isinstance(profile.backend, DraBackend):
        # The claim's capacity request is the cap (render/claims.py), whatever the ratio.
        return f" on dra, claimed of the device's {profile.backend.memory_capacity}"
    extra = f", {format_mebibytes(reserved)} reserved" if reserved is not None else ""
    return f"{extra} on {backend}"


def _gpus_text(profile: ResolvedProfile, plan: BackendPlan) -> str:
    """What a container gets, after its GPU count: shared with a cap, or whole GPUs."""
    if plan.shared:
        cap = format_bytes(profile.max_memory) if profile.max_memory is not None else "no"
        return f" shared GPU, {cap} GPU-memory cap{_cap_detail(profile)}"
    return f" whole GPU(s) on {profile.backend.type}"


def _overcommit_text(profile: ResolvedProfile) -> str:
    """Where an overcommitted cap holds its reservation ("" for a profile that does not)."""
    reserved = profile.reserved_memory
    if profile.backend.type not in ("volcano", "hami") or reserved is None:
        return ""
    if profile.overcommit_ratio <= 1:
        return ""
    ratio = f"{profile.overcommit_ratio:g}"
    return (
        f"overcommit {ratio} holds {format_mebibytes(reserved)} per GPU "
        f"only on nodes whose deviceMemoryScaling is {ratio}"
    )


def _with_pod_fields(grant: Grant) -> Grant:
    profile = grant.profile
    limits = dict(grant.plan.resources) if grant.plan is not None else {}
    if profile.host_memory is not None:
        limits["memory"] = profile.host_memory
    requests = dict(limits)
    if profile.cpu is not None:
        requests["cpu"] = profile.cpu
    return replace(
        grant,
        limits=limits,
        requests=requests,
        node_selector=dict(sorted(profile.node_selector.items())),
        tolerations=tuple(
            t.model_dump(by_alias=True, exclude_none=True) for t in profile.tolerations
        ),
    )


def _rules_by_kind(rules: Sequence[WorkloadRule]) -> dict[str | None, tuple[int, ...]]:
    """For each workload kind some rule is bound to, and for None (any other pod), the indices
    of the rules a pod of that kind may match, in load order."""
    kinds = [bound_kind(rule.match) for rule in rules]
    return {
        wanted: tuple(i for i, kind in enumerate(kinds) if kind in (None, wanted))
        for wanted in (None, *kinds)
    }


def _first_listing(tenants: Sequence[Tenant]) -> dict[str, Tenant]:
    """Each namespace listed by name, and the first tenant (in load order) that lists it."""
    out: dict[str, Tenant] = {}
    for tenant in tenants:
        for namespace in tenant.namespaces:
            out.setdefault(namespace, tenant)
    return out


@dataclass(frozen=True)
class PolicySet:
    policies: tuple[GPUPolicy, ...]
    fingerprint: str
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    profile_policy: Mapping[str, GPUPolicy] = field(default_factory=dict)
    rules: tuple[tuple[WorkloadRule, GPUPolicy], ...] = ()
    tenants: tuple[Tenant, ...] = ()
    default_profile: str | None = None
    # Every (tenant, profile) grant, computed once at load: decisions only look them up.
    grants: Mapping[tuple[str | None, str], Grant] = field(default_factory=dict)
    # Grants of profiles that leave the count to the pod, for the counts pods usually ask.
    sized_grants: Mapping[tuple[str | None, str, int], Grant] = field(default_factory=dict)
    # Precedence (gpuwarden.policy.spec.precedence), computed once at load: the tenant that lists
    # each namespace first, the selector tenants in the order they are tried, and for each rule
    # the later rules of its kind that narrow it.
    tenant_by_namespace: Mapping[str, Tenant] = field(default_factory=dict)
    selector_tenants: tuple[Tenant, ...] = ()
    narrower: tuple[tuple[int, ...], ...] = ()
    # The rules a pod of each workload kind may match (see rules_for), computed once at load.
    rules_by_kind: Mapping[str | None, tuple[int, ...]] = field(default_factory=dict)
    # The first spec.enforcementAction in load order, and each tenant's own (docs/rollout.md).
    enforcement_action: EnforcementAction | None = None
    tenant_actions: Mapping[str, EnforcementAction] = field(default_factory=dict)

    @classmethod
    def build(cls, policies: Sequence[GPUPolicy], *, fingerprint: str) -> PolicySet:
        profiles: dict[str, Profile] = {}
        owners: dict[str, GPUPolicy] = {}
        rules: list[tuple[WorkloadRule, GPUPolicy]] = []
        tenants: list[Tenant] = []
        default_profile = None
        action: EnforcementAction | None = None
        for policy in policies:
            for profile in policy.spec.profiles:
                profiles[profile.name] = profile
                owners[profile.name] = policy
            rules += [(rule, policy) for rule in policy.spec.workloads]
            tenants += policy.spec.tenants
            default_profile = default_profile or policy.spec.default_profile
            action = action or policy.spec.enforcement_action
        unresolved = cls(
            policies=tuple(policies),
            fingerprint=fingerprint,
            profiles=profiles,
            profile_policy=owners,
            rules=tuple(rules),
            tenants=tuple(tenants),
            default_profile=default_profile,
            tenant_by_namespace=_first_listing(tenants),
            selector_tenants=selector_order(tenants),
            narrower=narrower_rules([rule for rule, _ in rules]),
            rules_by_kind=_rules_by_kind([rule for rule, _ in rules]),
            enforcement_action=action,
            tenant_actions={
                t.name: t.enforcement_action for t in reversed(tenants) if t.enforcement_action
            },
        )
        grants: dict[tuple[str | None, str], Grant] = {}
        sized: dict[tuple[str | None, str, int], Grant] = {}
        for tenant in (None, *tenants):
            tenant_name = tenant.name if tenant else None
            for name in profiles:
                base = grants[(tenant_name, name)] = _grant(
                    unresolved._resolve(name, tenant), tenant
                )
                if base.profile.gpus_set_by is not None:
                    continue
                for gpus in range(2, PRECOMPUTED_GPU_COUNTS + 1):
                    sized[(tenant_name, name, gpus)] = _grant(
                        replace(base.profile, gpus=gpus), tenant
                    )
        return replace(unresolved, grants=grants, sized_grants=sized)

    def tenant_policy(self, tenant: Tenant) -> GPUPolicy | None:
        """The policy document that defines ``tenant`` (and so its limits)."""
        return next(
            (p for p in self.policies if any(t.name == tenant.name for t in p.spec.tenants)), None
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(policy.metadata.name for policy in self.policies)

    def action_for(
        self, tenant: str | None, default: EnforcementAction = "enforce"
    ) -> EnforcementAction:
        """What a decision on a pod of ``tenant`` does: the tenant's enforcementAction, else the
        set's, else ``default`` (the webhook's --enforcement-action)."""
        own = self.tenant_actions.get(tenant) if tenant is not None else None
        return own or self.enforcement_action or default

    def rules_for(self, kind: str | None) -> tuple[int, ...]:
        """The indices of the rules a pod of this workload kind (None: not a known workload) may
        match, in load order: those bound to its kind and those bound to none."""
        found = self.rules_by_kind.get(kind)
        return found if found is not None else self.rules_by_kind.get(None, ())

    def tenant_for(self, namespace: str, labels: Mapping[str, str]) -> Tenant | None:
        """The tenant that lists the namespace by name, else the one with the most specific
        selector that selects it by its labels; ties go to the first in load order."""
        named = self.tenant_by_namespace.get(namespace)
        if named is not None:
            return named
        for tenant in self.selector_tenants:
            selector = tenant.namespace_selector
            if selector is not None and selector_matches(selector, labels):
                return tenant
        return None

    def resolve(self, profile_name: str, tenant: Tenant | None) -> ResolvedProfile:
        """The profile as the tenant gets it. Raises KeyError for an unknown profile."""
        return self.grant(profile_name, tenant).profile

    def grant(self, profile_name: str, tenant: Tenant | None, asked: int | None = None) -> Grant:
        """The profile, its backend plan and its annotations, as the tenant gets them, for a
        container that asks for `asked` GPUs (kept unless the profile or an override sets gpus)."""
        key = (tenant.name if tenant else None, profile_name)
        base = self.grants[key]
        if asked is None or asked == base.profile.gpus or base.profile.gpus_set_by is not None:
            return base
        sized = self.sized_grants.get((*key, asked))
        if sized is not None:
            return sized
        return _grant(replace(base.profile, gpus=asked), tenant)

    def _resolve(self, profile_name: str, tenant: Tenant | None) -> ResolvedProfile:
        profile = self.profiles[profile_name]
        policy = self.profile_policy[profile_name]
        override = tenant.overrides.get(profile_name) if tenant else None
        changed = {
            name: getattr(override, name)
            for name in (override.model_fields_set if override else ())
            if getattr(override, name) is not None
        }
        merged = profile.model_copy(update=changed) if changed else profile
        max_memory = merged.max_memory
        gpus_set_by = None
        if "gpus" in changed and tenant is not None:
            gpus_set_by = f"tenant {tenant.name}'s override"
        elif profile.gpus is not None:
            gpus_set_by = f"profile {profile.name}"
        return ResolvedProfile(
            name=profile.name,
            policy=policy.metadata.name,
            backend=profile.backend or policy.spec.backend,
            gpu_share=bool(merged.gpu_share),
            gpus=merged.gpus if merged.gpus is not None else 1,
            max_memory=quantity_value(max_memory) if max_memory else None,
            max_memory_text=max_memory,
            overcommit_ratio=merged.overcommit_ratio or 1.0,
            thread_percentage=merged.thread_percentage,
            host_memory=merged.host_memory,
            cpu=merged.cpu,
            priority=profile.priority,
            preemptible=profile.preemptible,
            priority_class_name=profile.derived_priority_class,
            preemption=profile.preemption_policy,
            node_selector=dict(merged.node_selector or {}),
            tolerations=tuple(merged.tolerations or ()),
            overridden=tuple(sorted(to_camel(name) for name in changed)),
            gpus_set_by=gpus_set_by,
            gpu_types=tuple(merged.gpu_types or ()),
            idle=profile.idle,
        )
