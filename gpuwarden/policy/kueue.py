"""Tenant queues as Kueue objects (``kueue.x-k8s.io/v1beta2``, Kueue v0.17): Kueue's names and
semantics, and pure builders for its ResourceFlavors, ClusterQueues and LocalQueues.

What a tenant's ``quota`` and ``queueSpec`` (Volcano's Queue fields) become:

* **One ClusterQueue per tenant**, named after the tenant, all in one cohort (``gpuwarden``), so
  idle GPUs of one tenant can be borrowed by another. It covers the device-count resources the
  tenant's profiles ask for (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
  ``volcano.sh/vgpu-number``), each under the flavor of the pool that serves it:

  - ``nominalQuota``: ``quota.gpus`` (0 without one: the tenant only borrows).
  - ``borrowingLimit``: ``queueSpec.capability`` minus the nominal quota. Volcano's capability
    caps what the queue may use in all; Kueue caps what it may borrow on top of its own.
  - ``lendingLimit``: the nominal quota minus ``queueSpec.guarantee``. Volcano's guarantee is
    reserved for the queue and never lent; ``guarantee`` equal to the quota lends nothing.
  - ``fairSharing.weight``: ``queueSpec.weight`` (Kueue compares the borrowed share over weight).
  - ``preemption.reclaimWithinCohort``: from the *other* tenants' ``reclaimable``. Volcano marks
    the borrower (``reclaimable: false``: what it took is never taken back); Kueue sets
    reclaiming on the lender, for every borrower at once. So a lender reclaims (``Any``: the
    borrower's workloads, whatever their priority, as Volcano's reclaim action does) only when
    every tenant that can borrow is reclaimable, else ``Never``.
  - ``preemption.withinClusterQueue``: ``LowerPriority`` where the tenant's profiles have
    different priorities and a higher one may preempt (``preemptionPolicy:
    PreemptLowerPriority``), else ``Never``. Kueue orders a pod's Workload by its PriorityClass.
  - ``namespaceSelector``: the tenant's namespaces (Kueue's default, null, admits none).

* **ResourceFlavors** for the pools, by the node labels GPU Feature Discovery writes:
  ``nvidia.com/gpu.sharing-strategy: none`` (whole GPUs) and ``mps`` (NVIDIA's MPS replicas).
  Volcano vGPU and HAMi slices are placed by their own schedulers' device accounting, so their
  flavor selects no nodes. Kueue adds a flavor's node labels to the pod's nodeSelector when it
  admits it, and skips flavors the pod's own node selection contradicts.

* **A LocalQueue named ``default``** in each namespace the tenant lists. Kueue's pod webhook
  labels a pod with ``kueue.x-k8s.io/queue-name: default`` when the namespace has a LocalQueue of
  that name (LocalQueue defaulting, GA and always on in v0.17: pkg/controller/jobs/pod/
  pod_webhook.go), so no label has to be added: the API server does not call Kueue's webhook
  again after gpuwarden's (reinvocationPolicy Never), and would not see one added there.

A ClusterQueue covers only GPU counts, and Kueue leaves a Workload pending when it asks for a
resource no ResourceGroup covers ("resource ... unavailable in ClusterQueue"), so Kueue's
Configuration must exclude the other resources the pods request:
:func:`configuration_requirements` says what, and the lab writes exactly that.

**What Kueue charges and what pods ask.** Kueue charges a plain pod (a notebook, a pipeline
step, a predictor's pod) as it is created, after gpuwarden's mutation. A job Kueue admits whole
(its ``kubeflow.org/*`` integrations for the Training Operator's jobs, ``trainer.kubeflow.org/
trainjob``, ``jobset.x-k8s.io/jobset``, ``batch/job`` for a Katib trial's Job; all on in Kueue's
default Configuration) is charged from its pod templates before any pod exists, and gpuwarden
rewrites each pod later. gpuwarden never raises a count a pod asks for, so a whole-GPU profile
that sets no ``gpus`` keeps the template's ``nvidia.com/gpu`` and the two agree. A profile that
sets ``gpus``, gives no GPU, or shares GPUs under another resource name (MPS replicas as
``nvidia.com/gpu.shared``, Volcano's ``volcano.sh/vgpu-number``), and a rule without
``requireGpuRequest`` (it gives a GPU to a replica that asks for none), make the pods ask for
something else than what Kueue charged. :func:`template_charge_errors` says so for each such rule
of a Kueue-queued tenant (`gpuwarden lint`), and the validating webhook warns on a pod of a job
Kueue admitted (:data:`PODSET_LABEL`) that such a profile rewrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpuwarden.policy.backends import SHARING_STRATEGY_LABEL, BackendPlan, plan_for
from gpuwarden.policy.model import (
    HamiBackend,
    LabelSelector,
    Tenant,
    VolcanoBackend,
    VolcanoQueueSpec,
    WorkloadRule,
    quantity_value,
)
from gpuwarden.policy.policyset import PolicySet
from gpuwarden.policy.resolved import ResolvedProfile
from gpuwarden.policy.resources import GPU_COUNT_RESOURCES, GPU_RESOURCES

KUEUE_API = "kueue.x-k8s.io/v1beta2"
#: The cohort every tenant's ClusterQueue joins (an implicit Cohort: no object is needed).
COHORT = "gpuwarden"
#: Kueue's constants.DefaultLocalQueueName: the LocalQueue its pod webhook defaults to.
DEFAULT_LOCAL_QUEUE = "default"
#: The label that names a pod's LocalQueue (Kueue's constants.QueueLabel).
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
#: Kueue's integration name for plain pods (Configuration integrations.frameworks).
POD_FRAMEWORK = "pod"
#: The label Kueue puts on a job's pod templates when it admits the job (constants.PodSetLabel,
#: set in pkg/controller/jobframework/reconciler.go): the pods of a job Kueue charged whole.
PODSET_LABEL = "kueue.x-k8s.io/podset"
#: The resource a job template asks whole GPUs by, which Kueue charges.
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
#: Workload kinds whose pods come from a job Kueue can admit from its pod templates, and what
#: those jobs are.
TEMPLATE_ADMITTED_KINDS = {
    "training-job": "Training Operator jobs (PyTorchJob, TFJob, MPIJob, ...)",
    "trainjob": "TrainJobs",
    "katib-trial": "Katib trials (a Job or a Training Operator job)",
}
#: fairSharing.preemptionStrategies: Kueue's Configuration refuses fairSharing without one of
#: its valid sets (validateFairSharing in pkg/config/validation.go); this is its sample's.
FAIR_SHARING_STRATEGIES = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
#: Resources a governed pod may request that Kueue must not count (excludeResourcePrefixes
#: matches by prefix): host resources, and the GPU resources that size a slice of a device.
_HOST_RESOURCES = ("cpu", "memory", "ephemeral-storage", "hugepages-")
_NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class GpuFlavor:
    """A Kueue ResourceFlavor for one GPU pool, and what it is."""

    name: str
    node_labels: tuple[tuple[str, str], ...]  # (key, value) pairs: a flavor is hashable
    what: str


# Listed in the order a ClusterQueue tries them: a shared pod that names no pool lands on
# shared GPUs first; an exclusive pod on the nvidia backend keeps off them by node affinity
# (backends.exclusive_node_expression), which Kueue's flavor assignment honours.
MPS_GPUS = GpuFlavor(
    "gpuwarden-mps-gpus",
    ((SHARING_STRATEGY_LABEL, "mps"),),
    "GPUs NVIDIA's device plugin shares through MPS",
)
WHOLE_GPUS = GpuFlavor(
    "gpuwarden-whole-gpus",
    ((SHARING_STRATEGY_LABEL, "none"),),
    "GPUs NVIDIA's device plugin hands out whole",
)
DEVICE_SLICES = GpuFlavor(
    "gpuwarden-gpu-slices",
    (),
    "GPU slices of Volcano vGPU or HAMi, placed by their scheduler's device accounting",
)
FLAVORS = (MPS_GPUS, WHOLE_GPUS, DEVICE_SLICES)


def gpu_flavor(profile: ResolvedProfile, plan: BackendPlan) -> GpuFlavor:
    """The pool a profile's GPU containers are served from."""
    if isinstance(profile.backend, HamiBackend) or "volcano.sh/vgpu-number" in plan.resources:
        return DEVICE_SLICES
    if isinstance(profile.backend, VolcanoBackend) and plan.shared:
        return DEVICE_SLICES
    return MPS_GPUS if plan.shared else WHOLE_GPUS


