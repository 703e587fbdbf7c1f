"""A Katib trial as a batch/v1 Job, queued by the real Kueue and charged what its pod will use
(issue 30, item 2).

The lab on a control plane of its own: kube-apiserver, kube-scheduler, KWOK's nodes (one pool
sharing its GPUs through MPS, advertised as ``nvidia.com/gpu.shared``, and one of whole GPUs),
gpuwarden serve behind the chart's webhooks (the job webhooks on), Kueue v0.17.0 with its
``batch/job`` integration, and kube-controller-manager's Job controller. The Job is what Katib
creates for a trial, labelled as Katib's pod webhook labels the trial's pods (Katib itself does
not run here), suspended and queued as Kueue requires. gpuwarden mutates its template at submit
to one MPS slice; Kueue builds the Workload from the stored Job and charges that slice to the
tenant's ClusterQueue (the queues are ``gpuwarden render --kueue --job-webhooks``'s); the Job
controller creates the pod, which gpuwarden's pod webhook leaves as the template said and
kube-scheduler binds to an MPS node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from gpuwarden.lab.cluster.controllermanager import running_controller_manager
from gpuwarden.lab.cluster.controlplane import Tools
from gpuwarden.lab.cluster.gpuwardenserver import wait_for
from gpuwarden.lab.cluster.kueue import Kueue, running_kueue
from gpuwarden.lab.cluster.nodes import GpuNodePool
from gpuwarden.lab.cluster.schedulinglab import SchedulingLab, lab_control_plane, running_lab
from gpuwarden.lab.cluster.webhookstack import KUBEFLOW_PROFILE_LABELS, WebhookStack
from gpuwarden.lab.cluster.webhookstack import plane_webhook_stack as gpuwarden_on
from gpuwarden.policy import load_paths
from gpuwarden.policy.pod.jobs import batch as batch_jobs
from gpuwarden.policy.render.kueue import DEFAULT_LOCAL_QUEUE, MPS_GPUS, QUEUE_NAME_LABEL
from gpuwarden.policy.render.objects import RenderOptions, render

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
NAMESPACE = "katib-trials"
SHARED = "nvidia.com/gpu.shared"
_SETTLE = 120.0

# Katib trials of one GPU share it: MPS replicas advertised as nvidia.com/gpu.shared.
POLICY = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: katib-kueue}
spec:
  backend: {type: nvidia, sharedResourceName: nvidia.com/gpu.shared, mpsReplicas: 4}
  profiles:
    - {name: batch-hpo, gpuShare: true, maxMemory: 20Gi, priority: 50, preemptible: true, threadPercentage: 25}
  workloads:
    - {name: katib-trials, match: {kind: katib-trial}, profile: batch-hpo, requireGpuRequest: true}
  defaultProfile: batch-hpo
  tenants:
    - name: hpo
      namespaces: [katib-trials]
      queue: hpo
      quota: {gpus: 1}
      queueSpec: {weight: 1}
"""


@dataclass
class KatibLab:
    api: k8s_client.ApiClient
    gpuwarden: WebhookStack
    kueue: Kueue
    nodes: list[str]


@pytest.fixture(scope="module")
def katib_lab(e2e_tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KatibLab]:
    policies = tmp_path_factory.mktemp("katib-policies")
    (policies / "katib.yaml").write_text(POLICY)
    plane = lab_control_plane(e2e_tools)
    plane.start()
    with contextlib.ExitStack() as stack:
        stack.callback(plane.stop)
        lab: SchedulingLab = stack.enter_context(running_lab(plane, e2e_tools))
        api = plane.api_client()
        stack.callback(api.close)
        gpuwarden = stack.enter_context(
            gpuwarden_on(
                plane,
                helm=e2e_tools.helm,
                workdir=tmp_path_factory.mktemp("katib-gpuwarden"),
                policies=(Path(policies),),
            )
        )
        kueue = stack.enter_context(running_kueue(plane, e2e_tools, jobs=True))
        stack.enter_context(running_controller_manager(plane, e2e_tools))
        gpuwarden.tenant_namespace(labels=KUBEFLOW_PROFILE_LABELS, name=NAMESPACE)
        rendering = render(
            load_paths([str(policies)]),
            RenderOptions(
                priority_classes=False, quotas=False, queues=False, kueue=True, job_webhooks=True
            ),
        )
        assert not rendering.errors, rendering.errors
        kueue.apply_queues(api, rendering.objects)
        nodes = lab.add_pools(
            api,
            [
                GpuNodePool("mps", 1, 1, mps_replicas=4, rename_shared=True),
                GpuNodePool("whole", 1, 4),
            ],
        )
        yield KatibLab(api, gpuwarden, kueue, nodes)


