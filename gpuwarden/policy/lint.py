"""What `gpuwarden lint` reports: risky but valid settings (warnings), and tenants and rules
that can never apply (errors; the loader's errors come first)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from pydantic.alias_generators import to_camel

from gpuwarden.policy.pod.workloads import KATIB_INJECTION, KATIB_INJECTION_ENABLED
from gpuwarden.policy.render.kueue import gpu_pools, shared_gpus_warnings, template_charge_errors
from gpuwarden.policy.render.objects import tenant_plans
from gpuwarden.policy.render.scope import review_scope
from gpuwarden.policy.spec.backends import reads_gpu_types, selects_shared_gpus
from gpuwarden.policy.spec.model import (
    Backend,
    DraBackend,
    Enforcement,
    GPUPolicy,
    HamiBackend,
    KatibTrialMatch,
    LabelSelector,
    NativeBackend,
    NvidiaBackend,
    Profile,
    SelectorMatch,
    Tenant,
    VolcanoBackend,
    WorkloadRule,
    quantity_value,
)
from gpuwarden.policy.spec.policyset import PolicySet
from gpuwarden.policy.spec.precedence import (
    NAMESPACE_NAME_LABEL,
    TenantMatch,
    rule_covers,
    rule_specificity,
    rules_overlap,
    selectors_overlap,
    shadowed_rules,
    tenant_problems,
    why_rule_wins,
    why_tenant_wins,
)
from gpuwarden.policy.spec.resolved import ResolvedProfile
from gpuwarden.policy.spec.selectors import describe_selector, selector_matches

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
    """Every warning and note (`lint_findings`), as one list."""
    warnings, notes = lint_findings(policies)
    return warnings + notes


def lint_findings(policies: PolicySet) -> tuple[list[str], list[str]]:
    """(warnings, notes): warnings are settings that do not do what they say, or rules and
    tenants that lose what they were likely written for; notes are what a valid setting needs
    from the cluster, which lint cannot see (a node's device plugin setting, a namespace's
    label), so `lint` prints them as `info:` and `--strict` ignores them."""
    warnings: list[str] = []
    notes: list[str] = []
    for name, profile in policies.profiles.items():
        backend = profile.backend or policies.profile_policy[name].spec.backend
        gpus = profile.gpus if profile.gpus is not None else 1
        if gpus and profile.gpu_share and isinstance(backend, NativeBackend):
            warnings.append(
                f"profile {name}: the native backend cannot share GPUs; pods get whole GPUs"
            )
        if gpus and profile.gpu_share and isinstance(backend, VolcanoBackend | HamiBackend):
            notes += _limiter_backend_warnings(name, profile, backend)
        if profile.gpu_types and not reads_gpu_types(backend, bool(profile.gpu_share)):
            warnings.append(
                f"profile {name}: gpuTypes has no effect on {backend.type} "
                f"{'shared' if profile.gpu_share else 'whole'} GPUs (only Volcano vGPU and HAMi "
                "read nvidia.com/use-gputype); select nodes by nvidia.com/gpu.product in "
                "nodeSelector instead"
            )
        if gpus and isinstance(backend, NvidiaBackend):
            warnings += _nvidia_warnings(name, profile)
        if gpus and profile.gpu_share and isinstance(backend, DraBackend):
            warnings += _dra_warnings(name, profile, backend, gpus)
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
        warnings += _dra_override_warnings(policies, tenant)
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
    notes += _memory_scaling_conflicts(policies)
    warnings += _selector_rules_after_other_kinds(policies)
    warnings += _untenanted_namespaces(policies)
    notes += _label_selected_tenant_objects(policies)
    notes += _katib_injection_warnings(policies)
    notes += _dra_shared_nodes_notes(policies)
    warnings += _kueue_queue_warnings(policies)
    warnings += _idle_stop_warnings(policies)
    return warnings, notes


def _idle_stop_warnings(policies: PolicySet) -> list[str]:
    """``idle.action: stop`` stops Kubeflow Notebooks only: a profile that other pods also get
    (a rule of another kind, or the default profile) notifies for those instead."""
    warnings: list[str] = []
    for name, profile in policies.profiles.items():
        if profile.idle is None or profile.idle.action != "stop":
            continue
        others = [
            f"rule {rule.name} (kind {rule.match.kind})"
            for rule, _ in policies.rules
            if rule.profile == name and rule.match.kind != "notebook"
        ]
        if policies.default_profile == name:
            others.append("the default profile")
        if others:
            warnings.append(
                f"profile {name}: idle.action stop stops Kubeflow Notebooks only, but "
                f"{', '.join(others)} gives it to other pods; the node agent notifies for "
                "those instead (an Event and a metric), and never stops training or serving"
            )
    return warnings


def _selector_rules_after_other_kinds(policies: PolicySet) -> list[str]:
    """A selector rule loaded after another policy's rules of other kinds loses every pod both
    match, however narrow it is: rules of different kinds are tried in load order
    (precedence.py), and narrowness only counts within a kind."""
    warnings: list[str] = []
    for index, (rule, policy) in enumerate(policies.rules):
        if not isinstance(rule.match, SelectorMatch):
            continue
        earlier: dict[str, list[str]] = {}
        for other, other_policy in policies.rules[:index]:
            if (
                other_policy is not policy
                and other.match.kind != rule.match.kind
                and rules_overlap(other, rule)
            ):
                earlier.setdefault(other_policy.metadata.name, []).append(other.name)
        if not earlier:
            continue
        before = "; ".join(f"policy {name}: {', '.join(names)}" for name, names in earlier.items())
        warnings.append(
            f"rule {rule.name} (policy {policy.metadata.name}, kind selector) loses every pod "
            f"that an earlier rule of another kind also matches ({before}): rules of different "
            "kinds are tried in load order, and a narrower match wins only within a kind; to "
            "change what one tenant's pods get, use that tenant's overrides"
        )
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


def _label_selected_tenant_objects(policies: PolicySet) -> list[str]:
    """Tenants that select namespaces by label get their ResourceQuota (and LocalQueue) from the
    tenant controller as each namespace appears, not from `render` (render/tenants.py)."""
    notes: list[str] = []
    for tenant in policies.tenants:
        if tenant.namespaces or tenant.namespace_selector is None:
            continue
        if tenant.quota is None and tenant.limits.gpu_memory_quota is None:
            continue
        notes.append(
            f"tenant {tenant.name} selects namespaces by label "
            f"({describe_selector(tenant.namespace_selector)}): render writes no ResourceQuota or "
            "LocalQueue for them; the tenant controller (the chart's tenantController) applies "
            "them in each such namespace as it appears"
        )
    return notes


def object_tenant_namespace_warnings(files: PolicySet, served: PolicySet) -> list[str]:
    """Namespaces that object tenants list by name: the chart selects listed namespaces by name
    from its policy files alone (_tenant-namespaces.tpl), so one only an object lists reaches
    the webhooks only if it carries the webhooks' namespace label."""
    listed = {ns for tenant in files.tenants for ns in tenant.namespaces}
    objects = {id(policy) for policy in _objects(files, served)}
    warnings: list[str] = []
    for policy in served.policies:
        if id(policy) not in objects:
            continue
        for tenant in policy.spec.tenants:
            unlisted = [ns for ns in tenant.namespaces if ns not in listed]
            if unlisted:
                warnings.append(
                    f"{OBJECT_PREFIX}{policy.metadata.name}: tenant {tenant.name} lists "
                    f"{', '.join(unlisted)} by name, but the chart's webhooks select namespaces "
                    "by name only from its policy files: pods there are never sent to gpuwarden "
                    "unless the namespace carries the label of webhook.namespaceSelector (a "
                    "Kubeflow profile namespace); label it, or list the tenant in the chart's "
                    "policies"
                )
    return warnings


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


