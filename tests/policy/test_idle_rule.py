"""A profile's idle rule (issue 31, item 4): its errors, the annotation the node agent reads,
and lint's word on ``stop`` for pods that are not notebooks."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuwarden.policy import ClusterView, PolicyError, load_texts
from gpuwarden.policy.lint import lint_warnings
from gpuwarden.policy.pod.record import IdleRecord, PodRecord

from .support import gpu_pod, mutated, policies_from, policy_text

SPEC = """
profiles:
  - {name: notebook, gpuShare: false, idle: {after: 1h30m, below: 5%, action: stop}}
  - {name: training, gpuShare: false}
workloads:
  - {name: notebooks, match: {kind: notebook}, profile: notebook}
  - {name: jobs, match: {kind: selector, labels: {matchLabels: {app: train}}}, profile: training}
tenants: [{name: team, namespaces: [team], limits: {maxGpusPerPod: 8}}]
"""


def notebook_pod() -> dict[str, object]:
    return gpu_pod("nb-0", labels={"notebook-name": "nb", "statefulset": "nb"})


def test_the_webhook_records_the_rule_for_the_node_agent() -> None:
    policies = policies_from(SPEC)
    annotations = mutated(notebook_pod(), policies, ClusterView())["metadata"]["annotations"]
    assert annotations["gpuwarden.io/idle"] == "action=stop,after=5400s,below=5%"
    record = PodRecord.from_annotations(annotations)
    assert record.idle == IdleRecord(action="stop", after=5400, below=Decimal(5))
    # A profile without a rule writes none (its pods' patches are as before).
    job = gpu_pod("train-0", labels={"app": "train"})
    assert (
        "gpuwarden.io/idle" not in mutated(job, policies, ClusterView())["metadata"]["annotations"]
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("action=stop,after=0s,below=5%", "after above 0"),
        ("action=halt,after=60s,below=5%", "action=stop|notify"),
        ("action=stop,after=60s,below=500%", "at most 100"),
    ],
)
def test_a_forged_or_broken_annotation_is_read_as_no_rule(value: str, problem: str) -> None:
    record = PodRecord.from_annotations({"gpuwarden.io/idle": value})
    assert record.idle is None
    [message] = record.problems
    assert message.startswith(f"annotation gpuwarden.io/idle={value!r}: must read")
    assert problem in message


@pytest.mark.parametrize(
    ("idle", "field", "error"),
    [
        ("{after: 2 hours}", "after", "'2 hours' must be a duration such as 2h, 90m or 1h30m"),
        ("{after: 0m}", "after", "'0m' must be longer than zero"),
        ("{after: 2h, below: 0.05}", "below", "0.05 must be a percentage above 0%"),
        ("{after: 2h, action: kill}", "action", "Input should be 'stop' or 'notify'"),
    ],
)
def test_a_bad_rule_is_a_load_error_naming_the_field(idle: str, field: str, error: str) -> None:
    text = policy_text(f"profiles: [{{name: a, idle: {idle}}}]")
    with pytest.raises(PolicyError) as err:
        load_texts([("p.yaml", text)])
    [message] = [str(issue) for issue in err.value.issues]
    assert f"spec.profiles[0].idle.{field}: " in message
    assert error in message


def test_lint_says_stop_notifies_pods_that_are_not_notebooks() -> None:
    assert not [w for w in lint_warnings(policies_from(SPEC)) if "idle.action stop" in w]
    shared = SPEC.replace("profile: training}", "profile: notebook}")
    [warning] = [w for w in lint_warnings(policies_from(shared)) if "idle.action stop" in w]
    assert warning == (
        "profile notebook: idle.action stop stops Kubeflow Notebooks only, but rule jobs (kind "
        "selector) gives it to other pods; the node agent notifies for those instead (an Event "
        "and a metric), and never stops training or serving"
    )
