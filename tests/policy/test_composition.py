"""How several policy files combine: a team file beside the default policy takes effect, and
`lint` fails on a tenant or rule that can never apply, naming what shadows it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.cli import main
from gpuwarden.policy import ClusterView, PolicySet, load_paths, load_texts
from gpuwarden.policy.admission.placement import place
from gpuwarden.policy.lint import lint_errors
from gpuwarden.policy.spec.precedence import tenant_matches

from .support import EXAMPLES, NAMESPACES_FILE, POLICIES, example, mutated, policy_text

DEFAULT = POLICIES / "default.yaml"
TEAM = EXAMPLES / "teams" / "team-vision.yaml"
# Namespace vision as Kubeflow's profile controller creates it: the default's kubeflow-profiles
# tenant selects it by these labels.
VISION_LABELS = {
    "kubernetes.io/metadata.name": "vision",
    "app.kubernetes.io/part-of": "kubeflow-profile",
    "katib.kubeflow.org/metrics-collector-injection": "enabled",
}
CLUSTER = ClusterView(namespace_labels={"vision": VISION_LABELS})


def in_vision(name: str, experiment: str | None = None) -> dict[str, Any]:
    pod = copy.deepcopy(example(name))
    pod["metadata"]["namespace"] = "vision"
    if experiment is not None:
        pod["metadata"]["labels"]["katib.kubeflow.org/experiment"] = experiment
        pod["metadata"]["labels"]["katib.kubeflow.org/trial"] = f"{experiment}-x9z4m2kt"
    return pod


def several(*specs: tuple[str, str]) -> PolicySet:
    """A set of policy documents, each (name, indented spec), loaded in that order."""
    return load_texts([(f"{name}.yaml", policy_text(spec, name)) for name, spec in specs])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the team file beside the default ------------------------------------------------------


@pytest.mark.parametrize(
    "order", [(DEFAULT, TEAM), (TEAM, DEFAULT)], ids=["default-first", "team-first"]
)
def test_the_team_tenant_and_its_override_win_for_its_namespace(order: tuple[Path, Path]) -> None:
    policies = load_paths(order)
    notebook = in_vision("notebook")

    placement = place(notebook, "vision", VISION_LABELS, policies)
    assert placement.tenant is not None and placement.tenant.name == "vision"
    assert placement.tenant_reason == "namespace vision is tenant vision (by name)"

    # The team's override: a 24Gi cap where the default gives notebook 15Gi.
    pod = mutated(notebook, policies, CLUSTER)
    annotations = pod["metadata"]["annotations"]
    assert annotations["gpuwarden.io/tenant"] == "vision"
    assert annotations["gpuwarden.io/profile"] == "notebook"
    assert annotations["gpuwarden.io/gpu-memory-limit"] == "24Gi"
    # Every other Kubeflow namespace keeps the default's tenant and cap.
    kubeflow = {"carol": {"app.kubernetes.io/part-of": "kubeflow-profile"}}
    carol = mutated(example("notebook"), policies, ClusterView(kubeflow), namespace="carol")
    assert carol["metadata"]["annotations"]["gpuwarden.io/tenant"] == "kubeflow-profiles"
    assert carol["metadata"]["annotations"]["gpuwarden.io/gpu-memory-limit"] == "15Gi"


def test_the_team_rule_that_names_experiments_beats_the_defaults_broad_ones() -> None:
    policies = load_paths([DEFAULT, TEAM])
    trial = place(in_vision("katib-trial", "vision-detector"), "vision", VISION_LABELS, policies)
    assert (trial.origin, trial.profile and trial.profile.name) == (
        "rule/vision-hpo",
        "batch-hpo-whole",
    )
    other = place(in_vision("katib-trial"), "vision", VISION_LABELS, policies)
    assert (other.origin, other.profile and other.profile.name) == (
        "rule/katib-trials",
        "batch-hpo",
    )


def test_lint_passes_the_default_alone_and_with_the_team_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "lint", str(POLICIES))
    assert (code, "error:" in err) == (0, False)
    assert out.startswith("ok: 1 policies, ")
    code, out, err = run(capsys, "lint", str(DEFAULT), str(TEAM))
    assert (code, "error:" in err) == (0, False)
    assert out.startswith("ok: 2 policies, 14 profiles, 18 rules, 4 tenants, ")


def test_explain_says_which_tenant_and_rule_won_and_what_they_beat(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    namespaces = tmp_path / "namespaces.yaml"
    vision = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "vision", "labels": VISION_LABELS},
    }
    namespaces.write_text(NAMESPACES_FILE.read_text() + "\n---\n" + yaml.safe_dump(vision))
    notebook, trial = tmp_path / "notebook.yaml", tmp_path / "trial.yaml"
    notebook.write_text(yaml.safe_dump(in_vision("notebook")))
    trial.write_text(yaml.safe_dump(in_vision("katib-trial", "vision-detector")))

    code, out, _ = run(
        capsys,
        "explain",
        "-p",
        str(DEFAULT),
        "-p",
        str(TEAM),
        "--namespaces",
        str(namespaces),
        str(notebook),
        str(trial),
    )

    assert code == 0
    assert "  tenant:   namespace vision is tenant vision (by name)\n" in out
    assert (
        "            beats tenant kubeflow-profiles (by namespace labels "
        "app.kubernetes.io/part-of=kubeflow-profile): listing a namespace by name beats "
        "selecting it by labels\n"
    ) in out
    assert "            tenant overrides: maxMemory\n" in out
    assert (
        "    LOST  katib-trials: katib-trial vision-detector-x9z4m2kt (vision-detector); rule "
        "vision-hpo is narrower: it names experiments by glob, rule katib-trials names no "
        "experiments\n"
    ) in out
    assert "    MATCH vision-hpo: katib-trial vision-detector-x9z4m2kt (vision-detector)\n" in out
    assert "  profile:  batch-hpo-whole via rule/vision-hpo (policy kubeflow-default)\n" in out


# --- tenants ---------------------------------------------------------------------------------


PROFILE = "profiles: [{name: p, maxMemory: 8Gi}]\n"


def tenants(*lines: str) -> PolicySet:
    return load_texts([("t.yaml", policy_text(PROFILE + "tenants:\n" + "\n".join(lines)))])


def test_the_more_specific_selector_wins_whatever_the_order() -> None:
    broad = "  - {name: broad, namespaceSelector: {matchLabels: {kind: kf}}}"
    narrow = "  - {name: narrow, namespaceSelector: {matchLabels: {kind: kf, team: vision}}}"
    labels = {"kind": "kf", "team": "vision"}
    for policies in (tenants(broad, narrow), tenants(narrow, broad)):
        chosen = policies.tenant_for("ns", labels)
        assert chosen is not None and chosen.name == "narrow"
        assert lint_errors(policies) == []
        elsewhere = policies.tenant_for("ns", {"kind": "kf"})
        assert elsewhere is not None and elsewhere.name == "broad"


def test_tenant_for_agrees_with_the_ranking_explain_prints() -> None:
    policies = tenants(
        "  - {name: a, namespaceSelector: {matchLabels: {x: '1'}}}",
        "  - {name: b, namespaces: [named], namespaceSelector: {matchExpressions: [{key: y, operator: Exists}]}}",
        "  - {name: c, namespaceSelector: {matchLabels: {x: '1', y: '2'}}}",
        "  - {name: d, namespaces: [other]}",
    )
    cases = [
        ("named", {"x": "1", "y": "2"}, "b"),
        ("ns", {"x": "1", "y": "2"}, "c"),
        ("ns", {"x": "1"}, "a"),
        ("ns", {"y": "3"}, "b"),
        ("other", {"x": "1"}, "d"),
        ("ns", {}, None),
    ]
    for namespace, labels, expected in cases:
        chosen = policies.tenant_for(namespace, labels)
        ranked = tenant_matches(policies.tenants, namespace, labels)
        assert (chosen.name if chosen else None) == expected
        assert (ranked[0].tenant.name if ranked else None) == expected


def test_lint_fails_on_a_tenant_shadowed_by_an_equal_selector(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    team = tmp_path / "team.yaml"
    team.write_text(
        policy_text(
            "tenants:\n"
            "  - name: copy\n"
            "    namespaceSelector: {matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}}\n"
            "    limits: {maxGpusPerPod: 1}\n",
            "team",
        )
    )
    code, out, err = run(capsys, "lint", str(DEFAULT), str(team))
    assert code == 1
    assert (
        "error: tenant copy: can never be chosen: tenant kubeflow-profiles selects every "
        "namespace its namespaceSelector selects (app.kubernetes.io/part-of=kubeflow-profile) "
        "and wins: equally specific selectors; tenant kubeflow-profiles comes first in load "
        "order\n"
    ) in err
    assert out.startswith("failed: 2 policies, ") and out.rstrip().endswith(", 1 errors")


def test_lint_fails_on_a_namespace_listed_by_two_tenants() -> None:
    policies = tenants(
        "  - {name: first, namespaces: [shared, own]}",
        "  - {name: second, namespaces: [shared]}",
        "  - {name: third, namespaces: [own, more]}",
    )
    assert lint_errors(policies) == [
        "tenant second: can never be chosen: namespace shared is listed by tenant first first",
        "tenant third: namespace own is also listed by tenant first, which takes it (load "
        "order); list each namespace in one tenant",
    ]
    chosen = policies.tenant_for("own", {})
    assert chosen is not None and chosen.name == "first"


def test_lint_fails_on_a_selector_that_matches_nothing_or_only_names_taken_by_name() -> None:
    policies = tenants(
        "  - {name: listed, namespaces: [a, b]}",
        "  - name: empty",
        "    namespaceSelector:",
        "      matchLabels: {x: '1'}",
        "      matchExpressions: [{key: x, operator: DoesNotExist}]",
        "  - name: by-name-label",
        "    namespaceSelector:",
        "      matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [a, b]}]",
        "  - name: half",
        "    namespaces: [c]",
        "    namespaceSelector: {matchExpressions: [{key: x, operator: In, values: ['1']},"
        " {key: x, operator: NotIn, values: ['1']}]}",
    )
    assert lint_errors(policies) == [
        "tenant empty: can never be chosen: its namespaceSelector x=1,!x matches no namespace",
        "tenant by-name-label: can never be chosen: its namespaceSelector selects only a, b, "
        "which tenant listed lists by name (a name beats a selector)",
        "tenant half: chosen only for the namespaces it lists: its namespaceSelector "
        "x in (1),x notin (1) matches no namespace",
    ]


def test_lint_fails_on_equally_specific_selectors_that_overlap_until_one_says_more() -> None:
    kubeflow = "  - {name: kubeflow, namespaceSelector: {matchLabels: {part-of: kubeflow-profile}}}"
    team = "  - {name: vision, namespaceSelector: {matchLabels: {team: vision}}}"
    assert lint_errors(tenants(kubeflow, team)) == [
        "tenants kubeflow (part-of=kubeflow-profile) and vision (team=vision) select the same "
        "namespaces with equally specific selectors: a namespace matching both goes to "
        "kubeflow by load order only; make one selector more specific, or list such "
        "namespaces by name"
    ]
    specific = "  - {name: vision, namespaceSelector: {matchLabels: {team: vision, part-of: kubeflow-profile}}}"
    policies = tenants(kubeflow, specific)
    assert lint_errors(policies) == []
    chosen = policies.tenant_for("ns", {"team": "vision", "part-of": "kubeflow-profile"})
    assert chosen is not None and chosen.name == "vision"
    # Selectors that cannot meet are no ambiguity.
    other = "  - {name: nlp, namespaceSelector: {matchLabels: {part-of: nlp}}}"
    assert lint_errors(tenants(kubeflow, other)) == []


# --- rules -----------------------------------------------------------------------------------


RULES = """
profiles:
  - {name: whole, gpuShare: false, maxMemory: 80Gi}
  - {name: shared, maxMemory: 16Gi}
