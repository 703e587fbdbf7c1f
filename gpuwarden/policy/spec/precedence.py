"""How several policy documents combine: which tenant a namespace belongs to, which rule a pod
gets when several match, and which tenants and rules can never win.

Tenants: one that lists the namespace by name beats one that selects it by labels; among
selectors the more specific (more matchLabels pairs and matchExpressions) wins; ties go by load
order, and `lint` reports them.

Rules: they are tried in load order, and the first match is taken, unless a later rule of the
same kind that narrows the kind more also matches: then the narrowest one wins (ties by load
order). Rules of different kinds never outrank each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

from gpuwarden.policy.spec.model import (
    KatibTrialMatch,
    KfpStepMatch,
    KservePredictorMatch,
    LabelSelector,
    Matcher,
    SelectorMatch,
    Tenant,
    TrainingJobMatch,
    TrainJobMatch,
    WorkloadRule,
)
from gpuwarden.policy.spec.selectors import describe_selector, selector_matches

# The label the API server puts on every namespace (Kubernetes 1.21+): a selector on it names
# namespaces, and the cluster views the engine is given carry it as the API server would.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# Kind-bound matchers that narrow their kind by a list of names: (field, what the names are).
_NAME_FIELDS: dict[type, tuple[str, str]] = {
    KfpStepMatch: ("task_names", "task names"),
    TrainingJobMatch: ("replica_types", "replica types"),
    TrainJobMatch: ("replicated_jobs", "replicated jobs"),
    KatibTrialMatch: ("experiments", "experiments"),
    KservePredictorMatch: ("inference_services", "inference services"),
}
_GLOB = frozenset("*?[")


# --- Label selectors as sets of namespaces or pods -------------------------------------------


@dataclass(frozen=True)
class _KeyConstraint:
    """What a selector demands of one label key."""

    present: bool = False
    absent: bool = False
    allowed: frozenset[str] | None = None  # None: any value
    excluded: frozenset[str] = frozenset()

    @property
    def values(self) -> frozenset[str] | None:
        return None if self.allowed is None else self.allowed - self.excluded

    @property
    def satisfiable(self) -> bool:
        values = self.values
        return not (self.present and self.absent) and (values is None or bool(values))


Requirement = tuple[str, str, frozenset[str]]  # key, operator, values


def _requirements(selector: LabelSelector | None) -> list[Requirement]:
    if selector is None:
        return []
    out = [(key, "In", frozenset([value])) for key, value in selector.match_labels.items()]
    out += [(req.key, req.operator, frozenset(req.values)) for req in selector.match_expressions]
    return out


def _constraints(requirements: Sequence[Requirement]) -> dict[str, _KeyConstraint]:
    out: dict[str, _KeyConstraint] = {}
    for key, operator, values in requirements:
        c = out.get(key, _KeyConstraint())
        if operator == "In":
            c = replace(
                c, present=True, allowed=values if c.allowed is None else c.allowed & values
            )
        elif operator == "NotIn":
            c = replace(c, excluded=c.excluded | values)
        elif operator == "Exists":
            c = replace(c, present=True)
        else:
            c = replace(c, absent=True)
        out[key] = c
    return out


def selector_specificity(selector: LabelSelector | None) -> int:
    """How much a selector says: its matchLabels pairs and matchExpressions."""
    return len(_requirements(selector))


def selector_satisfiable(selector: LabelSelector | None) -> bool:
    """Whether any label set matches the selector."""
    return all(c.satisfiable for c in _constraints(_requirements(selector)).values())


def selectors_overlap(a: LabelSelector | None, b: LabelSelector | None) -> bool:
    """Whether one label set can match both selectors."""
    both = _constraints(_requirements(a) + _requirements(b))
    return all(c.satisfiable for c in both.values())


def selector_implies(a: LabelSelector | None, b: LabelSelector | None) -> bool:
    """Whether every label set that matches ``a`` matches ``b``."""
    known = _constraints(_requirements(a))
    if not all(c.satisfiable for c in known.values()):
        return True  # a matches nothing
    for key, operator, values in _requirements(b):
        c = known.get(key, _KeyConstraint())
        have = c.values
        if operator == "In":
            holds = c.present and have is not None and have <= values
        elif operator == "Exists":
            holds = c.present
        elif operator == "DoesNotExist":
            holds = c.absent
        else:  # NotIn
            holds = c.absent or (have is not None and not have & values) or values <= c.excluded
        if not holds:
            return False
    return True


def _describe(selector: LabelSelector | None) -> str:
    return describe_selector(selector) if selector is not None else "<everything>"


def selected_names(selector: LabelSelector | None) -> frozenset[str] | None:
    """The namespaces a selector names through kubernetes.io/metadata.name; None: not a list."""
    c = _constraints(_requirements(selector)).get(NAMESPACE_NAME_LABEL)
    return None if c is None else c.values


# --- Tenants ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantMatch:
    """A tenant that claims a namespace, and how."""

    tenant: Tenant
    index: int  # load order
    by_name: bool

    @property
    def specificity(self) -> int:
        return 0 if self.by_name else selector_specificity(self.tenant.namespace_selector)

    @property
    def rank(self) -> tuple[int, int, int]:
        """Lower wins: by name, then the more specific selector, then load order."""
        return (0 if self.by_name else 1, -self.specificity, self.index)

    @property
    def how(self) -> str:
        if self.by_name:
            return "by name"
        return f"by namespace labels {_describe(self.tenant.namespace_selector)}"


def tenant_matches(
    tenants: Sequence[Tenant], namespace: str, labels: Mapping[str, str]
) -> tuple[TenantMatch, ...]:
    """Every tenant that claims the namespace, the winner first."""
    found = []
    for index, tenant in enumerate(tenants):
        if namespace in tenant.namespaces:
            found.append(TenantMatch(tenant, index, by_name=True))
        elif tenant.namespace_selector is not None and selector_matches(
            tenant.namespace_selector, labels
        ):
            found.append(TenantMatch(tenant, index, by_name=False))
    return tuple(sorted(found, key=lambda m: m.rank))


def selector_order(tenants: Sequence[Tenant]) -> tuple[Tenant, ...]:
    """Tenants with a namespaceSelector, in the order their selectors are tried."""
    ranked = [
        (-selector_specificity(t.namespace_selector), index, t)
        for index, t in enumerate(tenants)
        if t.namespace_selector is not None
    ]
    return tuple(t for _, _, t in sorted(ranked, key=lambda r: (r[0], r[1])))


def why_tenant_wins(winner: TenantMatch, loser: TenantMatch) -> str:
    if winner.by_name and not loser.by_name:
        return "listing a namespace by name beats selecting it by labels"
    if winner.by_name:
        return f"both list it by name; tenant {winner.tenant.name} comes first in load order"
    if winner.specificity > loser.specificity:
        return (
            f"its selector is more specific ({winner.specificity} requirements to "
            f"{loser.specificity})"
        )
    return f"equally specific selectors; tenant {winner.tenant.name} comes first in load order"


def beaten_tenants(
    tenants: Sequence[Tenant], namespace: str, labels: Mapping[str, str]
) -> tuple[str, ...]:
    """For `explain`: each tenant that also claims the namespace, and why the winner beat it."""
    matches = tenant_matches(tenants, namespace, labels)
    if not matches:
        return ()
    winner = matches[0]
    return tuple(
        f"beats tenant {m.tenant.name} ({m.how}): {why_tenant_wins(winner, m)}" for m in matches[1:]
    )


def tenant_problems(tenants: Sequence[Tenant]) -> list[str]:
    """Tenants that can never be chosen, or that share namespaces only load order decides."""
    owner: dict[str, Tenant] = {}
    for tenant in tenants:
        for namespace in tenant.namespaces:
            owner.setdefault(namespace, tenant)
    problems: list[str] = []
    dead_selectors: set[str] = set()
    for index, tenant in enumerate(tenants):
        taken = {ns: owner[ns].name for ns in tenant.namespaces if owner[ns] is not tenant}
        own = [ns for ns in tenant.namespaces if owner[ns] is tenant]
        dead = _dead_selector(index, tenant, tenants, owner)
        if dead is not None:
            dead_selectors.add(tenant.name)
        if not own and (tenant.namespace_selector is None or dead is not None):
            reasons = [f"namespace {ns} is listed by tenant {by} first" for ns, by in taken.items()]
            reasons += [dead] if dead is not None else []
            problems.append(f"tenant {tenant.name}: can never be chosen: {'; '.join(reasons)}")
            continue
        problems += [
            f"tenant {tenant.name}: namespace {ns} is also listed by tenant {by}, which takes it "
            "(load order); list each namespace in one tenant"
            for ns, by in taken.items()
        ]
        if dead is not None:
            problems.append(
                f"tenant {tenant.name}: chosen only for the namespaces it lists: {dead}"
            )
    live = [t for t in tenants if t.namespace_selector is not None and t.name not in dead_selectors]
    return problems + _ambiguous_selectors(live)


def _dead_selector(
    index: int, tenant: Tenant, tenants: Sequence[Tenant], owner: Mapping[str, Tenant]
) -> str | None:
    """Why the tenant's namespaceSelector never chooses it, or None."""
    selector = tenant.namespace_selector
    if selector is None:
        return None
    described = describe_selector(selector)
    if not selector_satisfiable(selector):
        return f"its namespaceSelector {described} matches no namespace"
    names = selected_names(selector)
    if names is not None:
        others = sorted({owner[ns].name for ns in names if ns in owner and owner[ns] is not tenant})
        if all(ns in owner for ns in names) and others:
            listed = ", ".join(sorted(names))
            return (
                f"its namespaceSelector selects only {listed}, which tenant "
                f"{', '.join(others)} lists by name (a name beats a selector)"
            )
    mine = TenantMatch(tenant, index, by_name=False)
    for other_index, other in enumerate(tenants):
        if other is tenant or other.namespace_selector is None:
            continue
        theirs = TenantMatch(other, other_index, by_name=False)
        if theirs.rank < mine.rank and selector_implies(selector, other.namespace_selector):
            return (
                f"tenant {other.name} selects every namespace its namespaceSelector selects "
                f"({_describe(other.namespace_selector)}) and wins: "
                f"{why_tenant_wins(theirs, mine)}"
            )
    return None


