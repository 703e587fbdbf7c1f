"""Resolution: which tenant, which rule, which profile and which containers a pod gets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import QuantityError
from gpuwarden.policy.pod.view import PodView
from gpuwarden.policy.pod.workloads import SIDECARS, Workload, identify
from gpuwarden.policy.spec.backends import shared_slices_per_container
from gpuwarden.policy.spec.matchers import MatchResult, PodFacts, match, may_match
from gpuwarden.policy.spec.model import DraBackend, GPUPolicy, Tenant, WorkloadRule
from gpuwarden.policy.spec.policyset import Grant, PolicySet
from gpuwarden.policy.spec.precedence import why_rule_wins
from gpuwarden.policy.spec.resolved import ResolvedProfile

Source = Literal["rule", "label", "default", "skip", "none"]


class ContainerGrant(NamedTuple):
    """What one target container gets, beside what it asked for (a tuple: one per decision)."""

    name: str
    grant: Grant
    asked: int | None  # the GPUs the container asked for; None when it named no count

    @property
    def gpus(self) -> int:
        return self.grant.profile.gpus

    def count_reason(self) -> str:
        """Why the container gets its GPU count, for warnings and `explain`."""
        profile = self.grant.profile
        if profile.gpus_set_by is not None:
            asked = "" if self.asked in (None, self.gpus) else f" (it asked for {self.asked})"
            return f"{profile.gpus_set_by} sets gpus: {self.gpus}{asked}"
        if self.asked is None:
            return f"it names no GPU count and profile {profile.name} sets none: 1"
        return f"the count it asks for; profile {profile.name} sets none"

    @property
    def overridden(self) -> bool:
        """Whether the policy's count replaced the one the container asked for."""
        return self.asked is not None and self.asked != self.gpus


class RuleOutcome(NamedTuple):
    """One rule as `explain` shows it: whether it matched, and if it matched but lost, why."""

    name: str
    result: MatchResult
    lost: str | None = None  # why the chosen rule beat this one, which matched too


class Placement(NamedTuple):
    """The outcome of resolution, with the trace `explain` prints."""

    source: Source
    tenant: Tenant | None
    workload: Workload | None
    rule: WorkloadRule | None
    profile: ResolvedProfile | None
    containers: tuple[str, ...]
    problems: tuple[str, ...]
    tenant_reason: str
    grant: Grant | None = None
    # Every rule in load order, how many were tried up to the first match, and what they saw:
    # `trace` and `outcomes` re-run them for `explain`, so admission never formats the reasons
    # of rules that did not match.
    rules: tuple[tuple[WorkloadRule, GPUPolicy], ...] = ()
    tried: int = 0
    facts: PodFacts | None = None
    # One per target container, in the order of `containers`; `grant` is the one with the most
    # GPUs (its annotations describe the pod).
    container_grants: tuple[ContainerGrant, ...] = ()
    # The rule was the one recorded on the pod, kept past its count condition (_recorded_rule).
    recorded: bool = False

    @property
    def total_gpus(self) -> int:
        return sum(c.gpus for c in self.container_grants)

    @property
    def rules_tried(self) -> tuple[tuple[WorkloadRule, GPUPolicy], ...]:
        """The rules tried in load order, up to the first that matched."""
        return self.rules[: self.tried]

    @property
    def trace(self) -> tuple[tuple[str, MatchResult], ...]:
        """Each rule tried and why it matched or not, in order; then the chosen rule, where a
        narrower rule of the same kind took the first match's place."""
        if self.facts is None:
            return ()
        tried = [(rule.name, _judge(rule, self.facts)) for rule, _ in self.rules_tried]
        if self.rule is not None and all(rule is not self.rule for rule, _ in self.rules_tried):
            tried.append((self.rule.name, _judge(self.rule, self.facts)))
        return tuple(tried)

    @property
    def outcomes(self) -> tuple[RuleOutcome, ...]:
        """For `explain`: the rules tried before the first match, then every rule that matched,
        in load order, each that lost with the reason the chosen rule beat it."""
        facts, chosen = self.facts, self.rule
        if facts is None:
            return ()
        if chosen is None:
            return tuple(RuleOutcome(name, result) for name, result in self.trace)
        out = [RuleOutcome(rule.name, _judge(rule, facts)) for rule, _ in self.rules_tried[:-1]]
        for rule, _ in self.rules[self.tried - 1 :]:
            result = _judge(rule, facts) if may_match(rule.match, facts) else None
            if rule is chosen and self.recorded and self.profile is not None:
                reason = match(rule.match, facts).reason
                set_by = self.profile.gpus_set_by
                why = (
                    f"{set_by} sets the {self.profile.gpus} GPUs it asks for"
                    if set_by is not None
                    else f"it asks for the {self.profile.gpus} GPU(s) profile "
                    f"{self.profile.name} gives a pod that asks for none"
                )
                result = MatchResult(
                    True, f"{reason}; kept as recorded in {keys.ANNOTATION_RULE}: {why}"
                )
            if result is not None and result.matched:
                lost = None if rule is chosen else why_rule_wins(chosen, rule)
                if lost is not None and self.recorded:
                    lost = f"rule {chosen.name} is recorded on the pod ({keys.ANNOTATION_RULE})"
                out.append(RuleOutcome(rule.name, result, lost))
        return tuple(out)

    @property
    def governed(self) -> bool:
        return self.profile is not None and not self.problems

    @property
    def origin(self) -> str:
        """How the profile was chosen, for annotations and messages."""
        if self.source == "rule" and self.rule is not None:
            return f"rule/{self.rule.name}"
        return self.source


