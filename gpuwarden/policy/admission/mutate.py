"""The mutating decision: a pod in, the JSON Patch that gives it its profile out."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, NamedTuple

from gpuwarden.policy.admission.decision import (
    NO_ANNOTATIONS,
    AdmissionRequest,
    ClusterView,
    Decision,
    bounded_warnings,
    warning,
)
from gpuwarden.policy.admission.patch import PatchBuilder
from gpuwarden.policy.admission.placement import ContainerGrant, Placement, place
from gpuwarden.policy.admission.rollout import reported
from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import same_quantity
from gpuwarden.policy.pod.record import CHARGE_FIELDS, PodRecord, field_annotations
from gpuwarden.policy.pod.resources import (
    GPU_COUNT_RESOURCES,
    ContainerRef,
    annotations_of,
    containers,
    is_gpu_resource,
)
from gpuwarden.policy.pod.view import PodView, names_gpuwarden_claim
from gpuwarden.policy.spec.backends import (
    DEFAULT_SCHEDULER,
    DRA_CLAIM_NAME,
    VOLCANO_GROUP_NAME_ANNOTATION,
    VOLCANO_QUEUE_ANNOTATION,
    BackendPlan,
    exclusive_node_expression,
    no_shared_gpus_expression,
    preferred_nodes_term,
    selects_shared_gpus,
)
from gpuwarden.policy.spec.model import DraBackend, EnforcementAction
from gpuwarden.policy.spec.policyset import Grant, PolicySet
from gpuwarden.policy.spec.resolved import ResolvedProfile

# The decision annotations desired_annotations() writes only for some profiles: when a
# reinvocation (e.g. after Katib's webhook added the trial labels) changes the profile, or a user
# set one, the ones the new decision does not write are removed, or the node agent would read them.
_CONDITIONAL_ANNOTATIONS = (
    keys.ANNOTATION_TENANT,
    keys.ANNOTATION_BACKEND,
    keys.ANNOTATION_GPU_SHARED,
    keys.ANNOTATION_PREEMPTIBLE,
    keys.ANNOTATION_GPU_MEMORY_LIMIT,
    keys.ANNOTATION_GPU_MEMORY_RESERVED,
    keys.ANNOTATION_OVERCOMMIT_RATIO,
    keys.ANNOTATION_THREAD_PERCENTAGE,
    keys.ANNOTATION_IDLE,
)


#: The containers of one pod that may get GPUs. Each costs about five patch operations and a
#: warning line or two; a pod with more is not mutated, and the validator denies it, rather than
#: answering with a patch of thousands of operations.
MAX_GPU_CONTAINERS = 64


def size_problems(placement: Placement) -> tuple[str, ...]:
    """Why the pod is too big to govern: more containers would get GPUs than MAX_GPU_CONTAINERS."""
    count = len(placement.containers)
    if placement.profile is None or count <= MAX_GPU_CONTAINERS:
        return ()
    return (
        f"spec.containers: {count} containers would get GPUs (profile {placement.profile.name}, "
        f"{placement.origin}) but gpuwarden governs at most {MAX_GPU_CONTAINERS} per pod; give "
        "GPUs to fewer containers or split the work over several pods",
    )


def _is_pod(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind", "Pod") == "Pod" and isinstance(obj.get("spec"), Mapping)


def desired_annotations(placement: Placement) -> dict[str, str]:
    assert placement.grant is not None
    # The grant's annotations were written from its record at load; this adds what the
    # placement decided (rule, containers), last, as the patch has always ordered them.
    decided = field_annotations({"rule": placement.origin, "containers": placement.containers})
    return {**placement.grant.annotations, **decided}


def plan(placement: Placement) -> BackendPlan | None:
    """The backend plan, or None for a profile that gives no GPU."""
    return placement.grant.plan if placement.grant is not None else None


def own_claim(placement: Placement) -> str | None:
    """The ResourceClaimTemplate of the claim gpuwarden gives the pod (dra backend, shared
    profile); None where it gives none."""
    backend_plan = plan(placement) if placement.governed else None
    return backend_plan.claim_template if backend_plan is not None else None


def is_own_claim_entry(entry: Any, template: str | None) -> bool:
    """Whether a spec.resourceClaims entry is exactly the one gpuwarden writes for ``template``."""
    return template is not None and entry == _pod_claim(template)


def _pod_claim(template: str) -> dict[str, str]:
    return {"name": DRA_CLAIM_NAME, "resourceClaimTemplateName": template}


def _set_resources(patch: PatchBuilder, ref: ContainerRef, grant: Grant, notes: list[str]) -> None:
    # A value the container set that the profile replaces or removes is said in a warning (the
    # GPU count has its own line in the summary): the policy's word wins, never silently.
    replaced: dict[str, str] = {}
    changes: list[tuple[str, Mapping[str, str], list[str]]] = []
    for section, values in (("limits", grant.limits), ("requests", grant.requests)):
        # The patch writes each container once, and this first: the pod's own section is the
        # working copy's.
        current = ref.resources(section)
        stale: list[str] = []
        if current:
            stale = [n for n in current if n not in values and is_gpu_resource(str(n))]
            stale.sort()
            for name in stale:
                if name not in GPU_COUNT_RESOURCES:
                    replaced[name] = f"removed {name} {current[name]}"
            for name, value in values.items():
                old = current.get(name)
                if (
                    old is not None
                    and name not in GPU_COUNT_RESOURCES
                    and not same_quantity(old, value)
                ):
                    replaced[name] = f"{name} {old} -> {value}"
        changes.append((section, values, stale))
    patch.update_each([*ref.path, "resources"], changes)
    notes += [
        f"{ref.name}: {replaced[name]} (profile {grant.profile.name} sets it)"
        for name in sorted(replaced)
    ]


def _set_claim(
    patch: PatchBuilder, ref: ContainerRef, template: str | None, asked: Mapping[str, Any]
) -> list[str]:
    """Give a target container the pod's claim gpuwarden-gpu where its plan shares through
    one; returns the note that says which GPU resources (``asked``, as sent) it replaces."""
    if template is None:
        return []
    path = [*ref.path, "resources", "claims"]
    if not names_gpuwarden_claim(patch.get(path)):
        patch.append(path, {"name": DRA_CLAIM_NAME})
    if not asked:
        return []
    replaced = ", ".join(f"{name} {value}" for name, value in sorted(asked.items()))
    return [f"{ref.name}: {replaced} replaced by claim {DRA_CLAIM_NAME} (template {template})"]


def _set_pod_claim(patch: PatchBuilder, template: str) -> None:
    """The pod-level claim the GPU container uses; an entry of that name the pod already has is
    left as it is (the escapes check denies it unless it is this one)."""
    path: list[str | int] = ["spec", "resourceClaims"]
    if not names_gpuwarden_claim(patch.get(path)):
        patch.append(path, _pod_claim(template))


# The MPS client variables gpuwarden writes; on a governed container they are gpuwarden's own.
_OWNED_ENV = (keys.ENV_MPS_THREAD_PERCENTAGE, keys.ENV_MPS_PINNED_MEM_LIMIT)


def _set_env(
    patch: PatchBuilder, ref: ContainerRef, env: Mapping[str, str], notes: list[str]
) -> None:
    path = [*ref.path, "env"]
    current = patch.get(path)
    if isinstance(current, list):
        # An owned variable the current plan does not set (a reinvocation moved the pod to
        # another backend, or the user set it) goes, last index first so the others stay valid.
        stale = [
            i
            for i, e in enumerate(current)
            if isinstance(e, dict) and e.get("name") in _OWNED_ENV and e.get("name") not in env
        ]
        for stale_index in reversed(stale):
            notes.append(
                f"removed {current[stale_index]['name']} from {ref.name} (gpuwarden sets it)"
            )
            patch.remove([*path, stale_index])
    for name, value in env.items():
        current = patch.get(path)
        entries = current if isinstance(current, list) else []
        found = next(
            (i for i, e in enumerate(entries) if isinstance(e, dict) and e.get("name") == name),
            None,
        )
        if found is None:
            patch.append(path, {"name": name, "value": value})
        else:
            patch.set_list_item(path, found, {"name": name, "value": value})


def _set_scheduler(
    patch: PatchBuilder, plan: BackendPlan, profile: ResolvedProfile, notes: list[str]
) -> None:
    wanted = plan.scheduler_name
    if wanted is None:
        return
    current = patch.get(["spec", "schedulerName"])
    if current in (None, "", DEFAULT_SCHEDULER, wanted):
        patch.merge(["spec"], {"schedulerName": wanted})
    elif profile.backend.foreign_scheduler == "replace":
        patch.merge(["spec"], {"schedulerName": wanted})
        notes.append(f"replaced schedulerName {current} with {wanted}")
    else:
        notes.append(f"kept schedulerName {current} set by another controller (policy: keep)")


# The pod's required node affinity: its terms are ORed, the expressions of a term ANDed.
_NODE_TERMS: list[str | int] = [
    "spec",
    "affinity",
    "nodeAffinity",
    "requiredDuringSchedulingIgnoredDuringExecution",
    "nodeSelectorTerms",
]


def _shared_gpu_selector(patch: PatchBuilder) -> str | None:
    """The pod's nodeSelector entry that picks nodes whose GPUs are shared, as key=value."""
    selector = patch.get(["spec", "nodeSelector"])
    if not isinstance(selector, dict):
        return None
    for key, value in sorted(selector.items()):
        if isinstance(value, str) and selects_shared_gpus(str(key), "In", [value]):
            return f"{key}={value}"
    return None


