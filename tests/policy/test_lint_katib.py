"""`gpuwarden lint` says where Katib trial rules cannot see trials: Katib labels trial pods only in
namespaces labelled katib.kubeflow.org/metrics-collector-injection=enabled."""

from __future__ import annotations

import pytest

from gpuwarden.policy import PolicySet
from gpuwarden.policy.lint import lint_warnings

from .support import policies_from

PROFILE = "profiles:\n  - {name: hpo, gpuShare: false}\n"
KATIB_RULE = "  - {name: trials, match: {kind: katib-trial}, profile: hpo}\n"


def katib_warnings(policies: PolicySet) -> list[str]:
    return [w for w in lint_warnings(policies) if "Katib" in w]


def test_default_policy_names_the_tenants_to_check(default_policies: PolicySet) -> None:
    assert katib_warnings(default_policies) == [
        "rules katib-trials, katib-multi-gpu-trials match Katib trials, but Katib labels trial "
        "pods only in namespaces labelled katib.kubeflow.org/metrics-collector-injection=enabled "
        "(elsewhere they are governed as the Job, training job or pipeline step they run): make "
        "sure the namespaces of tenants tenant-a, tenant-b, kubeflow-profiles carry it"
    ]


@pytest.mark.parametrize(
    "selector",
    [
        "{matchLabels: {katib.kubeflow.org/metrics-collector-injection: enabled}}",
        "{matchExpressions: [{key: katib.kubeflow.org/metrics-collector-injection, "
        "operator: In, values: [enabled]}]}",
    ],
)
def test_no_warning_where_every_tenant_selects_on_the_label(selector: str) -> None:
    spec = (
        f"{PROFILE}workloads:\n{KATIB_RULE}"
        f"tenants:\n  - {{name: research, namespaceSelector: {selector}, limits: {{maxGpusPerPod: 8}}}}\n"
    )
    assert katib_warnings(policies_from(spec)) == []


def test_a_tenant_naming_namespaces_is_not_sure_to_have_the_label() -> None:
    spec = (
        f"{PROFILE}workloads:\n{KATIB_RULE}"
        "tenants:\n"
        "  - name: research\n"
        "    namespaces: [hpo-lab]\n"
        "    namespaceSelector: {matchLabels: {katib.kubeflow.org/metrics-collector-injection: enabled}}\n"
        "    limits: {maxGpusPerPod: 8}\n"
    )
    [warning] = katib_warnings(policies_from(spec))
    assert warning.startswith("rule trials matches Katib trials, but Katib labels trial pods ")
    assert warning.endswith("make sure the namespaces of tenant research carry it")


def test_without_tenants_the_warning_points_at_the_trial_namespaces() -> None:
    [warning] = katib_warnings(policies_from(f"{PROFILE}workloads:\n{KATIB_RULE}"))
    assert warning.endswith("make sure the namespaces that run trials carry it")


def test_no_warning_without_katib_rules() -> None:
    spec = f"{PROFILE}workloads:\n  - {{name: nb, match: {{kind: notebook}}, profile: hpo}}\n"
    assert katib_warnings(policies_from(spec)) == []
