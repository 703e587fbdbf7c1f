"""What Kueue charges a job and what its pods ask agree (issue 20, item 2).

Kueue admits a PyTorchJob, a TrainJob or a Katib trial's Job from its pod templates and charges
what they ask for before any pod exists; gpuwarden rewrites each pod later. `gpuwarden lint`
refuses a Kueue-queued tenant's rule for those kinds whose profile would make the pods ask for
something else, and the validating webhook warns on such a pod of a job Kueue admitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden.cli import main
from gpuwarden.lab.inputs.workloads import workload_pod
from gpuwarden.policy import AdmissionRequest, ClusterView, admit, load_texts
from gpuwarden.policy.lint import lint_errors
from gpuwarden.policy.render.kueue import PODSET_LABEL

from .support import POLICIES

POLICY = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {{name: kueue-consistency}}
spec:
  backend: {{type: nvidia, sharedResourceName: nvidia.com/gpu.shared}}
  profiles:
    - {{name: whole, gpuShare: false, maxMemory: 80Gi}}
    - {{name: two-gpus, gpuShare: false, gpus: 2, maxMemory: 80Gi}}
    - {{name: shared, gpuShare: true, maxMemory: 20Gi, threadPercentage: 25}}
  workloads:
{rules}
  tenants:
    - name: vision
      namespaces: [vision]
      limits: {{maxGpusPerPod: 8}}
{vision}
"""
KUEUE_QUEUED = "      queue: vision\n      quota: {gpus: 8}\n      queueSpec: {weight: 2}"
QUOTA_ONLY = "      quota: {gpus: 8}"
CONSISTENT_RULES = """\
    - {name: training, match: {kind: training-job}, profile: whole, requireGpuRequest: true}
    - {name: trials, match: {kind: katib-trial}, profile: whole, requireGpuRequest: true}
    - {name: notebooks, match: {kind: notebook}, profile: shared, requireGpuRequest: true}"""


def _policy(rules: str, vision: str = KUEUE_QUEUED) -> str:
    return POLICY.format(rules=rules, vision=vision)