def _ambiguous_selectors(selecting: Sequence[Tenant]) -> list[str]:
    """Pairs of equally specific selectors that can match one namespace: load order decides."""
    problems = []
    for n, first in enumerate(selecting):
        for second in selecting[n + 1 :]:
            a, b = first.namespace_selector, second.namespace_selector
            if (
                selector_specificity(a) != selector_specificity(b)
                or not selectors_overlap(a, b)
                or selector_implies(b, a)  # then the second can never win: reported as such
                or selector_implies(a, b)
            ):
                continue
            problems.append(
                f"tenants {first.name} ({_describe(a)}) and {second.name} "
                f"({_describe(b)}) select the same namespaces with equally specific "
                f"selectors: a namespace matching both goes to {first.name} by load order only; "
                "make one selector more specific, or list such namespaces by name"
            )
    return problems


# --- Rules --------------------------------------------------------------------------------


def _names(match: Matcher) -> tuple[tuple[str, ...], str] | None:
    """The names a kind-bound matcher lists and what they are; None for a kind without names."""
    field = _NAME_FIELDS.get(type(match))
    if field is None:
        return None
    names: tuple[str, ...] = getattr(match, field[0])
    if isinstance(match, TrainingJobMatch):
        names = tuple(name.lower() for name in names)
    return names, field[1]


