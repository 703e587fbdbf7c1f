"""What the tenant controller applies in a namespace (gpuwarden/policy/render/tenants.py)."""

from __future__ import annotations

from gpuwarden.policy import PolicySet, load_texts
from gpuwarden.policy.lint import lint_findings
from gpuwarden.policy.render.objects import RenderOptions, render
from gpuwarden.policy.render.tenants import namespace_objects

TENANTS = """
  backend: {type: volcano}
  profiles:
    - {name: shared, maxMemory: 8Gi, overcommitRatio: 2, priority: 100}
  defaultProfile: shared
  tenants:
    - name: vision
      namespaces: [vision]
      quota: {gpus: 4}
    - name: profiles
      namespaceSelector: {matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}}
      quota: {gpus: 2, hard: {pods: "10"}}
      limits: {gpuMemoryQuota: 16Gi}
"""
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}


def _policy(spec: str) -> PolicySet:
    text = "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: p}\nspec:\n" + spec
    return load_texts([("p.yaml", text)])


def test_a_label_selected_namespace_gets_what_render_writes_for_a_listed_one() -> None:
    got = namespace_objects(_policy(TENANTS), "alice", PROFILE, with_kueue=True)
    listed = TENANTS.replace(
        "namespaceSelector: {matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}}",
        "namespaces: [alice]",
    )
    rendered = render(_policy(listed), RenderOptions(kueue=True)).objects
    expected = [
        o
        for o in rendered
        if o["kind"] in ("ResourceQuota", "LocalQueue") and o["metadata"]["namespace"] == "alice"
    ]
    assert [o["kind"] for o in got] == ["ResourceQuota", "LocalQueue"]
    assert sorted(got, key=lambda o: o["kind"]) == sorted(expected, key=lambda o: o["kind"])
    assert got[0]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpuwarden"
    without_kueue = namespace_objects(_policy(TENANTS), "alice", PROFILE, with_kueue=False)
    assert [o["kind"] for o in without_kueue] == ["ResourceQuota"]


def test_listed_and_unselected_namespaces_need_nothing_from_the_controller() -> None:
    policies = _policy(TENANTS)
    # vision is listed by name: the chart's renderedObjects hold its quota, even if labelled.
    assert namespace_objects(policies, "vision", PROFILE, with_kueue=True) == []
    assert namespace_objects(policies, "elsewhere", {}, with_kueue=True) == []


def test_lint_says_the_controller_applies_label_selected_tenants_objects() -> None:
    _, notes = lint_findings(_policy(TENANTS))
    (note,) = [n for n in notes if "tenant profiles selects namespaces by label" in n]
    assert "app.kubernetes.io/part-of=kubeflow-profile" in note
    assert "the tenant controller" in note
    assert not [n for n in notes if "tenant vision selects" in n]