def _lint(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    code = main(["lint", str(path)])
    out, err = capsys.readouterr()
    return code, out + err


def test_lint_refuses_a_training_rule_that_sets_gpus_for_a_kueue_queued_tenant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = "    - {name: training, match: {kind: training-job}, profile: two-gpus, requireGpuRequest: true}"
    code, output = _lint(capsys, tmp_path, _policy(rules))
    assert code == 1
    (line,) = [line for line in output.splitlines() if line.startswith("error:")]
    assert line.startswith("error: tenant vision: rule training gives training-job pods profile")
    assert "profile two-gpus sets gpus: 2" in line
    # What Kueue charges, and what the pods would ask instead.
    assert "Kueue admits Training Operator jobs (PyTorchJob" in line
    assert "charges the nvidia.com/gpu they ask for, but each pod asks for 2 nvidia.com/gpu" in line


def test_lint_refuses_shared_trials_and_rules_that_give_gpus_to_replicas_asking_none(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = """\
    - {name: trials, match: {kind: katib-trial}, profile: shared, requireGpuRequest: true}
    - {name: trainers, match: {kind: trainjob}, profile: whole}"""
    code, output = _lint(capsys, tmp_path, _policy(rules))
    assert code == 1
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 2
    trials, trainers = errors
    assert "rule trials gives katib-trial pods profile shared" in trials
    assert "each pod asks for the template's count as nvidia.com/gpu.shared" in trials
    assert "rule trainers gives trainjob pods profile whole whether or not they ask" in trainers
    assert "set requireGpuRequest: true" in trainers


def test_a_tenant_override_that_sets_gpus_is_named(tmp_path: Path) -> None:
    vision = KUEUE_QUEUED + "\n      overrides: {whole: {gpus: 4}}"
    rules = "    - {name: training, match: {kind: training-job}, profile: whole, requireGpuRequest: true}"
    (error,) = lint_errors(load_texts([("policy.yaml", _policy(rules, vision))]))
    assert "tenant vision's override sets gpus: 4" in error
    assert "each pod asks for 4 nvidia.com/gpu" in error


def test_consistent_rules_and_tenants_kueue_does_not_queue_pass(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Whole GPUs at the template's count for jobs; notebooks are plain pods, charged as
    # gpuwarden made them, so they may share.
    code, output = _lint(capsys, tmp_path, _policy(CONSISTENT_RULES))
    assert code == 0, output
    # A tenant with only a quota is a ResourceQuota unless rendered for Kueue: lint cannot tell.
    rules = "    - {name: training, match: {kind: training-job}, profile: two-gpus, requireGpuRequest: true}"
    code, output = _lint(capsys, tmp_path, _policy(rules, QUOTA_ONLY))
    assert code == 0, output


# --- the pods -------------------------------------------------------------------------------


def _job_pod(admitted_by_kueue: bool, gpus: int = 4) -> dict[str, Any]:
    """A PyTorchJob worker as the Training Operator creates it; once Kueue admitted the job, its
    pod template carries Kueue's podset label."""
    labels = {PODSET_LABEL: "worker"} if admitted_by_kueue else {}
    return workload_pod(
        "training-job",
        name="bert-worker-0",
        namespace="vision",
        workload="bert",
        gpus=gpus,
        labels=labels,
    )


def _gpus(pod: dict[str, Any]) -> dict[str, str]:
    (container,) = pod["spec"]["containers"]
    limits: dict[str, str] = container["resources"]["limits"]
    return {k: v for k, v in limits.items() if k.startswith("nvidia.com/gpu")}


def test_a_whole_gpu_profile_keeps_what_kueue_charged_and_warns_nothing() -> None:
    policies = load_texts([("policy.yaml", _policy(CONSISTENT_RULES))])
    result = admit(AdmissionRequest("CREATE", "vision", _job_pod(True)), policies, ClusterView())
    assert result.allowed
    assert _gpus(dict(result.pod)) == {"nvidia.com/gpu": "4"}  # the template's request
    assert not [w for w in result.validation.warnings if "Kueue" in w]


def test_a_pod_of_a_kueue_admitted_job_that_the_policy_rewrites_gets_a_warning() -> None:
    rules = "    - {name: training, match: {kind: training-job}, profile: two-gpus}"
    policies = load_texts([("policy.yaml", _policy(rules))])
    result = admit(AdmissionRequest("CREATE", "vision", _job_pod(True)), policies, ClusterView())
    assert result.allowed
    assert _gpus(dict(result.pod)) == {"nvidia.com/gpu": "2"}  # Kueue charged 4
    assert result.validation.warnings == (
        "gpuwarden: Kueue charged the job's template, but profile two-gpus sets gpus: 2",
    )
    # A pod Kueue did not admit from a template (a plain pod: Kueue charges it as created).
    plain = admit(AdmissionRequest("CREATE", "vision", _job_pod(False)), policies, ClusterView())
    assert not [w for w in plain.validation.warnings if "Kueue" in w]


def test_a_shared_profile_on_a_kueue_admitted_job_pod_is_named_with_its_resource() -> None:
    rules = "    - {name: training, match: {kind: training-job}, profile: shared}"
    policies = load_texts([("policy.yaml", _policy(rules))])
    pod = _job_pod(True, gpus=1)
    result = admit(AdmissionRequest("CREATE", "vision", pod), policies, ClusterView())
    assert _gpus(dict(result.pod)) == {"nvidia.com/gpu.shared": "1"}
    (said,) = [w for w in result.validation.warnings if "Kueue" in w]
    assert "profile shared asks for GPUs as nvidia.com/gpu.shared" in said


def test_render_kueue_refuses_what_kueue_would_charge_differently() -> None:
    from gpuwarden.policy.render.objects import RenderOptions, render

    rules = CONSISTENT_RULES.replace(
        "profile: whole, requireGpuRequest: true}\n    - {name: trials",
        "profile: two-gpus, requireGpuRequest: true}\n    - {name: trials",
    )
    bad = render(load_texts([("p.yaml", _policy(rules))]), RenderOptions(kueue=True))
    assert any("rule training" in e and "two-gpus" in e for e in bad.errors), bad.errors
    good = render(load_texts([("p.yaml", _policy(CONSISTENT_RULES))]), RenderOptions(kueue=True))
    assert not good.errors


def test_render_kueue_with_the_job_webhooks_accepts_shared_trials_where_templates_are_mutated() -> (
    None
):
    """With the job webhooks on, a Katib trial's Job or a Training Operator job reaches Kueue
    with its templates asking what its pods will (issue 30): a shared profile for trials is then
    charged as the pods use it. A tenant that keeps its job templates is still refused, and so
    is every such rule while the job webhooks are off, saying how to fix it."""
    from gpuwarden.policy.render.objects import RenderOptions, render

    rules = """\
    - {name: training, match: {kind: training-job}, profile: two-gpus, requireGpuRequest: true}
    - {name: trials, match: {kind: katib-trial}, profile: shared, requireGpuRequest: true}"""
    policies = load_texts([("p.yaml", _policy(rules))])
    off = render(policies, RenderOptions(kueue=True))
    assert len(off.errors) == 2
    assert all("pass --job-webhooks" in e for e in off.errors), off.errors
    on = render(policies, RenderOptions(kueue=True, job_webhooks=True))
    assert not on.errors
    kept = load_texts([("p.yaml", _policy(rules, KUEUE_QUEUED + "\n      jobTemplates: keep"))])
    refused = render(kept, RenderOptions(kueue=True, job_webhooks=True)).errors
    assert len(refused) == 2
    assert all("keeps its job templates as written (jobTemplates: keep)" in e for e in refused)
    # TrainJobs are not mutated at submit, and a rule that gives a GPU to a replica asking none
    # is wrong either way (the job webhooks never see a job without GPUs).
    rules = (
        "    - {name: trainers, match: {kind: trainjob}, profile: shared, requireGpuRequest: true}"
    )
    (error,) = render(
        load_texts([("p.yaml", _policy(rules))]), RenderOptions(kueue=True, job_webhooks=True)
    ).errors
    assert "Kueue admits TrainJobs" in error and "--job-webhooks" not in error
    rules = "    - {name: trials, match: {kind: katib-trial}, profile: whole}"
    (error,) = render(
        load_texts([("p.yaml", _policy(rules))]), RenderOptions(kueue=True, job_webhooks=True)
    ).errors
    assert "set requireGpuRequest: true" in error


def test_render_kueue_on_the_default_policy(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped default policy (Katib trials share GPUs) is refused without the job webhooks
    and rendered with them."""
    assert main(["render", "-p", str(POLICIES), "--kueue"]) != 0
    assert "rule katib-trials gives katib-trial pods profile batch-hpo" in capsys.readouterr().err
    assert main(["render", "-p", str(POLICIES), "--kueue", "--job-webhooks"]) == 0
    assert "kind: ClusterQueue" in capsys.readouterr().out