def _judge(rule: WorkloadRule, facts: PodFacts) -> MatchResult:
    result = match(rule.match, facts)
    if not result.matched:
        return result
    asks_for_gpu, largest_request = facts.asks_for_gpu, facts.largest_request
    wants_gpu = rule.require_gpu_request or rule.max_gpu_request is not None
    if wants_gpu and not asks_for_gpu:
        return MatchResult(False, f"{result.reason}, but it asks for no GPU")
    limit = rule.max_gpu_request
    if limit is not None and (largest_request is None or largest_request > limit):
        asked = (
            "a GPU count that is not a whole number"
            if largest_request is None
            else f"{largest_request} GPUs"
        )
        return MatchResult(
            False, f"{result.reason}, but a container asks for {asked} (the rule: at most {limit})"
        )
    return result


def _first_rule(policies: PolicySet, facts: PodFacts) -> tuple[int, WorkloadRule] | None:
    """The index of the first rule that matches, and the rule the pod gets for it: that rule, or
    a later rule of the same kind that narrows it more and matches too."""
    rules = policies.rules
    for index in policies.rules_for(facts.workload.kind if facts.workload is not None else None):
        first = rules[index][0]
        if not _judge(first, facts).matched:
            continue
        narrower = (rules[later][0] for later in policies.narrower[index])
        return index, next((rule for rule in narrower if _judge(rule, facts).matched), first)
    return None


def _recorded_rule(
    view: PodView,
    facts: PodFacts,
    policies: PolicySet,
    tenant: Tenant | None,
    workload: Workload | None,
) -> int | None:
    """The index of the rule gpuwarden recorded on the pod, where the count its profile fixed is
    what moved the pod across a rule's GPU-count condition.

    A profile or tenant override that sets ``gpus`` changes what the pod asks for: a step given 8
    GPUs by its tenant no longer matches the rule for steps of at most 4 that chose it, and
    re-resolving it on reinvocation or validation would pick another rule and contradict the
    patch. A profile that fixes no count gives a pod that asks for none one GPU, which moves it
    the same way (a train step named for its GPUs gets one, then matches the rule for steps that
    ask for at most 4). The recorded rule is kept only where it matches the pod but for its count
    condition, every container it gives GPUs to has exactly the count its profile (as the tenant
    gets it) gives, and either the profile fixes that count or the pod asking for no GPU would get
    this very rule: all a forged record can choose is what asking for that count, or for none,
    would give.
    """
    recorded = view.record
    origin = recorded.rule or ""
    name = origin.removeprefix("rule/")
    if not origin.startswith("rule/") or not name:
        return None
    index = next((i for i, (rule, _) in enumerate(policies.rules) if rule.name == name), None)
    if index is None:
        return None
    rule = policies.rules[index][0]
    if rule.skip or rule.profile is None or recorded.profile != rule.profile:
        return None
    if not may_match(rule.match, facts) or not match(rule.match, facts).matched:
        return None
    profile = policies.grant(rule.profile, tenant).profile
    if not profile.gpus:
        return None
    chosen = target_containers(view, rule, workload, profile)
    refs = view.main_by_name
    try:
        if not chosen or any(view.asked_gpus(refs[name]) != profile.gpus for name in chosen):
            return None
    except QuantityError:
        return None
    if profile.gpus_set_by is None:
        targets = {id(refs[name].body) for name in chosen}
        if any(view.gpus(ref).asks for ref in view.all_containers if id(ref.body) not in targets):
            return None
        asking_none = facts._replace(asks_for_gpu=False, largest_request=None)
        found = _first_rule(policies, asking_none)
        if found is None or found[1] is not rule:
            return None
    return index


