"""What each failurePolicy does in practice when gpuwarden is down.

The chart's webhooks are installed, gpuwarden serve is stopped (SIGKILL: as if it crashed), and
pods are created in a governed Kubeflow namespace and in namespaces outside gpuwarden's scope.
Switching failurePolicy goes through the chart's values (webhook.failurePolicy), rendered again
and installed over the running configuration, as `helm upgrade` would.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.gpuwardenserver import (
    wait_for,
)
from gpuwarden.lab.cluster.webhookstack import (
    KUBEFLOW_PROFILE_LABELS,
    RELEASE_NAMESPACE,
    Obj,
    WebhookStack,
    chart_values_for,
    chart_webhook_configurations,
    create_namespace,
    create_pod,
    gpu_probe_pod,
    pod_annotations,
    render_chart,
    wait_until_governed,
)
from gpuwarden.policy.render.scope import review_scope

from .controlplane import ControlPlane
from .webhook import (
    EXAMPLES_DIR,
    POLICY_TEST_PODS,
    AuditLog,
    api_error,
    example_pod,
    place_pod,
    plain_pod,
    pod_exists,
    read_pod,
    webhook_audit,
)


@dataclass(frozen=True)
class Scope:
    governed: str  # a Kubeflow profile namespace
    unlabelled: str  # not a Kubeflow profile namespace: outside the chart's namespaceSelector
    opted_out: str  # a Kubeflow profile namespace labelled gpuwarden.io/ignore

    def outside(self) -> list[str]:
        return [self.unlabelled, self.opted_out, "kube-system", RELEASE_NAMESPACE]


@pytest.fixture(scope="module")
def scope(gpuwarden: WebhookStack) -> Scope:
    api = gpuwarden.api
    governed = gpuwarden.tenant_namespace("e2e-fp")
    unlabelled, _ = create_namespace(api, "e2e-fp-plain")
    opted_out, _ = create_namespace(
        api, "e2e-fp-ignored", {**KUBEFLOW_PROFILE_LABELS, "gpuwarden.io/ignore": "true"}
    )
    create_namespace(api, RELEASE_NAMESPACE, name=RELEASE_NAMESPACE)
    return Scope(governed, unlabelled, opted_out)


@pytest.fixture(scope="module")
def gpuwarden_down(gpuwarden: WebhookStack, scope: Scope) -> Iterator[WebhookStack]:
    """The module's gpuwarden, killed; started again (and re-registered) at the end."""
    assert gpuwarden.server.running
    gpuwarden.server.kill()
    yield gpuwarden


def chart_configs_with(
    stack: WebhookStack, control_plane: ControlPlane, tmp_path: Path, mutating: str, validating: str
) -> list[Obj]:
    values = {
        **chart_values_for([stack.server.policies[0]]),
        "webhook": {"failurePolicy": {"mutating": mutating, "validating": validating}},
    }
    rendered = render_chart(control_plane.helm_path, values=values, workdir=tmp_path)
    return chart_webhook_configurations(
        rendered, base_url=stack.server.base_url, ca_bundle_b64=stack.server.ca_bundle_b64()
    )


def _outcome(stack: WebhookStack, pod: Obj, *, dry_run: bool) -> str:
    """ "created", or the name of the webhook whose call failed and blocked the pod."""
    try:
        create_pod(stack.api, pod, dry_run=dry_run)
    except ApiException as exc:
        _, text = api_error(exc)
        for hook in ("mutate.gpuwarden.io", "validate.gpuwarden.io"):
            if f'failed calling webhook "{hook}"' in text:
                return hook
        raise
    return "created"


def _assert_outside_scope_unaffected(stack: WebhookStack, scope: Scope) -> None:
    for namespace in scope.outside():
        pod = gpu_probe_pod(namespace)
        created = create_pod(stack.api, pod)
        assert "gpuwarden.io/profile" not in pod_annotations(created.pod), namespace
        assert created.pod["spec"]["schedulerName"] == "default-scheduler", namespace


def test_the_chart_defaults_to_fail(gpuwarden: WebhookStack) -> None:
    policies = {
        config["kind"]: hook["failurePolicy"]
        for config in gpuwarden.configs
        for hook in config["webhooks"]
    }
    assert policies == {
        "MutatingWebhookConfiguration": "Fail",
        "ValidatingWebhookConfiguration": "Fail",
    }