def _picks_shared_gpus(expressions: list[Any]) -> bool:
    return any(
        isinstance(e, dict)
        and isinstance(e.get("values"), list)
        and selects_shared_gpus(str(e.get("key")), str(e.get("operator")), e["values"])
        for e in expressions
    )


def _remove_emptied(patch: PatchBuilder, path: list[str | int]) -> None:
    """Remove the list at ``path`` and each parent map above it (not ``spec``) that a removal
    left empty, deepest first."""
    for depth in range(len(path), 1, -1):
        if patch.get(path[:depth]) in ([], {}):
            patch.remove(path[:depth])


def _drop_node_expression(patch: PatchBuilder, expression: Mapping[str, Any]) -> None:
    """Remove an expression gpuwarden added, from every term; a term that held nothing else
    was gpuwarden's own and goes, and so do the parents that it leaves empty."""
    terms = patch.get(_NODE_TERMS)
    if not isinstance(terms, list):
        return
    removed = False
    for index in reversed(range(len(terms))):
        term = terms[index]
        expressions = term.get("matchExpressions") if isinstance(term, dict) else None
        if not isinstance(expressions, list) or expression not in expressions:
            continue
        removed = True
        if list(term) == ["matchExpressions"] and all(e == expression for e in expressions):
            patch.remove([*_NODE_TERMS, index])
            continue
        for where in reversed(range(len(expressions))):
            if expressions[where] == expression:
                patch.remove([*_NODE_TERMS, index, "matchExpressions", where])
    if removed:
        _remove_emptied(patch, _NODE_TERMS)


