"""The cluster objects a policy set implies: PriorityClasses, tenant ResourceQuotas, Volcano Queues.

Pure: a PolicySet in, plain dicts (ready for YAML or the API) plus warnings and notes out.

What each object is for, and what it deliberately is not:

* **PriorityClass** per profile. The mutating webhook sets ``priorityClassName``,
  ``priority`` and ``preemptionPolicy`` together (the Priority admission plugin re-checks them
  after webhooks), so the class must exist with exactly the same value and policy:
  ``preemptionPolicy`` comes from :attr:`ResolvedProfile.preemption_policy`, as in mutate.py.
* **ResourceQuota** per tenant namespace, as an API-server backstop that holds even if the
  webhook is bypassed (``failurePolicy: Ignore``) or down. For extended resources the quota
  system charges only ``requests.<resource>`` keys; ``limits.nvidia.com/gpu`` or a bare
  ``nvidia.com/gpu`` are accepted and never charged (checked against kube-apiserver 1.37), so
  rendered quotas use only ``requests.`` keys and :func:`quota_key_warnings` flags the others.
* **LimitRange**: none for GPU resources. A LimitRange ``max`` on an extended resource makes the
  API server refuse every pod that does not name that resource ("No limit is specified"), and a
  ``default`` for it would be injected *before* the webhook runs, so gpuwarden would see a GPU
  request on every pod. ``limits.maxGpusPerPod`` is therefore the validating webhook's job.
* **Volcano Queue** (``scheduling.volcano.sh/v1beta1``) per queue a tenant names, with the real
  fields only: ``weight``, ``capability``, ``deserved``, ``reclaimable``, ``guarantee.resource``.
  Volcano has no per-queue overcommit field: its overcommit factor is the ``overcommit``
  scheduler plugin's ``overcommit-factor`` argument (cluster-wide, enqueue admission only),
  which is said in a note.
* **Kueue** (``RenderOptions.kueue``, off by default): a ClusterQueue per tenant in one cohort,
  the ResourceFlavors of its GPU pools and a ``default`` LocalQueue per tenant namespace, from the
  same ``quota`` and ``queueSpec`` (:mod:`gpuwarden.policy.render.kueue` says how each field maps).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.resources import DEVICE_CLASS_RESOURCE_PREFIX
from gpuwarden.policy.render import kueue
from gpuwarden.policy.spec.backends import VOLCANO_QUEUE_ANNOTATION, BackendPlan, plan_for
from gpuwarden.policy.spec.model import Tenant, VolcanoBackend, quantity_value
from gpuwarden.policy.spec.policyset import PolicySet
from gpuwarden.policy.spec.resolved import ResolvedProfile

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuwarden"}
ANNOTATION_RENDERED_FROM = "gpuwarden.io/rendered-from"
VOLCANO_QUEUE_API = "scheduling.volcano.sh/v1beta1"
# Extended resources whose unit is MiB of GPU memory (per GPU the container gets).
GPU_MEMORY_MIB_RESOURCES = frozenset({"volcano.sh/vgpu-memory", "nvidia.com/gpumem"})
# Queues Volcano creates itself.
BUILTIN_QUEUES = frozenset({"default", "root"})
_MIB = Decimal(2**20)
VOLCANO_OVERCOMMIT_NOTE = (
    "Volcano has no per-queue overcommit field. Its overcommit factor is the scheduler's "
    "'overcommit' plugin argument 'overcommit-factor' (volcano-scheduler.conf, cluster-wide, "
    "applies to enqueue admission only). GPU memory is overcommitted by the volcano-vgpu device "
    "plugin's deviceMemoryScaling: pods request their cap, maxMemory, as volcano.sh/vgpu-memory."
)


@dataclass(frozen=True)
class RenderOptions:
    priority_classes: bool = True
    quotas: bool = True
    queues: bool = True
    kueue: bool = False  # Kueue ClusterQueues, ResourceFlavors and LocalQueues
    # Whether the job webhooks mutate job templates at submit (the chart's webhook.jobs), so
    # Kueue charges Training Operator jobs and Katib trials what their pods ask.
    job_webhooks: bool = False


@dataclass(frozen=True)
class Rendering:
    """Objects in apply order, plus what the user should hear about them."""

    objects: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj.get("kind") == kind]


@dataclass
class _Out:
    objects: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def warn(self, *texts: str) -> None:
        self.warnings += [text for text in texts if text not in self.warnings]


def render(policies: PolicySet, options: RenderOptions | None = None) -> Rendering:
    """Every object the policy set implies, validated by nothing yet (the caller does that)."""
    options = options or RenderOptions()
    out = _Out()
    if options.priority_classes:
        out.objects += _priority_classes(policies, out)
    if options.quotas:
        out.objects += _resource_quotas(policies, out)
    if options.queues:
        out.objects += _volcano_queues(policies, out)
    if options.kueue:
        out.objects += _kueue_queues(policies, out, job_webhooks=options.job_webhooks)
    _memory_scaling_notes(policies, out)
    for obj in out.objects:
        if obj["kind"] == "ResourceQuota":
            where = f"ResourceQuota {obj['metadata']['namespace']}/{obj['metadata']['name']}"
            out.warnings += quota_key_warnings(obj["spec"]["hard"], where)
    return Rendering(tuple(out.objects), tuple(out.warnings), tuple(out.notes), tuple(out.errors))


# --- PriorityClasses ----------------------------------------------------------------------


def priority_class(profile: ResolvedProfile, profiles: Iterable[str] = ()) -> dict[str, Any]:
    """The PriorityClass a profile's pods are given (what mutate.py writes on the pod)."""
    names = sorted({profile.name, *profiles})
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": profile.priority_class_name,
            "labels": dict(MANAGED_BY),
            "annotations": {ANNOTATION_RENDERED_FROM: f"{profile.policy}/{','.join(names)}"},
        },
        "value": profile.priority,
        "preemptionPolicy": profile.preemption_policy,
        "globalDefault": False,
        "description": f"gpuwarden profile {', '.join(names)} (policy {profile.policy})",
    }