def excluded_resource_prefixes() -> tuple[str, ...]:
    """Kueue's ``resources.excludeResourcePrefixes`` for governed pods: everything they request
    but the device counts a ClusterQueue covers. No prefix matches a covered resource."""
    slices = sorted(GPU_RESOURCES - GPU_COUNT_RESOURCES)
    prefixes = (*_HOST_RESOURCES, *slices)
    assert not any(r.startswith(p) for r in GPU_COUNT_RESOURCES for p in prefixes)
    return prefixes


def configuration_requirements() -> dict[str, Any]:
    """The part of Kueue's Configuration (``config.kueue.x-k8s.io/v1beta2``) that the rendered
    queues rely on: plain pods managed, fair sharing on (weights), the non-GPU resources not
    counted."""
    return {
        "integrations": {"frameworks": [POD_FRAMEWORK]},
        "fairSharing": {"preemptionStrategies": list(FAIR_SHARING_STRATEGIES)},
        "resources": {"excludeResourcePrefixes": list(excluded_resource_prefixes())},
    }


# --- one tenant's queue ---------------------------------------------------------------------


@dataclass(frozen=True)
class FlavorQuota:
    """One (flavor, resource) cell of a ClusterQueue; limits None: unlimited."""

    flavor: GpuFlavor
    resource: str
    nominal: Decimal
    borrowing_limit: Decimal | None = None
    lending_limit: Decimal | None = None