def _keep_off_shared_gpus(patch: PatchBuilder, profile: ResolvedProfile, notes: list[str]) -> None:
    """Give an exclusive nvidia profile a required node affinity that avoids shared GPUs, in
    every term the pod has (the user's own expressions stay as they are); a pod that itself
    picks shared GPUs keeps its choice, and the warning says so."""
    wanted = exclusive_node_expression(profile)
    if wanted is None:
        # A reinvocation moved the pod to a profile that may use shared GPUs.
        _drop_node_expression(patch, no_shared_gpus_expression())
        return
    picked = _shared_gpu_selector(patch)
    if picked is not None:
        notes.append(
            f"kept nodeSelector {picked}: it picks shared GPUs, not profile {profile.name}'s "
            "whole GPUs"
        )
        return
    terms = patch.get(_NODE_TERMS)
    if not isinstance(terms, list) or not terms:
        patch.set(_NODE_TERMS, [{"matchExpressions": [wanted]}])
        return
    for index, term in enumerate(terms):
        if not isinstance(term, dict):
            continue
        if not term.get("matchExpressions") and not term.get("matchFields"):
            continue  # an empty term matches no node: an expression would widen it
        expressions = term.get("matchExpressions", [])
        if not isinstance(expressions, list) or wanted in expressions:
            continue
        if _picks_shared_gpus(expressions):
            notes.append(
                f"kept node affinity term {index}: it picks shared GPUs, not profile "
                f"{profile.name}'s whole GPUs"
            )
            continue
        patch.append([*_NODE_TERMS, index, "matchExpressions"], wanted)


