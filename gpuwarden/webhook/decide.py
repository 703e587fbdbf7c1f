"""From a decoded review to a policy decision: the only place the webhook calls the policy core."""

from __future__ import annotations

from typing import Literal

from pydantic.alias_generators import to_camel

from gpuwarden.policy import ClusterView, Decision, PolicySet, mutate, validate
from gpuwarden.policy.admission.mutate import Placed
from gpuwarden.policy.admission.placement import place
from gpuwarden.policy.admission.rollout import audited
from gpuwarden.policy.admission.validate import (
    ESCAPE_CHECKS,
    MAX_MESSAGE,
    validate_config_map,
    violations,
)
from gpuwarden.policy.pod.resources import reaches_accelerator
from gpuwarden.policy.pod.view import PodView
from gpuwarden.policy.spec.model import EnforcementAction
from gpuwarden.webhook.jobdecide import decide_job
from gpuwarden.webhook.podshape import ShapeError, check_pod
from gpuwarden.webhook.review import Review, ReviewError

Endpoint = Literal["mutate", "validate"]
FailureMode = Literal["allow", "deny"]

NO_POLICY_REASON = "gpuwarden-no-policy"
NAMESPACE_UNKNOWN_RULE = "namespace-unknown"


def no_policy_message(error: str | None) -> str:
    """What a user whose GPU pod is refused for lack of a policy is told (the first problem)."""
    first = error.splitlines()[0] if error else "no policy loaded yet"
    return (
        "gpuwarden has no valid GPU policy loaded, so pods that request GPUs are refused until "
        "one is served (fix the policy files or the ConfigMap and the webhook reloads it): "
        f"{first}"
    )


def namespace_unknown_message(namespace: str, error: str) -> str:
    """What a user whose GPU pod is refused because its namespace could not be read is told."""
    return (
        f"gpuwarden could not read namespace {namespace} to find its tenant ({error}), so pods "
        "that request GPUs are refused for now; retry in a moment (controllers retry on their own)"
    )


def _guarded_gpu_pod(review: Review) -> bool:
    """A request that could start GPU use: a new pod, or ephemeral containers, that may reach a
    device by any route (a GPU of any vendor, a DRA device class's resource, a CDI annotation)."""
    guarded = review.operation == "CREATE" or review.sub_resource == "ephemeralcontainers"
    return guarded and review.obj is not None and reaches_accelerator(review.obj)


def decide(
    endpoint: Endpoint,
    review: Review,
    policies: PolicySet | None,
    cluster: ClusterView,
    *,
    policy_error: str | None = None,
    namespace_error: str | None = None,
    default_action: EnforcementAction = "enforce",
) -> Decision:
    """The decision for one review; raises ReviewError for a request that makes no sense.

    ``default_action`` (``serve --enforcement-action``) is the enforcementAction of policies
    that set none; with no policy loaded it decides alone whether GPU pods are refused.

    ``namespace_error`` says the request's namespace is not in ``cluster`` and could not be
    read: its tenant is unknown, so GPU pods are refused (fail closed for gpuwarden's scope),
    other pods are validated against every escape check (no tenant can have turned one off),
    and nothing is mutated.
    """
    if review.is_config_map:
        # The keys a pod's envFrom makes into variables, judged when they change (validating
        # only; with no policy loaded, ConfigMaps go ahead like every other non-GPU object).
        if endpoint != "validate" or policies is None or review.obj is None:
            return Decision()
        return validate_config_map(
            review.admission_request(), policies, cluster, default_action=default_action
        )
    if review.is_job:
        refused = None
        if policies is None or namespace_error is not None:
            unavailable = _unavailable(review, policies, policy_error, namespace_error)
            refused = _refusal(endpoint, unavailable, _fallback_action(policies, default_action))
        return decide_job(
            endpoint == "mutate", review, policies, cluster, refused, default_action=default_action
        )
    if not review.is_pod or review.operation in ("DELETE", "CONNECT"):
        return Decision()
    if review.obj is None:
        raise ReviewError(f"request.object is missing for a {review.operation} of a Pod")
    try:
        check_pod(review.obj, "request.object")
        if review.old_obj is not None:
            check_pod(review.old_obj, "request.oldObject")
    except ShapeError as exc:
        raise ReviewError(str(exc)) from None
    if policies is None or namespace_error is not None:
        action = _fallback_action(policies, default_action)
        if _guarded_gpu_pod(review):
            refused = _unavailable(review, policies, policy_error, namespace_error)
            return _refusal(endpoint, refused, action)
        if policies is not None and namespace_error is not None and endpoint == "validate":
            escapes = _escapes_without_namespace(review, policies, cluster, namespace_error)
            return audited(escapes, action)
        # Fail closed for our scope: GPU pods wait for a policy, everything else goes ahead.
        return Decision()
    request = review.admission_request()
    if endpoint == "mutate":
        return mutate(request, policies, cluster, default_action=default_action)
    return validate(request, policies, cluster, default_action=default_action)


