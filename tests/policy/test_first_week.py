"""Issue 32 item 5: the traps and noise a platform team met in its first week, each as the user
meets it through the CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from gpuwarden.cli import main

from .support import EXAMPLES, NAMESPACES_FILE, POLICIES, example, policy_text

DEFAULT = POLICIES / "default.yaml"
TEAM = EXAMPLES / "teams" / "team-vision.yaml"
NS = ["--namespaces", str(NAMESPACES_FILE)]
ESCAPE = POLICIES / "tests" / "pods" / "escape-mps-pipe.yaml"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- lint ----------------------------------------------------------------------------------


def test_a_team_selector_rule_behind_the_defaults_other_kinds_is_flagged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    team = tmp_path / "team.yaml"
    team.write_text(
        policy_text(
            "workloads:\n"
            "  - name: vision-notebooks\n"
            "    match: {kind: selector, namespaces: [vision], labels: {matchExpressions: "
            "[{key: notebook-name, operator: Exists}]}}\n"
            "    profile: heavy-training",
            "team-sel",
        )
    )
    code, _, err = run(capsys, "lint", str(DEFAULT), str(team))
    assert code == 0
    (line,) = [w for w in err.splitlines() if "vision-notebooks" in w]
    assert line.startswith(
        "warning: rule vision-notebooks (policy team-sel, kind selector) loses every pod that an "
        "earlier rule of another kind also matches (policy kubeflow-default: kfp-system, "
    )
    assert " notebooks, " in line
    assert "rules of different kinds are tried in load order" in line
    assert "use that tenant's overrides" in line


def test_the_defaults_own_selector_rule_is_not_flagged(capsys: pytest.CaptureFixture[str]) -> None:
    """llm-model-servers follows rules of other kinds in the same file, on purpose."""
    _, _, err = run(capsys, "lint", str(POLICIES))
    assert "llm-model-servers" not in err


def test_lint_of_the_defaults_prints_no_warning_only_information(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "lint", "--strict", str(POLICIES))
    assert code == 0
    lines = err.splitlines()
    assert lines and all(line.startswith("info: ") for line in lines)
    assert out == (
        "ok: 1 policies, 14 profiles, 17 rules, 3 tenants, 0 warnings, 13 notes "
        "(info: what the nodes or namespaces must provide)\n"
    )


def test_a_team_file_alone_is_told_to_load_the_defaults_beside_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "lint", str(TEAM))
    assert code == 1
    assert (
        "unknown profile 'notebook' (known: none); profiles are shared by the policy files "
        f"loaded together: if another file defines it, load that file too (gpuwarden lint "
        f"policies/ {TEAM})"
    ) in err


def test_an_unknown_profile_gets_a_did_you_mean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    typo = tmp_path / "typo.yaml"
    typo.write_text(
        policy_text(
            "workloads: [{name: nb, match: {kind: notebook}, profile: light-trainin}]", "typo"
        )
    )
    code, _, err = run(capsys, "lint", str(POLICIES), str(typo))
    assert code == 1
    assert err.rstrip().endswith("; did you mean light-training?")


def test_a_policy_defined_twice_names_both_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    copied = tmp_path / "team-vision-copy.yaml"
    copied.write_text(TEAM.read_text())
    code, _, err = run(capsys, "lint", str(POLICIES), str(TEAM), str(copied))
    assert code == 1
    assert (
        f"error: {copied}: document 1: metadata.name: policy 'team-vision' is defined twice: "
        f"here and in {TEAM}: document 1"
    ) in err.splitlines()
    code, _, err = run(capsys, "lint", str(POLICIES), str(TEAM), str(TEAM))
    assert "policy 'team-vision' is defined twice: the same file is loaded twice" in err


# --- apply ---------------------------------------------------------------------------------


def test_apply_prints_nothing_on_stdout_for_a_denied_pod(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for output in ("yaml", "json", "patch", "diff"):
        code, out, err = run(capsys, "apply", "-p", str(POLICIES), *NS, "-o", output, str(ESCAPE))
        assert (code, out) == (1, ""), output
        assert "tenant-b/bob-jupyter-0: denied: gpuwarden denied the pod: " in err
    code, out, _ = run(
        capsys, "apply", "-p", str(POLICIES), *NS, "--show-denied", "-o", "json", str(ESCAPE)
    )
    assert code == 1
    assert json.loads(out)["metadata"]["name"] == "bob-jupyter-0"


def test_apply_of_an_allowed_and_a_denied_pod_prints_only_the_allowed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    notebook = str(EXAMPLES / "notebook.yaml")
    code, out, _ = run(capsys, "apply", "-p", str(POLICIES), *NS, notebook, str(ESCAPE))
    assert code == 1
    assert [pod["metadata"]["name"] for pod in yaml.safe_load_all(out)] == ["alice-jupyter-0"]


def test_apply_reads_a_kind_list_of_pods_and_multi_document_yaml(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pods = [example("notebook"), example("kserve-predictor")]
    listed = tmp_path / "pods.yaml"
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}))
    code, out, err = run(capsys, "apply", "-p", str(POLICIES), *NS, "-o", "json", str(listed))
    assert code == 0, err
    names = [pod["metadata"]["name"] for pod in json.loads(out)["items"]]
    assert names == [pod["metadata"]["name"] for pod in pods]
    assert f"{listed}: items[1]" not in err  # labels are the pods' names
    documents = tmp_path / "pods-docs.yaml"
    documents.write_text(yaml.safe_dump_all(pods))
    code, out2, _ = run(capsys, "apply", "-p", str(POLICIES), *NS, "-o", "json", str(documents))
    assert (code, out2) == (0, out)
    listed.write_text(yaml.safe_dump({"kind": "PodList", "items": [{"kind": "Service"}]}))
    code, _, err = run(capsys, "apply", "-p", str(POLICIES), *NS, str(listed))
    assert code == 2
    assert f"{listed}: items[0]: expected kind Pod or AdmissionReview, got 'Service'" in err
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": []}))
    code, _, err = run(capsys, "apply", "-p", str(POLICIES), *NS, str(listed))
    assert (code, err) == (2, f"error: {listed}: empty List\n")


# --- denials name the policy the limit came from ----------------------------------------------


def test_a_denial_by_a_team_tenants_limit_names_the_team_policy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pod = copy.deepcopy(example("pytorchjob-worker"))
    pod["metadata"]["namespace"] = "vision"
    for item in pod["spec"]["containers"]:
        item.setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = 8
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(pod))
    code, out, err = run(capsys, "apply", "-p", str(DEFAULT), "-p", str(TEAM), str(path))
    assert (code, out) == (1, "")
    assert "but tenant vision allows at most 4 per pod" in err
    assert "[policy team-vision, check tenantLimits, " in err
    assert "kubeflow-default" not in err
