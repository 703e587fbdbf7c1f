"""What `gpuwarden lint` reports: risky but valid settings (warnings), and tenants and rules
that can never apply (errors; the loader's errors come first)."""

from __future__ import annotations

from gpuwarden.policy.pod.workloads import KATIB_INJECTION, KATIB_INJECTION_ENABLED
from gpuwarden.policy.render.kueue import gpu_pools, shared_gpus_warnings, template_charge_errors
from gpuwarden.policy.render.objects import tenant_plans
from gpuwarden.policy.spec.backends import selects_shared_gpus
from gpuwarden.policy.spec.model import (
    Backend,
    HamiBackend,
    KatibTrialMatch,
    LabelSelector,
    NativeBackend,
    NvidiaBackend,
    Profile,
    Tenant,
    VolcanoBackend,
)
from gpuwarden.policy.spec.policyset import PolicySet
from gpuwarden.policy.spec.precedence import shadowed_rules, tenant_problems
from gpuwarden.policy.spec.resolved import ResolvedProfile
from gpuwarden.policy.spec.selectors import selector_matches

# The device plugin setting that advertises scaling x each GPU's memory, per backend: the only
# way to overcommit GPU memory on Volcano vGPU and HAMi, where the request is the enforced cap.
MEMORY_SCALING_SETTING = {
    "volcano": "deviceMemoryScaling in the volcano-vgpu device plugin's ConfigMap "
    "(volcano-vgpu-device-config, key device-config.yaml, nvidia.deviceMemoryScaling)",
    "hami": "deviceMemoryScaling in HAMi's device plugin configuration "
    "(chart value devicePlugin.deviceMemoryScaling, or devicememoryscaling per node in "
    "nodeConfiguration)",
}


def lint_warnings(policies: PolicySet) -> list[str]:
    warnings: list[str] = []
    for name, profile in policies.profiles.items():
        backend = profile.backend or policies.profile_policy[name].spec.backend
        gpus = profile.gpus if profile.gpus is not None else 1
        if gpus and profile.gpu_share and isinstance(backend, NativeBackend):
            warnings.append(
                f"profile {name}: the native backend cannot share GPUs; pods get whole GPUs"
            )
        if gpus and profile.gpu_share and isinstance(backend, VolcanoBackend | HamiBackend):
            warnings += _limiter_backend_warnings(name, profile, backend)
        if profile.gpu_types and not _reads_gpu_types(backend, bool(profile.gpu_share)):
            warnings.append(
                f"profile {name}: gpuTypes has no effect on {backend.type} "
                f"{'shared' if profile.gpu_share else 'whole'} GPUs (only Volcano vGPU and HAMi "
                "read nvidia.com/use-gputype); select nodes by nvidia.com/gpu.product in "
                "nodeSelector instead"
            )
        if gpus and isinstance(backend, NvidiaBackend):
            warnings += _nvidia_warnings(name, profile)
        if not profile.gpu_share and profile.thread_percentage is not None:
            warnings.append(
                f"profile {name}: threadPercentage only applies to shared (MPS) GPUs; ignored"
            )
        if profile.preemptible and profile.priority > 1000:
            warnings.append(
                f"profile {name}: preemptible with priority {profile.priority}; "
                "preemptible work usually has the lowest priorities"
            )
    for tenant in policies.tenants:
        limits = tenant.limits
        if (
            limits.max_gpus_per_pod is None
            and limits.max_gpu_memory_per_pod is None
            and limits.gpu_memory_quota is None
        ):
            warnings.append(f"tenant {tenant.name}: no GPU limits or quota are set")
        warnings += shared_gpus_warnings(tenant, gpu_pools(tenant_plans(policies, tenant)))
        allowed = limits.allowed_profiles
        if allowed is None:
            continue
        for rule, _ in policies.rules:
            if rule.profile and rule.profile not in allowed:
                warnings.append(
                    f"tenant {tenant.name}: rule {rule.name} gives profile {rule.profile}, "
                    "which the tenant may not use: such pods will be denied"
                )
    warnings += _memory_scaling_conflicts(policies)
    warnings += _untenanted_namespaces(policies)
    warnings += _katib_injection_warnings(policies)
    warnings += _kueue_queue_warnings(policies)
    return warnings


# The label the Kubeflow profile controller puts on every profile namespace, which the chart's
# webhooks select by default (charts/gpuwarden/values.yaml, webhook.namespaceSelector).
KUBEFLOW_PROFILE_LABEL = ("app.kubernetes.io/part-of", "kubeflow-profile")