def _unavailable(
    review: Review,
    policies: PolicySet | None,
    policy_error: str | None,
    namespace_error: str | None,
) -> Decision:
    """The refusal of a GPU request while no policy is loaded, or its namespace is unknown."""
    if policies is None or namespace_error is None:
        return Decision(
            allowed=False,
            code=403,
            reason="Forbidden",
            message=no_policy_message(policy_error),
            rule=NO_POLICY_REASON,
        )
    return Decision(
        allowed=False,
        code=503,
        reason="ServiceUnavailable",
        message=namespace_unknown_message(review.namespace, namespace_error),
        rule=NAMESPACE_UNKNOWN_RULE,
    )


def _fallback_action(
    policies: PolicySet | None, default_action: EnforcementAction
) -> EnforcementAction:
    """The action where the tenant is unknown: the set's own, or the webhook's."""
    return default_action if policies is None else policies.action_for(None, default_action)


def _refusal(endpoint: Endpoint, refused: Decision, action: EnforcementAction) -> Decision:
    """A refusal both webhooks answer when enforced; under audit and dryrun the validating one
    reports it (once) and the mutating one lets the pod through."""
    if action == "enforce":
        return refused
    return audited(refused, action) if endpoint == "validate" else Decision()


def _escapes_without_namespace(
    review: Review, policies: PolicySet, cluster: ClusterView, error: str
) -> Decision:
    """The validating decision on a pod whose namespace could not be read: its tenant, and so
    what the tenant's enforcement turns off, is unknown, so every escape check applies (as in a
    namespace of no tenant), and nothing else does."""
    request = review.admission_request()
    view = PodView.of(request.pod)
    placement = place(view, request.namespace, {}, policies)._replace(tenant=None)
    _, found = violations(request, policies, cluster, Placed(view, placement))
    escapes = [violation for violation in found if violation.check in ESCAPE_CHECKS]
    if not escapes:
        return Decision()
    first = escapes[0]
    more = f"; and {len(escapes) - 1} more" if len(escapes) > 1 else ""
    tail = (
        f" [check {to_camel(first.check)}; gpuwarden could not read namespace "
        f"{review.namespace} ({error}), so every escape check applies, whatever its tenant "
        "turns off]"
    )
    head = "gpuwarden denied the pod: "
    room = MAX_MESSAGE - len(head) - len(more) - len(tail)
    shown = first.message if len(first.message) <= room else first.message[: room - 3] + "..."
    return Decision(
        allowed=False,
        code=403,
        reason=first.reason,
        message=f"{head}{shown}{more}{tail}",
        rule=NAMESPACE_UNKNOWN_RULE,
        audit_annotations={"denied-by": first.check, "reason": first.reason},
    )


def failure_decision(mode: FailureMode, endpoint: Endpoint, uid: str) -> Decision:
    """The answer to a request whose evaluation failed inside gpuwarden."""
    if mode == "allow":
        return Decision(
            warnings=(
                f"gpuwarden: internal error evaluating this pod ({endpoint}); admitted "
                "unchanged because the webhook runs with --failure-mode allow",
            ),
            rule="internal-error",
        )
    return Decision(
        allowed=False,
        code=500,
        reason="InternalError",
        message=(
            f"gpuwarden could not evaluate this pod ({endpoint}, request {uid}): internal error; "
            "retry, and report it with this request id if it persists"
        ),
        rule="internal-error",
    )