def _priority_classes(policies: PolicySet, out: _Out) -> list[dict[str, Any]]:
    chosen: dict[str, ResolvedProfile] = {}
    sharing: dict[str, list[str]] = {}
    for name in policies.profiles:
        profile = policies.resolve(name, None)
        class_name = profile.priority_class_name
        if class_name.startswith("system-"):
            out.note(
                f"profile {name} uses the built-in PriorityClass {class_name}; "
                "it is not rendered (the API server reserves the system- prefix)"
            )
            continue
        first = chosen.get(class_name)
        if first is None:
            chosen[class_name] = profile
            sharing[class_name] = []
            continue
        if (first.priority, first.preemption_policy) != (
            profile.priority,
            profile.preemption_policy,
        ):
            out.errors.append(
                f"profiles {first.name} and {name} share PriorityClass {class_name} but disagree: "
                f"priority {first.priority}/{first.preemption_policy} vs "
                f"{profile.priority}/{profile.preemption_policy}"
            )
            continue
        sharing[class_name].append(name)
    return [priority_class(profile, sharing[name]) for name, profile in chosen.items()]


# --- device plugin settings ---------------------------------------------------------------

# Where each limiter backend's device plugin takes the memory scaling that makes overcommit
# real: the request is HAMi-core's cap, and a node advertises scaling x each GPU's memory
# (Project-HAMi/volcano-vgpu-device-plugin doc/config.md, Project-HAMi/HAMi charts/hami/values.yaml).
DEVICE_MEMORY_SCALING = {
    "volcano": "the volcano-vgpu device plugin's ConfigMap volcano-vgpu-device-config "
    "(device-config.yaml: nvidia.deviceMemoryScaling)",
    "hami": "HAMi's chart value devicePlugin.deviceMemoryScaling (or devicememoryscaling in a "
    "node's entry of devicePlugin.nodeConfiguration)",
}


def _memory_scaling_notes(policies: PolicySet, out: _Out) -> None:
    """Say which deviceMemoryScaling each limiter backend's nodes need for the profiles'
    overcommit ratios; the plugins' own configuration is theirs to apply."""
    for name in policies.profiles:
        resolved = policies.resolve(name, None)
        backend = resolved.backend.type
        if backend not in DEVICE_MEMORY_SCALING or not resolved.gpu_share:
            continue
        if resolved.overcommit_ratio <= 1:
            continue
        where = ", ".join(f"{k}={v}" for k, v in sorted(resolved.node_selector.items()))
        out.note(
            f"profile {name}: overcommitRatio {resolved.overcommit_ratio:g} needs "
            f"deviceMemoryScaling: {resolved.overcommit_ratio:g} in "
            f"{DEVICE_MEMORY_SCALING[backend]} on the nodes its pods use "
            f"({where or 'every GPU node'}); pods request and are capped at maxMemory "
            f"{resolved.max_memory_text}"
        )