def _is_glob(pattern: str) -> bool:
    return any(char in _GLOB for char in pattern)


def _selector_conditions(match: SelectorMatch) -> int:
    return (
        selector_specificity(match.labels)
        + len(match.annotations)
        + (1 if match.namespaces else 0)
        + selector_specificity(match.namespace_selector)
    )


def rule_specificity(match: Matcher) -> int:
    """How much a match narrows its kind: a selector counts its conditions; a kind-bound matcher
    that lists only exact names is 2, one with a glob among them 1, one that lists none 0."""
    if isinstance(match, SelectorMatch):
        return _selector_conditions(match)
    named = _names(match)
    if named is None or not named[0]:
        return 0
    return 1 if any(_is_glob(name) for name in named[0]) else 2


def narrowing(match: Matcher) -> str:
    """What narrows the match, as `explain` and `lint` say it."""
    if isinstance(match, SelectorMatch):
        count = _selector_conditions(match)
        return f"has {count} selector condition{'' if count == 1 else 's'}"
    named = _names(match)
    if named is None:
        return f"matches every {match.kind}"
    names, what = named
    if not names:
        return f"names no {what}"
    return f"names {what} {'by glob' if any(_is_glob(n) for n in names) else 'exactly'}"


def narrower_rules(rules: Sequence[WorkloadRule]) -> tuple[tuple[int, ...], ...]:
    """For each rule, the later rules of its kind that narrow it, in the order they are tried
    when it matches: the narrowest first, ties in load order."""
    specificity = [rule_specificity(rule.match) for rule in rules]
    out = []
    for i, rule in enumerate(rules):
        later = [
            j
            for j in range(i + 1, len(rules))
            if rules[j].match.kind == rule.match.kind and specificity[j] > specificity[i]
        ]
        out.append(tuple(sorted(later, key=lambda j: (-specificity[j], j))))
    return tuple(out)


