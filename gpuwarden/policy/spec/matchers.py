"""Match a pod against one workload rule; every answer carries the reason, for `explain`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from gpuwarden.policy.pod.workloads import Workload
from gpuwarden.policy.spec.model import (
    KatibTrialMatch,
    KfpStepMatch,
    KfpSystemMatch,
    KservePredictorMatch,
    Matcher,
    NotebookMatch,
    SelectorMatch,
    TrainingJobMatch,
    TrainJobMatch,
)
from gpuwarden.policy.spec.selectors import describe_selector, name_matches, selector_matches


class PodFacts(NamedTuple):
    """The read-only attributes a rule may look at."""

    namespace: str
    namespace_labels: Mapping[str, str]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    workload: Workload | None
    asks_for_gpu: bool = False  # a container names a GPU resource above zero
    largest_request: int | None = None  # the most GPUs one container asks for


class MatchResult(NamedTuple):
    matched: bool
    reason: str


# The workload kind each kind-bound matcher wants: a pod of another kind can skip match().
_KINDS: dict[type, str] = {
    KfpStepMatch: "kfp-step",
    KfpSystemMatch: "kfp-system",
    TrainingJobMatch: "training-job",
    TrainJobMatch: "trainjob",
    KatibTrialMatch: "katib-trial",
    NotebookMatch: "notebook",
    KservePredictorMatch: "kserve-predictor",
}


def bound_kind(rule: Matcher) -> str | None:
    """The workload kind the matcher is bound to; None when it may match a pod of any kind."""
    return _KINDS.get(type(rule))


def may_match(rule: Matcher, facts: PodFacts) -> bool:
    """False when ``match`` certainly fails: the rule is bound to another workload kind."""
    kind = bound_kind(rule)
    return kind is None or (facts.workload is not None and facts.workload.kind == kind)


def _kind_is(facts: PodFacts, kind: str) -> MatchResult | None:
    """None when the workload is of ``kind``; otherwise the reason it is not."""
    if facts.workload is None:
        return MatchResult(False, f"not a Kubeflow workload (wants {kind})")
    if facts.workload.kind != kind:
        return MatchResult(False, f"is a {facts.workload.kind}, not a {kind}")
    return None


def _names(
    facts: PodFacts, kind: str, patterns: tuple[str, ...], what: str, value: str | None
) -> MatchResult:
    mismatch = _kind_is(facts, kind)
    if mismatch is not None:
        return mismatch
    if not name_matches(patterns, value):
        return MatchResult(False, f"{what} {value or '<unknown>'!s} is not in {list(patterns)}")
    return MatchResult(True, f"{facts.workload.describe() if facts.workload else kind}")


def _selector(rule: SelectorMatch, facts: PodFacts) -> MatchResult:
    if rule.namespaces and facts.namespace not in rule.namespaces:
        return MatchResult(False, f"namespace {facts.namespace} is not in {list(rule.namespaces)}")
    if rule.namespace_selector is not None and not selector_matches(
        rule.namespace_selector, facts.namespace_labels
    ):
        return MatchResult(
            False, f"namespace labels do not match {describe_selector(rule.namespace_selector)}"
        )
    if rule.labels is not None and not selector_matches(rule.labels, facts.labels):
        return MatchResult(False, f"pod labels do not match {describe_selector(rule.labels)}")
    for key, value in rule.annotations.items():
        if facts.annotations.get(key) != value:
            return MatchResult(False, f"annotation {key} is not {value!r}")
    return MatchResult(True, "selector matched")


def match(rule: Matcher, facts: PodFacts) -> MatchResult:
    workload = facts.workload
    if isinstance(rule, KfpStepMatch):
        return _names(
            facts, "kfp-step", rule.task_names, "task", workload.name if workload else None
        )
    if isinstance(rule, KfpSystemMatch):
        if mismatch := _kind_is(facts, "kfp-system"):
            return mismatch
        if facts.asks_for_gpu:
            # A real driver or importer never asks for one: this is user code wearing its labels.
            return MatchResult(
                False, "KFP driver or importer pod, but it asks for a GPU, which none does"
            )
        return MatchResult(True, "KFP driver or importer pod")
    if isinstance(rule, TrainingJobMatch):
        # The operator writes replica types in lower case (Worker -> worker).
        return _names(
            facts,
            "training-job",
            tuple(t.lower() for t in rule.replica_types),
            "replica type",
            workload.detail.lower() if workload and workload.detail else None,
        )
    if isinstance(rule, TrainJobMatch):
        return _names(
            facts,
            "trainjob",
            rule.replicated_jobs,
            "replicated job",
            workload.detail if workload else None,
        )
    if isinstance(rule, KatibTrialMatch):
        return _names(
            facts,
            "katib-trial",
            rule.experiments,
            "experiment",
            workload.detail if workload else None,
        )
    if isinstance(rule, NotebookMatch):
        return _kind_is(facts, "notebook") or MatchResult(True, "notebook pod")
    if isinstance(rule, KservePredictorMatch):
        return _names(
            facts,
            "kserve-predictor",
            rule.inference_services,
            "inference service",
            workload.name if workload else None,
        )
    return _selector(rule, facts)
