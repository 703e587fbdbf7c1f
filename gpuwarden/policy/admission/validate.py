"""The validating decision, judged on the final (mutated) pod. Validation never mutates.

Each check (checks/) returns the violations it finds; the first violation denies, and its message
names the field and says what to change. Which checks apply is the tenant's ``enforcement``
setting (all on by default). The mutator and the validator agree by construction: the scheduling
check re-runs the mutation on the final pod and reports any field it would still change, so a pod
the mutator produced is never denied for something the mutator did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic.alias_generators import to_camel

from gpuwarden.policy.admission.checks import (
    CheckContext,
    Violation,
    checks_for,
    request_kind,
)
from gpuwarden.policy.admission.checks.base import MAX_SHOWN
from gpuwarden.policy.admission.checks.escapes import config_map_violations
from gpuwarden.policy.admission.decision import AdmissionRequest, ClusterView, Decision, warning
from gpuwarden.policy.admission.mutate import (
    Placed,
    context_of,
    mutation,
    plan,
    size_problems,
)
from gpuwarden.policy.admission.placement import Placement, place
from gpuwarden.policy.admission.rollout import audited
from gpuwarden.policy.pod.resources import labels_of
from gpuwarden.policy.pod.view import PodView
from gpuwarden.policy.render import kueue
from gpuwarden.policy.spec.model import EnforcementAction
from gpuwarden.policy.spec.policyset import PolicySet

# A denial's message stays within the 1 KiB an Event's note keeps (NoteLengthLimit in kubernetes
# pkg/apis/core/validation/events.go, which the scheduler also cuts its messages to): controllers
# report a pod they could not create in an Event. The first violations, then a count of the rest.
MAX_MESSAGE = 1024


#: The checks that keep a pod inside its GPUs, run in namespaces of no tenant too.
ESCAPE_CHECKS = frozenset(
    {"environment", "host_paths", "privileged", "host_namespaces", "annotations"}
)
#: Checks no tenant can turn off.
_ALWAYS = frozenset({"quantities", "annotations"})


def violations(
    request: AdmissionRequest,
    policies: PolicySet,
    cluster: ClusterView,
    placed: Placed | None = None,
) -> tuple[Placement, list[Violation]]:
    """Every violation of the pod, in check order (for `explain` and tests). ``placed``: what a
    mutation that left this very pod as it was read and placed of it."""
    if placed is None:
        view = PodView.of(request.pod)
        placement = place(view, request.namespace, cluster.labels_for(request.namespace), policies)
    else:
        view, placement = placed
    found: list[Violation] = []
    if placement.problems and request.operation == "CREATE":
        found += [Violation("placement", "ProfileSelection", p) for p in placement.problems]
    if request.operation == "CREATE":
        found += [
            Violation("placement", "TooManyGPUContainers", p) for p in size_problems(placement)
        ]
    tenant = placement.tenant
    # Escapes are denied in every namespace the webhook sees, tenant or not; a namespace of no
    # tenant has no limits, quota or profile to check.
    enforcement = tenant.enforcement if tenant is not None else None
    context = CheckContext(request, view, placement, cluster, policies, settled=placed is not None)
    for check in checks_for(request_kind(request)):
        switch = check.switch
        if enforcement is None and switch not in ESCAPE_CHECKS:
            continue
        if enforcement is not None and switch not in _ALWAYS and not getattr(enforcement, switch):
            continue
        # A count the placement could not read is also an invalid quantity: say it once.
        found += [v for v in check.find(context) if v.message not in placement.problems]
    return placement, found


def kueue_template_warnings(request: AdmissionRequest, placement: Placement) -> tuple[str, ...]:
    """A new pod of a job Kueue admitted whole (Kueue's podset label, which it puts on the job's
    pod templates when it admits the job): Kueue charged what the template asks, and a profile
    that decides the GPU request itself makes the pod ask for something else (kueue.py). The
    final pod no longer shows what the template asked, so the warning names what the profile
    does to it."""
    if request.operation != "CREATE" or request.sub_resource or not placement.governed:
        return ()
    if kueue.PODSET_LABEL not in labels_of(request.pod) or placement.profile is None:
        return ()
    rewrite = kueue.template_rewrite(placement.profile, plan(placement))
    if rewrite is None:
        return ()
    return (warning(f"gpuwarden: Kueue charged the job's template, but {rewrite.why}"),)


def validate(
    request: AdmissionRequest,
    policies: PolicySet,
    cluster: ClusterView,
    *,
    placed: Placed | None = None,
    default_action: EnforcementAction = "enforce",
) -> Decision:
    """The validating decision on the final pod under its enforcementAction (``default_action``
    where the policies set none); ``placed`` as for violations().

    Under dryrun the mutating webhook left a new pod as it was sent, so the pod is judged as
    the mutation would have left it: what enforcing would have denied, not what it would have
    fixed."""
    decision = enforced_validation(request, policies, cluster, placed=placed)
    action = policies.action_for(decision.tenant, default_action)
    if action == "dryrun" and placed is None and request.operation == "CREATE":
        mutated = mutation(request, policies, cluster)
        if mutated.decision.patch:
            final = request._replace(pod=mutated.pod)
            decision = enforced_validation(final, policies, cluster, placed=mutated.placed)
    return audited(decision, action)


def enforced_validation(
    request: AdmissionRequest,
    policies: PolicySet,
    cluster: ClusterView,
    *,
    placed: Placed | None = None,
) -> Decision:
    """The validating decision on the final pod as enforced; ``placed`` as for violations()."""
    pod = request.pod
    if request.operation not in ("CREATE", "UPDATE") or not isinstance(pod.get("spec"), Mapping):
        return Decision()
    if pod.get("kind", "Pod") != "Pod":
        return Decision()
    if request.sub_resource not in ("", "ephemeralcontainers", "resize"):
        return Decision()
    placement, found = violations(request, policies, cluster, placed)
    base = context_of(placement, warnings=kueue_template_warnings(request, placement))
    if not found:
        return base
    first = found[0]
    policy = placement.profile.policy if placement.profile else ",".join(policies.names)
    if first.check in _TENANT_CHECKS and placement.tenant is not None:
        # The tenant's limits and quota come from the document that defines the tenant, which
        # may be a team's file beside the one that defines the profile.
        owner = policies.tenant_policy(placement.tenant)
        policy = owner.metadata.name if owner is not None else policy
    return base._replace(
        allowed=False,
        code=403,
        reason=first.reason,
        message=_denial(
            "pod",
            found,
            f"[policy {_cut(policy, 80)}, check {to_camel(first.check)}, {placement.origin}]",
        ),
        audit_annotations={"denied-by": first.check, "reason": first.reason},
    )


# The checks whose limits the tenant sets (spec.tenants[].limits), not the profile.
_TENANT_CHECKS = frozenset({"tenant_limits", "gpu_memory_quota"})


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def _denial(subject: str, found: Sequence[Violation], tail: str) -> str:
    """The denial's message within MAX_MESSAGE: as many of the first MAX_SHOWN violations as
    fit (the first always, cut if it must be), then how many more there are, then ``tail``."""
    head = f"gpuwarden denied the {subject}: "
    room = MAX_MESSAGE - len(head) - len(tail) - len("; and 1000000 more ")
    shown = [_cut(found[0].message, room)]
    used = len(shown[0])
    for violation in found[1:MAX_SHOWN]:
        used += len(violation.message) + 2
        if used > room:
            break
        shown.append(violation.message)
    more = f"; and {len(found) - len(shown)} more" if len(found) > len(shown) else ""
    return f"{head}{'; '.join(shown)}{more} {tail}"


def validate_config_map(
    request: AdmissionRequest,
    policies: PolicySet,
    cluster: ClusterView,
    *,
    default_action: EnforcementAction = "enforce",
) -> Decision:
    """A ConfigMap's keys become variables in every container whose envFrom names it (without a
    prefix), at each container start, so a ConfigMap changed after its pods were admitted is
    judged itself: keys named as the variables the environment check denies are denied, in
    every namespace the webhook sees unless its tenant turns that check off. (A prefix that could
    make a denied variable is denied on the pod, whatever the ConfigMap holds.)"""
    config_map = request.pod
    if request.operation not in ("CREATE", "UPDATE"):
        return Decision()
    tenant = policies.tenant_for(request.namespace, cluster.labels_for(request.namespace))
    base = Decision(tenant=tenant.name if tenant is not None else None)
    if tenant is not None and not tenant.enforcement.environment:
        return base
    found = config_map_violations(config_map)
    if not found:
        return base
    action = policies.action_for(base.tenant, default_action)
    return audited(_config_map_denial(base, found, policies), action)


def _config_map_denial(base: Decision, found: Sequence[Violation], policies: PolicySet) -> Decision:
    return base._replace(
        allowed=False,
        code=403,
        reason=found[0].reason,
        message=_denial(
            "ConfigMap", found, f"[policy {_cut(','.join(policies.names), 80)}, check environment]"
        ),
        audit_annotations={"denied-by": "environment", "reason": found[0].reason},
    )
