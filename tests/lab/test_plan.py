"""Planning without a cluster: each trace row's pod is decided once per strategy, and what the
replay makes of that decision for any attempt's pod is the webhook's answer for it; the GPU
memory the replay's view charges each namespace is kept up to date as pods come and go."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuwarden.lab.cluster.controlplane import REPO_ROOT
from gpuwarden.lab.inputs.defaulttrace import busy_week, default_namespaces
from gpuwarden.lab.inputs.trace import row_pod
from gpuwarden.lab.planning.plan import attempt_pod, plan_strategy
from gpuwarden.lab.planning.strategies import (
    Layout,
    Strategy,
    builtin_strategies,
    strategy_from_texts,
)
from gpuwarden.lab.replay.admitted import AdmittedMemory
from gpuwarden.policy import AdmissionRequest, admit, validate

GIB = Decimal(2**30)


def _strategy(name: str) -> Strategy:
    if name == "default-policy-with-quota":
        # The default policy with a GPU memory quota for the trace's Profile namespaces, so
        # the GPU memory their live pods hold decides some pods.
        text = (REPO_ROOT / "policies" / "default.yaml").read_text()
        limits = "      limits:\n        # One node's GPUs"
        assert text.count(limits) == 1
        text = text.replace(
            limits, limits.replace("limits:", "limits:\n        gpuMemoryQuota: 400Gi")
        )
        return strategy_from_texts(name, [("default.yaml", text)])
    return next(s for s in builtin_strategies(REPO_ROOT / "policies") if s.name == name)


@pytest.mark.parametrize("name", ["sharing-only", "default-policy", "default-policy-with-quota"])
def test_a_planned_decision_is_the_webhooks_answer_for_every_attempt(name: str) -> None:
    strategy = _strategy(name)
    assert strategy.policies is not None
    denied = 0
    rows = busy_week()[:200]
    plan = plan_strategy(strategy, Layout(), rows, default_namespaces())
    assert sorted(plan.decisions) == sorted(r.row for r in rows)
    # The replay's view once tenants hold GPU memory: some pods are now past their quota.
    for held in (Decimal(0), 150 * GIB, 700 * GIB):
        view = type(plan.view)(
            namespace_labels=plan.view.namespace_labels,
            priority_classes=plan.view.priority_classes,
            namespace_gpu_memory={ns: held for ns in default_namespaces()},
        )
        for row in rows:
            pod = row_pod(row, f"{row.name}-{row.row}-2")
            request = AdmissionRequest(operation="CREATE", namespace=row.namespace, pod=pod)
            expected = admit(request, strategy.policies, view)
            decided = plan.decisions[row.row]
            attempt = attempt_pod(decided.pod, pod["metadata"]["name"])
            validation = validate(
                AdmissionRequest(operation="CREATE", namespace=row.namespace, pod=attempt),
                strategy.policies,
                view,
            )
            assert attempt == expected.pod, row
            assert decided.mutation == expected.mutation, row
            assert validation == expected.validation, (row, held)
            denied += not expected.allowed
    if name == "default-policy-with-quota":
        assert denied, "no pod was past its tenant's GPU memory quota"


def test_no_policies_no_decisions_and_no_mps_nodes() -> None:
    strategy = next(s for s in builtin_strategies(REPO_ROOT / "policies") if s.policies is None)
    plan = plan_strategy(strategy, Layout(), busy_week(), default_namespaces())
    assert plan.decisions == {}
    assert plan.priority_classes == ()
    assert plan.layout.mps_nodes == 0


def test_admitted_memory_is_what_the_live_pods_add_up_to() -> None:
    memory = AdmittedMemory()
    memory.admit("a-1", "team-a", 40 * GIB)
    memory.admit("a-2", "team-a", 20 * GIB)
    memory.admit("b-1", "team-b", 80 * GIB)
    assert memory.totals() == {"team-a": 60 * GIB, "team-b": 80 * GIB}
    memory.end("a-1")
    memory.end("a-1")  # ended twice (completed, then its deletion seen): counted once
    memory.end("never-admitted")
    assert memory.totals() == {"team-a": 20 * GIB, "team-b": 80 * GIB}
    memory.end("b-1")
    # A namespace with no live pods is not in the view at all, as before it had any.
    assert memory.totals() == {"team-a": 20 * GIB}