@dataclass(frozen=True)
class TenantQueue:
    """What one tenant's ClusterQueue holds, before the cohort-wide reclaim setting."""

    tenant: Tenant
    quotas: tuple[FlavorQuota, ...]
    weight: int
    reclaimable: bool
    within_cluster_queue: str
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.tenant.name

    @property
    def can_borrow(self) -> bool:
        return any(q.borrowing_limit is None or q.borrowing_limit > 0 for q in self.quotas)


def _text(amount: Decimal) -> str:
    """A quantity as Kubernetes writes a plain number (no exponent, no trailing zeros)."""
    return format(amount.normalize(), "f")


def _within_cluster_queue(profiles: Sequence[ResolvedProfile]) -> str:
    """LowerPriority when one of the tenant's GPU profiles may preempt a lower one."""
    gpu = [p for p in profiles if p.gpus > 0]
    for high in gpu:
        if high.preemption_policy != "PreemptLowerPriority":
            continue
        if any(low.priority < high.priority for low in gpu):
            return "LowerPriority"
    return "Never"


def _limits(
    tenant: Tenant, spec: VolcanoQueueSpec, resource: str, nominal: Decimal
) -> tuple[Decimal | None, Decimal | None, list[str]]:
    warnings: list[str] = []
    borrowing: Decimal | None = None
    lending: Decimal | None = None
    if resource in spec.capability:
        capability = quantity_value(spec.capability[resource])
        borrowing = max(capability - nominal, Decimal(0))
        if capability < nominal:
            warnings.append(
                f"tenant {tenant.name}: queueSpec.capability {resource} {_text(capability)} is "
                f"below quota.gpus {_text(nominal)}; Kueue cannot hold a ClusterQueue under its "
                "own nominal quota, so it only stops borrowing (borrowingLimit 0)"
            )
    if resource in spec.guarantee:
        guarantee = quantity_value(spec.guarantee[resource])
        lending = max(nominal - guarantee, Decimal(0))
        if guarantee > nominal:
            warnings.append(
                f"tenant {tenant.name}: queueSpec.guarantee {resource} {_text(guarantee)} is "
                f"above quota.gpus {_text(nominal)}; a ClusterQueue reserves only its nominal "
                "quota (lendingLimit 0)"
            )
    return borrowing, lending, warnings


