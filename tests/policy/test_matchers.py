"""Every matcher kind, and how rules pick a profile (first match wins)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import TypeAdapter

from gpuwarden.policy import ClusterView, PolicySet
from gpuwarden.policy.admission.placement import place
from gpuwarden.policy.pod.resources import annotations_of, labels_of
from gpuwarden.policy.pod.workloads import identify
from gpuwarden.policy.spec.matchers import PodFacts, match
from gpuwarden.policy.spec.model import Matcher

from .support import example, gpu_pod, policies_from

MATCHER: TypeAdapter[Matcher] = TypeAdapter(Matcher)


def facts(
    pod: Mapping[str, Any], namespace: str = "team", ns_labels: Mapping[str, str] | None = None
) -> PodFacts:
    return PodFacts(namespace, ns_labels or {}, labels_of(pod), annotations_of(pod), identify(pod))


def matches(rule: Mapping[str, Any], pod: Mapping[str, Any], **kwargs: Any) -> bool:
    return match(MATCHER.validate_python(rule), facts(pod, **kwargs)).matched


def kfp_step(node: str) -> dict[str, Any]:
    pod = example("kfp-train-step")
    pod["metadata"]["annotations"]["workflows.argoproj.io/node-name"] = node
    return pod


# --- Kubeflow matchers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_names", "node", "expected"),
    [
        ([], "wf.root.anything.executor", True),
        (["train"], "wf.root.train.executor", True),
        (["train"], "wf.root.train.executor(1)", True),
        (["train*"], "wf.root.train-bert.executor", True),
        (["train*"], "wf.root.sub-dag.train-bert.executor(2)", True),
        (["train"], "wf.root.train-bert.executor", False),
        (["train"], "wf.root.pretrain.executor", False),
        (["eval*", "export*"], "wf.root.export-onnx.executor", True),
        (["Train"], "wf.root.train.executor", False),
    ],
)
def test_kfp_step_by_task_name(task_names: list[str], node: str, expected: bool) -> None:
    rule = {"kind": "kfp-step", "taskNames": task_names}
    assert matches(rule, kfp_step(node)) is expected


def test_kfp_step_matcher_never_takes_drivers() -> None:
    driver = example("kfp-driver")
    assert not matches({"kind": "kfp-step"}, driver)
    assert matches({"kind": "kfp-system"}, driver)
    assert not matches({"kind": "kfp-system"}, example("kfp-train-step"))


@pytest.mark.parametrize(
    ("replica_types", "expected"), [([], True), (["worker"], True), (["master"], False)]
)
def test_training_job_by_replica_type(replica_types: list[str], expected: bool) -> None:
    rule = {"kind": "training-job", "replicaTypes": replica_types}
    assert matches(rule, example("pytorchjob-worker")) is expected


@pytest.mark.parametrize(
    ("replicated", "pod_job", "expected"),
    [
        (None, "node", True),  # the default is the trainer's "node" job
        (None, "dataset-initializer", False),
        (["dataset-initializer", "model-initializer"], "model-initializer", True),
        (["*-initializer"], "dataset-initializer", True),
    ],
)
def test_trainjob_by_replicated_job(
    replicated: list[str] | None, pod_job: str, expected: bool
) -> None:
    pod = example("trainjob-node")
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] = pod_job
    rule: dict[str, Any] = {"kind": "trainjob"}
    if replicated is not None:
        rule["replicatedJobs"] = replicated
    assert matches(rule, pod) is expected


@pytest.mark.parametrize(
    ("experiments", "expected"),
    [([], True), (["random-search"], True), (["random-*"], True), (["nas-*", "grid"], False)],
)
def test_katib_trial_by_experiment_glob(experiments: list[str], expected: bool) -> None:
    rule = {"kind": "katib-trial", "experiments": experiments}
    assert matches(rule, example("katib-trial")) is expected


def test_katib_trial_without_experiment_label_matches_only_without_filter() -> None:
    pod = example("katib-trial")
    del pod["metadata"]["labels"]["katib.kubeflow.org/experiment"]
    assert matches({"kind": "katib-trial"}, pod)
    assert not matches({"kind": "katib-trial", "experiments": ["*"]}, pod)


def test_notebook_matcher() -> None:
    assert matches({"kind": "notebook"}, example("notebook"))
    assert not matches({"kind": "notebook"}, example("kserve-predictor"))


@pytest.mark.parametrize(
    ("services", "component", "expected"),
    [
        ([], "predictor", True),
        (["llama-*"], "predictor", True),
        (["mistral"], "predictor", False),
        ([], "transformer", False),
    ],
)
def test_kserve_predictor_not_transformer(
    services: list[str], component: str, expected: bool
) -> None:
    pod = example("kserve-predictor")
    pod["metadata"]["labels"]["component"] = component
    rule = {"kind": "kserve-predictor", "inferenceServices": services}
    assert matches(rule, pod) is expected


@pytest.mark.parametrize(
    "kind", ["kfp-step", "kfp-system", "training-job", "trainjob", "katib-trial", "notebook"]
)
def test_kubeflow_matchers_refuse_plain_pods_with_a_reason(kind: str) -> None:
    result = match(MATCHER.validate_python({"kind": kind}), facts(gpu_pod()))
    assert not result.matched
    assert result.reason == f"not a Kubeflow workload (wants {kind})"


def test_a_mismatch_says_what_the_pod_is() -> None:
    result = match(MATCHER.validate_python({"kind": "notebook"}), facts(example("katib-trial")))
    assert result.reason == "is a katib-trial, not a notebook"


# --- the generic selector ------------------------------------------------------------------

POD = gpu_pod(
    labels={"app": "llm", "tier": "gpu", "team": "nlp"},
    annotations={"example.com/owner": "alice", "example.com/cost~center": "42/7"},
)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({}, True),
        ({"labels": {"matchLabels": {"app": "llm"}}}, True),
        ({"labels": {"matchLabels": {"app": "llm", "tier": "cpu"}}}, False),
        (
            {
                "labels": {
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "x"]}]
                }
            },
            True,
        ),
        (
            {
                "labels": {
                    "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]
                }
            },
            False,
        ),
        (
            {
                "labels": {
                    "matchExpressions": [{"key": "absent", "operator": "NotIn", "values": ["a"]}]
                }
            },
            True,
        ),
        ({"labels": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}}, True),
        ({"labels": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}}, False),
        (
            {
                "labels": {
                    "matchExpressions": [{"key": "absent", "operator": "In", "values": ["a"]}]
                }
            },
            False,
        ),
        ({"annotations": {"example.com/owner": "alice"}}, True),
        ({"annotations": {"example.com/cost~center": "42/7"}}, True),
        ({"annotations": {"example.com/owner": "bob"}}, False),
        ({"namespaces": ["team", "other"]}, True),
        ({"namespaces": ["other"]}, False),
        ({"namespaceSelector": {"matchLabels": {"gpu": "yes"}}}, True),
        ({"namespaceSelector": {"matchLabels": {"gpu": "no"}}}, False),
        (
            {
                "labels": {"matchLabels": {"app": "llm"}},
                "annotations": {"example.com/owner": "alice"},
                "namespaces": ["team"],
                "namespaceSelector": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
            },
            True,
        ),
        (
            {"labels": {"matchLabels": {"app": "llm"}}, "namespaces": ["elsewhere"]},
            False,
        ),
    ],
)
def test_selector(rule: dict[str, Any], expected: bool) -> None:
    assert matches({"kind": "selector", **rule}, POD, ns_labels={"gpu": "yes"}) is expected


def test_selector_reasons_name_the_part_that_failed() -> None:
    def reason(rule: dict[str, Any]) -> str:
        parsed = MATCHER.validate_python({"kind": "selector", **rule})
        return match(parsed, facts(POD, ns_labels={"gpu": "yes"})).reason

    assert reason({"namespaces": ["x"]}) == "namespace team is not in ['x']"
    assert reason({"labels": {"matchLabels": {"app": "web"}}}) == (
        "pod labels do not match app=web"
    )
    assert reason(
        {"namespaceSelector": {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}}
    ) == ("namespace labels do not match !gpu")
    assert reason({"annotations": {"a": "b"}}) == "annotation a is not 'b'"


# --- rules in order ------------------------------------------------------------------------

RULES = """
profiles:
  - {name: small, maxMemory: 4Gi}
  - {name: big, gpuShare: false}
  - {name: chosen, maxMemory: 2Gi}
