"""Tenant queues as Kueue objects (``kueue.x-k8s.io/v1beta2``, Kueue v0.17): Kueue's names and
semantics, and pure builders for its ResourceFlavors, ClusterQueues and LocalQueues.

What a tenant's ``quota`` and ``queueSpec`` (Volcano's Queue fields) become:

* **One ClusterQueue per tenant**, named after the tenant, all in one cohort (``gpuwarden``), so
  idle GPUs of one tenant can be borrowed by another. It covers the device-count resources the
  tenant's profiles ask for (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
  ``volcano.sh/vgpu-number``), each under the flavor of the pool that serves it:

  - ``nominalQuota``: the pool's part of ``quota.gpus`` (0 without one: the tenant only
    borrows), counted as the pool's resource counts: a shared pool counts slices, so one GPU
    is the backend's slices per GPU (:func:`slices_per_gpu`: NVIDIA's ``mpsReplicas``, the
    vGPU device plugins' ``deviceSplitCount``). ``quota.sharedGpus`` splits ``quota.gpus``:
    ``sharedGpus`` x slices per GPU for the shared pool, the rest for whole GPUs; without it
    each pool gets all of ``quota.gpus`` (:func:`pool_nominal`).
  - ``borrowingLimit``: ``queueSpec.capability`` minus the nominal quota, both in the
    resource's units. Volcano's capability caps what the queue may use in all; Kueue caps what
    it may borrow on top of its own.
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
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Literal

from gpuwarden.policy.pod.resources import GPU_COUNT_RESOURCES, GPU_RESOURCES
from gpuwarden.policy.spec.backends import SHARING_STRATEGY_LABEL, BackendPlan, plan_for
from gpuwarden.policy.spec.model import (
    Backend,
    HamiBackend,
    LabelSelector,
    NvidiaBackend,
    Tenant,
    TenantQuota,
    VolcanoBackend,
    VolcanoQueueSpec,
    WorkloadRule,
    quantity_value,
)
from gpuwarden.policy.spec.policyset import PolicySet
from gpuwarden.policy.spec.precedence import NAMESPACE_NAME_LABEL
from gpuwarden.policy.spec.resolved import ResolvedProfile

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
#: Of those, the kinds whose jobs the job webhooks mutate at submit (docs/jobs.md): Training
#: Operator v1 jobs, and Katib trials as batch/v1 Jobs or Training Operator jobs. Kueue builds a
#: job's Workload from the stored job (its reconciler calls the job's PodSets(), e.g.
#: pkg/controller/jobs/job/job_controller.go in v0.17), after every admission webhook, so it
#: charges the mutated templates. A TrainJob's resourcesPerNode is mutated too, but one that
#: leaves its nodes' resources to its runtime reaches Kueue as the runtime wrote them.
SUBMIT_MUTATED_KINDS = frozenset({"training-job", "katib-trial"})
#: fairSharing.preemptionStrategies: Kueue's Configuration refuses fairSharing without one of
#: its valid sets (validateFairSharing in pkg/config/validation.go); this is its sample's.
FAIR_SHARING_STRATEGIES = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
#: Resources a governed pod may request that Kueue must not count (excludeResourcePrefixes
#: matches by prefix): host resources, and the GPU resources that size a slice of a device.
_HOST_RESOURCES = ("cpu", "memory", "ephemeral-storage", "hugepages-")


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


#: MPS replicas per GPU assumed for an nvidia backend that sets no ``mpsReplicas``: the least
#: NVIDIA's device plugin accepts (sharing.mps.resources[].replicas, no default, at least 2:
#: NVIDIA/k8s-device-plugin api/config/v1/replicas.go), so a shared quota never holds more GPUs
#: than the tenant's.
ASSUMED_MPS_REPLICAS = 2


def slices_per_gpu(backend: Backend) -> int:
    """How many of its shared pool's count resource one GPU is: NVIDIA's MPS replicas
    (``mpsReplicas``), the volcano-vgpu and HAMi device plugins' ``deviceSplitCount``."""
    if isinstance(backend, NvidiaBackend):
        return backend.mps_replicas or ASSUMED_MPS_REPLICAS
    if isinstance(backend, VolcanoBackend | HamiBackend):
        return backend.device_split_count
    return 1


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


# --- the GPU pools a tenant's quota is split over -------------------------------------------