def why_rule_wins(winner: WorkloadRule, loser: WorkloadRule) -> str:
    """Why the chosen rule beat another that matched the pod too."""
    if winner.match.kind != loser.match.kind:
        return f"rule {winner.name} comes first (rules of different kinds are tried in load order)"
    if rule_specificity(winner.match) > rule_specificity(loser.match):
        return (
            f"rule {winner.name} is narrower: it {narrowing(winner.match)}, "
            f"rule {loser.name} {narrowing(loser.match)}"
        )
    return f"rule {winner.name} is as narrow and comes first"


def _pattern_covers(broad: str, narrow: str) -> bool:
    """Whether every name the glob ``narrow`` matches, ``broad`` matches too (conservative)."""
    if broad == narrow or (not _is_glob(narrow) and fnmatchcase(narrow, broad)):
        return True
    prefix = broad[:-1]
    if broad.endswith("*") and not _is_glob(prefix):
        # Every name the glob matches starts with its literal part, which starts with prefix.
        cut = min((narrow.index(c) for c in _GLOB if c in narrow), default=len(narrow))
        return narrow[:cut].startswith(prefix)
    return False


def _match_covers(broad: Matcher, narrow: Matcher) -> bool:
    """Whether every pod ``narrow`` matches, ``broad`` matches too (conservative)."""
    if isinstance(broad, SelectorMatch):
        if not isinstance(narrow, SelectorMatch):
            return _selector_conditions(broad) == 0
        namespaces_covered = not broad.namespaces or (
            bool(narrow.namespaces) and set(narrow.namespaces) <= set(broad.namespaces)
        )
        return (
            namespaces_covered
            and selector_implies(narrow.namespace_selector, broad.namespace_selector)
            and selector_implies(narrow.labels, broad.labels)
            and all(narrow.annotations.get(k) == v for k, v in broad.annotations.items())
        )
    if type(broad) is not type(narrow):
        return False
    wide, thin = _names(broad), _names(narrow)
    if wide is None or thin is None or not wide[0]:
        return True
    return bool(thin[0]) and all(any(_pattern_covers(b, n) for b in wide[0]) for n in thin[0])


