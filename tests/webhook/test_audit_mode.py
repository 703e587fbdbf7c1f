"""Audit and dryrun over HTTPS (issue 32, item 1): with `serve --enforcement-action audit` a pod
the policies deny is admitted with the warning kubectl prints, the audit annotations and the
metric; a tenant's own enforcementAction wins; dryrun leaves the pod unpatched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuwarden.policy.pod import keys
from gpuwarden.webhook.app import Settings

from .support import BAD_POLICY, Webhook, apply_response, notebook_pod, review
from .test_denials_http import POLICY


def _big(namespace: str = "team-a") -> dict[str, Any]:
    pod = notebook_pod(namespace)
    pod["metadata"]["labels"][keys.PROFILE_LABEL] = "big"  # 4 GPUs: team-a allows 2
    return pod


@pytest.fixture
async def auditing(make_webhook: Callable[..., Any], workdir: Any) -> Webhook:
    workdir.write_policy(POLICY)
    hook: Webhook = await make_webhook(settings=Settings(enforcement_action="audit"))
    return hook


async def test_a_denied_pod_is_admitted_with_warnings_under_audit(auditing: Webhook) -> None:
    pod = _big()
    mutation = await auditing.admit("mutate", review(pod))
    assert mutation["allowed"] is True and "patch" in mutation  # audit still mutates
    response = await auditing.admit("validate", review(apply_response(pod, mutation)))
    assert response["allowed"] is True, response
    assert "status" not in response or response["status"].get("code", 200) == 200
    said = " ".join(response["warnings"])
    assert said.startswith("gpuwarden (audit) would deny the pod:")
    assert "allows at most 2 per pod" in said
    annotations = response["auditAnnotations"]
    assert annotations["would-deny"] == "tenant_limits"
    assert annotations["would-deny-reason"] == "TenantLimit"
    assert "allows at most 2 per pod" in annotations["would-deny-message"]
    _, metrics = await auditing.get("/metrics", metrics_port=True)
    assert (
        'gpuwarden_admission_audit_total{check="tenant_limits",endpoint="validate",'
        'tenant="team-a"} 1.0' in metrics
    )


async def test_a_tenant_that_enforces_is_denied_under_an_auditing_webhook(
    make_webhook: Callable[..., Any], workdir: Any
) -> None:
    workdir.write_policy(
        POLICY.replace("      limits:\n", "      enforcementAction: enforce\n      limits:\n", 1)
    )
    hook: Webhook = await make_webhook(settings=Settings(enforcement_action="audit"))
    pod = _big()
    mutated = apply_response(pod, await hook.admit("mutate", review(pod)))
    response = await hook.admit("validate", review(mutated))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403


async def test_dryrun_leaves_the_pod_unpatched(
    make_webhook: Callable[..., Any], workdir: Any
) -> None:
    workdir.write_policy(POLICY)
    hook: Webhook = await make_webhook(settings=Settings(enforcement_action="dryrun"))
    pod = _big()
    mutation = await hook.admit("mutate", review(pod))
    assert mutation["allowed"] is True
    assert "patch" not in mutation
    assert mutation["warnings"][0].startswith("gpuwarden (dryrun): the pod is left as sent")
    assert mutation["auditAnnotations"]["would-patch-operations"].isdigit()
    # The validating webhook gets the pod as sent and says what enforcing would have denied.
    response = await hook.admit("validate", review(pod))
    assert response["allowed"] is True
    assert "allows at most 2 per pod" in " ".join(response["warnings"])


async def test_with_no_valid_policy_an_auditing_webhook_refuses_nothing(
    make_webhook: Callable[..., Any], workdir: Any
) -> None:
    """The flag holds where no policy can say otherwise: a GPU pod goes ahead, the validating
    webhook saying (once) that enforcing would refuse it."""
    workdir.write_policy(BAD_POLICY)
    hook: Webhook = await make_webhook(settings=Settings(enforcement_action="audit"))
    mutation = await hook.admit("mutate", review(notebook_pod()))
    assert mutation["allowed"] is True and "warnings" not in mutation
    response = await hook.admit("validate", review(notebook_pod()))
    assert response["allowed"] is True
    said = " ".join(response["warnings"])
    assert said.startswith("gpuwarden (audit) would refuse the pod: gpuwarden has no valid GPU")
    assert response["auditAnnotations"]["would-deny"] == "gpuwarden-no-policy"
