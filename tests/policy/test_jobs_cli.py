"""`gpuwarden apply`, `explain`, `test` and `review` take Kubeflow jobs (issue 30): each replica's
decision, the mutated job, and the pods its controller will create."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuwarden.cli import main
from gpuwarden.commands.review import review_for
from gpuwarden.policy.pod.jobs import trainingoperator

from .support import EXAMPLES, NAMESPACES_FILE, POLICIES

JOB = EXAMPLES / "jobs" / "pytorchjob.yaml"
DRY_RUN = ("--policies", str(POLICIES), "--namespaces", str(NAMESPACES_FILE))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def over_limit(tmp_path: Path) -> Path:
    text = JOB.read_text().replace("namespace: tenant-a", "namespace: tenant-b")
    head, worker = text.split("    Worker:")
    path = tmp_path / "big.yaml"
    path.write_text(
        head + "    Worker:" + worker.replace('nvidia.com/gpu: "1"', 'nvidia.com/gpu: "8"')
    )
    return path


def test_apply_prints_each_replicas_decision_and_the_mutated_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "apply", *DRY_RUN, str(JOB))
    assert code == 0
    assert (
        "tenant-a/bert-finetune Master: allowed (profile heavy-training via rule/training-jobs)"
        in err
    )
    assert (
        "tenant-a/bert-finetune Worker: allowed (profile heavy-training via rule/training-jobs)"
        in err
    )
    job = yaml.safe_load(out)
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert worker["spec"]["schedulerName"] == "volcano"


def test_apply_pods_are_the_controllers_pods_as_admitted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "apply", *DRY_RUN, "-o", "pods", str(JOB))
    assert code == 0
    pods = list(yaml.safe_load_all(out))
    assert [p["metadata"]["name"] for p in pods] == [
        "bert-finetune-master-0",
        "bert-finetune-worker-0",
    ]
    worker = pods[1]
    assert worker["metadata"]["labels"][trainingoperator.REPLICA_TYPE_LABEL] == "worker"
    assert worker["metadata"]["annotations"]["gpuwarden.io/profile"] == "heavy-training"
    assert worker["spec"]["restartPolicy"] == "OnFailure"


def test_apply_and_explain_deny_an_over_limit_job_with_the_replica(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = over_limit(tmp_path)
    code, _, err = run(capsys, "apply", *DRY_RUN, "-o", "patch", str(path))
    assert code == 1
    assert "tenant-b/bert-finetune: denied: Worker: gpuwarden denied the pod: " in err
    assert "tenant-b/bert-finetune Master: allowed" in err
    code, out, _ = run(capsys, "explain", *DRY_RUN, str(path))
    assert code == 1
    assert "PyTorchJob tenant-b/bert-finetune" in out
    assert "  replica Worker: pod bert-finetune-worker-0\n" in out
    assert "  verdict:  denied: Worker: gpuwarden denied the pod: " in out


def test_review_sends_a_job_as_its_own_kind() -> None:
    sent = review_for(yaml.safe_load(JOB.read_text()), "job.yaml", None)
    request = sent["request"]
    assert request["kind"] == {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"}
    assert request["resource"]["resource"] == "pytorchjobs"
    assert request["namespace"] == "tenant-a"


def test_apply_explain_and_review_take_a_katib_trials_batch_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trial = EXAMPLES / "jobs" / "katib-trial-job.yaml"
    code, out, err = run(capsys, "apply", *DRY_RUN, "-o", "pods", str(trial))
    assert code == 0, err
    assert (
        "tenant-a/random-search-x9z4m2kt Job: allowed (profile batch-hpo via rule/katib-trials)"
        in err
    )
    (pod,) = yaml.safe_load_all(out)
    assert pod["metadata"]["generateName"] == "random-search-x9z4m2kt-"
    assert pod["metadata"]["labels"]["katib.kubeflow.org/trial"] == "random-search-x9z4m2kt"
    code, out, _ = run(capsys, "explain", *DRY_RUN, str(trial))
    assert code == 0
    assert "  replica Job: pod random-search-x9z4m2kt-<random>\n" in out
    assert "workload: katib-trial random-search-x9z4m2kt" in out
    request = review_for(yaml.safe_load(trial.read_text()), "trial.yaml", None)["request"]
    assert request["kind"] == {"group": "batch", "version": "v1", "kind": "Job"}
    assert request["resource"]["resource"] == "jobs"


NOTEBOOK = EXAMPLES / "jobs" / "notebook.yaml"


def test_apply_explain_and_review_take_a_notebook(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "apply", *DRY_RUN, "-o", "pods", str(NOTEBOOK))
    assert code == 0, err
    assert "tenant-a/alice-jupyter Notebook: allowed (profile notebook via rule/notebooks)" in err
    (pod,) = yaml.safe_load_all(out)
    assert pod["metadata"]["name"] == "alice-jupyter-0"
    assert pod["metadata"]["labels"]["notebook-name"] == "alice-jupyter"
    assert pod["metadata"]["annotations"]["gpuwarden.io/profile"] == "notebook"
    code, out, _ = run(capsys, "apply", *DRY_RUN, str(NOTEBOOK))
    assert code == 0
    nb = yaml.safe_load(out)
    assert nb["metadata"]["annotations"]["gpuwarden.io/profile"] == "notebook"
    assert nb["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    code, out, _ = run(capsys, "explain", *DRY_RUN, str(NOTEBOOK))
    assert code == 0
    assert "Notebook tenant-a/alice-jupyter" in out
    assert "  replica Notebook: pod alice-jupyter-0\n" in out
    assert "workload: notebook alice-jupyter" in out
    # Over the tenant's limit, at a version the API server also serves.
    big = tmp_path / "big.yaml"
    big.write_text(
        NOTEBOOK.read_text()
        .replace("namespace: tenant-a", "namespace: tenant-b")
        .replace('nvidia.com/gpu: "1"', 'nvidia.com/gpu: "8"')
        .replace("kubeflow.org/v1\n", "kubeflow.org/v1beta1\n")
    )
    code, _, err = run(capsys, "apply", *DRY_RUN, "-o", "patch", str(big))
    assert code == 1
    assert "tenant-b/alice-jupyter: denied: Notebook: gpuwarden denied the pod: " in err
    request = review_for(yaml.safe_load(big.read_text()), "big.yaml", None)["request"]
    assert request["kind"] == {"group": "kubeflow.org", "version": "v1", "kind": "Notebook"}
    assert request["requestKind"]["version"] == "v1beta1"
    assert request["resource"]["resource"] == "notebooks"
    assert request["object"]["apiVersion"] == "kubeflow.org/v1"