def test_fail_blocks_gpu_pods_but_not_cpu_pods_in_governed_namespaces(
    gpuwarden_down: WebhookStack, scope: Scope
) -> None:
    stack = gpuwarden_down
    pod = place_pod(example_pod("pytorchjob-worker"), scope.governed)
    with pytest.raises(ApiException) as refused:
        create_pod(stack.api, pod)
    status, text = api_error(refused.value)
    assert status == 500
    assert 'failed calling webhook "mutate.gpuwarden.io"' in text
    assert "connection refused" in text
    assert not pod_exists(stack.api, scope.governed, pod["metadata"]["name"])
    # The chart's matchConditions (webhook.scope: policies) keep a CPU pod away from the
    # webhook: the API server creates it while gpuwarden is down.
    cpu = plain_pod(scope.governed)
    create_pod(stack.api, cpu)
    assert pod_exists(stack.api, scope.governed, cpu["metadata"]["name"])
    _assert_outside_scope_unaffected(stack, scope)


def test_the_api_server_sends_exactly_the_pods_the_policy_core_would_act_on(
    gpuwarden_down: WebhookStack, scope: Scope
) -> None:
    """The CEL the chart renders against its Python twin, on every example and test pod: with
    gpuwarden down, a pod is created exactly when the twin says the webhook is not needed."""
    stack = gpuwarden_down
    review = review_scope(stack.policies)
    paths = [*sorted(EXAMPLES_DIR.glob("*.yaml")), *sorted(POLICY_TEST_PODS.glob("*.yaml"))]
    checked = {"created": 0, "sent": 0}
    pods = [
        (path.name, doc)
        for path in paths
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "Pod"
    ]
    for name, pod in pods:
        placed = place_pod(pod, scope.governed)
        outcome = _outcome(stack, placed, dry_run=True)
        expected = "mutate.gpuwarden.io" if review.needs_review(placed) else "created"
        assert outcome == expected, name
        checked["created" if outcome == "created" else "sent"] += 1
    # Both kinds of pod were seen, or the check proves nothing.
    assert checked["created"] and checked["sent"], checked


@pytest.mark.parametrize(
    ("mutating", "validating", "blocked_by"),
    [
        # The chart's suggestion for "pod creation must go on": not enough on its own, the
        # validating webhook still fails closed.
        ("Ignore", "Fail", "validate.gpuwarden.io"),
        ("Ignore", "Ignore", None),
    ],
)
def test_ignore_lets_pods_pass_unmutated(
    gpuwarden_down: WebhookStack,
    scope: Scope,
    control_plane: ControlPlane,
    audit_log: AuditLog,
    tmp_path: Path,
    mutating: str,
    validating: str,
    blocked_by: str | None,
) -> None:
    stack = gpuwarden_down
    stack.install(chart_configs_with(stack, control_plane, tmp_path, mutating, validating))
    expected = blocked_by or "created"
    # The API server's webhook informer picks the new configuration up asynchronously.
    wait_for(
        f"failurePolicy mutating={mutating} validating={validating} to take effect",
        lambda: _outcome(stack, gpu_probe_pod(scope.governed), dry_run=True) == expected,
    )

    pod = place_pod(example_pod("pytorchjob-worker"), scope.governed)
    assert _outcome(stack, pod, dry_run=False) == expected
    if blocked_by is None:
        stored_pod = read_pod(stack.api, scope.governed, pod["metadata"]["name"])
        # Through unchanged: no profile, no Volcano, no priority class.
        assert "gpuwarden.io/profile" not in pod_annotations(stored_pod)
        assert stored_pod["spec"]["schedulerName"] == "default-scheduler"
        assert "priorityClassName" not in stored_pod["spec"]
        event = audit_log.pod_creation(scope.governed, pod["metadata"]["name"])
        # The API server records that both webhooks failed open for this pod.
        assert webhook_audit(event, "failed-open.mutation.webhook.admission.k8s.io") == {
            "round_0_index_0": "mutate.gpuwarden.io"
        }
        assert webhook_audit(event, "failed-open.validating.webhook.admission.k8s.io") == {
            "round_0_index_0": "validate.gpuwarden.io"
        }
    else:
        assert not pod_exists(stack.api, scope.governed, pod["metadata"]["name"])
    _assert_outside_scope_unaffected(stack, scope)


def test_governance_resumes_when_gpuwarden_is_back(
    gpuwarden_down: WebhookStack, scope: Scope
) -> None:
    stack = gpuwarden_down
    stack.server.start()
    stack.install()  # the chart's defaults again: Fail
    wait_until_governed(stack.api, scope.governed, "kubeflow-profiles")
    created = create_pod(stack.api, place_pod(example_pod("pytorchjob-worker"), scope.governed))
    assert pod_annotations(created.pod)["gpuwarden.io/profile"] == "heavy-training"
    assert created.pod["spec"]["schedulerName"] == "volcano"
