"""Checks that keep gpuwarden's decision as it was made: its annotations (never forged on a new
pod, never changed on an update) and the resources its profile set (never resized)."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwarden.policy.admission.checks.base import (
    CREATE,
    RESIZE,
    UPDATE,
    Check,
    CheckContext,
    Violation,
    container_path,
)
from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import same_quantity
from gpuwarden.policy.pod.resources import annotations_of
from gpuwarden.policy.pod.view import PodView
from gpuwarden.policy.spec.backends import (
    BACKEND_ANNOTATIONS,
    USE_GPU_TYPE_ANNOTATION,
    VOLCANO_PREEMPTABLE_ANNOTATION,
    VOLCANO_QUEUE_ANNOTATION,
)

# Why each backend annotation matters, for the denial.
_BACKEND_ANNOTATION_USES = {
    VOLCANO_PREEMPTABLE_ANNOTATION: "gpuwarden sets it from the profile's preemptible, and "
    "Volcano reads it to preempt",
    VOLCANO_QUEUE_ANNOTATION: "gpuwarden sets it to the tenant's queue, and Volcano charges the "
    "pod to that queue",
    USE_GPU_TYPE_ANNOTATION: "gpuwarden sets it from the profile's gpuTypes, and Volcano's vGPU "
    "device and HAMi place the pod by it",
}


def _changed_annotations(context: CheckContext) -> Iterator[Violation]:
    """On UPDATE, gpuwarden's own annotations are read by the node agent and charge quota, and
    the backend annotations it writes (spec/backends.py BACKEND_ANNOTATIONS: Volcano's queue and
    preemptable, the GPU types Volcano vGPU and HAMi read) decide where and how the pod is
    scheduled: nobody may change them, in any namespace."""
    request = context.request
    old = annotations_of(request.old_pod or {})
    new = context.view.annotations
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key):
            continue
        if key.startswith(keys.API_GROUP + "/"):
            yield Violation(
                "annotations",
                "PolicyMismatch",
                f"metadata.annotations[{key}]: gpuwarden's decision annotations cannot be "
                "changed after admission; revert the change",
            )
        elif key in BACKEND_ANNOTATIONS:
            yield Violation(
                "annotations",
                "PolicyMismatch",
                f"metadata.annotations[{key}]: {_BACKEND_ANNOTATION_USES[key]}; it cannot be "
                "changed after admission; revert the change",
            )


def _resize(context: CheckContext) -> Iterator[Violation]:
    """pods/resize may change the cpu and memory of running containers: not those the profile
    set (hostMemory, cpu), or a pod would keep its profile and outgrow it."""
    request, placement = context.request, context.placement
    old_pod = request.old_pod
    if old_pod is None or not placement.governed:
        return
    profile = placement.profile.name if placement.profile else "?"
    before = PodView.of(old_pod).main_by_name
    after = context.view.main_by_name
    for granted in placement.container_grants:
        old, new = before.get(granted.name), after.get(granted.name)
        if old is None or new is None:
            continue
        for section, values in (
            ("limits", granted.grant.limits),
            ("requests", granted.grant.requests),
        ):
            for name in sorted(values):
                was, now = old.resources(section).get(name), new.resources(section).get(name)
                if same_quantity(was, now):
                    continue
                yield Violation(
                    "scheduling",
                    "PolicyMismatch",
                    f"{container_path(new)}.resources.{section}[{name}]: profile {profile} "
                    f"({placement.origin}) sets it to {values[name]}, and a resize may not change "
                    f"what gpuwarden set; resize only what the profile leaves to the pod",
                )


def _forged_annotations(context: CheckContext) -> Iterator[Violation]:
    """gpuwarden's decision annotations on a pod it did not decide: they would charge another
    tenant's GPU memory or steer the node agent."""
    if context.placement.governed:
        return  # the mutation wrote them, and the scheduling check compares them
    forged = sorted(k for k in context.view.annotations if k in keys.DECISION_ANNOTATIONS)
    if forged:
        yield Violation(
            "annotations",
            "ForgedDecision",
            f"metadata.annotations {', '.join(forged)}: only gpuwarden writes these, and it "
            "gives this pod no profile; remove them",
        )


FORGED_ANNOTATIONS = Check(
    "forged annotations", "annotations", frozenset({CREATE}), _forged_annotations
)
CHANGED_ANNOTATIONS = Check(
    "changed annotations", "annotations", frozenset({UPDATE}), _changed_annotations
)
POD_RESIZE = Check("resize", "scheduling", frozenset({RESIZE}), _resize)