def _untenanted_namespaces(policies: PolicySet) -> list[str]:
    """Governed namespaces no tenant claims get only the isolation checks: say so when the
    policies leave a new Kubeflow profile namespace without a tenant."""
    key, value = KUBEFLOW_PROFILE_LABEL
    profile_namespace = {key: value}
    if any(
        tenant.namespace_selector is not None
        and selector_matches(tenant.namespace_selector, profile_namespace)
        for tenant in policies.tenants
    ):
        return []
    who = (
        "no tenant is defined"
        if not policies.tenants
        else "every tenant lists its namespaces by name"
    )
    return [
        f"{who}: a Kubeflow profile namespace the webhook governs ({key}={value}) that no "
        "tenant names gets only the isolation checks, no limits, quota or overrides; add a "
        f"tenant with namespaceSelector matchLabels {{{key}: {value}}} to catch new profiles"
    ]


def lint_errors(policies: PolicySet) -> list[str]:
    """Tenants that can never be chosen or that only load order tells apart, and rules that can
    never match, each with what shadows it (precedence.py says how policies combine)."""
    errors = tenant_problems(policies.tenants)
    several = len(policies.policies) > 1

    def ref(index: int) -> str:
        rule, policy = policies.rules[index]
        return f"{rule.name} (policy {policy.metadata.name})" if several else rule.name

    for index, by, does in shadowed_rules([rule for rule, _ in policies.rules]):
        line = f"rule {ref(index)}: never matches, rule {ref(by)} {does}"
        if policies.rules[index][1] is not policies.rules[by][1]:
            line += (
                "; rules apply in every namespace: to change what one tenant's pods get, "
                "use that tenant's overrides"
            )
        errors.append(line)
    # What Kueue charges a job must be what its pods ask (gpuwarden/policy/render/kueue.py).
    errors += template_charge_errors(policies, [tenant for tenant, _ in kueue_tenants(policies)])
    return errors


def _limiter_backend_warnings(
    name: str, profile: Profile, backend: VolcanoBackend | HamiBackend
) -> list[str]:
    """Volcano vGPU and HAMi: the memory request is HAMi-core's cap and cores are reservations."""
    warnings: list[str] = []
    ratio = profile.overcommit_ratio or 1.0
    if ratio > 1.0:
        warnings.append(
            f"profile {name}: overcommitRatio {ratio:g} has no per-pod form on {backend.type}: "
            f"pods request and are capped at maxMemory {profile.max_memory or '(none)'}; "
            f"GPU memory is overcommitted only where the nodes set "
            f"{MEMORY_SCALING_SETTING[backend.type]} to {ratio:g} (gpuwarden render says so)"
        )
    share = profile.thread_percentage
    if share is not None and share < 100:
        resource = "volcano.sh/vgpu-cores" if backend.type == "volcano" else "nvidia.com/gpucores"
        warnings.append(
            f"profile {name}: threadPercentage {share} becomes {resource}: {share}, a "
            f"reservation of {share} of a GPU's 100 cores, so at most {100 // share} such pods "
            "share a GPU whatever memory is free (MPS thread percentages may add up past 100)"
        )
    return warnings


def _memory_scaling_conflicts(policies: PolicySet) -> list[str]:
    """Shared profiles on one limiter backend that need different deviceMemoryScaling values on
    the same nodes: the setting is per node, so one of them cannot be honoured."""
    wanted: dict[tuple[str, tuple[tuple[str, str], ...]], dict[float, list[str]]] = {}
    for name, profile in policies.profiles.items():
        backend: Backend = profile.backend or policies.profile_policy[name].spec.backend
        if not profile.gpu_share or not isinstance(backend, VolcanoBackend | HamiBackend):
            continue
        nodes = tuple(sorted((profile.node_selector or {}).items()))
        ratios = wanted.setdefault((backend.type, nodes), {})
        ratios.setdefault(profile.overcommit_ratio or 1.0, []).append(name)
    warnings: list[str] = []
    for (backend_type, nodes), ratios in sorted(wanted.items()):
        if len(ratios) < 2:
            continue
        where = ", ".join(f"{k}={v}" for k, v in nodes) or "any node"
        sets = "; ".join(
            f"{', '.join(names)} want {ratio:g}" for ratio, names in sorted(ratios.items())
        )
        warnings.append(
            f"{backend_type}: shared profiles on the same nodes ({where}) need different "
            f"deviceMemoryScaling ({sets}), which is one value per node; give them "
            "different nodeSelectors or one overcommitRatio"
        )
    return warnings


