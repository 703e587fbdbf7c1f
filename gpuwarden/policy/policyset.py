"""A loaded, cross-checked set of GPUPolicy documents and the lookups the engine needs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from pydantic.alias_generators import to_camel

from gpuwarden.policy.model import (
    Backend,
    GPUPolicy,
    Profile,
    Tenant,
    Toleration,
    WorkloadRule,
    quantity_value,
)
from gpuwarden.policy.selectors import selector_matches


@dataclass(frozen=True)
class ResolvedProfile:
    """A profile with its tenant's overrides applied: what a matched container gets."""

    name: str
    policy: str
    backend: Backend
    gpu_share: bool
    gpus: int
    max_memory: Decimal | None
    max_memory_text: str | None
    overcommit_ratio: float
    thread_percentage: int | None
    host_memory: str | None
    cpu: str | None
    priority: int
    preemptible: bool
    priority_class_name: str
    node_selector: Mapping[str, str]
    tolerations: tuple[Toleration, ...]
    overridden: tuple[str, ...] = ()

    @property
    def reserved_memory(self) -> Decimal | None:
        """GPU memory the scheduler reserves: the cap divided by the overcommit ratio."""
        if self.max_memory is None:
            return None
        return self.max_memory / Decimal(str(self.overcommit_ratio))

    @property
    def preemption_policy(self) -> str:
        # Preemptible work waits for capacity rather than evicting others.
        return "Never" if self.preemptible else "PreemptLowerPriority"


@dataclass(frozen=True)
class PolicySet:
    policies: tuple[GPUPolicy, ...]
    fingerprint: str
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    profile_policy: Mapping[str, GPUPolicy] = field(default_factory=dict)
    rules: tuple[tuple[WorkloadRule, GPUPolicy], ...] = ()
    tenants: tuple[Tenant, ...] = ()
    default_profile: str | None = None
    # Every (tenant, profile) resolution, computed once at load: decisions only look them up.
    resolutions: Mapping[tuple[str | None, str], ResolvedProfile] = field(default_factory=dict)

    @classmethod
    def build(cls, policies: Sequence[GPUPolicy], *, fingerprint: str) -> PolicySet:
        profiles: dict[str, Profile] = {}
        owners: dict[str, GPUPolicy] = {}
        rules: list[tuple[WorkloadRule, GPUPolicy]] = []
        tenants: list[Tenant] = []
        default_profile = None
        for policy in policies:
            for profile in policy.spec.profiles:
                profiles[profile.name] = profile
                owners[profile.name] = policy
            rules += [(rule, policy) for rule in policy.spec.workloads]
            tenants += policy.spec.tenants
            default_profile = default_profile or policy.spec.default_profile
        unresolved = cls(
            policies=tuple(policies),
            fingerprint=fingerprint,
            profiles=profiles,
            profile_policy=owners,
            rules=tuple(rules),
            tenants=tuple(tenants),
            default_profile=default_profile,
        )
        resolutions = {
            (tenant.name if tenant else None, name): unresolved._resolve(name, tenant)
            for tenant in (None, *tenants)
            for name in profiles
        }
        return replace(unresolved, resolutions=resolutions)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(policy.metadata.name for policy in self.policies)

    def tenant_for(self, namespace: str, labels: Mapping[str, str]) -> Tenant | None:
        """The first tenant that lists the namespace by name or selects it by its labels."""
        for tenant in self.tenants:
            if namespace in tenant.namespaces:
                return tenant
            if tenant.namespace_selector is not None and selector_matches(
                tenant.namespace_selector, labels
            ):
                return tenant
        return None

    def resolve(self, profile_name: str, tenant: Tenant | None) -> ResolvedProfile:
        """The profile as the tenant gets it. Raises KeyError for an unknown profile."""
        return self.resolutions[(tenant.name if tenant else None, profile_name)]

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
            node_selector=dict(merged.node_selector or {}),
            tolerations=tuple(merged.tolerations or ()),
            overridden=tuple(sorted(to_camel(name) for name in changed)),
        )
