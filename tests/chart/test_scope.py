"""The webhooks' matchConditions as the chart renders them equal what the policy core derives
from the same policies (gpuwarden.policy.render.scope), for every test values file and for rules that
widen the scope."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.policy import PolicySet, load_paths
from gpuwarden.policy.render.scope import chart_template, review_scope

from .support import CHART, FULLNAME, Rendering, template, values_files

WIDENING_POLICY = {
    "apiVersion": "gpuwarden.io/v1alpha1",
    "kind": "GPUPolicy",
    "metadata": {"name": "widening"},
    "spec": {
        "profiles": [{"name": "p", "gpuShare": False}],
        "workloads": [
            {"name": "steps", "match": {"kind": "kfp-step"}, "profile": "p"},
            {
                "name": "nb",
                "match": {"kind": "notebook"},
                "profile": "p",
                "requireGpuRequest": True,
            },
            {
                "name": "team",
                "match": {
                    "kind": "selector",
                    "labels": {
                        "matchLabels": {"team": "vision"},
                        "matchExpressions": [{"key": "tier", "operator": "Exists"}],
                    },
                    "annotations": {"example.com/gpu": "yes"},
                },
                "profile": "p",
            },
        ],
    },
}


def _policies(rendering: Rendering, directory: Path) -> PolicySet:
    """The policies ConfigMap as the webhook loads it."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, text in rendering.one("ConfigMap", f"{FULLNAME}-policies")["data"].items():
        (directory / key).write_text(text)
    return load_paths([directory])


def _conditions(rendering: Rendering) -> list[list[dict[str, Any]]]:
    return [
        hook["matchConditions"]
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for hook in rendering.one(kind)["webhooks"]
        if hook["name"] in ("mutate.gpuwarden.io", "validate.gpuwarden.io")
    ]


@pytest.mark.parametrize("values", ["", *values_files()], ids=lambda v: v or "defaults")
def test_the_chart_sends_what_the_policy_core_says(values: str, tmp_path: Path) -> None:
    rendering = template([values] if values else [])
    expected = review_scope(_policies(rendering, tmp_path / "p")).match_conditions()
    for conditions in _conditions(rendering):
        assert conditions == expected


def test_rules_that_give_gpus_unasked_widen_what_the_chart_sends(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"policies": {"widening.yaml": WIDENING_POLICY}}))
    rendering = template([values])
    scope = review_scope(_policies(rendering, tmp_path / "p"))
    assert scope.label_keys == ("pipelines.kubeflow.org/v2_component", "team", "tier")
    assert scope.annotation_keys == (
        "example.com/gpu",
        "pipelines.kubeflow.org/runtime-role",
        "pipelines.kubeflow.org/v2_component",
    )
    for conditions in _conditions(rendering):
        assert conditions == scope.match_conditions()


def test_all_pods_keeps_only_the_pod_condition() -> None:
    rendering = template(sets={"webhook.scope": "allPods"})
    for conditions in _conditions(rendering):
        assert [c["name"] for c in conditions] == ["pods-only"]


def test_the_fixed_parts_are_generated_from_the_policy_core() -> None:
    assert (CHART / "templates" / "_scope.tpl").read_text() == chart_template(), (
        "run .venv/bin/python hack/update-docs.py"
    )