_PREFERRED_TERMS: list[str | int] = [
    "spec",
    "affinity",
    "nodeAffinity",
    "preferredDuringSchedulingIgnoredDuringExecution",
]


def _prefer_nodes(
    patch: PatchBuilder, profile: ResolvedProfile, backend_plan: BackendPlan | None
) -> None:
    """Give the pod the preferred node affinity term its plan asks for (dra shares: the
    backend's sharedNodeLabels), beside the pod's own terms; a reinvocation that moved the pod
    to a plan without one takes gpuwarden's term away again."""
    backend = profile.backend
    if not isinstance(backend, DraBackend) or not backend.shared_node_labels:
        return  # the common pod: no backend of it prefers nodes
    ours = preferred_nodes_term(backend.shared_node_labels)
    terms = patch.get(_PREFERRED_TERMS)
    if backend_plan is not None and backend_plan.preferred_nodes:
        if not isinstance(terms, list) or ours not in terms:
            patch.append(_PREFERRED_TERMS, ours)
        return
    if not isinstance(terms, list) or ours not in terms:
        return
    for index in reversed(range(len(terms))):
        if terms[index] == ours:
            patch.remove([*_PREFERRED_TERMS, index])
    _remove_emptied(patch, _PREFERRED_TERMS)


def _priority(profile: ResolvedProfile, cluster: ClusterView) -> tuple[int, str]:
    """(priority, preemptionPolicy) of the profile's class: the cluster's, where it has one."""
    known = cluster.priority_classes.get(profile.priority_class_name)
    if known is not None:
        return known.value, known.preemption_policy
    return profile.priority, profile.preemption_policy


def _set_priority(
    patch: PatchBuilder, profile: ResolvedProfile, cluster: ClusterView, notes: list[str]
) -> None:
    value, preemption = _priority(profile, cluster)
    current = patch.get(["spec", "priorityClassName"])
    if current not in (None, "", profile.priority_class_name):
        notes.append(
            f"replaced priorityClassName {current} with {profile.priority_class_name} "
            f"(profile {profile.name} sets the priority)"
        )
    # The Priority admission plugin runs again after webhooks and rejects a pod whose priority
    # or preemptionPolicy disagrees with its class, so all three change together.
    patch.merge(
        ["spec"],
        {
            "priorityClassName": profile.priority_class_name,
            "priority": value,
            "preemptionPolicy": preemption,
        },
    )


def _set_placement(patch: PatchBuilder, grant: Grant, notes: list[str]) -> None:
    current = patch.get(["spec", "nodeSelector"])
    if isinstance(current, dict):
        for key, value in grant.node_selector.items():
            if current.get(key) not in (None, value):
                notes.append(
                    f"replaced nodeSelector {key}={current[key]} with {key}={value} "
                    f"(profile {grant.profile.name}'s GPU pool)"
                )
    patch.merge(["spec", "nodeSelector"], grant.node_selector)
    for wanted in grant.tolerations:
        current = patch.get(["spec", "tolerations"])
        if not isinstance(current, list) or wanted not in current:
            patch.append(["spec", "tolerations"], wanted)