# --- ResourceQuotas -----------------------------------------------------------------------


def tenant_profiles(policies: PolicySet, tenant: Tenant) -> list[ResolvedProfile]:
    """The profiles a tenant's pods can get, with the tenant's overrides applied."""
    allowed = tenant.limits.allowed_profiles
    names = [name for name in policies.profiles if allowed is None or name in allowed]
    return [policies.resolve(name, tenant) for name in names]


def tenant_plans(policies: PolicySet, tenant: Tenant) -> list[tuple[ResolvedProfile, BackendPlan]]:
    """The tenant's profiles that give GPUs, each with its backend plan."""
    return [
        (profile, plan_for(profile, queue=tenant.queue))
        for profile in tenant_profiles(policies, tenant)
        if profile.gpus > 0
    ]


def mebibytes_ceil(amount: Decimal) -> int:
    return int((amount / _MIB).to_integral_value(rounding=ROUND_CEILING))


# Keys that HAMi's scheduler charges from a namespace's ResourceQuota (QuotaManager in
# Project-HAMi/HAMi pkg/device/quota.go: only limits.<memory or cores resource> is managed, and
# each device a container gets is charged its memory and cores). The API server's quota admission
# never charges limits.<extended resource>, so these keys mean something only to HAMi.
HAMI_QUOTA_KEYS = frozenset({"limits.nvidia.com/gpumem", "limits.nvidia.com/gpucores"})


def _largest_ratio(policies: PolicySet, tenant: Tenant) -> Decimal:
    ratios = [
        Decimal(str(p.overcommit_ratio)) for p in tenant_profiles(policies, tenant) if p.gpu_share
    ]
    return max(ratios, default=Decimal(1))


def gpu_device_classes(policies: PolicySet) -> tuple[str, ...]:
    """The DRA DeviceClasses whose devices are GPUs, as the policies of the set name them."""
    return tuple(sorted({name for p in policies.policies for name in p.spec.gpu_device_classes}))


def tenant_quota_hard(policies: PolicySet, tenant: Tenant) -> dict[str, str]:
    """``spec.hard`` for a tenant's namespaces, from what the policy says today.

    ``limits.gpuMemoryQuota`` bounds the GPU memory the tenant's pods reserve; the shared
    backends request each container's cap per GPU in MiB (``volcano.sh/vgpu-memory``,
    ``nvidia.com/gpumem``), so the quota charges it there, at quota x the largest overcommit
    ratio (the webhook's ceiling). Those resources count per GPU, so the API server charges a
    multi-GPU container once: the quota never refuses what the webhook (which multiplies by the
    GPU count) admits, and the webhook stays the exact check. On HAMi the same limit also goes
    to ``limits.nvidia.com/gpumem``, which HAMi's scheduler charges per device, and a GPU quota
    to ``limits.nvidia.com/gpucores`` (100 per GPU).

    ``quota.gpus`` goes to ``requests.<count resource>`` as a ClusterQueue's nominal quotas
    (:func:`kueue.pool_quotas`): a shared pool in slices (GPUs x the backend's slices per GPU),
    split by ``quota.sharedGpus``; the pools that share a resource name add up, since the API
    server cannot tell them apart. It goes as well to
    ``requests.deviceclass.resource.kubernetes.io/<class>`` of each of ``gpuDeviceClasses``
    (DRA's extended resources, which the API server's quota charges by that key alone), 0 where
    the tenant may not use DRA: the backstop for the webhook's denial.
    """
    plans = tenant_plans(policies, tenant)
    return _quota_hard(policies, tenant, plans, kueue.pool_quotas(tenant, plans))