def trial_job(name: str) -> Obj:
    """A trial's Job as Katib v0.19 creates it from an Experiment's batch Job trialSpec, its
    template labelled as Katib's pod webhook labels the pods (Katib does not run here)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {QUEUE_NAME_LABEL: DEFAULT_LOCAL_QUEUE},
        },
        "spec": {
            "suspend": True,
            "template": {
                "metadata": {
                    "labels": {
                        "katib.kubeflow.org/trial": name,
                        "katib.kubeflow.org/experiment": "random-search",
                    }
                },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "training-container",
                            "image": "docker.io/kubeflowkatib/pytorch-mnist-gpu:v0.19.0",
                            "command": ["python3", "/opt/pytorch-mnist/mnist.py", "--lr=0.01"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def _workload(api: k8s_client.ApiClient, job: Mapping[str, Any]) -> Obj | None:
    custom: Any = k8s_client.CustomObjectsApi(api)
    for item in custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "workloads")[
        "items"
    ]:
        owners = item["metadata"].get("ownerReferences") or []
        if any(o["uid"] == job["metadata"]["uid"] for o in owners):
            found: Obj = item
            return found
    return None


def _usage(api: k8s_client.ApiClient, flavor: str, resource: str) -> str:
    custom: Any = k8s_client.CustomObjectsApi(api)
    queue = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", "hpo")
    for used in (queue.get("status") or {}).get("flavorsUsage") or []:
        if used["name"] == flavor:
            for r in used["resources"]:
                if r["name"] == resource:
                    return str(r.get("total", "0"))
    return "0"


def test_a_shared_katib_trial_job_is_mutated_queued_charged_slices_and_runs_on_mps(
    katib_lab: KatibLab,
) -> None:
    api = katib_lab.api
    batch: Any = k8s_client.BatchV1Api(api)
    core: Any = k8s_client.CoreV1Api(api)
    job = trial_job("random-search-x9z4m2kt")
    batch.create_namespaced_job(NAMESPACE, job)
    stored: Obj = api.sanitize_for_serialization(
        batch.read_namespaced_job(job["metadata"]["name"], NAMESPACE)
    )

    # Mutated at submit: the template asks for what the pod will get.
    template = stored["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert container["resources"]["limits"] == {SHARED: "1"}, container["resources"]
    assert template["metadata"]["annotations"]["gpuwarden.io/profile"] == "batch-hpo"

    # Queued by Kueue, which charges the slice from the stored template.
    def admitted() -> Obj | None:
        workload = _workload(api, stored)
        status = (workload or {}).get("status") or {}
        return workload if status.get("admission") else None

    workload = wait_for("Kueue to admit the trial's Workload", admitted, _SETTLE)
    assert workload is not None
    (podset,) = workload["spec"]["podSets"]
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    assert assignment["flavors"] == {SHARED: MPS_GPUS.name}, assignment
    assert assignment["resourceUsage"][SHARED] == "1", assignment
    assert "nvidia.com/gpu" not in assignment["resourceUsage"]
    assert podset["template"]["spec"]["containers"][0]["resources"]["limits"] == {SHARED: "1"}
    wait_for(
        "the ClusterQueue to report the slice in use",
        lambda: _usage(api, MPS_GPUS.name, SHARED) == "1",
        _SETTLE,
    )

    # Admitted: unsuspended; the Job controller creates the pod, the pod webhook leaves it as
    # the template said, and it runs on the MPS node.
    selector = f"{batch_jobs.JOB_LABELS[1]}={job['metadata']['name']}"

    def running() -> Obj | None:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        for pod in pods:
            if pod.status.phase == "Running":
                found: Obj = api.sanitize_for_serialization(pod)
                return found
        return None

    pod = wait_for("the trial's pod to run", running, _SETTLE)
    assert pod is not None
    assert pod["spec"]["nodeName"].startswith("mps-"), pod["spec"]["nodeName"]
    # Kueue wrote its flavor's node labels into the suspended Job's template as it admitted it:
    # that update went through gpuwarden's job webhooks too.
    assert pod["spec"]["nodeSelector"] == dict(MPS_GPUS.node_labels)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {SHARED: "1"}
    assert pod["metadata"]["annotations"]["gpuwarden.io/profile"] == "batch-hpo"
    assert pod["metadata"]["labels"]["katib.kubeflow.org/trial"] == job["metadata"]["name"]
