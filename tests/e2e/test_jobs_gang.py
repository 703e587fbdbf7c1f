"""Volcano's PodGroup charges what the pods will use (issue 30): the real Training Operator
v1.8.1, gang scheduling with Volcano, sums a PyTorchJob's PodGroup ``minResources`` from its
replica templates, which gpuwarden's job webhooks mutated at submit.

Sources (training-operator v1.8.1): cmd/training-operator.v1/main.go (``--gang-scheduler-name
volcano`` needs the ``scheduling.volcano.sh/v1beta1`` PodGroup CRD); pkg/controller.v1/common/
job.go (ReconcileJobs: the PodGroup named as the job, ``minMember`` the replicas' sum, and
``minResources`` from calcPGMinResources unless ``runPolicy.schedulingPolicy.minResources`` is
set); pkg/controller.v1/common/util.go (CalcPGMinResources, AddResourceList: per pod up to
``minMember``, each container's requests, or its limits where it has no requests). Volcano
itself is not run: the PodGroup is what the operator writes (a minimal CRD keeps it), and the
operator holds the pods while the group has no phase (control/podgroup_control.go,
DelayPodCreationDueToPodGroup).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.gpuwardenserver import wait_for
from gpuwarden.lab.cluster.trainingoperator import TrainingOperator, delete_jobs
from gpuwarden.lab.cluster.webhookstack import Obj, WebhookStack
from gpuwarden.policy.pod.quantity import parse_quantity

from .controlplane import REPO_ROOT, ControlPlane, Tools
from .test_jobs import keeping_crd, predicted
from .webhook import serve_crd

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
VOLCANO_GROUP, VOLCANO_VERSION, PODGROUPS = "scheduling.volcano.sh", "v1beta1", "podgroups"


@pytest.fixture(scope="module")
def gang_operator(
    control_plane: ControlPlane, e2e_tools: Tools, gpuwarden: WebhookStack
) -> Iterator[TrainingOperator]:
    """The operator's PyTorchJob controller with Volcano gang scheduling, after gpuwarden's
    webhooks and a served PodGroup CRD."""
    assert e2e_tools.training_operator is not None, "hack/build-tools.sh builds it"
    serve_crd(gpuwarden.api, keeping_crd("PodGroup", PODGROUPS, VOLCANO_VERSION, VOLCANO_GROUP))
    operator = TrainingOperator(
        control_plane, e2e_tools.training_operator, gang_scheduler="volcano"
    )
    operator.start()
    yield operator
    operator.stop()
    delete_jobs(gpuwarden.api)


def min_resources(job: Obj) -> dict[str, Decimal]:
    """calcPGMinResources of a job with no schedulingPolicy: every replica's pods, each
    container's requests or, without requests, its limits."""
    total: dict[str, Decimal] = {}
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        for _ in range(replica.get("replicas", 1)):
            for container in replica["template"]["spec"]["containers"]:
                resources = container.get("resources") or {}
                asked = resources.get("requests") or resources.get("limits") or {}
                for name, value in asked.items():
                    total[name] = total.get(name, Decimal(0)) + parse_quantity(str(value))
    return total


def as_numbers(resources: Mapping[str, Any]) -> dict[str, Decimal]:
    return {k: parse_quantity(str(v)) for k, v in resources.items()}


def test_the_podgroup_charges_the_mutated_templates(
    gpuwarden: WebhookStack, gang_operator: TrainingOperator
) -> None:
    """A Katib trial's PyTorchJob (one GPU a replica; the default policy shares it as Volcano
    vGPUs): the PodGroup the operator creates asks ``volcano.sh/vgpu-number`` (and the vGPU
    memory and cores) for the three pods, as the pods will, and no ``nvidia.com/gpu``."""
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    job: Obj = yaml.safe_load((REPO_ROOT / "examples" / "jobs" / "pytorchjob.yaml").read_text())
    name = f"trial-{uuid.uuid4().hex[:6]}"
    job["metadata"] = {
        "name": name,
        "namespace": ns,
        "ownerReferences": [
            {
                "apiVersion": "kubeflow.org/v1beta1",
                "kind": "Trial",
                "name": name,
                "uid": str(uuid.uuid4()),
                "controller": True,
            }
        ],
    }
    # As written, each container's requests name no GPU (it is in its limits only), so the
    # operator's PodGroup would charge none.
    as_written = min_resources(job)
    assert not any("gpu" in name for name in as_written), as_written
    expected = predicted(gpuwarden, job)
    assert expected.allowed
    assert {r.admission.mutation.profile for r in expected.replicas} == {"batch-hpo"}
    objects: Any = k8s_client.CustomObjectsApi(gpuwarden.api)
    objects.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job)
    stored = objects.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    assert stored["spec"] == expected.pod["spec"]

    def podgroup() -> Obj | None:
        try:
            found: Obj = objects.get_namespaced_custom_object(
                VOLCANO_GROUP, VOLCANO_VERSION, ns, PODGROUPS, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    group = wait_for(f"the operator's PodGroup {name}", podgroup, timeout=60)
    assert group["spec"]["minMember"] == 3
    charged = as_numbers(group["spec"]["minResources"])
    assert "nvidia.com/gpu" not in charged
    assert charged["volcano.sh/vgpu-number"] == 3
    assert charged == min_resources(stored)  # every resource, as the mutated templates ask
    objects.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    objects.delete_namespaced_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, ns, PODGROUPS, name)