workloads:
  - {name: training-jobs, match: {kind: training-job}, profile: whole}
  - {name: llm, match: {kind: selector, labels: {matchLabels: {app: llm}}}, profile: shared}
  - {name: workers, match: {kind: training-job, replicaTypes: [worker]}, profile: shared}
"""


def training_pod(replica: str, **labels: str) -> dict[str, Any]:
    pod = copy.deepcopy(example("pytorchjob-worker"))
    pod["metadata"]["labels"] = {
        **pod["metadata"]["labels"],
        "training.kubeflow.org/replica-type": replica,
        **labels,
    }
    return pod


def test_a_narrower_rule_of_the_same_kind_takes_the_broader_ones_place() -> None:
    policies = several(("rules", RULES))
    worker = place(training_pod("worker", app="llm"), "team", {}, policies)
    assert worker.origin == "rule/workers"
    assert [name for name, _ in worker.trace] == ["training-jobs", "workers"]
    lost = {o.name: o.lost for o in worker.outcomes if o.lost}
    assert lost == {
        "training-jobs": "rule workers is narrower: it names replica types exactly, rule "
        "training-jobs names no replica types",
        "llm": "rule workers comes first (rules of different kinds are tried in load order)",
    }
    # A master is not a worker: the broad rule keeps it, and still comes before the selector.
    master = place(training_pod("master", app="llm"), "team", {}, policies)
    assert master.origin == "rule/training-jobs"
    assert lint_errors(policies) == []


def test_lint_fails_on_a_team_rule_the_defaults_rule_of_its_kind_takes_first(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    team = tmp_path / "team.yaml"
    team.write_text(
        policy_text(
            "profiles: [{name: vision-nb, maxMemory: 24Gi}]\n"
            "workloads:\n"
            "  - {name: vision-notebooks, match: {kind: notebook}, profile: vision-nb, requireGpuRequest: true}\n"
            "  - {name: vision-export, match: {kind: kfp-step, taskNames: [export-*]}, profile: vision-nb}\n"
            "  - {name: vision-train, match: {kind: kfp-step, taskNames: [train-vision]}, profile: vision-nb}\n",
            "team",
        )
    )
    code, _, err = run(capsys, "lint", str(DEFAULT), str(team))
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    hint = (
        "; rules apply in every namespace: to change what one tenant's pods get, use that "
        "tenant's overrides"
    )
    assert errors == [
        "error: rule vision-notebooks (policy team): never matches, rule notebooks (policy "
        "kubeflow-default) takes every notebook first" + hint,
        "error: rule vision-export (policy team): never matches, rule kfp-export (policy "
        "kubeflow-default) takes every kfp-step it matches first" + hint,
    ]
    # The exact task name beats the default's train* glob: that rule is no error, and wins.
    policies = load_paths([DEFAULT, team])
    step = example("kfp-train-step")
    assert place(step, "tenant-a", {}, policies).origin == "rule/kfp-training"
    step["metadata"]["annotations"]["workflows.argoproj.io/node-name"] = (
        "wf.root.train-vision.executor"
    )
    assert place(step, "tenant-a", {}, policies).origin == "rule/vision-train"


def test_lint_flags_a_rule_behind_a_catch_all_but_not_behind_a_sized_one() -> None:
    policies = several(
        (
            "sized",
            """
profiles:
  - {name: shared, maxMemory: 16Gi}
  - {name: whole, gpuShare: false, maxMemory: 80Gi}
workloads:
  - {name: small, match: {kind: kserve-predictor}, profile: shared, maxGpuRequest: 1}
  - {name: large, match: {kind: kserve-predictor}, profile: whole}
  - {name: never, match: {kind: kserve-predictor}, profile: whole}
""",
        )
    )
    assert lint_errors(policies) == [
        "rule never: never matches, rule large takes every kserve-predictor first"
    ]


def test_a_catch_all_selector_shadows_later_kinds_only_where_none_of_them_came_first() -> None:
    policies = several(
        (
            "catch-all",
            """
profiles: [{name: p, maxMemory: 8Gi}]
workloads:
  - {name: notebooks, match: {kind: notebook}, profile: p}
  - {name: everything, match: {kind: selector}, profile: p}
  - {name: more-notebooks, match: {kind: notebook}, profile: p}
  - {name: predictors, match: {kind: kserve-predictor}, profile: p}
""",
        )
    )
    assert lint_errors(policies) == [
        "rule more-notebooks: never matches, rule notebooks takes every notebook first",
        "rule predictors: never matches, rule everything takes every pod first",
    ]
