"""The dry-run CLI: `gpuwarden lint`, `apply`, `test` and `explain`, through gpuwarden.cli.main."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from gpuwarden.cli import main

from .support import EXAMPLES, NAMESPACES_FILE, POLICIES, example

NS = ["--namespaces", str(NAMESPACES_FILE)]
TEST_PODS = POLICIES / "tests" / "pods"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def apply(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run(capsys, "apply", "--policies", str(POLICIES), *NS, *argv)


def write(path: Path, obj: Any) -> Path:
    path.write_text(yaml.safe_dump(obj) if path.suffix == ".yaml" else json.dumps(obj))
    return path


# --- lint ----------------------------------------------------------------------------------


def test_lint_clean_policies(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "lint", str(POLICIES))
    assert code == 0
    assert out.startswith("ok: 1 policies, 14 profiles, 17 rules, 3 tenants, ")
    assert "Traceback" not in err


def test_lint_reports_risky_settings_and_strict_fails_on_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "profiles:\n  - {name: a, maxMemory: 8Gi, overcommitRatio: 2.0}\n"
        "  - {name: b, maxMemory: 8Gi, backend: native}\n"
    )
    code, out, err = run(capsys, "lint", str(path))
    assert code == 0
    assert (
        "info: profile a: overcommitRatio 2 has no per-pod form on volcano: pods request and "
        "are capped at maxMemory 8Gi"
    ) in err
    assert "warning: profile b: the native backend cannot share GPUs" in err
    assert "warning: no tenant is defined: a Kubeflow profile namespace" in err
    assert "2 warnings, 1 notes (info: " in out
    assert run(capsys, "lint", "--strict", str(path))[0] == 1


def test_lint_errors_name_file_document_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("profiles:\n  - {name: a, maxMemory: 8GB}\n")
    code, out, err = run(capsys, "lint", str(path))
    assert code == 1
    assert out == ""
    assert err.startswith(f"error: {path}: document 1: profiles[0].maxMemory: '8GB' is not a ")
    assert "Traceback" not in err


def test_lint_missing_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "lint", str(tmp_path / "nope"))
    assert code == 1
    assert "no such file or directory" in err


# --- apply ---------------------------------------------------------------------------------


def test_apply_json_prints_exactly_one_pod(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = apply(capsys, "-o", "json", str(EXAMPLES / "notebook.yaml"))
    assert code == 0
    pod = json.loads(out)  # one JSON document, nothing else on stdout
    assert pod["kind"] == "Pod"
    assert pod["metadata"]["annotations"]["gpuwarden.io/profile"] == "notebook"
    assert "tenant-a/alice-jupyter-0: allowed (profile notebook via rule/notebooks)" in err
    assert "warning: tenant-a/alice-jupyter-0: gpuwarden: profile notebook" in err


def test_apply_json_with_several_inputs_prints_a_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = apply(
        capsys, "-o", "json", str(EXAMPLES / "notebook.yaml"), str(EXAMPLES / "kfp-driver.yaml")
    )
    assert code == 0
    listed = json.loads(out)
    assert (listed["kind"], len(listed["items"])) == ("List", 2)
    assert listed["items"][1] == example("kfp-driver")  # the driver is untouched


def test_apply_yaml_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = apply(capsys, str(EXAMPLES / "kserve-predictor.yaml"))
    assert code == 0
    (pod,) = list(yaml.safe_load_all(out))
    assert pod["spec"]["priorityClassName"] == "gpuwarden-inference"


def test_apply_patch_is_the_rfc6902_patch(capsys: pytest.CaptureFixture[str]) -> None:
    source = EXAMPLES / "kfp-train-step.yaml"
    code, out, _ = apply(capsys, "-o", "patch", str(source))
    assert code == 0
    ops = json.loads(out)
    assert {"op": "add", "path": "/spec/schedulerName", "value": "volcano"} in ops
    _, mutated, _ = apply(capsys, "-o", "json", str(source))
    assert jsonpatch.apply_patch(example("kfp-train-step"), ops) == json.loads(mutated)


def test_apply_patch_of_an_untouched_pod_is_empty(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = apply(capsys, "-o", "patch", str(TEST_PODS / "plain-web.yaml"))
    assert (code, out) == (0, "[]\n")
    assert "tenant-a/web: allowed (untouched)" in err


def test_apply_diff(capsys: pytest.CaptureFixture[str]) -> None:
    source = EXAMPLES / "pytorchjob-worker.yaml"
    code, out, _ = apply(capsys, "-o", "diff", str(source))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"--- {source} (original)"
    assert lines[1] == f"+++ {source} (mutated)"
    assert "+    gpuwarden.io/profile: heavy-training" in lines
    assert "+  schedulerName: volcano" in lines


def test_apply_denied_pod_exits_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = apply(capsys, "-o", "json", str(TEST_PODS / "privileged-gpu.yaml"))
    assert (code, out) == (1, "")  # nothing to pipe into kubectl apply (--show-denied shows it)
    assert "tenant-a/root-me: denied: gpuwarden denied the pod: " in err
    assert "spec.containers[main].securityContext.privileged" in err


def test_apply_admission_review(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pod = example("notebook")
    del pod["metadata"]["namespace"]
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "tenant-b",
            "operation": "CREATE",
            "object": pod,
        },
    }
    path = write(tmp_path / "review.json", review)
    code, out, err = apply(capsys, "-o", "json", str(path))
    assert code == 0
    assert json.loads(out)["metadata"]["annotations"]["gpuwarden.io/tenant"] == "tenant-b"
    assert "tenant-b/alice-jupyter-0: allowed" in err


def test_apply_update_review_judges_the_change(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, out, _ = apply(capsys, "-o", "json", str(EXAMPLES / "notebook.yaml"))
    old = json.loads(out)
    new = json.loads(out)
    new["metadata"]["annotations"]["gpuwarden.io/gpu-memory-limit"] = "80Gi"
    review = {
        "kind": "AdmissionReview",
        "request": {
            "operation": "UPDATE",
            "namespace": "tenant-a",
            "object": new,
            "oldObject": old,
        },
    }
    code, _, err = apply(capsys, "-o", "patch", str(write(tmp_path / "update.yaml", review)))
    assert code == 1
    assert "metadata.annotations[gpuwarden.io/gpu-memory-limit]" in err


def test_apply_reads_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((EXAMPLES / "katib-trial.yaml").read_text()))
    code, out, err = apply(capsys, "-o", "json", "-")
    assert code == 0
    assert json.loads(out)["metadata"]["annotations"]["gpuwarden.io/profile"] == "batch-hpo"
    assert "tenant-a/random-search-x9z4m2kt-8hq2v: allowed" in err


def test_apply_namespace_flag_overrides_the_pod(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = apply(
        capsys, "-o", "json", "-n", "tenant-b", str(EXAMPLES / "kfp-train-step.yaml")
    )
    assert code == 0
    annotations = json.loads(out)["metadata"]["annotations"]
    assert (annotations["gpuwarden.io/tenant"], annotations["gpuwarden.io/gpu-shared"]) == (
        "tenant-b",
        "true",
    )


BAD_INPUTS: list[tuple[str, str, str]] = [
    ("broken.yaml", "kind: Pod\nmetadata: {name: x\n", "invalid YAML: line 3"),
    ("broken.json", '{"kind": "Pod",', "invalid JSON: line 1"),
    ("empty.yaml", "", "holds no document"),
    ("list.yaml", "- a\n- b\n", "expected a Pod or an AdmissionReview"),
    (
        "deploy.yaml",
        "apiVersion: apps/v1\nkind: Deployment\n",
        "expected kind Pod or AdmissionReview, got 'Deployment'",
    ),
    ("nometa.yaml", "kind: Pod\nmetadata: [1]\nspec: {}\n", "the Pod has no metadata"),
    ("nospec.yaml", "kind: Pod\nmetadata: {name: x}\n", "the Pod has no spec"),
    ("noreq.yaml", "kind: AdmissionReview\n", "the AdmissionReview has no request"),
    (
        "noobj.yaml",
        "kind: AdmissionReview\nrequest: {operation: CREATE}\n",
        "request.object is missing",
    ),
    (
        "badop.yaml",
        "kind: AdmissionReview\nrequest: {operation: PATCH, object: {kind: Pod}}\n",
        "request.operation 'PATCH' is not one of",
    ),
    ("binary.yaml", "\udcff", "cannot read"),
]


@pytest.mark.parametrize(("name", "content", "message"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_apply_bad_input_names_the_file_and_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    code, out, err = apply(capsys, str(path))
    assert code == 2
    assert out == ""
    assert err.startswith(f"error: {path}")
    assert message in err
    assert "Traceback" not in err


def test_apply_missing_file_and_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = apply(capsys, str(tmp_path / "nope.yaml"))
    assert (code, err) == (2, f"error: {tmp_path / 'nope.yaml'}: no such file\n")
    code, _, err = apply(capsys, str(tmp_path))
    assert code == 2 and err.startswith(f"error: {tmp_path}: cannot read")


def test_apply_review_with_odd_metadata_does_not_crash(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    review = {
        "kind": "AdmissionReview",
        "request": {
            "operation": "CREATE",
            "object": {"kind": "Pod", "metadata": "odd", "spec": {"containers": [{"name": "a"}]}},
        },
    }
    code, _, err = apply(capsys, "-o", "patch", str(write(tmp_path / "odd.json", review)))
    assert code == 0
    assert "Traceback" not in err


def test_apply_bad_namespaces_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "ns.yaml"
    path.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n")
    code, _, err = run(
        capsys,
        "apply",
        "-p",
        str(POLICIES),
        "--namespaces",
        str(path),
        str(EXAMPLES / "notebook.yaml"),
    )
    assert code == 2
    assert err.startswith(f"error: {path}: document 1: kind 'Pod' is not read here; give ")
    path.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x, labels: [a]}\n")
    code, _, err = run(capsys, "apply", "-p", str(POLICIES), "--namespaces", str(path), "-")
    assert (code, err) == (
        2,
        f"error: {path}: document 1: Namespace x: metadata.labels must be a map\n",
    )


def test_apply_bad_policies_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("profiles: [{name: a, gpuShare: false, overcommitRatio: 3}]\n")
    code, out, err = run(capsys, "apply", "-p", str(path), str(EXAMPLES / "notebook.yaml"))
    assert (code, out) == (2, "")
    assert f"error: {path}: document 1: profiles[0].overcommitRatio: must be 1.0" in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        [],
        ["apply"],
        ["apply", "pod.yaml"],
        ["apply", "-p", "x", "-o", "xml", "pod.yaml"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
    capsys.readouterr()


# --- explain -------------------------------------------------------------------------------


def explain(capsys: pytest.CaptureFixture[str], *files: Path) -> tuple[int, str, str]:
    return run(capsys, "explain", "--policies", str(POLICIES), *NS, *map(str, files))


def test_explain_says_which_tenant_rule_and_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = explain(capsys, EXAMPLES / "notebook.yaml")
    assert code == 0
    assert "  tenant:   namespace tenant-a is tenant tenant-a (by name)\n" in out
    assert "  workload: notebook alice-jupyter [notebook-name label]\n" in out
    assert "    MATCH notebooks: notebook pod\n" in out
    assert "      -   katib-trials: is a notebook, not a katib-trial\n" in out
    assert "  profile:  notebook via rule/notebooks (policy kubeflow-default)\n" in out
    assert "  containers: alice-jupyter\n" in out
    assert out.rstrip().endswith("verdict:  allowed")


def test_explain_skip_and_untouched(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = explain(capsys, EXAMPLES / "kfp-driver.yaml", TEST_PODS / "plain-web.yaml")
    assert code == 0
    assert "  profile:  untouched (the rule says skip)\n" in out
    assert "  profile:  none: the pod is left untouched\n" in out
    assert "  workload: not a Kubeflow workload\n" in out


def test_explain_denied_pod_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = explain(capsys, TEST_PODS / "unknown-profile-label.yaml")
    assert code == 1
    assert "  problem:  label gpuwarden.io/profile=heavy-trainig names no profile" in out
    assert "  verdict:  denied: " in out


def test_explain_bad_input_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("kind: Pod\n")
    code, _, err = explain(capsys, path)
    assert (code, err) == (2, f"error: {path}: the Pod has no metadata\n")


# --- test ----------------------------------------------------------------------------------


def test_bundled_suite_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "test", str(POLICIES / "tests"))
    assert code == 0, out
    assert "FAIL" not in out
    assert out.splitlines()[0].split() == ["#", "SUITE", "TEST", "RESULT", "DETAIL"]
    assert out.rstrip().endswith(" passed, 0 failed")


def suite(tmp_path: Path, results: Any, **extra: Any) -> Path:
    (tmp_path / "pods").mkdir(exist_ok=True)
    for path in (EXAMPLES / "notebook.yaml", TEST_PODS / "privileged-gpu.yaml"):
        (tmp_path / "pods" / path.name).write_text(path.read_text())
    doc = {
        "apiVersion": "gpuwarden.io/v1alpha1",
        "kind": "Test",
        "metadata": {"name": "mine"},
        "policies": [str(POLICIES / "default.yaml")],
        "namespaces": [str(NAMESPACES_FILE)],
        "results": results,
        **extra,
    }
    return write(tmp_path / "suite.yaml", doc)


def test_failing_suite_reports_fail_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = suite(
        tmp_path,
        [
            {"name": "right", "resource": "pods/notebook.yaml", "profile": "notebook"},
            {"name": "wrong profile", "resource": "pods/notebook.yaml", "profile": "inference"},
            {"name": "wrong verdict", "resource": "pods/privileged-gpu.yaml", "result": "allowed"},
            {
                "name": "wrong field",
                "resource": "pods/notebook.yaml",
                "fields": {"spec.schedulerName": "default-scheduler", "spec.nope": "x"},
            },
            {
                "name": "wrong message",
                "resource": "pods/privileged-gpu.yaml",
                "result": "denied",
                "message": "hostNetwork",
            },
            {"name": "no warning", "resource": "pods/notebook.yaml", "warnings": ["never said"]},
            {"name": "whole pod", "resource": "pods/notebook.yaml", "pod": "pods/notebook.yaml"},
            {"name": "missing pod", "resource": "pods/absent.yaml"},
        ],
    )
    code, out, _ = run(capsys, "test", str(path))
    assert code == 1
    rows = {
        name: line
        for line in out.splitlines()
        if "  mine  " in line
        for name in [line.split("  mine  ", 1)[1].split("  ")[0]]
    }
    assert " pass " in rows["right"]
    assert "FAIL    expected profile inference, got notebook" in rows["wrong profile"]
    assert "FAIL    expected allowed, got denied: gpuwarden denied the pod" in rows["wrong verdict"]
    assert "spec.schedulerName is 'volcano', expected 'default-scheduler'" in rows["wrong field"]
    assert "spec.nope is missing" in rows["wrong field"]
    assert "denial message lacks 'hostNetwork'" in rows["wrong message"]
    assert "no warning contains 'never said'" in rows["no warning"]
    assert "the mutated pod differs from pods/notebook.yaml" in rows["whole pod"]
    assert "pods/absent.yaml: no such file" in rows["missing pod"]
    assert out.rstrip().endswith("1 passed, 7 failed")


def test_suite_with_bad_policies_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles: [{name: A}]\n")
    path = suite(tmp_path, [{"resource": "pods/notebook.yaml"}], policies=[str(bad)])
    code, out, _ = run(capsys, "test", str(path))
    assert code == 1
    assert "load policies  FAIL" in out
    assert "profiles[0].name" in out


def test_no_suites_found_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "test", str(tmp_path))
    assert code == 2
    assert out.startswith("error: no test suites found")


@pytest.mark.parametrize(
    ("result", "detail"),
    [
        (
            {"fields": ["spec.schedulerName"]},
            "fields must be a map of field path to expected value",
        ),
        ({"pod": 5}, "pod must name a file holding the expected pod"),
    ],
)
def test_malformed_results_fail_instead_of_crashing_or_passing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, result: dict[str, Any], detail: str
) -> None:
    path = suite(tmp_path, [{"name": "odd", "resource": "pods/notebook.yaml", **result}])
    code, out, err = run(capsys, "test", str(path))
    assert code == 1
    assert "FAIL" in out and detail in out
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "detail"),
    [
        ({"metadata": 5}, "metadata: Input should be a valid dictionary"),
        ({"results": 5}, "results must be a list"),
    ],
)
def test_malformed_suites_do_not_crash(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: dict[str, Any], detail: str
) -> None:
    results = extra.pop("results", [{"resource": "pods/notebook.yaml", "result": "allowed"}])
    path = suite(tmp_path, results, **extra)
    code, out, _ = run(capsys, "test", str(path))
    assert detail in out
    assert code == (0 if "0 failed" in detail else 1)
