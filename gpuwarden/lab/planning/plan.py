"""Each strategy's plan for its replay: every trace row's pod decided once by the policy core
(offline, no cluster involved), and the layout with the MPS nodes the strategy needs, sized from
those decisions.

A row's decision is what the webhook answers when its pod is created, but for what only the replay
knows: the mutating answer depends on the pod, its namespace's labels and the PriorityClasses,
all fixed before the replay starts; the validating answer also on the GPU memory admitted to the
tenant's live pods, so the replay validates each pod again, against them, when it creates it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden.lab.cluster.dradriver import Reservation, reservation
from gpuwarden.lab.cluster.nodes import pod_devices
from gpuwarden.lab.inputs.trace import TraceRow, row_pod
from gpuwarden.lab.planning.follow import FollowPools
from gpuwarden.lab.planning.sizing import (
    probe_counts,
    services_peak,
    shared_demand,
    shared_gpu_hours,
    size_mps_nodes,
    size_shares_nodes,
    sweep_candidates,
    whole_demand,
    whole_node_counts,
)
from gpuwarden.lab.planning.strategies import Layout, Strategy
from gpuwarden.policy import Admission, AdmissionRequest, ClusterView, PolicySet, admit
from gpuwarden.policy.admission.manifests import priority_class
from gpuwarden.policy.pod.record import IdleRecord
from gpuwarden.policy.pod.record import PodRecord as DecisionRecord
from gpuwarden.policy.render.claims import claim_templates
from gpuwarden.policy.render.objects import render
from gpuwarden.policy.spec.precedence import NAMESPACE_NAME_LABEL

#: A swept strategy's name is ``<strategy>@<MPS nodes>``.
SPLIT_MARK = "@"


@dataclass(frozen=True)
class StrategyPlan:
    """What one strategy's replay is given, decided before it starts."""

    strategy: Strategy
    layout: Layout  # its MPS nodes resolved
    notes: tuple[str, ...]  # on its MPS nodes
    # The policy's PriorityClasses as `gpuwarden render` writes them, created in the lab.
    priority_classes: tuple[Mapping[str, Any], ...]
    view: ClusterView  # what the policy core knows of the lab before any pod exists
    decisions: Mapping[int, Admission]  # by trace row; none without policies
    # Its MPS pool follows demand from the layout's split (None: the split stays fixed).
    follow: FollowPools | None = None
    # DRA nodes: the ResourceClaimTemplates its shared profiles need, by trace namespace.
    claim_templates: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)


def namespace_view_labels(
    namespaces: Mapping[str, Mapping[str, str]],
) -> dict[str, dict[str, str]]:
    """Each namespace's labels as the API server shows them (with its name label)."""
    return {ns: {**dict(labels), NAMESPACE_NAME_LABEL: ns} for ns, labels in namespaces.items()}


def lab_view(
    namespaces: Mapping[str, Mapping[str, str]], classes: Sequence[Mapping[str, Any]]
) -> ClusterView:
    """The namespaces and PriorityClasses a lab has before its replay starts."""
    infos = {
        str(m["metadata"]["name"]): info for m in classes if (info := priority_class(m)) is not None
    }
    return ClusterView(namespace_labels=namespace_view_labels(namespaces), priority_classes=infos)


def decide_rows(
    policies: PolicySet, rows: Sequence[TraceRow], view: ClusterView
) -> dict[int, Admission]:
    """Each row's pod as the policy core decides it at its creation, by row."""
    return {
        row.row: admit(
            AdmissionRequest(
                operation="CREATE", namespace=row.namespace, pod=row_pod(row, f"row-{row.row}")
            ),
            policies,
            view,
        )
        for row in rows
    }


