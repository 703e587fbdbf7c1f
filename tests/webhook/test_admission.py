"""/mutate and /validate answer real AdmissionReviews the way the API server needs."""

from __future__ import annotations

import base64
import contextlib
import datetime
import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden import cli
from gpuwarden.policy.pod import keys
from gpuwarden.webhook.logs import AdmissionLog, JSONFormatter

from .support import (
    POLICY,
    Webhook,
    Workdir,
    apply_response,
    decoded_patch,
    notebook_pod,
    review,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_pods() -> list[Path]:
    pods = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        if any(d.get("kind") == "Pod" for d in docs):
            pods.append(path)
    return pods


async def test_mutate_gives_a_notebook_its_profile(webhook: Webhook) -> None:
    pod = notebook_pod()
    response = await webhook.admit("mutate", review(pod))
    assert response["allowed"] is True
    mutated = apply_response(pod, response)
    annotations = mutated["metadata"]["annotations"]
    assert annotations[keys.ANNOTATION_PROFILE] == "light-training"
    assert annotations[keys.ANNOTATION_TENANT] == "team-a"
    assert annotations[keys.ANNOTATION_GPU_MEMORY_LIMIT] == "16Gi"
    limits = mutated["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits
    assert limits["volcano.sh/vgpu-number"] == "1"
    assert mutated["spec"]["schedulerName"] == "volcano"
    assert mutated["spec"]["priorityClassName"]
    assert any("light-training" in w for w in response["warnings"])
    assert response["auditAnnotations"]["tenant"] == "team-a"
    # The user's own settings survive.
    assert mutated["spec"]["containers"][0]["env"][0]["name"] == "NB_PREFIX"


async def test_the_mutated_pod_passes_validate_without_a_patch(webhook: Webhook) -> None:
    pod = notebook_pod()
    mutated = apply_response(pod, await webhook.admit("mutate", review(pod)))
    response = await webhook.admit("validate", review(mutated))
    assert response["allowed"] is True, response
    assert "patch" not in response and "patchType" not in response


async def test_validate_denies_with_status_and_what_to_change(webhook: Webhook) -> None:
    pod = notebook_pod()
    mutated = apply_response(pod, await webhook.admit("mutate", review(pod)))
    mutated["spec"]["containers"][0]["env"].append(
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    )
    response = await webhook.admit("validate", review(mutated))
    assert response["allowed"] is False
    status = response["status"]
    assert status["code"] == 403
    assert status["reason"] == "Forbidden"
    assert "NVIDIA_VISIBLE_DEVICES" in status["message"]
    assert "patch" not in response


async def test_a_denial_logs_its_reason_and_message(
    webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuwarden.admission")
    pod = notebook_pod()
    pod["spec"]["containers"][0]["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    await webhook.admit("validate", review(pod))
    (record,) = [r for r in caplog.records if r.name == "gpuwarden.admission"]
    fields: dict[str, Any] = record.fields  # type: ignore[attr-defined]
    assert fields["decision"] == "denied"
    assert fields["reason"] == "GPUIsolationEscape"
    assert "env[NVIDIA_VISIBLE_DEVICES]" in fields["message"]


async def test_v1beta1_is_answered_in_kind(webhook: Webhook) -> None:
    response = await webhook.admit(
        "mutate", review(notebook_pod(), api_version="admission.k8s.io/v1beta1")
    )
    assert response["allowed"] is True
    assert decoded_patch(response)


@pytest.mark.parametrize(
    ("kind", "resource"),
    [
        ({"group": "apps", "version": "v1", "kind": "Deployment"}, "deployments"),
        ({"group": "", "version": "v1", "kind": "ConfigMap"}, "configmaps"),
        ({"group": "", "version": "v1", "kind": "Binding"}, "pods"),
    ],
)
async def test_objects_that_are_not_pods_are_allowed_untouched(
    webhook: Webhook, kind: dict[str, str], resource: str
) -> None:
    obj = {"apiVersion": "apps/v1", "kind": kind["kind"], "metadata": {"name": "x"}, "spec": {}}
    data = review(
        obj,
        kind=kind,
        resource={"group": kind["group"], "version": "v1", "resource": resource},
        sub_resource="binding" if kind["kind"] == "Binding" else None,
    )
    for endpoint in ("mutate", "validate"):
        response = await webhook.admit(endpoint, data)
        assert response == {"uid": data["request"]["uid"], "allowed": True}


async def test_delete_of_a_pod_is_allowed(webhook: Webhook) -> None:
    data = review(None, operation="DELETE", old=notebook_pod())
    for endpoint in ("mutate", "validate"):
        assert (await webhook.admit(endpoint, data))["allowed"] is True


async def test_dry_run_gets_the_same_answer(webhook: Webhook) -> None:
    pod = notebook_pod()
    real = await webhook.admit("mutate", review(pod, uid="same"))
    dry = await webhook.admit("mutate", review(pod, uid="same", dry_run=True))
    assert dry == real


async def test_one_json_log_line_per_admission(
    webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuwarden.admission")
    data = review(notebook_pod())
    await webhook.admit("mutate", data)
    records = [r for r in caplog.records if r.name == "gpuwarden.admission"]
    assert len(records) == 1
    fields: dict[str, Any] = records[0].fields  # type: ignore[attr-defined]
    assert fields["uid"] == data["request"]["uid"]
    assert fields["namespace"] == "team-a"
    assert fields["pod"] == "alice-jupyter-0"
    assert fields["tenant"] == "team-a"
    assert fields["profile"] == "light-training"
    assert fields["decision"] == "allowed"
    assert fields["duration_ms"] > 0
    line = json.loads(JSONFormatter().format(records[0]))
    assert line["uid"] == data["request"]["uid"] and line["msg"] == "admission"


async def test_metrics_count_requests_by_tenant_and_profile(webhook: Webhook) -> None:
    await webhook.admit("mutate", review(notebook_pod()))
    for metrics_port in (False, True):
        status, text = await webhook.get("/metrics", metrics_port=metrics_port)
        assert status == 200
        assert (
            'gpuwarden_admission_requests_total{decision="allowed",endpoint="mutate",'
            'profile="light-training",tenant="team-a"} 1.0'
        ) in text
        assert "gpuwarden_admission_duration_seconds_bucket" in text
        assert "gpuwarden_certificate_expiry_timestamp_seconds 1." in text
        assert "gpuwarden_namespace_cache_age_seconds" in text
        assert 'gpuwarden_policy_reloads_total{result="ok"} 1.0' in text


async def test_probes(webhook: Webhook) -> None:
    assert await webhook.get("/healthz") == (200, "ok\n")
    status, text = await webhook.get("/readyz", metrics_port=True)
    assert status == 200 and text.startswith("ready\n")


def cli_patch(policies: Path, namespaces: Path, pod_file: Path, namespace: str) -> bytes:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(
            [
                "apply",
                "--policies",
                str(policies),
                "--namespaces",
                str(namespaces),
                "-n",
                namespace,
                "-o",
                "patch",
                str(pod_file),
            ]
        )
    assert code in (0, 1), out.getvalue()
    return out.getvalue().strip().encode()


@pytest.mark.parametrize("pod_file", example_pods(), ids=lambda p: p.stem)
async def test_patch_bytes_equal_the_cli(
    webhook: Webhook, workdir: Workdir, pod_file: Path
) -> None:
    pod = next(
        d
        for d in yaml.safe_load_all(pod_file.read_text())
        if isinstance(d, dict) and d.get("kind") == "Pod"
    )
    pod["metadata"]["namespace"] = "team-a"
    single = workdir.root / f"{pod_file.stem}.yaml"
    single.write_text(yaml.safe_dump(pod))
    expected = cli_patch(workdir.policies, workdir.namespaces, single, "team-a")
    response = await webhook.admit("mutate", review(pod))
    got = base64.b64decode(response["patch"]) if "patch" in response else b"[]"
    assert got == expected


def test_there_are_example_pods() -> None:
    assert len(example_pods()) >= 3


async def test_the_json_line_on_the_configured_stream(
    webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuwarden.admission")  # as --log-level info does
    stream = io.StringIO()
    assert webhook.server.context is not None
    webhook.server.context.admission_log = AdmissionLog(stream)
    data = review(notebook_pod(), dry_run=True)
    await webhook.admit("mutate", data)
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["msg"] == "admission" and entry["level"] == "info"
    assert entry["uid"] == data["request"]["uid"]
    assert (entry["namespace"], entry["pod"]) == ("team-a", "alice-jupyter-0")
    assert (entry["tenant"], entry["profile"], entry["decision"]) == (
        "team-a",
        "light-training",
        "allowed",
    )
    assert entry["dry_run"] is True and entry["duration_ms"] > 0
    # The same timestamp format as every other log line: ISO 8601, milliseconds, UTC.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", entry["ts"])
    written = datetime.datetime.fromisoformat(entry["ts"])
    assert abs((datetime.datetime.now(datetime.UTC) - written).total_seconds()) < 60


# Manifests as `kubectl get namespaces,priorityclasses,configmaps -o yaml` writes them. The
# Namespace carries no labels in the file: the API server gives every namespace its
# kubernetes.io/metadata.name label, so the CLI and `serve --namespaces` must add it alike.
CLUSTER_LIST = """\
apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: Namespace, metadata: {name: research}}
  - apiVersion: scheduling.k8s.io/v1
    kind: PriorityClass
    metadata: {name: gpuwarden-light-training}
    value: 4242
    preemptionPolicy: Never
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: mps-settings, namespace: research}
    data: {CUDA_MPS_PIPE_DIRECTORY: /tmp/mps}
"""
BY_NAME = "    - {name: research, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: research}}}"


async def test_the_cli_reads_a_cluster_file_as_the_webhook_does(
    make_webhook: Any, workdir: Workdir
) -> None:
    workdir.write_policy(POLICY.replace("    - {name: team-a, namespaces: [team-a]}", BY_NAME))
    workdir.namespaces.write_text(CLUSTER_LIST)
    webhook = await make_webhook()
    pod = notebook_pod("research")
    single = workdir.root / "research-notebook.yaml"
    single.write_text(yaml.safe_dump(pod))

    response = await webhook.admit("mutate", review(pod, namespace="research"))
    patch = base64.b64decode(response["patch"])
    assert patch == cli_patch(workdir.policies, workdir.namespaces, single, "research")
    ops = {op["path"]: op.get("value") for op in json.loads(patch)}
    assert ops["/metadata/annotations/gpuwarden.io~1tenant"] == "research"
    assert (ops["/spec/priority"], ops["/spec/preemptionPolicy"]) == (4242, "Never")

    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "mps-settings"}}]
    denied = await webhook.admit("validate", review(pod, namespace="research"))
    assert denied["allowed"] is False
    assert "ConfigMap key CUDA_MPS_PIPE_DIRECTORY" in denied["status"]["message"]
    single.write_text(yaml.safe_dump(pod))
    err = io.StringIO()
    argv = ["-p", str(workdir.policies), "--namespaces", str(workdir.namespaces), str(single)]
    with contextlib.redirect_stderr(err):
        code = cli.main(["apply", "-n", "research", *argv])
    assert code == 1
    assert "ConfigMap key CUDA_MPS_PIPE_DIRECTORY" in err.getvalue()
    # The summary names the priority the pod gets: the cluster's PriorityClass value.
    assert "(priority 4242)" in err.getvalue()