def _dra_warnings(name: str, profile: Profile, backend: DraBackend, gpus: int) -> list[str]:
    """Settings of a shared profile that the dra backend's claim cannot carry."""
    out: list[str] = []
    if gpus > 1:
        out.append(
            f"profile {name}: gpus: {gpus} on the dra backend, where a shared pod gets one claim "
            "on a share of one device, so its pods are denied; set gpus: 1 or gpuShare: false"
        )
    if profile.overcommit_ratio is not None and profile.overcommit_ratio > 1:
        out.append(
            f"profile {name}: overcommitRatio {profile.overcommit_ratio:g} has no form on the dra "
            f"backend: its claim requests maxMemory of the devices' {backend.memory_capacity} "
            "capacity"
        )
    if profile.thread_percentage is not None and backend.cores_capacity is None:
        out.append(
            f"profile {name}: threadPercentage {profile.thread_percentage} is not reserved on "
            "the dra backend without backend.coresCapacity (a device capacity of 100 that "
            "claims reserve their share of)"
        )
    return out


def _dra_shared_nodes_notes(policies: PolicySet) -> list[str]:
    """Where the dra backend's shares land: on labelled nodes, which lint cannot see, or, with
    no sharedNodeLabels, on any node (kube-scheduler scores a claim-only pod alike on every node
    but for its CPU and memory), which can leave no node whole for multi-GPU pods."""
    shared: dict[str, tuple[DraBackend, list[str]]] = {}
    for name in policies.profiles:
        profile = policies.resolve(name, None)
        if profile.gpu_share and isinstance(profile.backend, DraBackend):
            key = profile.backend.model_dump_json()
            shared.setdefault(key, (profile.backend, []))[1].append(name)
    out: list[str] = []
    for backend, names in shared.values():
        profiles = f"profile{'s' if len(names) > 1 else ''} {', '.join(sorted(names))}"
        labels = ",".join(f"{k}={v}" for k, v in sorted(backend.shared_node_labels.items()))
        if labels:
            out.append(
                f"{profiles}: shared claims on the dra backend prefer nodes labelled {labels}; "
                "label as many nodes as the shares need at their peak"
            )
        else:
            out.append(
                f"{profiles}: shared claims on the dra backend may land on any node (kube-"
                "scheduler scores a pod whose GPU is a claim by its CPU and memory alone), which "
                "can leave no node whole for multi-GPU pods; set backend.sharedNodeLabels to "
                "keep them together"
            )
    return out


