"""The job webhooks' matchConditions as the chart renders them equal the policy core's
(gpuwarden.policy.render.scope.job_match_conditions), and webhook.scope allPods sends every job
(issue 30)."""

from __future__ import annotations

from typing import Any

from gpuwarden.policy.render.scope import JOBS_ONLY_CEL, job_match_conditions

from .support import template

JOB_WEBHOOKS = ("mutate-jobs.gpuwarden.io", "validate-jobs.gpuwarden.io")


def _job_hooks(sets: dict[str, str]) -> list[dict[str, Any]]:
    rendering = template(sets=sets)
    configs = [
        *rendering.all("MutatingWebhookConfiguration"),
        *rendering.all("ValidatingWebhookConfiguration"),
    ]
    return [h for c in configs for h in c["webhooks"] if h["name"] in JOB_WEBHOOKS]


def test_the_chart_sends_the_jobs_the_policy_core_scopes() -> None:
    hooks = _job_hooks({})
    assert [h["name"] for h in hooks] == list(JOB_WEBHOOKS)
    for hook in hooks:
        assert hook["matchConditions"] == job_match_conditions()


def test_all_pods_sends_every_job_and_jobs_false_none() -> None:
    for hook in _job_hooks({"webhook.scope": "allPods"}):
        assert hook["matchConditions"] == [
            {"name": "kubeflow-jobs-only", "expression": JOBS_ONLY_CEL}
        ]
    assert _job_hooks({"webhook.jobs": "false"}) == []
