"""lint says when the policies leave governed Kubeflow profile namespaces without a tenant."""

from __future__ import annotations

from gpuwarden.policy import load_paths
from gpuwarden.policy.lint import lint_warnings

from .support import POLICIES, policies_from


def _untenanted(spec: str) -> list[str]:
    return [w for w in lint_warnings(policies_from(spec)) if "gets only the isolation checks" in w]


def test_tenants_listed_only_by_name_leave_new_profiles_unlimited() -> None:
    (warning,) = _untenanted("tenants: [{name: a, namespaces: [a]}]")
    assert warning.startswith("every tenant lists its namespaces by name: a Kubeflow profile ")
    assert "app.kubernetes.io/part-of: kubeflow-profile" in warning
    assert _untenanted("profiles: [{name: p, gpuShare: false}]")[0].startswith(
        "no tenant is defined"
    )


def test_a_tenant_that_selects_profile_namespaces_or_every_namespace_is_enough() -> None:
    for selector in ("{matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}}", "{}"):
        spec = (
            f"tenants: [{{name: a, namespaces: [a]}}, {{name: b, namespaceSelector: {selector}}}]"
        )
        assert _untenanted(spec) == []
    assert not [
        w for w in lint_warnings(load_paths([POLICIES])) if "gets only the isolation checks" in w
    ]