def _dra_override_warnings(policies: PolicySet, tenant: Tenant) -> list[str]:
    """A tenant override that makes a shared dra profile ask for more than one GPU."""
    out: list[str] = []
    for name in sorted(tenant.overrides):
        if name not in policies.profiles:
            continue  # the loader names an override of an unknown profile
        resolved = policies.resolve(name, tenant)
        own = policies.resolve(name, None)
        shared = resolved.gpu_share and isinstance(resolved.backend, DraBackend)
        if shared and resolved.gpus > 1 and (own.gpus, own.gpu_share) != (resolved.gpus, True):
            out.append(
                f"tenant {tenant.name}: its override of profile {name} asks for {resolved.gpus} "
                "shared GPUs on the dra backend, where a shared pod gets one claim on a share of "
                "one device, so its pods are denied; override gpus: 1 or gpuShare: false"
            )
    return out


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


# --- GPUPolicy objects: what each one overrides in the policy files ----------------------------

# How the webhook and its messages name a GPUPolicy object (gpuwarden.webhook.policies).
OBJECT_PREFIX = "gpupolicy/"
_LIMITS_AMOUNTS = ("max_gpus_per_pod", "max_gpu_memory_per_pod", "gpu_memory_quota")


def _objects(files: PolicySet, served: PolicySet) -> list[GPUPolicy]:
    """The policies of ``served`` that came from GPUPolicy objects: those not in ``files``."""
    file_names = {policy.metadata.name for policy in files.policies}
    return [policy for policy in served.policies if policy.metadata.name not in file_names]