def _patterns_overlap(a: str, b: str) -> bool:
    """Whether some name matches both patterns (conservative: two globs overlap unless their
    literal prefixes differ)."""
    if not _is_glob(a):
        return fnmatchcase(a, b) if _is_glob(b) else a == b
    if not _is_glob(b):
        return fnmatchcase(b, a)
    cut_a = min(a.index(c) for c in _GLOB if c in a)
    cut_b = min(b.index(c) for c in _GLOB if c in b)
    return a[:cut_a].startswith(b[:cut_b]) or b[:cut_b].startswith(a[:cut_a])


def rules_overlap(a: WorkloadRule, b: WorkloadRule) -> bool:
    """Whether one pod may match both rules' matchers (conservative: true unless they cannot)."""
    first, second = a.match, b.match
    if isinstance(first, SelectorMatch) and isinstance(second, SelectorMatch):
        return (
            (
                not first.namespaces
                or not second.namespaces
                or bool(set(first.namespaces) & set(second.namespaces))
            )
            and selectors_overlap(first.namespace_selector, second.namespace_selector)
            and selectors_overlap(first.labels, second.labels)
            and all(second.annotations.get(k, v) == v for k, v in first.annotations.items())
        )
    if isinstance(first, SelectorMatch) or isinstance(second, SelectorMatch):
        return True
    if type(first) is not type(second):
        return False
    one, other = _names(first), _names(second)
    if one is None or other is None or not one[0] or not other[0]:
        return True
    return any(_patterns_overlap(x, y) for x in one[0] for y in other[0])


def rule_covers(broad: WorkloadRule, narrow: WorkloadRule) -> bool:
    """Whether every pod ``narrow`` matches (its GPU conditions included), ``broad`` matches."""
    broad_wants = broad.require_gpu_request or broad.max_gpu_request is not None
    narrow_wants = narrow.require_gpu_request or narrow.max_gpu_request is not None
    if broad_wants and not narrow_wants:
        return False
    limit = broad.max_gpu_request
    if limit is not None and (narrow.max_gpu_request is None or narrow.max_gpu_request > limit):
        return False
    return _match_covers(broad.match, narrow.match)


def _takes(rule: WorkloadRule) -> str:
    """The pods a rule takes, for a shadowing message."""
    if isinstance(rule.match, SelectorMatch):
        return "every pod" if _selector_conditions(rule.match) == 0 else "every pod it matches"
    named = _names(rule.match)
    if named is None or not named[0]:
        return f"every {rule.match.kind}"
    return f"every {rule.match.kind} it matches"


def shadowed_rules(rules: Sequence[WorkloadRule]) -> list[tuple[int, int, str]]:
    """(rule, the rule that shadows it, what that rule does) for each rule that can never be
    chosen, by index into ``rules`` (in load order)."""
    specificity = [rule_specificity(rule.match) for rule in rules]
    first_of_kind: dict[str, int] = {}
    for index, rule in enumerate(rules):
        first_of_kind.setdefault(rule.match.kind, index)
    out = []
    for i, rule in enumerate(rules):
        for j, other in enumerate(rules):
            if j == i or not rule_covers(other, rule):
                continue
            if other.match.kind == rule.match.kind:
                if j < i and specificity[j] >= specificity[i]:
                    out.append((i, j, f"takes {_takes(other)} first"))
                    break
                if j > i and specificity[j] > specificity[i]:
                    out.append(
                        (
                            i,
                            j,
                            f"is narrower (it {narrowing(other.match)}) and takes {_takes(other)}",
                        )
                    )
                    break
            elif isinstance(other.match, SelectorMatch) and first_of_kind[rule.match.kind] > j:
                # A catch-all selector, and no rule of this kind is tried before it.
                out.append((i, j, f"takes {_takes(other)} first"))
                break
    return out
