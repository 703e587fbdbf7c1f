"""gpuwarden.kfp and `gpuwarden check-pipeline` on pipelines compiled by the real kfp SDK."""

# No `from __future__ import annotations`: kfp reads the components' parameter types at run time.

from pathlib import Path
from typing import Any

import pytest
import yaml

# kfp 2.17 pins kubernetes<31, which the services' venv cannot take: these run in the kfp
# extra's own venv (`make kfp-test`, part of `make test`).
pytest.importorskip("kfp", reason="needs the kfp extra: make kfp-test")

from kfp import dsl

from gpuwarden.cli import main
from gpuwarden.kfp import ProfileError, check_pipeline, compile_pipeline, use_profile
from gpuwarden.pipelines import read_ir, steps_of

from .example import COMPILED, POLICIES, ROOT, compile_to, example_module


@dsl.component(base_image="python:3.11")
def fit(epochs: int) -> int:
    return epochs


@dsl.pipeline(name="two-profiles")
def two_profiles(gpus: int = 1) -> None:
    train = fit(epochs=3).set_display_name("Fine-tune")
    train.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1)
    use_profile(train, "light-training")
    evaluate = fit(epochs=1)
    use_profile(evaluate, "ligth-training")


@dsl.pipeline(name="four-gpus")
def four_gpus() -> None:
    train = fit(epochs=3)
    train.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(4)
    use_profile(train, "light-training")


def _labels(documents: list[Any], executor: str) -> dict[str, str]:
    platform = next(doc for doc in documents if "platforms" in doc)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    labels: dict[str, str] = executors[executor]["podMetadata"]["labels"]
    return labels