def object_overrides(files: PolicySet, served: PolicySet) -> list[str]:
    """What each GPUPolicy object served with the policy files takes from them: the file
    tenants it takes namespaces from (and the limits it raises there), and the file rules it
    takes pods from (and the profile they get instead). ``served`` is the files with the
    objects, as the webhook composes them; one line per override, naming the object."""
    objects = {id(policy) for policy in _objects(files, served)}
    owners = [(tenant, policy) for policy in served.policies for tenant in policy.spec.tenants]
    lines: list[str] = []
    for index, (tenant, policy) in enumerate(owners):
        if id(policy) not in objects:
            continue
        for other_index, (other, other_policy) in enumerate(owners):
            if id(other_policy) in objects:
                continue
            for what, where, why in _tenant_takeovers(tenant, index, other, other_index):
                raised = _raised_limits(served, tenant, other)
                lines.append(
                    f"{OBJECT_PREFIX}{policy.metadata.name}: tenant {tenant.name} takes {what} "
                    f"from tenant {other.name} (policy {other_policy.metadata.name}){where}: "
                    f"{why}; "
                    + (
                        f"there it raises {', '.join(raised)}"
                        if raised
                        else "its limits there are no higher"
                    )
                )
    rules = list(served.rules)
    for rule, policy in rules:
        if id(policy) not in objects:
            continue
        for earlier, earlier_policy in rules:
            if id(earlier_policy) in objects or not _takes_pods(rule, earlier):
                continue
            which = "every pod it matches" if rule_covers(earlier, rule) else "the pods both match"
            outcome = (
                f"they get {_outcome(rule)} instead of {_outcome(earlier)}"
                if _outcome(rule) != _outcome(earlier)
                else f"they get the same {_outcome(rule)}, with this rule's other settings"
            )
            lines.append(
                f"{OBJECT_PREFIX}{policy.metadata.name}: rule {rule.name} takes {which} from "
                f"rule {earlier.name} (policy {earlier_policy.metadata.name}), in every "
                f"namespace: {why_rule_wins(rule, earlier)}; {outcome}"
            )
    return lines


def _tenant_takeovers(
    tenant: Tenant, index: int, other: Tenant, other_index: int
) -> list[tuple[str, str, str]]:
    """(the namespaces, where, why) the object's tenant takes from a file's tenant, which
    loads before it (precedence.py: a name beats a selector, a more specific selector a less)."""
    out: list[tuple[str, str, str]] = []
    theirs = TenantMatch(other, other_index, by_name=False)
    selector = other.namespace_selector
    if selector is not None:
        named = [
            ns
            for ns in tenant.namespaces
            if ns not in other.namespaces and selectors_overlap(selector, _named_namespace(ns))
        ]
        if named:
            plural = len(named) > 1
            out.append(
                (
                    f"namespace{'s' if plural else ''} {', '.join(named)}",
                    f", wherever that tenant's namespaceSelector ({describe_selector(selector)}) "
                    f"selects {'them' if plural else 'it'}",
                    why_tenant_wins(TenantMatch(tenant, index, by_name=True), theirs),
                )
            )
    mine = TenantMatch(tenant, index, by_name=False)
    if (
        tenant.namespace_selector is not None
        and selector is not None
        and selectors_overlap(tenant.namespace_selector, selector)
        and mine.rank < theirs.rank
    ):
        out.append(
            (
                "the namespaces both select "
                f"({describe_selector(tenant.namespace_selector)}; {describe_selector(selector)})",
                ", but those that tenant lists by name" if other.namespaces else "",
                why_tenant_wins(mine, theirs),
            )
        )
    return out


def _named_namespace(name: str) -> LabelSelector:
    return LabelSelector(match_labels={NAMESPACE_NAME_LABEL: name})


def _amount(value: int | str) -> Decimal:
    return Decimal(value) if isinstance(value, int) else quantity_value(value)