def _nvidia_warnings(name: str, profile: Profile) -> list[str]:
    """NVIDIA's device plugin with MPS: the daemon's equal share bounds the caps, scheduling
    counts replicas, and an exclusive profile must stay off shared GPUs."""
    warnings: list[str] = []
    if not profile.gpu_share:
        for key, value in sorted((profile.node_selector or {}).items()):
            if selects_shared_gpus(key, "In", [value]):
                warnings.append(
                    f"profile {name}: nodeSelector {key}={value} picks shared GPUs, but the "
                    "profile is exclusive: its pods would get MPS replicas, not whole GPUs"
                )
        return warnings
    # NVIDIA/k8s-device-plugin cmd/mps-control-daemon/mps/daemon.go: the daemon's defaults are
    # total memory / replicas and 100 / replicas percent of threads, which a client can lower
    # (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) but not raise.
    capped = [
        f"{field} {value}"
        for field, value in (
            ("maxMemory", profile.max_memory),
            ("threadPercentage", profile.thread_percentage),
        )
        if value is not None
    ]
    if capped:
        warnings.append(
            f"profile {name}: NVIDIA's MPS control daemon gives each client 1/replicas of a "
            "GPU's memory and 100/replicas percent of its threads, and a client can only lower "
            f"that: {' and '.join(capped)} above the equal share is lowered to it, unless "
            "gpuwarden's node agent sets the daemon's limits (nodeAgent.mps)"
        )
    ratio = profile.overcommit_ratio or 1.0
    if ratio > 1.0:
        warnings.append(
            f"profile {name}: overcommitRatio {ratio:g} has no scheduling effect on nvidia: "
            "each pod reserves one MPS replica, whatever its maxMemory; the replicas per GPU "
            "in the device plugin's sharing config set how many pods share a GPU"
        )
    return warnings


def _katib_injection_warnings(policies: PolicySet) -> list[str]:
    """Katib trial rules see trial pods only where Katib's pod webhook labels them: in namespaces
    labelled for its metrics-collector injection. Elsewhere the pods keep only their Job's labels."""
    rules = [rule.name for rule, _ in policies.rules if isinstance(rule.match, KatibTrialMatch)]
    if not rules:
        return []
    # Only a tenant whose namespaceSelector requires the label, and that names no namespace
    # outright, is sure to have it in every namespace.
    unsure = [
        tenant.name
        for tenant in policies.tenants
        if tenant.namespaces or not _requires_katib_injection(tenant.namespace_selector)
    ]
    if policies.tenants and not unsure:
        return []
    which = f"rule {rules[0]} matches" if len(rules) == 1 else f"rules {', '.join(rules)} match"
    namespaces = "the namespaces that run trials"
    if unsure:
        owners = "tenant" if len(unsure) == 1 else "tenants"
        namespaces = f"the namespaces of {owners} {', '.join(unsure)}"
    return [
        f"{which} Katib trials, but Katib labels trial pods only in namespaces labelled "
        f"{KATIB_INJECTION}={KATIB_INJECTION_ENABLED} (elsewhere they are governed as the Job, "
        f"training job or pipeline step they run): make sure {namespaces} carry it"
    ]


def _requires_katib_injection(selector: LabelSelector | None) -> bool:
    if selector is None:
        return False
    if selector.match_labels.get(KATIB_INJECTION) == KATIB_INJECTION_ENABLED:
        return True
    return any(
        req.key == KATIB_INJECTION
        and req.operator == "In"
        and req.values == (KATIB_INJECTION_ENABLED,)
        for req in selector.match_expressions
    )


def _reads_gpu_types(backend: Backend, shared: bool) -> bool:
    """Whether the backend's scheduler reads nvidia.com/use-gputype for such a pod."""
    if isinstance(backend, HamiBackend):
        return True
    if isinstance(backend, VolcanoBackend):
        return shared or backend.whole_gpus == "vgpu"
    return False


def kueue_tenants(policies: PolicySet) -> list[tuple[Tenant, list[ResolvedProfile]]]:
    """The tenants whose queueSpec no Volcano profile reads, so a Kueue ClusterQueue (`gpuwarden
    render --kueue`, gpuwarden/policy/render/kueue.py), each with the profiles it may get."""
    out: list[tuple[Tenant, list[ResolvedProfile]]] = []
    for tenant in policies.tenants:
        allowed = tenant.limits.allowed_profiles
        names = [n for n in policies.profiles if allowed is None or n in allowed]
        profiles = [policies.resolve(name, tenant) for name in names]
        if tenant.queue_spec is None or any(
            isinstance(p.backend, VolcanoBackend) for p in profiles
        ):
            continue
        out.append((tenant, profiles))
    return out


def _kueue_queue_warnings(policies: PolicySet) -> list[str]:
    """Say which of the article's Queue fields a Kueue ClusterQueue cannot mean. Kueue counts
    devices against quotas; it has no overcommit and no deserved share."""
    warnings: list[str] = []
    for tenant, profiles in kueue_tenants(policies):
        spec = tenant.queue_spec
        assert spec is not None
        where = f"tenant {tenant.name}: queueSpec is a Kueue ClusterQueue (render --kueue)"
        over = [f"{p.name} {p.overcommit_ratio:g}" for p in profiles if p.overcommit_ratio > 1]
        if over:
            warnings.append(
                f"{where}, which counts GPU devices against quota.gpus: overcommitRatio "
                f"({', '.join(over)}) has no Kueue equivalent, and neither has a Queue "
                "overcommitRatio; Kueue admits no more than the quota plus what it borrows"
            )
        if spec.deserved:
            warnings.append(
                f"{where}: queueSpec.deserved has no Kueue field; its share of the cohort is "
                "its nominalQuota (quota.gpus), and fairSharing.weight (weight) for what it borrows"
            )
    return warnings
