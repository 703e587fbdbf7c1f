"""Risky but valid settings: what `gpuwarden lint` warns about (errors are the loader's)."""

from __future__ import annotations

from gpuwarden.policy.model import (
    HamiBackend,
    KfpStepMatch,
    NativeBackend,
    VolcanoBackend,
)
from gpuwarden.policy.policyset import PolicySet


def lint_warnings(policies: PolicySet) -> list[str]:
    warnings: list[str] = []
    for name, profile in policies.profiles.items():
        backend = profile.backend or policies.profile_policy[name].spec.backend
        gpus = profile.gpus if profile.gpus is not None else 1
        if gpus and profile.gpu_share and isinstance(backend, NativeBackend):
            warnings.append(
                f"profile {name}: the native backend cannot share GPUs; pods get whole GPUs"
            )
        if (
            gpus
            and profile.gpu_share
            and (profile.overcommit_ratio or 1.0) > 1.0
            and isinstance(backend, VolcanoBackend | HamiBackend)
        ):
            warnings.append(
                f"profile {name}: {backend.type}'s in-container limiter enforces the reserved "
                f"memory (maxMemory / overcommitRatio), not maxMemory"
            )
        if not profile.gpu_share and profile.thread_percentage is not None:
            warnings.append(
                f"profile {name}: threadPercentage only applies to shared (MPS) GPUs; ignored"
            )
        if profile.preemptible and profile.priority > 1000:
            warnings.append(
                f"profile {name}: preemptible with priority {profile.priority}; "
                "preemptible work usually has the lowest priorities"
            )
    for tenant in policies.tenants:
        limits = tenant.limits
        if (
            limits.max_gpus_per_pod is None
            and limits.max_gpu_memory_per_pod is None
            and limits.gpu_memory_quota is None
        ):
            warnings.append(f"tenant {tenant.name}: no GPU limits or quota are set")
        allowed = limits.allowed_profiles
        if allowed is None:
            continue
        for rule, _ in policies.rules:
            if rule.profile and rule.profile not in allowed:
                warnings.append(
                    f"tenant {tenant.name}: rule {rule.name} gives profile {rule.profile}, "
                    "which the tenant may not use: such pods will be denied"
                )
    seen_catch_all: dict[str, str] = {}
    for rule, _ in policies.rules:
        kind = rule.match.kind
        if kind in seen_catch_all:
            warnings.append(
                f"rule {rule.name}: never matches, rule {seen_catch_all[kind]} takes every {kind} first"
            )
        elif kind != "selector" and not _filters(rule.match) and rule.max_gpu_request is None:
            seen_catch_all[kind] = rule.name
    return warnings


def _filters(match: object) -> bool:
    """Whether a Kubeflow matcher narrows its kind (by names, types or jobs)."""
    if isinstance(match, KfpStepMatch):
        return bool(match.task_names)
    for field in ("replica_types", "replicated_jobs", "experiments", "inference_services"):
        if getattr(match, field, ()):
            return True
    return False
