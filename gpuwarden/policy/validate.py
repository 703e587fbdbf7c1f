"""The validating decision (being written): judged on the final, mutated pod."""

from __future__ import annotations

from gpuwarden.policy.decision import AdmissionRequest, ClusterView, Decision
from gpuwarden.policy.policyset import PolicySet


def validate(request: AdmissionRequest, policies: PolicySet, cluster: ClusterView) -> Decision:
    del request, policies, cluster
    return Decision()