def tenant_queue(
    tenant: Tenant, profiles: Iterable[tuple[ResolvedProfile, BackendPlan]]
) -> TenantQueue | None:
    """The ClusterQueue content for a tenant's profiles (each with its backend plan), or None
    when the tenant's pods ask for no GPU device count."""
    profiles = list(profiles)
    cells: dict[tuple[GpuFlavor, str], None] = {}
    for profile, plan in profiles:
        flavor = gpu_flavor(profile, plan)
        for resource in sorted(set(plan.resources) & GPU_COUNT_RESOURCES):
            cells[(flavor, resource)] = None
    if not cells:
        return None
    spec = tenant.queue_spec or VolcanoQueueSpec()
    gpus = tenant.quota.gpus if tenant.quota is not None else None
    nominal = Decimal(gpus or 0)
    warnings: list[str] = []
    quotas: list[FlavorQuota] = []
    for flavor, resource in sorted(cells, key=lambda c: (FLAVORS.index(c[0]), c[1])):
        borrowing, lending, said = _limits(tenant, spec, resource, nominal)
        warnings += [w for w in said if w not in warnings]
        quotas.append(FlavorQuota(flavor, resource, nominal, borrowing, lending))
    used = {resource for _, resource in cells}
    for field, given in (("capability", spec.capability), ("guarantee", spec.guarantee)):
        for key in sorted(set(given) - used):
            warnings.append(
                f"tenant {tenant.name}: queueSpec.{field} {key} is not in its ClusterQueue, "
                f"which counts only the GPU devices its pods ask for ({', '.join(sorted(used))})"
            )
    notes: list[str] = []
    for resource in sorted(used):
        pools = [q.flavor.name for q in quotas if q.resource == resource]
        if len(pools) > 1:
            notes.append(
                f"tenant {tenant.name}: {resource} is served by {' and '.join(pools)}; "
                f"its ClusterQueue holds each to quota.gpus ({_text(nominal)}) separately"
            )
    return TenantQueue(
        tenant=tenant,
        quotas=tuple(quotas),
        weight=spec.weight,
        reclaimable=spec.reclaimable,
        within_cluster_queue=_within_cluster_queue([p for p, _ in profiles]),
        warnings=tuple(warnings),
        notes=tuple(notes),
    )


def reclaim_within_cohort(queues: Sequence[TenantQueue]) -> tuple[dict[str, str], list[str]]:
    """Each ClusterQueue's ``reclaimWithinCohort``, and what the mapping could not keep.

    Kueue reclaims on the lender's side, from every borrower in the cohort alike; Volcano's
    ``reclaimable: false`` protects one borrower. A lender therefore reclaims (``Any``) only
    when no tenant that can borrow from it is unreclaimable.
    """
    settings: dict[str, str] = {}
    for queue in queues:
        others = [q for q in queues if q is not queue and q.can_borrow]
        settings[queue.name] = "Any" if all(q.reclaimable for q in others) else "Never"
    protected = [q.name for q in queues if q.can_borrow and not q.reclaimable]
    warnings: list[str] = []
    if protected:
        never = sorted(name for name, value in settings.items() if value == "Never")
        who = "tenant" if len(protected) == 1 else "tenants"
        warnings.append(
            f"{who} {', '.join(protected)}: queueSpec.reclaimable false; Kueue reclaims on the "
            f"lender's side, from all borrowers alike, so {', '.join(never)} never reclaim "
            "lent GPUs (reclaimWithinCohort: Never). To keep reclaiming, stop the unreclaimable "
            "tenants from borrowing instead: queueSpec.capability equal to quota.gpus"
        )
    return settings, warnings