@dataclass(frozen=True)
class GpuPool:
    """One (flavor, resource) a tenant's GPU pods ask for, and which of its profiles do."""

    flavor: GpuFlavor
    resource: str
    whole: bool = False  # whole-GPU pods ask for it, one per GPU
    # Shared pods that ask for it: (profile, slices per GPU of its backend).
    sharers: tuple[tuple[str, int], ...] = ()
    assumed: tuple[str, ...] = ()  # sharers on an nvidia backend without mpsReplicas

    @property
    def slices(self) -> int:
        """How many of the resource one GPU is for its shared pods (0: none asks for it)."""
        return max((n for _, n in self.sharers), default=0)

    @property
    def label(self) -> str:
        return f"{self.resource} in {self.flavor.name}"


def gpu_pools(profiles: Iterable[tuple[ResolvedProfile, BackendPlan]]) -> tuple[GpuPool, ...]:
    """The pools a tenant's profiles (each with its backend plan) ask GPUs from, in the order a
    ClusterQueue tries their flavors."""
    found: dict[tuple[GpuFlavor, str], GpuPool] = {}
    for profile, plan in profiles:
        flavor = gpu_flavor(profile, plan)
        for resource in sorted(set(plan.resources) & GPU_COUNT_RESOURCES):
            pool = found.get((flavor, resource), GpuPool(flavor, resource))
            if not plan.shared:
                pool = replace(pool, whole=True)
            else:
                sharer = (profile.name, slices_per_gpu(profile.backend))
                assumed = isinstance(profile.backend, NvidiaBackend) and (
                    profile.backend.mps_replicas is None
                )
                pool = replace(
                    pool,
                    sharers=(*pool.sharers, sharer),
                    assumed=(*pool.assumed, profile.name) if assumed else pool.assumed,
                )
            found[(flavor, resource)] = pool
    return tuple(found[c] for c in sorted(found, key=lambda c: (FLAVORS.index(c[0]), c[1])))


def pool_nominal(pool: GpuPool, quota: TenantQuota | None) -> Decimal:
    """The pool's share of ``quota.gpus`` in its resource's units. With ``sharedGpus``: the
    whole-GPU pods' pool ``gpus - sharedGpus``, the shared pods' ``sharedGpus`` x its slices per
    GPU (both where one resource serves both). Without: ``gpus``, or ``gpus`` x the slices per
    GPU where shared pods ask for it."""
    gpus = Decimal(quota.gpus or 0) if quota is not None else Decimal(0)
    shared = quota.shared_gpus if quota is not None else None
    if shared is None:
        return gpus * pool.slices if pool.slices else gpus
    whole = gpus - shared if pool.whole else Decimal(0)
    return whole + shared * pool.slices


