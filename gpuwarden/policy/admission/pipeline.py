"""Admission as the API server runs it: mutate, apply the patch, then validate the final pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonpatch

from gpuwarden.policy.admission.decision import AdmissionRequest, ClusterView, Decision
from gpuwarden.policy.admission.mutate import mutation
from gpuwarden.policy.admission.validate import validate
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


def admit(request: AdmissionRequest, policies: PolicySet, cluster: ClusterView) -> Admission:
    """Mutate, then validate the pod as the patch leaves it. A pod the mutation placed and left
    as it was is decided once: the validation reuses what the mutation read and placed. A pod
    the patch changed is read and placed again, as the API server's validating call would: the
    patch's annotations and GPU counts can move it to another rule."""
    mutated = mutation(request, policies, cluster)
    final = request._replace(pod=mutated.pod)
    validation = validate(final, policies, cluster, placed=mutated.placed)
    return Admission(mutated.decision, validation, mutated.pod)