def _quota_hard(
    policies: PolicySet,
    tenant: Tenant,
    plans: Sequence[tuple[ResolvedProfile, BackendPlan]],
    pools: kueue.PoolQuotas,
) -> dict[str, str]:
    """:func:`tenant_quota_hard` from the tenant's plans and pool quotas, computed once."""
    hard: dict[str, str] = {}
    resources = {resource for _, plan in plans for resource in plan.resources}
    quota = tenant.limits.gpu_memory_quota
    if quota is not None:
        mib = mebibytes_ceil(quantity_value(quota) * _largest_ratio(policies, tenant))
        for resource in sorted(resources & GPU_MEMORY_MIB_RESOURCES):
            hard[f"requests.{resource}"] = str(mib)
        if "nvidia.com/gpumem" in resources:
            hard["limits.nvidia.com/gpumem"] = str(mib)
    if tenant.quota is not None:
        if tenant.quota.gpus is not None:
            for resource, amount in sorted(pools.by_resource().items()):
                hard[f"requests.{resource}"] = str(int(amount))
            if "nvidia.com/gpucores" in resources:
                hard["limits.nvidia.com/gpucores"] = str(100 * tenant.quota.gpus)
            dra = tenant.quota.gpus if tenant.limits.allow_resource_claims else 0
            for device_class in gpu_device_classes(policies):
                hard[f"requests.{DEVICE_CLASS_RESOURCE_PREFIX}{device_class}"] = str(dra)
        hard.update(tenant.quota.hard)
    return hard


def resource_quota(
    namespace: str, tenant: Tenant, policy: str, hard: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": f"gpuwarden-{tenant.name}",
            "namespace": namespace,
            "labels": {**MANAGED_BY, keys.ANNOTATION_TENANT: tenant.name},
            "annotations": {ANNOTATION_RENDERED_FROM: f"{policy}/tenants/{tenant.name}"},
        },
        "spec": {"hard": dict(hard)},
    }


def _tenant_policy(policies: PolicySet, tenant: Tenant) -> str:
    for policy in policies.policies:
        if tenant in policy.spec.tenants:
            return policy.metadata.name
    return ""


def _resource_quotas(policies: PolicySet, out: _Out) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for tenant in policies.tenants:
        plans = tenant_plans(policies, tenant)
        pools = kueue.pool_quotas(tenant, plans)
        hard = _quota_hard(policies, tenant, plans, pools)
        if tenant.quota is not None and tenant.quota.gpus is not None and tenant.namespaces:
            out.warn(*pools.warnings)
            for note in pools.notes:
                out.note(note)
        if tenant.limits.max_gpus_per_pod is not None:
            out.note(
                f"tenant {tenant.name}: limits.maxGpusPerPod is enforced by the validating "
                "webhook, not by a LimitRange (a LimitRange max on an extended resource makes "
                "the API server refuse every pod that names no limit for it)"
            )
        if not hard:
            if tenant.limits.gpu_memory_quota is not None:
                out.note(
                    f"tenant {tenant.name}: gpuMemoryQuota has no ResourceQuota form on its "
                    "backends (only Volcano vGPU and HAMi request GPU memory as a resource); "
                    "the validating webhook enforces it"
                )
            continue
        if not tenant.namespaces:
            out.note(
                f"tenant {tenant.name} selects its namespaces by label, so no ResourceQuota is "
                "rendered (a quota needs a namespace): the tenant controller (the chart's "
                "tenantController, `gpuwarden tenant-controller`) applies it in each of them as "
                "it appears; without it, list them in spec.tenants[].namespaces, or put the same "
                "hard limits in each Kubeflow Profile's spec.resourceQuotaSpec"
            )
            continue
        policy = _tenant_policy(policies, tenant)
        objects += [resource_quota(ns, tenant, policy, hard) for ns in tenant.namespaces]
        if HAMI_QUOTA_KEYS & set(hard):
            out.note(
                f"tenant {tenant.name}: requests.* keys are charged by the API server's quota "
                "admission; limits.nvidia.com/gpumem and limits.nvidia.com/gpucores by HAMi's "
                "scheduler (memory and cores per device), which is the only one of the two that "
                "multiplies by the GPU count"
            )
        if len(tenant.namespaces) > 1:
            out.note(
                f"tenant {tenant.name}: each of its {len(tenant.namespaces)} namespaces gets the "
                "whole tenant quota (a ResourceQuota is per namespace); the webhook enforces the "
                "tenant-wide total"
            )
    return objects


