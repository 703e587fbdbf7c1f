"""From a decoded review to a policy decision: the only place the webhook calls the policy core."""

from __future__ import annotations

from typing import Literal

from gpuwarden.policy import ClusterView, Decision, PolicySet, mutate, validate
from gpuwarden.policy.admission.validate import validate_config_map
from gpuwarden.policy.pod.resources import requests_gpu
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
    """A request that could start GPU use: a new GPU pod, or GPU ephemeral containers."""
    guarded = review.operation == "CREATE" or review.sub_resource == "ephemeralcontainers"
    return guarded and review.obj is not None and requests_gpu(review.obj)


def _refusal(
    review: Review, policy_error: str | None, namespace_error: str | None, no_policy: bool
) -> Decision | None:
    """The refusal of a GPU request while no policy is loaded, or its namespace is unknown."""
    if no_policy:
        return Decision(
            allowed=False,
            code=403,
            reason="Forbidden",
            message=no_policy_message(policy_error),
            rule=NO_POLICY_REASON,
        )
    if namespace_error is not None:
        return Decision(
            allowed=False,
            code=503,
            reason="ServiceUnavailable",
            message=namespace_unknown_message(review.namespace, namespace_error),
            rule=NAMESPACE_UNKNOWN_RULE,
        )
    return None


def decide(
    endpoint: Endpoint,
    review: Review,
    policies: PolicySet | None,
    cluster: ClusterView,
    *,
    policy_error: str | None = None,
    namespace_error: str | None = None,
) -> Decision:
    """The decision for one review; raises ReviewError for a request that makes no sense.

    ``namespace_error`` says the request's namespace is not in ``cluster`` and could not be
    read: its tenant is unknown, so GPU pods are refused (fail closed for gpuwarden's scope)
    and everything else is admitted unchanged.
    """
    if review.is_config_map:
        # The keys a pod's envFrom makes into variables, judged when they change (validating
        # only; with no policy loaded, ConfigMaps go ahead like every other non-GPU object).
        if endpoint != "validate" or policies is None or review.obj is None:
            return Decision()
        return validate_config_map(review.admission_request(), policies, cluster)
    if review.is_job:
        return decide_job(
            endpoint == "mutate",
            review,
            policies,
            cluster,
            _refusal(review, policy_error, namespace_error, policies is None),
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
    if (policies is None or namespace_error is not None) and _guarded_gpu_pod(review):
        refused = _refusal(review, policy_error, namespace_error, policies is None)
        assert refused is not None
        return refused
    if policies is None or namespace_error is not None:
        # Fail closed for our scope: GPU pods wait for a policy, everything else goes ahead.
        return Decision()
    request = review.admission_request()
    if endpoint == "mutate":
        return mutate(request, policies, cluster)
    return validate(request, policies, cluster)


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