def _gpu_lines(granted: ContainerGrant, grant: Grant, profile: ResolvedProfile) -> list[str]:
    """The summary lines of one target container; ``grant`` is the pod's (its plan, its cap)."""
    name = granted.name
    lines = [f"gpuwarden: {name}: {granted.gpus}{grant.gpus_text}"]
    if grant.overcommit_text:
        lines.append(f"gpuwarden: {name}: {grant.overcommit_text}")
    if granted.overridden:
        # The one change to what a user asked that must never pass unnoticed.
        lines.append(
            f"gpuwarden: {name} asked for {granted.asked} GPU{'' if granted.asked == 1 else 's'}; "
            f"{profile.gpus_set_by} sets gpus: {granted.gpus}"
        )
    return lines


def _summary(placement: Placement, cluster: ClusterView) -> list[str]:
    grant, profile = placement.grant, placement.profile
    assert grant is not None and profile is not None
    who = f"tenant {placement.tenant.name}" if placement.tenant else "no tenant"
    lines = [f"gpuwarden: profile {profile.name} via {placement.origin} ({who})"]
    if grant.plan is None:
        asked = [f"{g.name} asked for {g.asked}" for g in placement.container_grants if g.asked]
        why = f" ({', '.join(asked)}; {profile.gpus_set_by} sets gpus: 0)" if asked else ""
        lines.append(f"gpuwarden: {','.join(placement.containers)}: no GPU for this profile{why}")
    else:
        for granted in placement.container_grants:
            lines += _gpu_lines(granted, grant, profile)
    priority, _ = _priority(profile, cluster)
    lines.append(
        f"gpuwarden: priorityClassName {profile.priority_class_name} (priority {priority})"
    )
    if profile.overridden:
        lines.append(
            f"gpuwarden: tenant override of {', '.join(profile.overridden)} for {profile.name}"
        )
    return lines


def _gang_queue_notes(view: PodView, plan: BackendPlan) -> list[str]:
    """A gang-scheduled pod's queue is its PodGroup's, not the pod's annotation.

    Volcano's PodGroup controller copies the pod's queue annotation only into the PodGroups it
    creates for pods without ``scheduling.k8s.io/group-name`` (buildPodGroupFromPod in
    volcano-sh/volcano pkg/controllers/podgroup/pg_controller_handler.go); the Training Operator
    creates the PodGroup itself, from ``runPolicy.schedulingPolicy.queue``.
    """
    queue = plan.annotations.get(VOLCANO_QUEUE_ANNOTATION)
    group = view.annotations.get(VOLCANO_GROUP_NAME_ANNOTATION)
    if not queue or not group:
        return []
    return [
        f"Volcano queues this pod by its PodGroup {group}: set the job's "
        f"runPolicy.schedulingPolicy.queue to {queue}"
    ]


def _replaced_backend_annotations(
    view: PodView, plan: BackendPlan, profile: ResolvedProfile
) -> list[str]:
    """A backend annotation the user set that the profile replaces is said, never silent."""
    current = view.annotations
    return [
        f"{key}: {current[key]} replaced by {value} (profile {profile.name})"
        for key, value in sorted(plan.annotations.items())
        if key in current and current[key] != value
    ]


def apply_placement(
    pod: Mapping[str, Any] | PodView, placement: Placement, cluster: ClusterView
) -> tuple[PatchBuilder, list[str]]:
    """Apply a governed placement to a copy of the pod (or of the view's pod); returns the
    builder (its document is the mutated pod) and notes for the warnings."""
    view = pod if isinstance(pod, PodView) else PodView.of(pod)
    grant = placement.grant
    assert grant is not None
    profile = grant.profile
    backend_plan = grant.plan
    patch = PatchBuilder(view.pod)
    notes: list[str] = []
    targets = {granted.name: granted.grant for granted in placement.container_grants}
    claim: str | None = None
    for ref in view.main_containers:
        own = targets.get(ref.name)
        if own is None:
            continue
        template = own.plan.claim_template if own.plan is not None else None
        asked = ref.gpu_resources() if template is not None else {}
        _set_resources(patch, ref, own, notes)
        notes += _set_claim(patch, ref, template, asked)
        claim = claim or template
        _set_env(patch, ref, own.plan.env if own.plan is not None else {}, notes)
    if claim is not None:
        _set_pod_claim(patch, claim)
    if backend_plan is not None:
        _set_scheduler(patch, backend_plan, profile, notes)
        notes += backend_plan.notes
        notes += _gang_queue_notes(view, backend_plan)
    wanted = desired_annotations(placement)
    if backend_plan is not None:
        notes += _replaced_backend_annotations(view, backend_plan, profile)
    patch.merge(["metadata", "annotations"], wanted)
    patch.discard(
        ["metadata", "annotations"], [key for key in _CONDITIONAL_ANNOTATIONS if key not in wanted]
    )
    _set_priority(patch, profile, cluster, notes)
    _set_placement(patch, grant, notes)
    _keep_off_shared_gpus(patch, profile, notes)
    _prefer_nodes(patch, profile, backend_plan)
    return patch, notes