def _is_extended(resource: str) -> bool:
    """Extended resources are domain-qualified names outside kubernetes.io (nvidia.com/gpu)."""
    if "/" not in resource:
        return False
    if resource.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
        return True  # DRA's extended resources, in kubernetes.io's domain all the same
    domain = resource.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def quota_key_warnings(hard: Mapping[str, Any], where: str) -> list[str]:
    """Quota keys the API server accepts but never charges.

    For extended resources (no overcommit, request equals limit) only ``requests.<resource>``
    is counted; ``limits.<resource>`` and the bare ``<resource>`` stay at zero used forever.
    """
    warnings: list[str] = []
    for key in sorted(map(str, hard)):
        if key.startswith("count/") or key.startswith("requests.") or key in HAMI_QUOTA_KEYS:
            continue
        if key.startswith("limits."):
            resource = key.removeprefix("limits.")
            if _is_extended(resource):
                warnings.append(
                    f"{where}: quota key {key} is accepted but never charged (quota counts only "
                    f"requests.{resource} for extended resources); use requests.{resource}"
                )
            continue
        if _is_extended(key):
            warnings.append(
                f"{where}: quota key {key} is accepted but never charged (quota counts only "
                f"requests.{key} for extended resources); use requests.{key}"
            )
    return warnings


# --- Volcano Queues -----------------------------------------------------------------------


