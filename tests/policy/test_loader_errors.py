"""Validation errors name the file's line and the field meant (issue 21, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.cli import main
from gpuwarden.policy import PolicyError, load_texts

from .support import FIXTURES, policy_text


def messages(*texts: tuple[str, str]) -> list[str]:
    with pytest.raises(PolicyError) as err:
        load_texts(list(texts))
    return [str(issue) for issue in err.value.issues]


def test_misspelled_profile_field_names_the_line_and_the_field_meant() -> None:
    text = policy_text(
        """
profiles:
  - {name: a, maxMemory: 1Gi}
  - name: b
    gpuShare: true
    maxMemroy: 8Gi
"""
    )
    line = [row.strip() for row in text.splitlines()].index("maxMemroy: 8Gi") + 1
    assert messages(("p.yaml", text)) == [
        "p.yaml: document 1: spec.profiles[1].maxMemroy: Extra inputs are not permitted; "
        f"did you mean maxMemory? (line {line})"
    ]


@pytest.mark.parametrize(
    ("spec", "path", "meant"),
    [
        ("backend: {type: volcano, queueName: q}", "spec.backend.queueName", "queue"),
        (
            "workloads: [{name: r, match: {kind: kfp-step, tasknames: [a]}, profile: a}]",
            "spec.workloads[0].match.tasknames",
            "taskNames",
        ),
        (
            "tenants: [{name: t, namespaces: [t], limits: {maxGPUs: 1}}]",
            "spec.tenants[0].limits.maxGPUs",
            "maxGpusPerPod",
        ),
        (
            "tenants: [{name: t, namespaces: [t], overrides: {a: {gpuz: 2}}}]",
            "spec.tenants[0].overrides.a.gpuz",
            "gpus",
        ),
    ],
)
def test_the_field_meant_is_found_inside_unions_lists_and_maps(
    spec: str, path: str, meant: str
) -> None:
    text = policy_text("profiles: [{name: a, maxMemory: 1Gi}]\n" + spec)
    line = [row.strip() for row in text.splitlines()].index(spec) + 1
    (message,) = messages(("p.yaml", text))
    assert message == (
        f"p.yaml: document 1: {path}: Extra inputs are not permitted; did you mean {meant}? "
        f"(line {line})"
    )


def test_a_key_like_no_field_gets_no_guess() -> None:
    text = policy_text("profiles: [{name: a, maxMemory: 1Gi, colour: red}]")
    (message,) = messages(("p.yaml", text))
    assert "did you mean" not in message
    assert message.endswith("colour: Extra inputs are not permitted (line 6)")


def test_lines_count_from_the_start_of_the_file_in_later_documents() -> None:
    first = policy_text("profiles: [{name: a, maxMemory: 1Gi}]", name="one")
    second = policy_text("profiles: [{name: b, maxMemory: lots}]", name="two")
    text = first + "---\n" + second
    line = text.splitlines().index("  profiles: [{name: b, maxMemory: lots}]") + 1
    (message,) = messages(("p.yaml", text))
    assert message.startswith("p.yaml: document 2: spec.profiles[0].maxMemory: ")
    assert message.endswith(f"(line {line})")


def test_bare_file_fields_and_unknown_top_level_keys() -> None:
    assert messages(("profiles.yaml", "profiles:\n  - {name: a}\n  - {name: b, gpuz: 1}\n")) == [
        "profiles.yaml: document 1: profiles[1].gpuz: Extra inputs are not permitted; "
        "did you mean gpus? (line 3)"
    ]
    (message,) = messages(("profiles.yaml", "# seed\nprofile:\n  - {name: a}\n"))
    assert message.endswith("; did you mean profiles? (line 2)")


def test_lines_inside_a_configmap_key_are_the_file_lines() -> None:
    text = (FIXTURES / "seed-configmap.yaml").read_text()
    line = text.splitlines().index(
        next(row for row in text.splitlines() if "maxMemory: 16Gi" in row)
    )
    (message,) = messages(("cm.yaml", text.replace("maxMemory: 16Gi", "maxMemory: x")))
    assert message.startswith("cm.yaml: document 1: data['profiles.yaml']: document 1: ")
    assert message.endswith(f"(line {line + 1})")


def test_lint_prints_the_line_and_the_field_meant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("profiles:\n  - name: a\n    maxMemroy: 8Gi\n")
    assert main(["lint", str(path)]) == 1
    _, err = capsys.readouterr()
    assert err == (
        f"error: {path}: document 1: profiles[0].maxMemroy: Extra inputs are not permitted; "
        "did you mean maxMemory? (line 3)\n"
    )