def _tenant(
    policies: PolicySet, namespace: str, labels: Mapping[str, str]
) -> tuple[Tenant | None, str]:
    tenant = policies.tenant_for(namespace, labels)
    if tenant is None:
        return None, f"namespace {namespace} belongs to no tenant"
    how = "by name" if namespace in tenant.namespaces else "by namespace labels"
    return tenant, f"namespace {namespace} is tenant {tenant.name} ({how})"


def target_containers(
    view: PodView,
    rule: WorkloadRule | None,
    workload: Workload | None,
    profile: ResolvedProfile | None = None,
) -> tuple[str, ...]:
    """The containers that get the GPU: the rule's list, else the workload's main container, else
    those already asking for a GPU, else the first container that is not a known sidecar."""
    refs = view.main_containers
    names = view.main_names
    if rule is not None and rule.containers:
        return tuple(name for name in rule.containers if name in names)
    if workload is not None and workload.container in names:
        return (workload.container,)
    asking = tuple(ref.name for ref in refs if view.gpus(ref).asks)
    if asking:
        return asking
    if profile is not None and profile.gpus == 0:
        # A GPU-free profile removed the GPU requests that chose its containers; on reinvocation
        # the recorded choice keeps the decision stable. It grants no GPU, so it widens nothing.
        recorded = view.record
        if recorded.profile == profile.name:
            kept = tuple(name for name in recorded.containers or () if name in names)
            if kept:
                return kept
    for name in names:
        if name not in SIDECARS:
            return (name,)
    return ()


def _gpus(granted: ContainerGrant) -> int:
    return granted.gpus


def _container_grants(
    view: PodView,
    chosen: tuple[str, ...],
    policies: PolicySet,
    profile_name: str,
    tenant: Tenant | None,
) -> tuple[tuple[ContainerGrant, ...], tuple[str, ...]]:
    """Each target container's grant (its own GPU count, unless the policy sets one), and the
    counts no grant can honour."""
    refs = view.main_by_name if len(chosen) > 1 else None
    grants: list[ContainerGrant] = []
    problems: list[str] = []
    for name in chosen:
        ref = refs[name] if refs is not None else view.first_named(name)
        try:
            asked = view.asked_gpus(ref)
        except QuantityError as exc:
            problems.append(f"spec.containers[{name}].{exc}")
            asked = None
        grant = policies.grant(profile_name, tenant, asked)
        profile = grant.profile
        slices = shared_slices_per_container(profile)
        if (
            asked is not None
            and profile.gpus_set_by is None
            and profile.gpu_share
            and slices is not None
            and asked > slices
        ):
            problems.append(
                f"spec.containers[{name}] asks for {asked} GPUs, but profile {profile.name} shares "
                f"GPUs through MPS on the {profile.backend.type} backend, where a container gets "
                f"{slices} replica; ask for {slices} GPU, or use an exclusive profile "
                f"(label {keys.PROFILE_LABEL})"
            )
        grants.append(ContainerGrant(name, grant, asked))
    return tuple(grants), tuple(problems)


def _dra_share_problems(granted: tuple[ContainerGrant, ...]) -> tuple[str, ...]:
    """A shared profile on the dra backend gives a pod one claim on a share of one device: more
    than one GPU cannot be honoured."""
    shared = [
        g
        for g in granted
        if g.grant.profile.gpu_share and isinstance(g.grant.profile.backend, DraBackend)
    ]
    total = sum(g.gpus for g in shared)
    if total <= 1:
        return ()
    profile = shared[0].grant.profile
    exclusive = f"use an exclusive profile (label {keys.PROFILE_LABEL})"
    why = (
        f"profile {profile.name} shares GPUs on the dra backend, where a pod gets one claim "
        f"({keys.DRA_CLAIM_NAME}) on a share of one device"
    )
    if len(shared) > 1:
        names = ", ".join(g.name for g in shared)
        return (
            f"spec.containers[{names}] would each get a shared GPU, but {why}; give the GPU to "
            f"one container (the rule's containers), or {exclusive}",
        )
    only = shared[0]
    if profile.gpus_set_by is not None:
        return (
            f"{profile.gpus_set_by} sets gpus: {only.gpus}, but {why}; {exclusive}, or have an "
            "admin set gpus: 1 for the shared profile",
        )
    return (
        f"spec.containers[{only.name}] asks for {only.gpus} GPUs, but {why}; ask for 1 GPU, "
        f"or {exclusive}",
    )


