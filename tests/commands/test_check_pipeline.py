"""`gpuwarden check-pipeline` on the checked-in compiled example, without the kfp SDK."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.cli import main

ROOT = Path(__file__).resolve().parents[2]
COMPILED = ROOT / "examples" / "kfp" / "pipeline.yaml"
POLICIES = ROOT / "policies"


def _check(pipeline: Path, namespace: str, *extra: str) -> int:
    return main(["check-pipeline", str(pipeline), "-p", str(POLICIES), "-n", namespace, *extra])


def test_the_compiled_example_passes_in_tenant_a(capsys: pytest.CaptureFixture[str]) -> None:
    assert _check(COMPILED, "tenant-a") == 0
    assert capsys.readouterr().out.splitlines() == [
        "pipeline gpu-aware-training in namespace tenant-a",
        "  ok       step load-data: no profile (left untouched)",
        "  ok       step train: profile light-training",
    ]


def test_a_step_beyond_the_tenants_limit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same pipeline edited by hand to 4 GPUs: tenant-b allows 2 a pod."""
    edited = tmp_path / "p.yaml"
    text = COMPILED.read_text(encoding="utf-8")
    edited.write_text(text.replace("Count: '1'", "Count: '4'").replace("count: '1'", "count: '4'"))
    assert _check(edited, "tenant-b") == 1
    out = capsys.readouterr().out
    assert (
        "  REFUSED  step train: denied: gpuwarden denied the pod: container main asks for 4" in out
    )
    assert "tenant tenant-b allows at most 2 per pod" in out


def test_a_label_set_by_hand_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edited = tmp_path / "p.yaml"
    text = COMPILED.read_text(encoding="utf-8")
    edited.write_text(
        text.replace("gpuwarden.io/profile: light-training", "gpuwarden.io/profile: heavy-trianing")
    )
    assert _check(edited, "tenant-a") == 1
    assert (
        "  REFUSED  step train: profile 'heavy-trianing' is not defined by the policies; did you "
        "mean heavy-training?" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("kind: Pod\n", "not a compiled KFP v2 pipeline"),
        ("pipelineInfo: {name: x}\n", "a component, not a pipeline (no root DAG)"),
        (
            "pipelineInfo: {name: x}\nroot: {dag: {tasks: {a: {componentRef: {name: c}}}}}\n",
            "root.dag.tasks.a.componentRef names no component: 'c'",
        ),
        ("pipelineInfo: {name: x}\nroot: {dag: {tasks: [a]}}\n", "root.dag.tasks is not a mapping"),
        ("root: [\n", "invalid YAML"),
    ],
)
def test_what_is_wrong_with_the_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, error: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text, encoding="utf-8")
    assert _check(bad, "tenant-a") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}") and error in err


def test_the_namespace_must_be_a_namespace_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert _check(COMPILED, "policies/") == 2
    assert "is not a namespace name" in capsys.readouterr().err


def test_namespace_labels_from_namespaces_file_pick_the_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kubeflow-user-carol is in the kubeflow-profiles tenant by its labels alone: with them the
    step is checked against that tenant's allowedProfiles; without them no tenant applies."""
    policy = tmp_path / "policy.yaml"
    text = (POLICIES / "default.yaml").read_text(encoding="utf-8")
    policy.write_text(text.replace(" light-training, inference, inference-whole,", " inference,"))
    args = ["check-pipeline", str(COMPILED), "-p", str(policy), "-n", "kubeflow-user-carol"]
    assert main([*args, "--namespaces", str(ROOT / "examples" / "namespaces.yaml")]) == 1
    assert (
        "  REFUSED  step train: profile light-training is not allowed for tenant "
        "kubeflow-profiles; set gpuwarden.io/profile to one of:" in capsys.readouterr().out
    )
    assert main(args) == 0