def test_use_profile_sets_the_pod_label_in_the_platform_spec(tmp_path: Path) -> None:
    documents = compile_to(two_profiles, tmp_path / "p.yaml")
    assert _labels(documents, "exec-fit") == {"gpuwarden.io/profile": "light-training"}
    assert _labels(documents, "exec-fit-2") == {"gpuwarden.io/profile": "ligth-training"}
    spec = documents[0]
    accelerator = spec["deploymentSpec"]["executors"]["exec-fit"]["container"]["resources"]
    assert accelerator["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert accelerator["accelerator"]["resourceCount"] == "1"
    # use_profile sets the label and nothing else: the second step's container has no resources.
    assert "resources" not in spec["deploymentSpec"]["executors"]["exec-fit-2"]["container"]


def test_the_check_refuses_a_typo_naming_the_step_and_the_profile_meant() -> None:
    with pytest.raises(ProfileError) as refused:
        check_pipeline(two_profiles, policies=POLICIES, namespace="tenant-a")
    assert refused.value.problems == (
        "step fit-2: profile 'ligth-training' is not defined by the policies; did you mean "
        "light-training? Fix the name in use_profile(task, NAME), or the pod label "
        "gpuwarden.io/profile.",
    )
    by_step = {s.step.name: s for s in refused.value.check.steps}
    assert by_step["fit"].ok and by_step["fit"].profile == "light-training"
    assert "pipeline two-profiles in namespace tenant-a: 1 problem(s)" in str(refused.value)


def test_the_check_refuses_what_the_tenants_limits_deny() -> None:
    """tenant-b allows at most 2 GPUs a pod; tenant-a 8."""
    with pytest.raises(ProfileError) as refused:
        check_pipeline(four_gpus, policies=[POLICIES], namespace="tenant-b")
    (problem,) = refused.value.problems
    assert problem.startswith("step fit: denied: gpuwarden denied the pod: container main asks")
    assert "tenant tenant-b allows at most 2 per pod" in problem
    assert "set_accelerator_limit(N)" in problem
    check = check_pipeline(four_gpus, policies=POLICIES, namespace="tenant-a")
    assert [s.profile for s in check.steps] == ["light-training"]


def test_a_tenant_that_may_not_choose_the_profile_is_refused(tmp_path: Path) -> None:
    """A Kubeflow Profile namespace (tenant kubeflow-profiles) may choose from allowedProfiles
    only; the check finds the tenant by the namespace's labels."""
    policy = tmp_path / "policy.yaml"
    text = (POLICIES / "default.yaml").read_text(encoding="utf-8")
    policy.write_text(text.replace(" light-training, inference, inference-whole,", " inference,"))
    with pytest.raises(ProfileError) as refused:
        check_pipeline(
            four_gpus,
            policies=policy,
            namespace="team-c",
            namespace_labels={"app.kubernetes.io/part-of": "kubeflow-profile"},
        )
    assert refused.value.problems[0].startswith(
        "step fit: profile light-training is not allowed for tenant kubeflow-profiles; "
        "set gpuwarden.io/profile to one of:"
    )


def test_compile_pipeline_writes_nothing_when_a_step_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "pipeline.yaml"
    with pytest.raises(ProfileError):
        compile_pipeline(two_profiles, target, policies=POLICIES, namespace="tenant-a")
    assert not target.exists()


def test_the_documented_example_compiles_and_passes(tmp_path: Path) -> None:
    target = tmp_path / "pipeline.yaml"
    module = example_module()
    check = compile_pipeline(
        module.gpu_aware_training, target, policies=POLICIES, namespace="tenant-a"
    )
    assert {s.step.name: s.profile for s in check.steps} == {
        "load-data": None,
        "train": "light-training",
    }
    fresh = steps_of(read_ir(compile_to(module.gpu_aware_training, target), str(target)))
    assert [s.profile for s in fresh] == [None, "light-training"]
    # The checked-in compiled example (which the CLI's tests and the e2e suite read) is what the
    # example compiles to: regenerate it with `python examples/kfp/pipeline.py`.
    checked_in = steps_of(read_ir(list(yaml.safe_load_all(COMPILED.read_text())), str(COMPILED)))
    assert checked_in == fresh


def test_the_docs_include_the_example() -> None:
    page = (ROOT / "docs" / "kfp.md").read_text(encoding="utf-8")
    assert '--8<-- "examples/kfp/pipeline.py"' in page


def test_check_pipeline_cli_on_the_compiled_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    compiled = tmp_path / "p.yaml"
    compile_to(two_profiles, compiled)
    code = main(["check-pipeline", str(compiled), "--policies", str(POLICIES), "-n", "tenant-a"])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines() == [
        "pipeline two-profiles in namespace tenant-a",
        "  ok       step fit (Fine-tune): profile light-training",
        "  REFUSED  step fit-2: profile 'ligth-training' is not defined by the policies; did you "
        "mean light-training? Fix the name in use_profile(task, NAME), or the pod label "
        "gpuwarden.io/profile.",
    ]


@dsl.pipeline(name="inner")
def inner(gpus: int = 1) -> None:
    step = fit(epochs=2)
    step.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(gpus)
    use_profile(step, "light-training")


@dsl.pipeline(name="nested")
def nested(gpus: int = 1) -> None:
    inner(gpus=gpus)


def test_a_nested_step_is_named_by_its_path_and_a_run_time_count_is_a_warning() -> None:
    """A pipeline used as a step: its steps are found under the outer task's name; a GPU count
    from a pipeline parameter is only known at run time, so the check says it left it out."""
    check = check_pipeline(nested, policies=POLICIES, namespace="tenant-a")
    (step,) = check.steps
    assert step.step.path == ("inner", "fit")
    assert step.profile == "light-training"
    (warning,) = step.warnings
    assert warning.startswith("step inner/fit: accelerator nvidia.com/gpu: {{$.inputs.parameters")
    assert warning.endswith("is set at run time; checked without it")


@dsl.pipeline(name="no-type")
def no_type() -> None:
    fit(epochs=1).set_accelerator_limit(2)


def test_a_gpu_count_without_a_type_is_refused() -> None:
    """KFP's driver sets the accelerator limit only with its type: the step would get no GPU."""
    with pytest.raises(ProfileError) as refused:
        check_pipeline(no_type, policies=POLICIES, namespace="tenant-a")
    assert refused.value.problems == (
        "step fit: asks for 2 accelerator(s) with no accelerator type, and KFP's driver sets no "
        "limit without one: the step would run with no GPU; add "
        ".set_accelerator_type('nvidia.com/gpu')",
    )
