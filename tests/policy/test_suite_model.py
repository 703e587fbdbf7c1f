"""`gpuwarden test` checks its suites (issue 21, item 6): an unknown key fails the suite with the
file, the line and the key meant; a result that states no expectation fails; -p tests other
policies; the format is in --help."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.cli import main

from .support import EXAMPLES, NAMESPACES_FILE, POLICIES

HEAD = f"""\
apiVersion: gpuwarden.io/v1alpha1
kind: Test
metadata: {{name: mine}}
policies: [{POLICIES / "default.yaml"}]
namespaces: {NAMESPACES_FILE}
results:
"""
NOTEBOOK = EXAMPLES / "notebook.yaml"
ESCAPE = POLICIES / "tests" / "pods" / "escape-visible-devices.yaml"


def run_suite(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, results: str, *argv: str
) -> tuple[int, list[str], Path]:
    path = tmp_path / "suite.yaml"
    path.write_text(HEAD + results)
    code = main(["test", *argv, str(path)])
    out, _ = capsys.readouterr()
    return code, out.splitlines(), path


def test_misspelled_key_fails_the_suite_with_line_and_the_key_meant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = f"""\
  - name: the escape is denied
    resource: {ESCAPE}
    reslt: denied
"""
    code, lines, path = run_suite(capsys, tmp_path, results)
    assert code == 1
    assert lines[1].split() == [
        "1",
        str(path),
        "read",
        "suite",
        "FAIL",
        "line",
        "9:",
        "results[0].reslt:",
        "unknown",
        "key;",
        "did",
        "you",
        "mean",
        "result?",
    ]
    assert lines[-1] == "0 passed, 1 failed"


def test_unknown_suite_level_key_is_named_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(HEAD.replace("namespaces:", "namespace:") + f"  - {{resource: {NOTEBOOK}}}\n")
    assert main(["test", str(path)]) == 1
    out = capsys.readouterr().out
    assert "line 5: namespace: unknown key; did you mean namespaces?" in out


def test_result_that_states_nothing_fails(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = f"""\
  - name: says nothing
    resource: {NOTEBOOK}
  - name: says allowed
    resource: {NOTEBOOK}
    result: allowed
"""
    code, lines, _ = run_suite(capsys, tmp_path, results)
    assert code == 1
    assert lines[1].split("  ")[-1] == (
        "states no expectation: give result, message, profile, fields, warnings or pod"
    )
    assert " pass " in lines[2]
    assert lines[-1] == "1 passed, 1 failed"


def test_profile_null_asserts_no_profile(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = f"""\
  - name: a notebook gets a profile
    resource: {NOTEBOOK}
    profile: null
"""
    code, lines, _ = run_suite(capsys, tmp_path, results)
    assert code == 1
    assert lines[1].endswith("FAIL    expected profile None, got notebook")


@pytest.mark.parametrize(
    ("line", "detail"),
    [
        ("result: deny", "results[0].result: Input should be 'allowed' or 'denied'"),
        ("namespace: examples/ns.yaml", "is not a namespace name"),
        ("fields: [spec.schedulerName]", "fields must be a map of field path to expected value"),
    ],
)
def test_invalid_values_fail_the_suite(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, detail: str
) -> None:
    code, lines, _ = run_suite(capsys, tmp_path, f"  - resource: {NOTEBOOK}\n    {line}\n")
    assert code == 1
    assert "read suite  FAIL" in lines[1] and detail in lines[1]


def test_p_tests_other_policies_than_the_suite_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = f"""\
  - name: notebooks share a GPU
    resource: {NOTEBOOK}
    profile: notebook
"""
    assert run_suite(capsys, tmp_path, results)[0] == 0
    other = tmp_path / "other.yaml"
    other.write_text(
        "profiles: [{name: whole, gpuShare: false}]\n"
        "workloads: [{name: nb, match: {kind: notebook}, profile: whole}]\n"
    )
    code, lines, _ = run_suite(capsys, tmp_path, results, "-p", str(other))
    assert code == 1
    assert lines[1].endswith("FAIL    expected profile notebook, got whole")


def test_the_bundled_suites_still_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test", str(POLICIES / "tests")]) == 0
    assert capsys.readouterr().out.rstrip().endswith(" passed, 0 failed")


def test_help_documents_the_suite_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["test", "--help"])
    out = capsys.readouterr().out
    for key in ("kind: Test", "policies:", "namespaces:", "results:", "resource:", "result:"):
        assert key in out
    for key in ("message:", "profile:", "fields:", "warnings:", "pod:"):
        assert key in out
    assert "a result that states nothing fails" in " ".join(out.split())