def _raised_limits(served: PolicySet, tenant: Tenant, other: Tenant) -> list[str]:
    """What ``tenant`` allows that ``other`` did not, as `field old -> new`."""
    mine, theirs = tenant.limits, other.limits
    out: list[str] = []
    for field in _LIMITS_AMOUNTS:
        new, old = getattr(mine, field), getattr(theirs, field)
        if old is not None and (new is None or _amount(new) > _amount(old)):
            out.append(f"{to_camel(field)} {old} -> {new if new is not None else 'unlimited'}")
    if theirs.allowed_profiles is not None:
        added = sorted(set(mine.allowed_profiles or served.profiles) - set(theirs.allowed_profiles))
        if added:
            out.append(f"allowedProfiles adds {', '.join(added)}")
    if theirs.require_shared and not mine.require_shared:
        out.append("requireShared true -> false")
    if mine.allow_resource_claims and not theirs.allow_resource_claims:
        out.append("allowResourceClaims false -> true")
    if tenant.allow_profile_label and not other.allow_profile_label:
        out.append("allowProfileLabel false -> true")
    for field in Enforcement.model_fields:
        if getattr(other.enforcement, field) and not getattr(tenant.enforcement, field):
            out.append(f"enforcement.{to_camel(field)} true -> false")
    for name in served.profiles:
        out += _raised_profile(name, served.resolve(name, other), served.resolve(name, tenant))
    return out


def _raised_profile(name: str, old: ResolvedProfile, new: ResolvedProfile) -> list[str]:
    out: list[str] = []
    if old.max_memory is not None and (new.max_memory is None or new.max_memory > old.max_memory):
        out.append(
            f"profile {name} maxMemory {old.max_memory_text} -> {new.max_memory_text or 'uncapped'}"
        )
    if new.gpus > old.gpus and new.gpus_set_by is not None:
        out.append(f"profile {name} gpus {old.gpus} -> {new.gpus}")
    old_threads, new_threads = old.thread_percentage or 100, new.thread_percentage or 100
    if new_threads > old_threads:
        out.append(f"profile {name} threadPercentage {old_threads} -> {new_threads}")
    if new.priority > old.priority:
        out.append(f"profile {name} priority {old.priority} -> {new.priority}")
    return out


def _takes_pods(rule: WorkloadRule, other: WorkloadRule) -> bool:
    """Whether a later rule wins over an earlier one for some pod: the same kind, narrower,
    and a pod may match both (rules of different kinds go by load order: the earlier wins)."""
    return (
        rule.match.kind == other.match.kind
        and rule_specificity(rule.match) > rule_specificity(other.match)
        and rules_overlap(rule, other)
    )


def _outcome(rule: WorkloadRule) -> str:
    return "no profile (skip)" if rule.skip else f"profile {rule.profile}"


def object_scope_warnings(files: PolicySet, served: PolicySet) -> list[str]:
    """Object rules that may give GPUs to pods asking for none, for pods the webhooks are never
    sent: the chart renders their CEL from its policy files alone (render/scope.py), so an
    object never widens it."""
    sent = review_scope(files)
    if sent.every_pod:
        return []
    warnings: list[str] = []
    objects = {id(policy) for policy in _objects(files, served)}
    for rule, policy in served.rules:
        if id(policy) not in objects:
            continue
        wanted = review_scope(replace(files, rules=((rule, policy),)))
        missing = [f"label {key}" for key in wanted.label_keys if key not in sent.label_keys]
        missing += [
            f"annotation {key}" for key in wanted.annotation_keys if key not in sent.annotation_keys
        ]
        if wanted.every_pod:
            unsent = "pods that carry nothing it could be sent by (its match names no label)"
        elif missing:
            unsent = f"pods known only by {', '.join(missing)}"
        else:
            continue
        warnings.append(
            f"{OBJECT_PREFIX}{policy.metadata.name}: rule {rule.name} may give GPUs to pods that "
            f"ask for none, but the webhooks' CEL, which the chart renders from its policy files "
            f"alone, does not send {unsent}: such pods are admitted without gpuwarden and the "
            "rule never applies to them; put the rule in the chart's policies, or set "
            "requireGpuRequest"
        )
    return warnings