# --- objects ------------------------------------------------------------------------------


def resource_flavor(
    flavor: GpuFlavor, *, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": flavor.name, "labels": dict(labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    spec: dict[str, Any] = {}
    if flavor.node_labels:
        spec["nodeLabels"] = dict(flavor.node_labels)
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": metadata, "spec": spec}


def resource_groups(quotas: Sequence[FlavorQuota]) -> list[dict[str, Any]]:
    """``spec.resourceGroups``: Kueue puts each resource in one group and each flavor in one
    group of a ClusterQueue, so resources that share a flavor share a group (connected parts)."""
    groups: list[tuple[list[str], list[GpuFlavor]]] = []
    for cell in quotas:
        joined = [g for g in groups if cell.resource in g[0] or cell.flavor in g[1]]
        resources = sorted({cell.resource, *(r for g in joined for r in g[0])})
        flavors = sorted({cell.flavor, *(f for g in joined for f in g[1])}, key=FLAVORS.index)
        groups = [g for g in groups if g not in joined] + [(resources, flavors)]
    cells = {(q.flavor, q.resource): q for q in quotas}
    out: list[dict[str, Any]] = []
    for resources, flavors in groups:
        out.append(
            {
                "coveredResources": resources,
                "flavors": [
                    {
                        "name": flavor.name,
                        "resources": [
                            _resource_quota(cells.get((flavor, r)), r) for r in resources
                        ],
                    }
                    for flavor in flavors
                ],
            }
        )
    return out


def _resource_quota(cell: FlavorQuota | None, resource: str) -> dict[str, Any]:
    if cell is None:  # a flavor of the group that does not serve this resource
        return {"name": resource, "nominalQuota": "0", "borrowingLimit": "0"}
    quota: dict[str, Any] = {"name": resource, "nominalQuota": _text(cell.nominal)}
    if cell.borrowing_limit is not None:
        quota["borrowingLimit"] = _text(cell.borrowing_limit)
    if cell.lending_limit is not None:
        quota["lendingLimit"] = _text(cell.lending_limit)
    return quota


def namespace_selector(tenant: Tenant) -> dict[str, Any]:
    """The namespaces that may submit to the tenant's ClusterQueue: the ones it lists, else
    its namespaceSelector."""
    if tenant.namespaces:
        return {
            "matchExpressions": [
                {
                    "key": _NAMESPACE_NAME_LABEL,
                    "operator": "In",
                    "values": sorted(tenant.namespaces),
                }
            ]
        }
    selector = tenant.namespace_selector or LabelSelector()
    out: dict[str, Any] = {}
    if selector.match_labels:
        out["matchLabels"] = dict(selector.match_labels)
    if selector.match_expressions:
        out["matchExpressions"] = [
            {
                "key": r.key,
                "operator": r.operator,
                **({"values": list(r.values)} if r.values else {}),
            }
            for r in selector.match_expressions
        ]
    return out


def cluster_queue(
    queue: TenantQueue,
    *,
    reclaim: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    cohort: str = COHORT,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": queue.name, "labels": dict(labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": metadata,
        "spec": {
            "cohortName": cohort,
            "namespaceSelector": namespace_selector(queue.tenant),
            "resourceGroups": resource_groups(queue.quotas),
            "fairSharing": {"weight": queue.weight},
            "preemption": {
                "reclaimWithinCohort": reclaim,
                "withinClusterQueue": queue.within_cluster_queue,
            },
        },
    }


def local_queue(
    namespace: str,
    cluster_queue_name: str,
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    name: str = DEFAULT_LOCAL_QUEUE,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": metadata,
        "spec": {"clusterQueue": cluster_queue_name},
    }


# --- what Kueue charges a job and what its pods ask ----------------------------------------


@dataclass(frozen=True)
class TemplateRewrite:
    """Why pods given a profile ask for other GPUs than their job's pod template, which Kueue
    charged when it admitted the job."""

    why: str  # what in the policy rewrites the request
    asked: str  # what each pod asks for instead, in words


def template_rewrite(profile: ResolvedProfile, plan: BackendPlan | None) -> TemplateRewrite | None:
    """How a pod given ``profile`` (with its backend plan; None when it gives no GPU) asks for
    other GPUs than its template did, or None when it keeps the template's request: a profile
    that sets no ``gpus`` keeps each container's count, and ``nvidia.com/gpu`` keeps its name."""
    set_by = profile.gpus_set_by or f"profile {profile.name}"
    if plan is None:
        return TemplateRewrite(f"{set_by} sets gpus: 0", "no GPU")
    counted = sorted(set(plan.resources) & GPU_COUNT_RESOURCES) or [WHOLE_GPU_RESOURCE]
    resource = " and ".join(counted)
    if profile.gpus_set_by is not None:
        return TemplateRewrite(f"{set_by} sets gpus: {profile.gpus}", f"{profile.gpus} {resource}")
    if counted != [WHOLE_GPU_RESOURCE]:
        return TemplateRewrite(
            f"profile {profile.name} asks for GPUs as {resource}",
            f"the template's count as {resource}",
        )
    return None


def _template_charge_error(
    rule: WorkloadRule, profile: ResolvedProfile, plan: BackendPlan | None
) -> str | None:
    kind = rule.match.kind
    jobs = TEMPLATE_ADMITTED_KINDS[kind]
    charged = (
        f"Kueue admits {jobs} from the job's pod templates and charges the {WHOLE_GPU_RESOURCE} "
        "they ask for"
    )
    rewrite = template_rewrite(profile, plan)
    if rewrite is not None:
        return (
            f"rule {rule.name} gives {kind} pods profile {profile.name}, and {rewrite.why}: "
            f"{charged}, but each pod asks for {rewrite.asked}; give these pods a whole-GPU "
            "profile that sets no gpus (gpuwarden then keeps the template's request)"
        )
    wants_gpu = rule.require_gpu_request or rule.max_gpu_request is not None
    if plan is not None and not wants_gpu:
        return (
            f"rule {rule.name} gives {kind} pods profile {profile.name} whether or not they ask "
            f"for a GPU: {charged}, nothing for a replica whose template asks for none, but "
            f"that replica's pod asks for {profile.gpus} {WHOLE_GPU_RESOURCE}; set "
            "requireGpuRequest: true on the rule"
        )
    return None


def template_charge_errors(policies: PolicySet, tenants: Iterable[Tenant]) -> list[str]:
    """For the tenants whose pods Kueue queues: each rule for the kinds Kueue admits from a job's
    pod templates (:data:`TEMPLATE_ADMITTED_KINDS`) whose profile makes the pods ask for other
    GPUs than the templates, which is what Kueue charged. Tenants with the same problem share a
    line."""
    found: dict[str, list[str]] = {}
    for tenant in tenants:
        allowed = tenant.limits.allowed_profiles
        for rule, _ in policies.rules:
            if rule.match.kind not in TEMPLATE_ADMITTED_KINDS or rule.skip or not rule.profile:
                continue
            if allowed is not None and rule.profile not in allowed:
                continue  # such pods are denied (lint warns about the rule)
            profile = policies.resolve(rule.profile, tenant)
            plan = plan_for(profile, queue=tenant.queue) if profile.gpus > 0 else None
            text = _template_charge_error(rule, profile, plan)
            if text is not None:
                found.setdefault(text, []).append(tenant.name)
    return [
        f"{'tenant' if len(names) == 1 else 'tenants'} {', '.join(names)}: {text}"
        for text, names in found.items()
    ]