def context_of(
    placement: Placement,
    *,
    patch: tuple[Mapping[str, Any], ...] = (),
    warnings: tuple[str, ...] = (),
    audit_annotations: Mapping[str, str] | None = None,
) -> Decision:
    """An allowed decision that names the tenant, profile and rule (for logs and metrics)."""
    return Decision(
        patch=patch,
        warnings=warnings,
        audit_annotations=audit_annotations or NO_ANNOTATIONS,
        tenant=placement.tenant.name if placement.tenant else None,
        profile=placement.profile.name if placement.profile else None,
        rule=placement.origin,
    )


class Placed(NamedTuple):
    """A pod a mutation read, placed and left as it was: deciding on it again would read and
    place it the same, and re-applying the placement would change nothing."""

    view: PodView
    placement: Placement


class Mutation(NamedTuple):
    decision: Decision
    pod: Mapping[str, Any]  # the pod as the patch leaves it
    placed: Placed | None = None  # where the mutation placed the pod and left it as it was


def mutate(
    request: AdmissionRequest,
    policies: PolicySet,
    cluster: ClusterView,
    *,
    default_action: EnforcementAction = "enforce",
) -> Decision:
    """The mutating decision under the pod's enforcementAction (``default_action`` where the
    policies set none): under dryrun the patch is only reported (rollout.py)."""
    decision = mutation(request, policies, cluster).decision
    return reported(decision, policies.action_for(decision.tenant, default_action))


def mutation(request: AdmissionRequest, policies: PolicySet, cluster: ClusterView) -> Mutation:
    """The mutating decision and the pod as its patch leaves it."""
    pod = request.pod
    if request.operation != "CREATE" or request.sub_resource or not _is_pod(pod):
        return Mutation(Decision(), pod)
    view = PodView.of(pod)
    placement = place(view, request.namespace, cluster.labels_for(request.namespace), policies)
    unchanged = Placed(view, placement)
    problems = placement.problems + size_problems(placement)
    if problems:
        warnings = bounded_warnings([warning(f"gpuwarden: {p}") for p in problems])
        return Mutation(context_of(placement, warnings=warnings), pod, unchanged)
    if not placement.governed:
        return Mutation(context_of(placement), pod, unchanged)
    patch, notes = apply_placement(view, placement, cluster)
    if not patch.ops:
        return Mutation(context_of(placement), pod, unchanged)
    lines = _summary(placement, cluster) + [f"gpuwarden: {note}" for note in notes]
    audit = {
        "profile": str(placement.profile.name if placement.profile else None),
        "rule": placement.origin,
    }
    if placement.tenant is not None:
        audit["tenant"] = placement.tenant.name
    decision = context_of(
        placement,
        patch=tuple(patch.ops),
        warnings=bounded_warnings([warning(line) for line in lines]),
        audit_annotations=audit,
    )
    return Mutation(decision, patch.document)


def admitted_gpu_memory(pod: Mapping[str, Any]) -> Decimal:
    """GPU memory a mutated pod holds against its tenant's quota (see PodRecord)."""
    record = PodRecord.from_annotations(annotations_of(pod), CHARGE_FIELDS)
    return record.admitted_gpu_memory(containers(pod, "containers"))
