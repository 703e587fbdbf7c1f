"""Admission as the API server runs it: mutate, apply the patch, then validate the final pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonpatch

from gpuwarden.policy.admission.decision import AdmissionRequest, ClusterView, Decision
from gpuwarden.policy.admission.mutate import mutation
from gpuwarden.policy.admission.rollout import audited, reported
from gpuwarden.policy.admission.validate import enforced_validation
from gpuwarden.policy.spec.model import EnforcementAction
from gpuwarden.policy.spec.policyset import PolicySet


@dataclass(frozen=True)
class Admission:
    mutation: Decision
    validation: Decision
    pod: Mapping[str, Any]  # the pod after the mutation

    @property
    def allowed(self) -> bool:
        return self.mutation.allowed and self.validation.allowed

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.mutation.warnings + self.validation.warnings


def apply_patch(pod: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
    if not decision.patch:
        return dict(pod)
    result: dict[str, Any] = jsonpatch.apply_patch(dict(pod), list(decision.patch))
    return result


def enforced(request: AdmissionRequest, policies: PolicySet, cluster: ClusterView) -> Admission:
    """Mutate, then validate the pod as the patch leaves it, as enforcing would, whatever the
    enforcementAction (`gpuwarden audit` asks what enforcing would do). A pod the mutation
    placed and left as it was is decided once: the validation reuses what the mutation read
    and placed. A pod the patch changed is read and placed again, as the API server's
    validating call would: the patch's annotations and GPU counts can move it to another rule."""
    mutated = mutation(request, policies, cluster)
    final = request._replace(pod=mutated.pod)
    validation = enforced_validation(final, policies, cluster, placed=mutated.placed)
    return Admission(mutated.decision, validation, mutated.pod)


def admit(
    request: AdmissionRequest,
    policies: PolicySet,
    cluster: ClusterView,
    *,
    default_action: EnforcementAction = "enforce",
) -> Admission:
    """What the webhooks answer, in order (see enforced()), under the pod's enforcementAction
    (``default_action`` where the policies set none): under audit and dryrun nothing is denied,
    and under dryrun the pod is stored as it was sent (rollout.py)."""
    result = enforced(request, policies, cluster)
    mutated, validation = result.mutation, result.validation
    action = policies.action_for(validation.tenant or mutated.tenant, default_action)
    if action == "enforce":
        return result
    pod = request.pod if action == "dryrun" else result.pod
    return Admission(reported(mutated, action), audited(validation, action), pod)
