"""`gpuwarden audit` on a `kubectl get pods -A -o yaml` dump (issue 32, item 1): per tenant and
namespace, what enforcing the policies would deny or change, as a table, JSON and PolicyReports."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.cli import main
from gpuwarden.policy import admit, load_paths
from gpuwarden.policy.admission.decision import AdmissionRequest, ClusterView
from gpuwarden.policy.admission.pipeline import apply_patch

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
EXAMPLES = ROOT / "examples"
NAMESPACES = EXAMPLES / "namespaces.yaml"


def _running(name: str, pod: dict[str, Any], phase: str = "Running") -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"]["name"] = name
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["status"] = {"phase": phase}
    return pod


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dump of four pods of tenant-a: one admitted before gpuwarden (would change), one that
    gpuwarden admitted (passes), one privileged (would be denied), one finished (skipped)."""
    notebook = yaml.safe_load((EXAMPLES / "notebook.yaml").read_text())
    policies = load_paths([POLICIES])
    labels = {
        doc["metadata"]["name"]: doc["metadata"].get("labels") or {}
        for doc in yaml.safe_load_all(NAMESPACES.read_text())
    }
    result = admit(
        AdmissionRequest("CREATE", "tenant-a", notebook),
        policies,
        ClusterView(namespace_labels=labels),
    )
    admitted = apply_patch(notebook, result.mutation)
    privileged = copy.deepcopy(admitted)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    items = [
        _running("before-gpuwarden", notebook),
        _running("admitted", admitted),
        _running("privileged", privileged),
        _running("finished", notebook, phase="Succeeded"),
    ]
    path = tmp_path_factory.mktemp("audit") / "pods.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def _audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["audit", "-p", str(POLICIES), "--namespaces", str(NAMESPACES), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_counts_per_tenant_and_namespace(
    dump: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _audit(capsys, str(dump))
    assert code == 1  # a pod would be denied
    lines = out.splitlines()
    assert lines[0].split() == [
        "TENANT",
        "NAMESPACE",
        "PODS",
        "JOBS",
        "WOULD",
        "DENY",
        "WOULD",
        "CHANGE",
        "PASS",
        "SKIP",
    ]
    assert lines[1].split() == ["tenant-a", "tenant-a", "4", "0", "1", "1", "1", "1"]
    assert any(
        line.startswith("tenant-a/privileged: would deny (privileged): gpuwarden denied the pod")
        for line in lines
    )
    assert any(
        line.startswith("tenant-a/before-gpuwarden: would apply ")
        and "(profile notebook via rule/notebooks)" in line
        for line in lines
    )
    assert not any(line.startswith(("tenant-a/admitted", "tenant-a/finished")) for line in lines)


def test_json_lists_each_pod_with_its_patch(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _audit(capsys, "-o", "json", str(dump))
    assert code == 1
    report = json.loads(out)
    pods = {pod["name"]: pod for pod in report["pods"]}
    assert {name: pod["verdict"] for name, pod in pods.items()} == {
        "before-gpuwarden": "change",
        "admitted": "pass",
        "privileged": "deny",
        "finished": "skip",
    }
    assert pods["privileged"]["wouldDeny"]["check"] == "privileged"
    assert "securityContext.privileged" in pods["privileged"]["wouldDeny"]["message"]
    change = pods["before-gpuwarden"]["wouldChange"]
    assert change and all({"op", "path"} <= set(op) for op in change)
    assert pods["admitted"]["wouldChange"] == []
    assert report["summary"] == [
        {
            "tenant": "tenant-a",
            "namespace": "tenant-a",
            "pods": 4,
            "jobs": 0,
            "wouldDeny": 1,
            "wouldChange": 1,
            "pass": 1,
            "skip": 1,
        }
    ]


# The fields of wgpolicyk8s.io/v1alpha2 PolicyReport that the output may use, read from
# kubernetes-sigs/wg-policy-prototypes policy-report/crd/v1alpha2 (no network in CI).
REPORT_FIELDS = {"apiVersion", "kind", "metadata", "results", "scope", "scopeSelector", "summary"}
RESULT_FIELDS = {
    "category",
    "message",
    "policy",
    "properties",
    "resourceSelector",
    "resources",
    "result",
    "rule",
    "scored",
    "severity",
    "source",
    "timestamp",
}
RESULT_VALUES = {"pass", "fail", "warn", "error", "skip"}
SUMMARY_FIELDS = {"pass", "fail", "warn", "error", "skip"}
REFERENCE_FIELDS = {
    "apiVersion",
    "fieldPath",
    "kind",
    "name",
    "namespace",
    "resourceVersion",
    "uid",
}


def test_policy_reports_follow_the_v1alpha2_schema(
    dump: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _audit(capsys, "-o", "policyreport", str(dump))
    assert code == 1
    listed = json.loads(out)
    assert listed["kind"] == "List"
    (report,) = listed["items"]
    assert report["apiVersion"] == "wgpolicyk8s.io/v1alpha2"
    assert report["kind"] == "PolicyReport"
    assert report["metadata"]["namespace"] == "tenant-a"
    assert set(report) <= REPORT_FIELDS
    for result in report["results"]:
        assert set(result) <= RESULT_FIELDS and "policy" in result  # policy is required
        assert result["result"] in RESULT_VALUES
        assert all(isinstance(v, str) for v in result["properties"].values())
        for resource in result["resources"]:
            assert set(resource) <= REFERENCE_FIELDS
    assert set(report["summary"]) <= SUMMARY_FIELDS
    assert all(isinstance(v, int) for v in report["summary"].values())
    outcomes = {(r["resources"][0]["name"], r["rule"], r["result"]) for r in report["results"]}
    assert outcomes == {
        ("before-gpuwarden", "mutation", "warn"),
        ("admitted", "admission", "pass"),
        ("privileged", "privileged", "fail"),
        ("finished", "admission", "skip"),
    }
    assert report["summary"] == {"pass": 1, "fail": 1, "warn": 1, "error": 0, "skip": 1}
    (fail,) = [r for r in report["results"] if r["result"] == "fail"]
    assert fail["policy"] == "kubeflow-default"
    assert fail["resources"][0] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "privileged",
        "namespace": "tenant-a",
        "uid": "uid-privileged",
    }


def test_bad_input_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [{"kind": "Service"}]})
    )
    code, _, err = _audit(capsys, str(wrong))
    assert code == 2
    assert f"error: {wrong}: document 1: item 1: expected a Pod or a Kubeflow job (" in err
    assert "PyTorchJob" in err and "with a spec, got 'Service'" in err
    code, _, err = _audit(capsys)
    assert code == 2 and "no pods given" in err


