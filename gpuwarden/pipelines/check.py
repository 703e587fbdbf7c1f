"""Each step of a compiled pipeline decided as the webhook would decide its pod: the profile it
gets, and what would refuse it (a profile the policies do not define, one the tenant may not
choose, a GPU request the tenant's limits deny)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.pipelines.ir import PipelineIR, Step, step_pod, steps_of
from gpuwarden.policy import AdmissionRequest, ClusterView, PolicySet, admit
from gpuwarden.policy.admission.placement import place
from gpuwarden.policy.pod.keys import ANNOTATION_PROFILE, PROFILE_LABEL
from gpuwarden.policy.spec.loader import did_you_mean

# How a step's GPUs are set in the SDK, for messages that say what to change.
_SDK_GPUS = "set_accelerator_limit(N)"
_SDK_PROFILE = f"use_profile(task, NAME), or the pod label {PROFILE_LABEL}"


@dataclass(frozen=True)
class StepCheck:
    step: Step
    profile: str | None  # what the webhook would record on the pod (None: left ungoverned)
    problems: tuple[str, ...]  # what refuses the step, each naming it and what to change
    warnings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class PipelineCheck:
    pipeline: str
    namespace: str
    steps: tuple[StepCheck, ...]

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(p for step in self.steps for p in step.problems)

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_step(
    ir: PipelineIR, step: Step, policies: PolicySet, cluster: ClusterView, namespace: str
) -> StepCheck:
    warnings = tuple(
        f"{step.label}: {what} is set at run time; checked without it" for what in step.unresolved
    )
    requested = step.profile
    if requested is not None and requested not in policies.profiles:
        hint = did_you_mean(requested, policies.profiles) or (
            f"; use one of: {', '.join(sorted(policies.profiles))}"
        )
        return StepCheck(
            step,
            None,
            (
                f"{step.label}: profile {requested!r} is not defined by the policies{hint} "
                f"Fix the name in {_SDK_PROFILE}.",
            ),
            warnings,
        )
    pod = step_pod(ir, step, namespace)
    request = AdmissionRequest(operation="CREATE", namespace=namespace, pod=pod)
    placement = place(pod, namespace, cluster.labels_for(namespace), policies)
    result = admit(request, policies, cluster)
    problems = [f"{step.label}: {problem}" for problem in placement.problems]
    if step.dropped_gpus is not None:
        problems.append(
            f"{step.label}: asks for {step.dropped_gpus} accelerator(s) with no accelerator "
            "type, and KFP's driver sets no limit without one: the step would run with no GPU; "
            "add .set_accelerator_type('nvidia.com/gpu')"
        )
    if not result.allowed:
        problems.append(
            f"{step.label}: denied: {result.validation.message or result.mutation.message} "
            f"(change the step's GPU count with {_SDK_GPUS}, or its profile with {_SDK_PROFILE})"
        )
    would_deny = result.validation.audit_annotations.get("would-deny-message")
    if result.allowed and would_deny:
        warnings += (f"{step.label}: admitted under audit; enforcing would deny: {would_deny}",)
    annotations = result.pod.get("metadata", {}).get("annotations") or {}
    return StepCheck(step, annotations.get(ANNOTATION_PROFILE), tuple(problems), warnings)


def check_steps(
    ir: PipelineIR,
    policies: PolicySet,
    namespace: str,
    cluster: ClusterView | None = None,
    steps: Sequence[Step] | None = None,
) -> PipelineCheck:
    """Every step of the pipeline run in ``namespace`` (whose labels ``cluster`` knows, where
    the tenant is found by them), decided by the policies."""
    view = cluster if cluster is not None else ClusterView()
    chosen = steps_of(ir) if steps is None else steps
    return PipelineCheck(
        ir.name, namespace, tuple(_check_step(ir, s, policies, view, namespace) for s in chosen)
    )
