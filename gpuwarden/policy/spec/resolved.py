"""A profile as one tenant gets it, with its overrides applied."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from gpuwarden.policy.spec.model import Backend, IdleRule, Toleration


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
    preemption: str | None  # the profile's explicit preemptionPolicy
    node_selector: Mapping[str, str]
    tolerations: tuple[Toleration, ...]
    overridden: tuple[str, ...] = ()
    gpu_types: tuple[str, ...] = ()  # GPU models, as Volcano's and HAMi's use-gputype
    # Who set `gpus` ("profile <name>" or "tenant <name>'s override"); None: the policy is silent,
    # so each container keeps the count it asks for and `gpus` is only the count for one that
    # names none.
    gpus_set_by: str | None = None
    idle: IdleRule | None = None

    @property
    def reserved_memory(self) -> Decimal | None:
        """GPU memory the scheduler reserves: the cap divided by the overcommit ratio."""
        if self.max_memory is None:
            return None
        return self.max_memory / Decimal(str(self.overcommit_ratio))

    @property
    def preemption_policy(self) -> str:
        if self.preemption is not None:
            return self.preemption
        # Preemptible work waits for capacity rather than evicting others.
        return "Never" if self.preemptible else "PreemptLowerPriority"