@dataclass(frozen=True)
class PoolQuotas:
    """A tenant's quota over its GPU pools, and what render says about it."""

    quotas: tuple[tuple[GpuPool, Decimal], ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def by_resource(self) -> dict[str, Decimal]:
        """What a ResourceQuota charges: the API server counts a resource whatever the pool,
        so the pools that share a resource name add up."""
        out: dict[str, Decimal] = {}
        for pool, nominal in self.quotas:
            out[pool.resource] = out.get(pool.resource, Decimal(0)) + nominal
        return out


def _explain(pool: GpuPool, nominal: Decimal, quota: TenantQuota | None) -> str:
    text = f"{pool.label} {_text(nominal)}"
    if not pool.slices or quota is None or not quota.gpus:
        return text
    shared = quota.shared_gpus if quota.shared_gpus is not None else quota.gpus
    return f"{text} ({shared} GPUs x {pool.slices})"


def shared_gpus_warnings(tenant: Tenant, pools: Sequence[GpuPool]) -> list[str]:
    """What a ``quota.sharedGpus`` gives to a pool none of the tenant's profiles asks for."""
    quota = tenant.quota
    if quota is None or not quota.shared_gpus or quota.gpus is None:
        return []
    shared, rest = quota.shared_gpus, quota.gpus - quota.shared_gpus
    if not any(p.slices for p in pools):
        return [
            f"tenant {tenant.name}: quota.sharedGpus {shared}, but none of its profiles shares "
            f"GPUs: it holds only quota.gpus - quota.sharedGpus ({rest}) whole GPUs"
        ]
    if rest and not any(p.whole for p in pools):
        return [
            f"tenant {tenant.name}: quota.sharedGpus {shared} leaves {rest} of quota.gpus to "
            "whole GPUs, which none of its profiles asks for"
        ]
    return []


def pool_quotas(
    tenant: Tenant, profiles: Iterable[tuple[ResolvedProfile, BackendPlan]]
) -> PoolQuotas:
    """The nominal quota of each GPU pool the tenant's profiles ask for (:func:`pool_nominal`),
    with warnings (slices per GPU assumed or ambiguous, a ``sharedGpus`` no pool uses) and notes
    (pools held apart, whole GPUs counted like slices)."""
    pools = gpu_pools(profiles)
    quota = tenant.quota
    gpus = (quota.gpus or 0) if quota is not None else 0
    shared = quota.shared_gpus if quota is not None else None
    quotas = tuple((pool, pool_nominal(pool, quota)) for pool in pools)
    who = f"tenant {tenant.name}"
    warnings: list[str] = []
    notes: list[str] = []
    for pool, nominal in quotas:
        if pool.assumed and gpus:
            which = "profile {} shares" if len(pool.assumed) == 1 else "profiles {} share"
            warnings.append(
                f"{who}: {which.format(', '.join(pool.assumed))} GPUs on an nvidia backend that "
                f"sets no mpsReplicas; the quota of {pool.label} assumes {ASSUMED_MPS_REPLICAS} "
                "MPS replicas per GPU, the least NVIDIA's device plugin accepts: set mpsReplicas "
                "to the device plugin's sharing.mps.resources[].replicas"
            )
        if len({n for _, n in pool.sharers}) > 1:
            ways = ", ".join(f"{name} {n}" for name, n in pool.sharers)
            warnings.append(
                f"{who}: its profiles split a GPU of {pool.label} different ways ({ways}); its "
                f"quota assumes the most, {pool.slices} per GPU"
            )
        if pool.whole and pool.slices and gpus:
            notes.append(
                f"{who}: whole-GPU and shared pods both ask for {pool.label}, which counts a "
                f"whole GPU as one, like a slice: its quota {_text(nominal)} does not stop "
                "whole-GPU pods at the GPUs meant for them"
            )
    warnings += shared_gpus_warnings(tenant, pools)
    whole = [p for p in pools if p.whole]
    sharing = [p for p in pools if p.slices]
    if gpus and len(quotas) > 1 and (shared is None or len(whole) > 1 or len(sharing) > 1):
        held = ", ".join(_explain(p, n, quota) for p, n in quotas)
        note = (
            f"{who}: its quota holds each GPU pool on its own ({held}), so together they may "
            f"hold more than quota.gpus ({gpus}) GPUs"
        )
        if shared is None and whole and sharing:
            note += "; quota.sharedGpus splits quota.gpus between whole GPUs and shared slices"
        notes.append(note)
    return PoolQuotas(quotas, tuple(warnings), tuple(notes))


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
    tenant: Tenant, spec: VolcanoQueueSpec, pool: GpuPool, nominal: Decimal
) -> tuple[Decimal | None, Decimal | None, list[str]]:
    """A cell's borrowingLimit and lendingLimit. ``capability`` and ``guarantee`` are amounts of
    the resource they name, as the user wrote them and as Volcano's Queue counts that resource:
    slices for a shared one (``nvidia.com/gpu.shared``, ``volcano.sh/vgpu-number``), like the
    cell's nominal quota, so neither is scaled. A resource served by several pools gets the
    same capability and guarantee in each."""
    warnings: list[str] = []
    borrowing: Decimal | None = None
    lending: Decimal | None = None
    resource = pool.resource
    if resource in spec.capability:
        capability = quantity_value(spec.capability[resource])
        borrowing = max(capability - nominal, Decimal(0))
        if capability < nominal:
            warnings.append(
                f"tenant {tenant.name}: queueSpec.capability {resource} {_text(capability)} is "
                f"below the nominal quota of {pool.label} ({_text(nominal)}); Kueue cannot hold "
                "a ClusterQueue under its own nominal quota, so it only stops borrowing "
                "(borrowingLimit 0)"
            )
    if resource in spec.guarantee:
        guarantee = quantity_value(spec.guarantee[resource])
        lending = max(nominal - guarantee, Decimal(0))
        if guarantee > nominal:
            warnings.append(
                f"tenant {tenant.name}: queueSpec.guarantee {resource} {_text(guarantee)} is "
                f"above the nominal quota of {pool.label} ({_text(nominal)}); a ClusterQueue "
                "reserves only its nominal quota (lendingLimit 0)"
            )
    return borrowing, lending, warnings