workloads:
  - {name: drivers, match: {kind: kfp-system}, skip: true}
  - {name: training-steps, match: {kind: kfp-step, taskNames: [train*]}, profile: big}
  - {name: any-step, match: {kind: kfp-step}, profile: small}
  - {name: llm-apps, match: {kind: selector, labels: {matchLabels: {app: llm}}}, profile: big}
defaultProfile: small
tenants:
  - {name: team, namespaces: [team]}
  - {name: strict, namespaces: [strict], allowProfileLabel: false}
"""


@pytest.fixture(scope="module")
def rules() -> PolicySet:
    return policies_from(RULES)


def test_first_matching_rule_wins(rules: PolicySet) -> None:
    placement = place(kfp_step("wf.root.train.executor"), "team", {}, rules)
    assert (placement.origin, placement.profile and placement.profile.name) == (
        "rule/training-steps",
        "big",
    )
    assert [name for name, _ in placement.trace] == ["drivers", "training-steps"]
    other = place(kfp_step("wf.root.eval.executor"), "team", {}, rules)
    assert other.origin == "rule/any-step"


def test_skip_rule_leaves_the_pod_alone(rules: PolicySet) -> None:
    placement = place(example("kfp-driver"), "team", {}, rules)
    assert (placement.source, placement.profile, placement.governed) == ("skip", None, False)


def test_default_profile_only_for_pods_asking_for_a_gpu(rules: PolicySet) -> None:
    assert place(gpu_pod(), "team", {}, rules).source == "default"
    assert place(gpu_pod(gpus=None), "team", {}, rules).source == "none"


def test_profile_label_selects_a_profile(rules: PolicySet) -> None:
    pod = gpu_pod(labels={"gpuwarden.io/profile": "chosen", "app": "llm"})
    placement = place(pod, "team", {}, rules)
    assert (placement.source, placement.profile and placement.profile.name) == ("label", "chosen")


def test_profile_label_refused_where_the_tenant_does_not_allow_it(rules: PolicySet) -> None:
    pod = gpu_pod(labels={"gpuwarden.io/profile": "chosen"})
    placement = place(pod, "strict", {}, rules)
    assert not placement.governed
    assert placement.problems == (
        "tenant strict does not allow choosing a profile; remove the label gpuwarden.io/profile",
    )


def test_profile_label_naming_no_profile(rules: PolicySet) -> None:
    placement = place(gpu_pod(labels={"gpuwarden.io/profile": "huge"}), "team", {}, rules)
    assert placement.problems == (
        "label gpuwarden.io/profile=huge names no profile; use one of: big, chosen, small",
    )


def test_tenant_by_namespace_label(default_policies: PolicySet, cluster: ClusterView) -> None:
    labels = {"app.kubernetes.io/part-of": "kubeflow-profile"}
    placement = place(example("notebook"), "carol", labels, default_policies)
    assert placement.tenant is not None and placement.tenant.name == "kubeflow-profiles"
    assert placement.tenant_reason == (
        "namespace carol is tenant kubeflow-profiles (by namespace labels)"
    )
    # tenant-a is listed (by name) before the selector tenant, so it wins though both match.
    named = place(example("notebook"), "tenant-a", cluster.labels_for("tenant-a"), default_policies)
    assert named.tenant is not None and named.tenant.name == "tenant-a"
    assert place(example("notebook"), "plain", {}, default_policies).tenant is None


@pytest.mark.parametrize(
    ("name", "containers"),
    [
        ("kfp-train-step", ("main",)),
        ("katib-trial", ("training-container",)),
        ("notebook", ("alice-jupyter",)),
        ("kserve-predictor", ("kserve-container",)),
        ("pytorchjob-worker", ("pytorch",)),
        ("trainjob-node", ("node",)),
    ],
)
def test_default_policies_target_the_main_container(
    name: str, containers: tuple[str, ...], default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example(name)
    ns = pod["metadata"]["namespace"]
    placement = place(pod, ns, cluster.labels_for(ns), default_policies)
    assert placement.containers == containers


def test_sidecars_never_get_the_gpu_by_default(rules: PolicySet) -> None:
    pod = gpu_pod(gpus=None, labels={"app": "llm"})
    pod["spec"]["containers"].insert(0, {"name": "istio-proxy", "image": "istio/proxyv2"})
    assert place(pod, "team", {}, rules).containers == ("main",)


def test_rule_containers_list(rules: PolicySet) -> None:
    policies = policies_from(
        RULES.replace(
            "profile: big}\ndefault", "profile: big, containers: [a, b, missing]}\ndefault"
        )
    )
    pod = gpu_pod(labels={"app": "llm"})
    pod["spec"]["containers"] += [{"name": "b", "image": "x"}, {"name": "a", "image": "x"}]
    assert place(pod, "team", {}, policies).containers == ("a", "b")
    del pod["spec"]["containers"][1:]
    placement = place(pod, "team", {}, policies)
    assert placement.problems == ("no container to give the GPU to (check the rule's containers)",)