def attempt_pod(decided: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A row's decided pod as one attempt of it is named (a decision never reads the name)."""
    return {**decided, "metadata": {**decided["metadata"], "name": name}}


def resolve_layout(
    layout: Layout,
    strategy: Strategy,
    rows: Sequence[TraceRow],
    decisions: Mapping[int, Admission],
) -> tuple[Layout, list[str]]:
    """``layout`` with the strategy's MPS nodes resolved (sized to its shared demand when the
    layout leaves them open, or those its tenant queues were split for), and notes on them."""
    if not strategy.shares or layout.dra:  # DRA nodes share any GPU: no MPS nodes
        return replace(layout, mps_nodes=0), []
    if layout.mps_nodes is None and strategy.mps_nodes is not None:
        layout = replace(layout, mps_nodes=strategy.mps_nodes)
        return layout, [f"MPS nodes: {strategy.mps_nodes}, those its tenant queues were split for"]
    if layout.mps_nodes is not None:
        if layout.mps_nodes == 0:
            return layout, [
                "it shares GPUs but the layout has no MPS nodes: its shared pods cannot be placed"
            ]
        return layout, []
    sized = size_mps_nodes(
        layout.mps_candidates,
        shared_demand(rows, decisions),
        whole_demand(rows, decisions),
        layout.mps_replicas,
        shared_gpu_hours(rows, decisions, layout.mps_replicas),
    )
    return replace(layout, mps_nodes=sized.nodes), [sized.note] if sized.note else []


def plan_strategy(
    strategy: Strategy,
    layout: Layout,
    rows: Sequence[TraceRow],
    namespaces: Mapping[str, Mapping[str, str]],
) -> StrategyPlan:
    """The strategy's plan: its rows decided once, its layout resolved from those decisions."""
    policies = strategy.policies
    classes = (
        ()
        if policies is None
        else tuple(o for o in render(policies).objects if o["kind"] == "PriorityClass")
    )
    view = lab_view(namespaces, classes)
    decisions = {} if policies is None else decide_rows(policies, rows, view)
    templates = (
        {
            ns: tuple(claim_templates(policies, ns, labels))
            for ns, labels in namespace_view_labels(namespaces).items()
        }
        if layout.dra and policies is not None
        else {}
    )
    if layout.dra:
        resolved, notes = resolve_shares_nodes(layout, rows, decisions, templates)
    else:
        resolved, notes = resolve_layout(layout, strategy, rows, decisions)
    return StrategyPlan(
        strategy, resolved, tuple(notes), classes, view, decisions, claim_templates=templates
    )


def _largest_gpu_memory(layout: Layout) -> float:
    return 2**20 * max(
        [pool.gpu_memory_mib for pool in layout.node_pools] or [layout.gpu_memory_mib]
    )


def _claim_reservations(
    layout: Layout, claim_templates: Mapping[str, Sequence[Mapping[str, Any]]]
) -> Callable[[TraceRow, Admission], list[tuple[str, Reservation]]]:
    """What each of a decided pod's DRA claims reserves, of the largest GPU the lab has, with
    its template's name."""
    memory = _largest_gpu_memory(layout)
    # Each namespace's templates by name, indexed once rather than for every row.
    templates = {
        ns: {t["metadata"]["name"]: t for t in made} for ns, made in claim_templates.items()
    }

    def reserved(row: TraceRow, decision: Admission) -> list[tuple[str, Reservation]]:
        mine = templates.get(row.namespace, {})
        return [
            (str(name), reservation(template, memory))
            for claim in (decision.pod.get("spec") or {}).get("resourceClaims") or []
            if (template := mine.get(name := claim.get("resourceClaimTemplateName"))) is not None
        ]

    return reserved


def resolve_shares_nodes(
    layout: Layout,
    rows: Sequence[TraceRow],
    decisions: Mapping[int, Admission],
    claim_templates: Mapping[str, Sequence[Mapping[str, Any]]],
) -> tuple[Layout, list[str]]:
    """A DRA layout with the nodes its shares prefer sized to the strategy's shared claims, each
    held from its arrival for its duration at the speed its reserved cores allow; and a note per
    template that asks more GPU memory than any GPU of the layout has: its pods are never placed
    (a Volcano vgpu-memory or HAMi gpumem request above every GPU's memory is not either),
    however idle the GPUs."""
    if not claim_templates:
        return replace(layout, mps_nodes=0, shares_nodes=0), []
    largest = _largest_gpu_memory(layout)
    reserved = _claim_reservations(layout, claim_templates)
    spans: list[tuple[float, float, float]] = []
    oversized: dict[str, tuple[float, int]] = {}  # template: (bytes asked, pods)
    for row in rows:
        decision = decisions.get(row.row)
        if decision is None or not decision.allowed:
            continue
        for name, claim in reserved(row, decision):
            if claim.memory > largest:
                oversized[name] = (claim.memory, oversized.get(name, (0.0, 0))[1] + 1)
            cap = claim.sm_share
            speed = 1.0 if cap is None or not row.batch or row.busy <= cap else cap / row.busy
            spans.append((row.at, row.duration / max(speed, 1e-3), claim.share))
    sized = size_shares_nodes(layout.mps_candidates, spans, whole_demand(rows, decisions))
    resolved = replace(layout, mps_nodes=0, shares_nodes=sized.nodes)
    notes = [sized.note] if sized.note else []
    notes += [
        f"claims of template {name} ask {asked / 2**30:g}Gi of GPU memory, more than any GPU "
        f"here has ({largest / 2**20:,.0f} MiB): its {pods:,} pods are never placed"
        for name, (asked, pods) in sorted(oversized.items())
    ]
    return resolved, notes


def held_gpus(plan: StrategyPlan) -> Callable[[TraceRow], float | None]:
    """The GPUs a row's pod holds as the strategy decided it (None: refused): its whole GPUs,
    an MPS slice as 1/replicas of one, a DRA claim as the share its template reserves of the
    largest GPU the lab has (so a peak of these is the least the services need)."""
    layout = plan.layout
    reserved = _claim_reservations(layout, plan.claim_templates)

    def held(row: TraceRow) -> float | None:
        if not plan.decisions:
            return float(row.devices)  # the pod as its controller made it
        decision = plan.decisions.get(row.row)
        if decision is None or not decision.allowed:
            return None
        whole, slices = pod_devices(decision.pod)
        gpus = whole + slices / layout.mps_replicas
        return gpus + sum(claim.share for _, claim in reserved(row, decision))

    return held


def services_note(plan: StrategyPlan, rows: Sequence[TraceRow], horizon: float) -> str | None:
    """What the services (notebooks, predictors) ask of the GPUs at their peak, at the shares
    the strategy gives them: where that is more than the GPUs, some of them wait whatever the
    scheduler does; near it, they wait unless whole-GPU work makes room."""
    if all(row.batch for row in rows):
        return None
    gpus = plan.layout.physical_gpus
    peak = services_peak(rows, held_gpus(plan), gpus, horizon)
    most = f"{peak.gpus:,.2f}".rstrip("0").rstrip(".")
    note = (
        f"services (notebooks, predictors) at its shares, each from its arrival: at most "
        f"{most} GPU{'' if most == '1' else 's'} at once ({peak.gpus / gpus:.0%} of the {gpus:,})"
    )
    if peak.seconds_over > 0:
        hours = peak.seconds_over / 3600
        note += f", more than the GPUs for {hours:,.1f}h: some wait whatever the scheduler"
    elif not plan.layout.dra and plan.layout.mps_nodes:
        note += f"; its MPS nodes have {plan.layout.mps_gpus(True):,}"
    return note


def idle_stop_rules(plan: StrategyPlan, rows: Sequence[TraceRow]) -> dict[int, IdleRecord]:
    """The idle rule that stops each notebook row with an idle tail, as the webhook recorded it
    on the row's decided pod (``gpuwarden.io/idle``, what the node agent reads), by row; rows
    whose profile has none, or only ``notify``, are left out (notify stops nothing)."""
    out: dict[int, IdleRecord] = {}
    for row in rows:
        decided = plan.decisions.get(row.row)
        if decided is None or row.kind != "notebook" or row.idle_from is None:
            continue
        annotations = (decided.pod.get("metadata") or {}).get("annotations") or {}
        rule = DecisionRecord.from_annotations(annotations, ("idle",)).idle
        if rule is not None and rule.action == "stop":
            out[row.row] = rule
    return out


def split_candidates(
    planned: StrategyPlan,
    rows: Sequence[TraceRow],
    size: int,
    reachable: Callable[[int], float] | None = None,
) -> list[int]:
    """The MPS node counts a sweep of the pool split replays for a strategy whose layout was
    sized (``--mps-nodes auto``), of those that leave the largest whole-GPU pod a node's worth
    of whole GPUs: the auto estimate and the ``size - 1`` others that leave the most work
    reachable (``reachable``: a count's split bound), or nearest it (none for a strategy that
    shares nothing)."""
    if not planned.strategy.shares or planned.layout.mps_nodes is None:
        return []
    counts = whole_node_counts(
        planned.layout.mps_candidates, whole_demand(rows, planned.decisions).largest
    )
    auto = planned.layout.mps_nodes
    bounds = (
        {n: reachable(n) for n in probe_counts(counts, auto)} if reachable is not None else None
    )
    return sweep_candidates(auto, counts, size, bounds)


#: A sized split gives way to one whose split bound is higher by more than this share.
REACHABLE_MARGIN = 0.02


def settle_split(
    planned: StrategyPlan, rows: Sequence[TraceRow], reachable: Callable[[int], float]
) -> StrategyPlan:
    """The strategy's plan with the MPS node count its sizing gave (``--mps-nodes auto``), or,
    where another count's split bound (``reachable``: the most work any scheduler could deliver
    with the pools split so, GPU-hours) is higher by more than :data:`REACHABLE_MARGIN`, that
    count: a rule of thumb never leaves clearly less work reachable than the trace allows.
    Tenant-queue variants keep the split their quotas were made for."""
    auto = planned.layout.mps_nodes
    if not planned.strategy.shares or planned.strategy.mps_nodes is not None or not auto:
        return planned
    counts = whole_node_counts(
        planned.layout.mps_candidates, whole_demand(rows, planned.decisions).largest
    )
    bounds = {n: reachable(n) for n in {*probe_counts(counts, auto), auto}}
    best = max(bounds, key=lambda n: (bounds[n], -abs(n - auto), -n))
    if bounds[best] <= bounds[auto] * (1 + REACHABLE_MARGIN):
        return planned
    note = (
        f"MPS nodes: {best}, not {auto}: any scheduler delivers at most {bounds[best]:,.0f} "
        f"GPU-hours with {best}, {bounds[auto]:,.0f} with {auto} (the split bound: services only "
        f"within their windows; see --mps-nodes sweep)"
    )
    return replace(
        planned,
        layout=replace(planned.layout, mps_nodes=best),
        notes=(*planned.notes, note),
    )


def split_plan(planned: StrategyPlan, mps_nodes: int) -> StrategyPlan:
    """The strategy's plan with ``mps_nodes`` MPS nodes instead of those it was sized to, named
    ``<strategy>@<nodes>`` (its rows' decisions do not depend on the split)."""
    auto = planned.layout.mps_nodes
    return replace(
        planned,
        strategy=replace(planned.strategy, name=f"{planned.strategy.name}{SPLIT_MARK}{mps_nodes}"),
        layout=replace(planned.layout, mps_nodes=mps_nodes),
        notes=(f"MPS nodes: {mps_nodes}, a split of the sweep (auto: {auto})",),
    )
