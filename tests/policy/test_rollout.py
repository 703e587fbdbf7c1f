"""Audit and dryrun (spec.enforcementAction, a tenant's own, the webhook's default): a denial
becomes an admitted pod with warnings and audit annotations; under dryrun the pod is left as
sent and its patch listed. Issue 32, item 1."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.policy import ClusterView, PolicyError, PolicySet, admit, mutate, validate
from gpuwarden.policy.admission.decision import MAX_WARNING, MAX_WARNINGS

from .support import create, gpu_pod, load_texts, policies_from, policy_text

CLUSTER = ClusterView()
SPEC = """
profiles:
  - {name: shared, maxMemory: 8Gi}
  - {name: whole, gpuShare: false, gpus: 4, maxMemory: 80Gi}
tenants:
  - name: team
    namespaces: [team]
    limits: {maxGpusPerPod: 2}
  - name: trial
    namespaces: [trial]
    limits: {maxGpusPerPod: 2}
    enforcementAction: audit
  - name: watch
    namespaces: [watch]
    limits: {maxGpusPerPod: 2}
    enforcementAction: dryrun
"""


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return policies_from(SPEC)


def whole_pod(namespace: str) -> dict[str, Any]:
    return gpu_pod(namespace=namespace, labels={"gpuwarden.io/profile": "whole"})


def test_enforce_denies_as_before(policies: PolicySet) -> None:
    result = admit(create(whole_pod("team")), policies, CLUSTER)
    assert not result.allowed
    assert result.validation.audited is None
    assert result.validation.audit_annotations["denied-by"] == "tenant_limits"


def test_a_tenant_under_audit_is_admitted_with_what_would_be_denied(policies: PolicySet) -> None:
    enforced = admit(create(whole_pod("team")), policies, CLUSTER).validation
    result = admit(create(whole_pod("trial")), policies, CLUSTER)
    assert result.allowed
    validation = result.validation
    assert validation.code == 200 and validation.message == ""
    assert validation.audited == "tenant_limits"
    said = " ".join(validation.warnings)
    assert said.startswith("gpuwarden (audit) would deny the pod: the pod would get 4 GPUs")
    assert "tenant trial allows at most 2 per pod" in said
    assert all(len(line) < MAX_WARNING for line in validation.warnings)
    assert len(validation.warnings) <= MAX_WARNINGS
    assert validation.audit_annotations["would-deny"] == "tenant_limits"
    assert validation.audit_annotations["would-deny-reason"] == "TenantLimit"
    assert validation.audit_annotations["would-deny-message"].startswith("gpuwarden denied the pod")
    assert "denied-by" not in validation.audit_annotations
    # The same words as the enforced denial, wrapped over lines.
    expected = enforced.message.replace("gpuwarden denied", "gpuwarden (audit) would deny")
    assert expected.replace("tenant team", "tenant trial") == said
    # Audit relaxes the denial only: the patch is applied as under enforce.
    assert result.mutation.patch and result.pod != create(whole_pod("trial")).pod


def test_the_policy_level_action_and_the_tenant_override(policies: PolicySet) -> None:
    audited_set = policies_from(SPEC + "enforcementAction: audit\n")
    # The set's audit holds for tenant team; the tenant trial's own audit too.
    assert admit(create(whole_pod("team")), audited_set, CLUSTER).allowed
    overriding = policies_from(
        SPEC.replace("enforcementAction: audit", "enforcementAction: enforce")
        + "enforcementAction: audit\n"
    )
    assert admit(create(whole_pod("team")), overriding, CLUSTER).allowed
    assert not admit(create(whole_pod("trial")), overriding, CLUSTER).allowed


def test_the_webhook_default_yields_to_the_policies(policies: PolicySet) -> None:
    request = create(whole_pod("team"))
    assert admit(request, policies, CLUSTER, default_action="audit").allowed
    assert validate(request, policies, CLUSTER, default_action="audit").allowed
    enforcing = policies_from(SPEC + "enforcementAction: enforce\n")
    assert not admit(request, enforcing, CLUSTER, default_action="audit").allowed


def test_dryrun_leaves_the_pod_as_sent_and_lists_the_patch(policies: PolicySet) -> None:
    shared = {"gpuwarden.io/profile": "shared"}
    request = create(gpu_pod(namespace="watch", labels=shared))
    enforced = mutate(create(gpu_pod(namespace="team", labels=shared)), policies, CLUSTER)
    decision = mutate(request, policies, CLUSTER)
    assert decision.patch == () and decision.audited == "mutation"
    count = len(enforced.patch)
    assert decision.warnings[0] == (
        f"gpuwarden (dryrun): the pod is left as sent; enforced, profile shared would make "
        f"{count} patch operations:"
    )
    assert decision.warnings[1].startswith("gpuwarden: would ")
    assert len(decision.warnings) == min(count + 1, MAX_WARNINGS)
    assert decision.audit_annotations["would-patch-operations"] == str(count)
    result = admit(request, policies, CLUSTER)
    assert result.allowed and result.pod == request.pod


def test_dryrun_judges_the_pod_the_mutation_would_have_made(policies: PolicySet) -> None:
    """The validating webhook sees the pod unmutated under dryrun; it reports what enforcing
    would deny (the profile's 4 GPUs), not what the mutation would have fixed."""
    request = create(whole_pod("watch"))
    decision = validate(request, policies, CLUSTER)
    assert decision.allowed and decision.audited == "tenant_limits"
    assert "would get 4 GPUs" in " ".join(decision.warnings)
    shared = {"gpuwarden.io/profile": "shared"}
    plain = validate(create(gpu_pod(namespace="watch", labels=shared)), policies, CLUSTER)
    assert plain.allowed and plain.audited is None and not plain.warnings


def test_two_policies_may_not_set_different_actions() -> None:
    with pytest.raises(PolicyError) as caught:
        load_texts(
            [
                ("a.yaml", policy_text(SPEC + "enforcementAction: audit\n", name="a")),
                ("b.yaml", policy_text("enforcementAction: enforce\n", name="b")),
            ]
        )
    assert "policy 'a' sets audit for the whole set" in str(caught.value)
