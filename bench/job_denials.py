"""How many pod creations the API server denies for one over-limit PyTorchJob (issue 30).

A PyTorchJob asking 8 GPUs per worker in tenant-b of the default policies (at most 2 a pod) is
submitted to a real kube-apiserver with the real Training Operator v1.8.1 running
(gpuwarden/lab/cluster/trainingoperator.py), twice:

* **pods only**: the chart's webhooks with ``webhook.jobs: false``, as before issue 30: the job is
  stored, and its controller's pods are denied, retry after retry;
* **jobs at submit**: the chart's default webhooks: the job itself is refused.

Printed, for each: whether the job was stored, and the pod creations gpuwarden's pod webhook
denied in the window (``apiserver_admission_webhook_admission_duration_seconds_count`` of
validate.gpuwarden.io with ``rejected="true"``, from the API server's /metrics).

Run: ``python bench/job_denials.py`` (two 5-minute windows); ``--seconds 30`` for a short run.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwarden.lab.cluster.controlplane import ControlPlane, build_tools  # noqa: E402
from gpuwarden.lab.cluster.gpuwardenserver import POLICIES_DIR  # noqa: E402
from gpuwarden.lab.cluster.trainingoperator import TrainingOperator  # noqa: E402
from gpuwarden.lab.cluster.webhookstack import webhook_stack  # noqa: E402

JOB_FILE = ROOT / "examples" / "jobs" / "pytorchjob.yaml"
POD_WEBHOOK = "validate.gpuwarden.io"


def denied_by_pod_webhook(plane: ControlPlane) -> float:
    """Requests the pod webhook has rejected so far (every one a pod creation here)."""
    total = 0.0
    for line in plane.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if (
            line.startswith("apiserver_admission_webhook_admission_duration_seconds_count{")
            and f'name="{POD_WEBHOOK}"' in line
            and 'rejected="true"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def over_limit_job(namespace: str) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(JOB_FILE.read_text())
    job["metadata"] = {"name": f"big-{uuid.uuid4().hex[:6]}", "namespace": namespace}
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"]["nvidia.com/gpu"] = "8"
    return job


def window(plane: ControlPlane, workdir: Path, jobs: bool, seconds: float) -> tuple[bool, float]:
    """Submit the job under one chart setting; whether it was stored, and the pod denials."""
    workdir.mkdir(parents=True, exist_ok=True)
    api = plane.api_client()
    try:
        with webhook_stack(
            api,
            kubeconfig=plane.kubeconfig_path,
            helm=plane.helm_path,
            workdir=workdir,
            policies=(POLICIES_DIR,),
            chart_values={"webhook": {"jobs": jobs}},
        ) as stack:
            namespace = stack.tenant_namespace(name="tenant-b")
            job = over_limit_job(namespace)
            objects: Any = k8s_client.CustomObjectsApi(api)
            before = denied_by_pod_webhook(plane)
            stored = True
            try:
                objects.create_namespaced_custom_object(
                    "kubeflow.org", "v1", namespace, "pytorchjobs", job
                )
            except ApiException as exc:
                if exc.status != 403:
                    raise
                stored = False
            time.sleep(seconds)
            denied = denied_by_pod_webhook(plane) - before
            if stored:
                objects.delete_namespaced_custom_object(
                    "kubeflow.org", "v1", namespace, "pytorchjobs", job["metadata"]["name"]
                )
            return stored, denied
    finally:
        api.close()  # type: ignore[no-untyped-call]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=300.0, help="each window (default 300)")
    args = parser.parse_args(argv)
    tools = build_tools(stdout=sys.stderr)
    if tools.training_operator is None:
        print("error: hack/build-tools.sh built no Training Operator", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        plane = stack.enter_context(ControlPlane(tools))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="job-denials-")))
        operator = TrainingOperator(plane, tools.training_operator)
        operator.start()
        stack.callback(operator.stop)
        rows = []
        for label, jobs in (("pods only", False), ("jobs at submit", True)):
            stored, denied = window(plane, workdir / label.replace(" ", "-"), jobs, args.seconds)
            rows.append((label, stored, denied))
    print(f"one over-limit PyTorchJob (8 GPUs a worker, tenant-b allows 2), {args.seconds:g} s:")
    print(f"{'webhooks':<16} {'job stored':>10} {'pod creations denied':>21}")
    for label, stored, denied in rows:
        print(f"{label:<16} {'yes' if stored else 'no':>10} {denied:>21.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