def test_unknown_namespace_labels_are_warned(
    dump: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["audit", "-p", str(POLICIES), str(dump)])
    _, err = capsys.readouterr()
    assert code == 1
    assert "warning: namespace tenant-a: its labels are unknown" in err


def test_apply_and_explain_give_the_webhooks_answer_under_audit(
    dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--enforcement-action` is the webhook's flag: the same decision, offline."""
    items = yaml.safe_load(dump.read_text())["items"]
    privileged = tmp_path / "privileged.yaml"
    privileged.write_text(yaml.safe_dump(items[2]))
    common = ["-p", str(POLICIES), "--namespaces", str(NAMESPACES), str(privileged)]
    assert main(["explain", *common]) == 1
    assert "  verdict:  denied: gpuwarden denied the pod" in capsys.readouterr().out
    assert main(["explain", "--enforcement-action", "audit", *common]) == 0
    out = capsys.readouterr().out
    assert "  verdict:  allowed (audit); enforced: gpuwarden denied the pod" in out
    assert main(["apply", "--enforcement-action", "audit", *common]) == 0
    err = capsys.readouterr().err
    assert "warning: tenant-a/privileged: gpuwarden (audit) would deny the pod:" in err
    notebook = tmp_path / "notebook.yaml"
    notebook.write_text(yaml.safe_dump(items[0]))
    dryrun = ["apply", "--enforcement-action", "dryrun", "-o", "patch", "-p", str(POLICIES)]
    assert main([*dryrun, "--namespaces", str(NAMESPACES), str(notebook)]) == 0
    out, err = capsys.readouterr()
    assert out == "[]\n"
    assert "gpuwarden (dryrun): the pod is left as sent" in err


def test_kubeflow_jobs_are_audited_as_their_replicas_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32 with issue 30: the Training Operator jobs in a dump are judged as the CREATE of
    their replicas' pods, a denial naming the replica; a finished job is skipped."""
    job = yaml.safe_load((EXAMPLES / "jobs" / "pytorchjob.yaml").read_text())
    job["metadata"].update(namespace="tenant-b", name="bert", uid="uid-bert")
    over = copy.deepcopy(job)
    over["metadata"].update(name="bert-8", uid="uid-bert-8")
    worker = over["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"]["nvidia.com/gpu"] = "8"
    done = copy.deepcopy(over)
    done["metadata"].update(name="bert-done", uid="uid-bert-done")
    done["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    dump = tmp_path / "jobs.yaml"
    dump.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [job, over, done]})
    )
    code, out, _ = _audit(capsys, str(dump))
    assert code == 1
    lines = out.splitlines()
    assert lines[1].split() == ["tenant-b", "tenant-b", "0", "3", "1", "2", "0", "1"]
    assert any(
        line.startswith("tenant-b/PyTorchJob/bert-8: would deny (tenantLimits): Worker: ")
        and "allows at most 2 per pod" in line
        for line in lines
    )
    assert any(line.startswith("tenant-b/PyTorchJob/bert: would apply ") for line in lines)
    code, out, _ = _audit(capsys, "-o", "json", str(dump))
    verdicts = {j["name"]: (j["kind"], j["verdict"]) for j in json.loads(out)["jobs"]}
    assert verdicts == {
        "bert": ("PyTorchJob", "change"),
        "bert-8": ("PyTorchJob", "deny"),
        "bert-done": ("PyTorchJob", "skip"),
    }
    code, out, _ = _audit(capsys, "-o", "policyreport", str(dump))
    (report,) = json.loads(out)["items"]
    (fail,) = [r for r in report["results"] if r["result"] == "fail"]
    assert fail["resources"][0] == {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "bert-8",
        "namespace": "tenant-b",
        "uid": "uid-bert-8",
    }