def tenant_queue(
    tenant: Tenant, profiles: Iterable[tuple[ResolvedProfile, BackendPlan]]
) -> TenantQueue | None:
    """The ClusterQueue content for a tenant's profiles (each with its backend plan), or None
    when the tenant's pods ask for no GPU device count."""
    profiles = list(profiles)
    pools = pool_quotas(tenant, profiles)
    if not pools.quotas:
        return None
    spec = tenant.queue_spec or VolcanoQueueSpec()
    warnings = list(pools.warnings)
    quotas: list[FlavorQuota] = []
    for pool, nominal in pools.quotas:
        borrowing, lending, said = _limits(tenant, spec, pool, nominal)
        warnings += [w for w in said if w not in warnings]
        quotas.append(FlavorQuota(pool.flavor, pool.resource, nominal, borrowing, lending))
    used = {q.resource for q in quotas}
    for field, given in (("capability", spec.capability), ("guarantee", spec.guarantee)):
        for key in sorted(set(given) - used):
            warnings.append(
                f"tenant {tenant.name}: queueSpec.{field} {key} is not in its ClusterQueue, "
                f"which counts only the GPU devices its pods ask for ({', '.join(sorted(used))})"
            )
    return TenantQueue(
        tenant=tenant,
        quotas=tuple(quotas),
        weight=spec.weight,
        reclaimable=spec.reclaimable,
        within_cluster_queue=_within_cluster_queue([p for p, _ in profiles]),
        warnings=tuple(warnings),
        notes=pools.notes,
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
                    "key": NAMESPACE_NAME_LABEL,
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
    rule: WorkloadRule,
    profile: ResolvedProfile,
    plan: BackendPlan | None,
    submit: SubmitMutation,
) -> str | None:
    kind = rule.match.kind
    jobs = TEMPLATE_ADMITTED_KINDS[kind]
    charged = (
        f"Kueue admits {jobs} from the job's pod templates and charges the {WHOLE_GPU_RESOURCE} "
        "they ask for"
    )
    rewrite = template_rewrite(profile, plan)
    if rewrite is not None and submit != "mutated":
        return (
            f"rule {rule.name} gives {kind} pods profile {profile.name}, and {rewrite.why}: "
            f"{charged}, but each pod asks for {rewrite.asked}; give these pods a whole-GPU "
            "profile that sets no gpus (gpuwarden then keeps the template's request)"
            + _SUBMIT_HINTS[submit]
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


#: Whether a rule's job templates are mutated at submit: "unknown" (lint cannot tell), "off"
#: (the job webhooks are off), "kept" (on, but the tenant keeps its job templates as written),
#: "mutated" (Kueue then charges what the pods ask).
SubmitMutation = Literal["unknown", "off", "kept", "mutated"]
_SUBMIT_HINTS: Mapping[SubmitMutation, str] = {
    "unknown": "",
    "off": (
        ", or turn on the job webhooks (chart value webhook.jobs, on by default) and pass "
        "--job-webhooks: they mutate the templates at submit, so Kueue charges what the pods ask"
    ),
    "kept": (
        "; the job webhooks do not help here: the tenant keeps its job templates as written "
        "(jobTemplates: keep), so Kueue charges the templates as written"
    ),
    "mutated": "",
}


def _submit_mutation(kind: str, tenant: Tenant, job_webhooks: bool | None) -> SubmitMutation:
    if job_webhooks is None or kind not in SUBMIT_MUTATED_KINDS:
        return "unknown"
    if not job_webhooks:
        return "off"
    return "kept" if tenant.job_templates == "keep" else "mutated"


def template_charge_errors(
    policies: PolicySet, tenants: Iterable[Tenant], *, job_webhooks: bool | None = None
) -> list[str]:
    """For the tenants whose pods Kueue queues: each rule for the kinds Kueue admits from a job's
    pod templates (:data:`TEMPLATE_ADMITTED_KINDS`) whose profile makes the pods ask for other
    GPUs than the templates, which is what Kueue charged. Tenants with the same problem share a
    line. ``job_webhooks``: whether the job webhooks run (None: not known, as for lint); where
    they do, a tenant's jobs of :data:`SUBMIT_MUTATED_KINDS` reach Kueue with the templates
    already asking what the pods will, unless the tenant keeps its job templates."""
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
            submit = _submit_mutation(rule.match.kind, tenant, job_webhooks)
            text = _template_charge_error(rule, profile, plan, submit)
            if text is not None:
                found.setdefault(text, []).append(tenant.name)
    return [
        f"{'tenant' if len(names) == 1 else 'tenants'} {', '.join(names)}: {text}"
        for text, names in found.items()
    ]