def _label_profile(
    policies: PolicySet, tenant: Tenant | None, requested: str
) -> tuple[str | None, str | None]:
    """(profile, problem) for a pod that names its profile with the gpuwarden.io/profile label."""
    if requested not in policies.profiles:
        known = ", ".join(sorted(policies.profiles))
        return None, (
            f"label {keys.PROFILE_LABEL}={requested} names no profile; use one of: {known}"
        )
    if tenant is not None and not tenant.allow_profile_label:
        return None, (
            f"tenant {tenant.name} does not allow choosing a profile; "
            f"remove the label {keys.PROFILE_LABEL}"
        )
    allowed = tenant.limits.allowed_profiles if tenant is not None else None
    if allowed is not None and requested not in allowed:
        return None, (
            f"profile {requested} is not allowed for tenant {tenant.name if tenant else ''}; "
            f"set {keys.PROFILE_LABEL} to one of: {', '.join(allowed)}"
        )
    return requested, None


def place(
    pod: Mapping[str, Any] | PodView,
    namespace: str,
    namespace_labels: Mapping[str, str],
    policies: PolicySet,
) -> Placement:
    """Resolve the pod (or the view of it a decision already read)."""
    view = pod if isinstance(pod, PodView) else PodView.of(pod)
    tenant, tenant_reason = _tenant(policies, namespace, namespace_labels)
    labels, annotations = view.labels, view.annotations
    workload = identify(view.pod, labels, annotations)
    asks_for_gpu = view.asks_for_gpu
    facts = PodFacts(
        namespace,
        namespace_labels,
        labels,
        annotations,
        workload,
        asks_for_gpu=asks_for_gpu,
        largest_request=view.largest_gpu_request if asks_for_gpu else None,
    )

    def placed(
        source: Source,
        rule: WorkloadRule | None,
        profile_name: str | None,
        problems: tuple[str, ...] = (),
        tried: int = 0,
        recorded: bool = False,
    ) -> Placement:
        grant = policies.grant(profile_name, tenant) if profile_name else None
        profile = grant.profile if grant is not None else None
        chosen = target_containers(view, rule, workload, profile) if profile is not None else ()
        if profile is not None and not chosen:
            problems += ("no container to give the GPU to (check the rule's containers)",)
        granted: tuple[ContainerGrant, ...] = ()
        if profile_name and chosen:
            granted, count_problems = _container_grants(
                view, chosen, policies, profile_name, tenant
            )
            problems += count_problems + _dra_share_problems(granted)
            grant = granted[0].grant if len(granted) == 1 else max(granted, key=_gpus).grant
            profile = grant.profile
        return Placement(
            source,
            tenant,
            workload,
            rule,
            profile,
            chosen,
            problems,
            tenant_reason,
            grant,
            rules=policies.rules,
            tried=tried,
            facts=facts,
            container_grants=granted,
            recorded=recorded,
        )

    requested = labels.get(keys.PROFILE_LABEL)
    if requested:
        profile_name, problem = _label_profile(policies, tenant, requested)
        return placed("label", None, profile_name, (problem,) if problem else ())

    rules = policies.rules
    kept = _recorded_rule(view, facts, policies, tenant, workload)
    if kept is not None:
        return placed("rule", rules[kept][0], rules[kept][0].profile, tried=kept + 1, recorded=True)
    found = _first_rule(policies, facts)
    if found is not None:
        index, rule = found
        if rule.skip:
            return placed("skip", rule, None, tried=index + 1)
        return placed("rule", rule, rule.profile, tried=index + 1)
    tried = len(policies.rules)
    if policies.default_profile and asks_for_gpu:
        return placed("default", None, policies.default_profile, tried=tried)
    return placed("none", None, None, tried=tried)
