"""Checks that the final pod is scheduled as its profile says: it has a profile if it asks for
a GPU, contradicts none of the fields the profile sets, and reaches the scheduler that assigns
its devices."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwarden.policy.admission.checks.base import (
    CREATE,
    Check,
    CheckContext,
    Violation,
    container_path,
    listed,
)
from gpuwarden.policy.admission.decision import ClusterView
from gpuwarden.policy.admission.mutate import apply_placement, plan, size_problems
from gpuwarden.policy.admission.placement import Placement
from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.pointer import tokens
from gpuwarden.policy.spec.model import HamiBackend, Tenant, VolcanoBackend


def _readable(path: str) -> str:
    out = ""
    for part in tokens(path):
        out += f"[{part}]" if ("/" in part or "." in part or part.isdigit()) else f".{part}"
    return out.lstrip(".")


def _profile_mismatch(context: CheckContext) -> Iterator[Violation]:
    """A GPU pod that no rule gives a profile, or a field that contradicts its profile (the
    mutation re-run on the final pod would still change it)."""
    view, placement, cluster = context.view, context.placement, context.cluster
    if not placement.governed:
        if placement.tenant is not None and placement.source != "skip" and view.asks_for_gpu:
            yield Violation(
                "scheduling",
                "NoGPUProfile",
                "the pod requests a GPU but no gpuwarden rule gives it a profile; set the label "
                f"{keys.PROFILE_LABEL} to one of: {', '.join(_allowed(placement.tenant, cluster))}",
            )
        return
    if size_problems(placement):
        return  # not mutated, and denied for its size: nothing to compare
    desired = () if context.settled else apply_placement(view, placement, cluster)[0].ops
    if desired:
        first = desired[0]
        field = _readable(str(first["path"]))
        wanted = first.get("value")
        profile = placement.profile.name if placement.profile else "?"
        verb = "must not be set" if first["op"] == "remove" else f"must be {wanted!r}"
        yield Violation(
            "scheduling",
            "PolicyMismatch",
            f"{field} contradicts profile {profile} ({placement.origin}): it {verb}; "
            "remove your change and let gpuwarden set it",
        )
    targets = set(placement.containers)
    for ref in view.all_containers:
        if ref.field == "containers" and ref.name in targets:
            continue
        if view.gpus(ref).asks:
            yield Violation(
                "scheduling",
                "PolicyMismatch",
                f"{container_path(ref)} requests {', '.join(sorted(ref.gpu_resources()))} but profile "
                f"{placement.profile.name if placement.profile else '?'} gives GPUs only to "
                f"{listed(placement.containers)}; remove those resources",
            )


def _node_name(context: CheckContext) -> Iterator[Violation]:
    """A GPU pod bound to a node by name never meets the scheduler: no device assignment (Volcano
    and HAMi write it), no queue, no packing, and no check that the node has the GPUs free."""
    node = context.view.spec.get("nodeName")
    if not node or not context.view.asks_for_gpu:
        return
    yield Violation(
        "scheduling",
        "PolicyMismatch",
        f"spec.nodeName {node}: a GPU pod bound to a node by name skips the scheduler and the GPU "
        "accounting it does; remove nodeName and pick the node with a nodeSelector or node "
        "affinity on kubernetes.io/hostname",
    )


def _scheduler_bound_resources(placement: Placement) -> list[str]:
    """The profile's GPU resources that only its backend's scheduler can place: Volcano's vGPU
    resources and everything HAMi's device plugin serves, whose device plugins read the device
    the scheduler assigned from the pod's annotations."""
    profile, backend_plan = placement.profile, plan(placement)
    if profile is None or backend_plan is None:
        return []
    if isinstance(profile.backend, HamiBackend):
        return sorted(backend_plan.resources)
    if isinstance(profile.backend, VolcanoBackend):
        return sorted(r for r in backend_plan.resources if r.startswith("volcano.sh/"))
    return []


def _foreign_scheduler(context: CheckContext) -> Iterator[Violation]:
    """foreignScheduler: keep leaves another controller's schedulerName (and warns), which is
    sound where any scheduler counts the pod's GPUs (nvidia.com/gpu and the device plugin's
    replicas: the kubelet refuses a pod past the node's devices). Where only the backend's own
    scheduler can assign the device, another scheduler would start a pod with no device, or
    none at all, outside the tenant's queue: denied."""
    placement = context.placement
    profile, backend_plan = placement.profile, plan(placement)
    if not placement.governed or profile is None or backend_plan is None:
        return
    wanted, current = backend_plan.scheduler_name, context.view.spec.get("schedulerName")
    if (
        wanted is None
        or current in (None, "", wanted)
        or profile.backend.foreign_scheduler != "keep"
    ):
        return
    bound = _scheduler_bound_resources(placement)
    if bound:
        yield Violation(
            "scheduling",
            "PolicyMismatch",
            f"spec.schedulerName {current}: profile {profile.name} ({placement.origin}) gives "
            f"{listed(bound)}, which only scheduler {wanted} assigns to a device, so "
            f"foreignScheduler: keep cannot keep another scheduler; remove schedulerName or set "
            f"it to {wanted}",
        )


def _allowed(tenant: Tenant | None, cluster: ClusterView) -> list[str]:
    del cluster
    if tenant is None or tenant.limits.allowed_profiles is None:
        return ["<any profile>"]
    return list(tenant.limits.allowed_profiles)


PROFILE_MISMATCH = Check("profile mismatch", "scheduling", frozenset({CREATE}), _profile_mismatch)
NODE_NAME = Check("node name", "scheduling", frozenset({CREATE}), _node_name)
FOREIGN_SCHEDULER = Check(
    "foreign scheduler", "scheduling", frozenset({CREATE}), _foreign_scheduler
)
