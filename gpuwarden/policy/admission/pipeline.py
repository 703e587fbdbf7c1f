"""Admission as the API server runs it: mutate, apply the patch, then validate the final pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import jsonpatch

from gpuwarden.policy.admission.decision import AdmissionRequest, ClusterView, Decision
from gpuwarden.policy.admission.mutate import mutate_pod
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
    mutation, pod = mutate_pod(request, policies, cluster)
    validation = validate(replace(request, pod=pod), policies, cluster)
    return Admission(mutation, validation, pod)