def volcano_queue(
    name: str,
    *,
    weight: int = 1,
    reclaimable: bool = True,
    capability: Mapping[str, str] | None = None,
    guarantee: Mapping[str, str] | None = None,
    deserved: Mapping[str, str] | None = None,
    rendered_from: str = "",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": weight, "reclaimable": reclaimable}
    if capability:
        spec["capability"] = dict(capability)
    if deserved:
        spec["deserved"] = dict(deserved)
    if guarantee:
        spec["guarantee"] = {"resource": dict(guarantee)}
    metadata: dict[str, Any] = {"name": name, "labels": dict(MANAGED_BY)}
    if rendered_from:
        metadata["annotations"] = {ANNOTATION_RENDERED_FROM: rendered_from}
    return {"apiVersion": VOLCANO_QUEUE_API, "kind": "Queue", "metadata": metadata, "spec": spec}


def _uses_volcano(policies: PolicySet, tenant: Tenant) -> bool:
    return any(isinstance(p.backend, VolcanoBackend) for p in tenant_profiles(policies, tenant))


def _gang_queue_note(tenant: Tenant, queue: str) -> str:
    """Gang-scheduled pods are queued by their PodGroup, which gpuwarden's pod annotation misses.

    The Training Operator creates the PodGroup with ``runPolicy.schedulingPolicy.queue``
    (``default`` when unset), and Volcano's PodGroup admission webhook replaces ``default`` with
    the namespace's ``scheduling.volcano.sh/queue-name`` annotation (createPodGroupPatch in
    volcano-sh/volcano pkg/webhooks/admission/podgroups/mutate/mutate_podgroup.go).
    """
    namespaces = " ".join(tenant.namespaces) or "<each of its namespaces>"
    return (
        f"tenant {tenant.name}: gang-scheduled jobs are queued by their PodGroup, not the pod "
        f"annotation: set runPolicy.schedulingPolicy.queue: {queue} on the job, or annotate the "
        f"namespace once so Volcano's PodGroup webhook fills it in: kubectl annotate namespace "
        f"{namespaces} {VOLCANO_QUEUE_ANNOTATION}={queue}"
    )


def _volcano_queues(policies: PolicySet, out: _Out) -> list[dict[str, Any]]:
    owners: dict[str, list[Tenant]] = {}
    for tenant in policies.tenants:
        if tenant.queue and _uses_volcano(policies, tenant):
            owners.setdefault(tenant.queue, []).append(tenant)
    for policy in policies.policies:
        backends = [policy.spec.backend, *(p.backend for p in policy.spec.profiles if p.backend)]
        for backend in backends:
            if isinstance(backend, VolcanoBackend) and backend.queue:
                owners.setdefault(backend.queue, [])
    objects: list[dict[str, Any]] = []
    for name, tenants in owners.items():
        for tenant in tenants:
            out.note(_gang_queue_note(tenant, name))
        if name in BUILTIN_QUEUES:
            continue
        capability: dict[str, str] = {}
        if len(tenants) == 1:
            hard = tenant_quota_hard(policies, tenants[0])
            capability = {
                key.removeprefix("requests."): value
                for key, value in hard.items()
                if key.removeprefix("requests.") in GPU_MEMORY_MIB_RESOURCES
                and key.startswith("requests.volcano.sh/")
            }
        elif len(tenants) > 1:
            out.note(
                f"queue {name} is shared by tenants {', '.join(t.name for t in tenants)}; it is "
                "rendered without a capability"
            )
        source = ",".join(f"tenants/{t.name}" for t in tenants) or "backend.queue"
        spec = next((t.queue_spec for t in tenants if t.queue_spec is not None), None)
        if spec is None:
            objects.append(volcano_queue(name, capability=capability, rendered_from=source))
            continue
        objects.append(
            volcano_queue(
                name,
                weight=spec.weight,
                reclaimable=spec.reclaimable,
                capability={**capability, **spec.capability},
                guarantee=spec.guarantee,
                deserved=spec.deserved,
                rendered_from=source,
            )
        )
    if objects:
        out.note(VOLCANO_OVERCOMMIT_NOTE)
    return objects


# --- Kueue --------------------------------------------------------------------------------


def kueue_configuration_note() -> str:
    """What Kueue's own Configuration must say for the rendered queues to work."""
    needs = kueue.configuration_requirements()
    strategies = ", ".join(needs["fairSharing"]["preemptionStrategies"])
    excluded = ", ".join(needs["resources"]["excludeResourcePrefixes"])
    return (
        "Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) must manage plain pods "
        f"(integrations.frameworks: [{kueue.POD_FRAMEWORK}]), enable fair sharing for the "
        f"weights (fairSharing.preemptionStrategies: [{strategies}]) and leave uncounted what "
        "a ClusterQueue does not cover, or pods asking for it never start "
        f"(resources.excludeResourcePrefixes: [{excluded}])"
    )


def _kueue_queues(policies: PolicySet, out: _Out, *, job_webhooks: bool) -> list[dict[str, Any]]:
    """ResourceFlavors, then a ClusterQueue per tenant with a quota or queueSpec, then the
    LocalQueues that point each tenant namespace at it."""
    queues: list[kueue.TenantQueue] = []
    for tenant in policies.tenants:
        if tenant.quota is None and tenant.queue_spec is None:
            continue
        queue = kueue.tenant_queue(tenant, tenant_plans(policies, tenant))
        if queue is None:
            out.note(f"tenant {tenant.name}: its profiles give no GPU, so it gets no ClusterQueue")
            continue
        if _uses_volcano(policies, tenant):
            out.warnings.append(
                f"tenant {tenant.name}: its pods are queued by Volcano's Queue as well; with "
                "Kueue they would wait in two queues (use one of them)"
            )
        out.warn(*queue.warnings)
        for note in queue.notes:
            out.note(note)
        queues.append(queue)
    # What Kueue charges a job's template must be what its pods ask after gpuwarden.
    out.errors += kueue.template_charge_errors(
        policies, [q.tenant for q in queues], job_webhooks=job_webhooks
    )
    if not queues:
        return []
    reclaim, warnings = kueue.reclaim_within_cohort(queues)
    out.warnings += warnings
    flavors = [f for f in kueue.FLAVORS if any(q.flavor == f for x in queues for q in x.quotas)]
    objects = [kueue.resource_flavor(f, labels=MANAGED_BY) for f in flavors]
    local: list[dict[str, Any]] = []
    for queue in queues:
        tenant = queue.tenant
        source = {
            ANNOTATION_RENDERED_FROM: f"{_tenant_policy(policies, tenant)}/tenants/{tenant.name}"
        }
        labels = {**MANAGED_BY, keys.ANNOTATION_TENANT: tenant.name}
        objects.append(
            kueue.cluster_queue(
                queue, reclaim=reclaim[queue.name], labels=labels, annotations=source
            )
        )
        local += [
            kueue.local_queue(ns, queue.name, labels=labels, annotations=source)
            for ns in tenant.namespaces
        ]
        if not tenant.namespaces:
            out.note(
                f"tenant {tenant.name} selects its namespaces by label, so no LocalQueue is "
                "rendered (a LocalQueue needs a namespace): the tenant controller (the chart's "
                "tenantController with kueue.enabled, `gpuwarden tenant-controller --kueue`) "
                f"applies LocalQueue {kueue.DEFAULT_LOCAL_QUEUE} (spec.clusterQueue: "
                f"{queue.name}) in each of them as it appears"
            )
    out.note(kueue_configuration_note())
    return objects + local
