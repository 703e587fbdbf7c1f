"""Tenant queues in the lab: `gpuwarden render --kueue` applied to a real API server, with the
real Kueue (v0.17.0, out of cluster: gpuwarden.lab.cluster.kueue), kube-scheduler and KWOK's GPU nodes.

Each test renders its own policy, creates the objects, and sends pods as gpuwarden's webhook
makes them (the policy core's admit(), the code the webhook runs) into namespaces that have the
rendered LocalQueue ``default``: Kueue's pod webhook labels and gates them, Kueue admits them
against the tenants' ClusterQueues, kube-scheduler binds them and KWOK runs them. What a tenant
sees is read back from the cluster: which pods run, which stay gated and why (the Workload's
condition), which were preempted and for what reason.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from e2e.webhook import read_pod
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.controlplane import ControlPlane, Tools
from gpuwarden.lab.cluster.gpuwardenserver import (
    wait_for,
)
from gpuwarden.lab.cluster.kueue import Kueue, running_kueue
from gpuwarden.lab.cluster.nodes import GpuNodePool
from gpuwarden.lab.cluster.schedulinglab import SchedulingLab
from gpuwarden.lab.cluster.webhookstack import (
    create_pod,
)
from gpuwarden.lab.inputs.workloads import workload_pod
from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    PolicySet,
    PriorityClassInfo,
    admit,
    load_texts,
)
from gpuwarden.policy.render.kueue import DEFAULT_LOCAL_QUEUE, QUEUE_NAME_LABEL
from gpuwarden.policy.render.objects import RenderOptions, render

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
}
ADMISSION_GATE = "kueue.x-k8s.io/admission"
WHOLE_FLAVOR = "gpuwarden-whole-gpus"
_SETTLE = 60.0
_HTTP_NOT_FOUND = 404
_HTTP_CONFLICT = 409

# Whole GPUs on NVIDIA's device plugin; every training-job replica gets one.
POLICY = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {{name: kueue-{suffix}}}
spec:
  backend: {{type: nvidia}}
  profiles:
    - {{name: kueue-training, gpuShare: false, maxMemory: 80Gi, priority: 200}}
  workloads:
    - {{name: training, match: {{kind: training-job}}, profile: kueue-training, requireGpuRequest: true}}
  tenants:
{tenants}
"""


@pytest.fixture(scope="module")
def kueue(lab_plane: ControlPlane, e2e_tools: Tools) -> Iterator[Kueue]:
    with running_kueue(lab_plane, e2e_tools) as manager:
        yield manager


@dataclass
class Cohort:
    """One test's tenants: the rendered policy applied, and their pods."""

    api: k8s_client.ApiClient
    policies: PolicySet
    names: Mapping[str, str]  # role in the test -> tenant (and namespace) name
    kueue: Kueue

    def pod(self, role: str) -> Obj:
        """A training-job replica in the role's namespace, mutated as gpuwarden's webhook
        mutates it, created through the API server (where Kueue's webhook gates it)."""
        namespace = self.names[role]
        name = f"{role}-{uuid.uuid4().hex[:6]}"
        pod = workload_pod("training-job", name=name, namespace=namespace, workload=name, gpus=1)
        classes = {
            o["metadata"]["name"]: PriorityClassInfo(o["value"], o["preemptionPolicy"])
            for o in render(self.policies).of_kind("PriorityClass")
        }
        admission = admit(
            AdmissionRequest("CREATE", namespace, pod),
            self.policies,
            ClusterView(priority_classes=classes),
        )
        assert admission.allowed, admission.validation.message
        created = create_pod(self.api, admission.pod).pod
        assert created["metadata"]["labels"][QUEUE_NAME_LABEL] == DEFAULT_LOCAL_QUEUE
        assert {"name": ADMISSION_GATE} in created["spec"]["schedulingGates"]
        return created

    def pods(self, role: str, count: int) -> list[Obj]:
        return [self.pod(role) for _ in range(count)]

    def cluster_queue(self, role: str) -> Obj:
        custom: Any = k8s_client.CustomObjectsApi(self.api)
        found: Obj = custom.get_cluster_custom_object(
            GROUP, VERSION, "clusterqueues", self.names[role]
        )
        return found

    def workload(self, pod: Mapping[str, Any]) -> Obj | None:
        """The Workload Kueue made for a pod (it names the pod as its owner)."""
        custom: Any = k8s_client.CustomObjectsApi(self.api)
        namespace = pod["metadata"]["namespace"]
        for item in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")[
            "items"
        ]:
            owners = item["metadata"].get("ownerReferences") or []
            if any(o["uid"] == pod["metadata"]["uid"] for o in owners):
                found: Obj = item
                return found
        return None


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition["type"] == kind:
            found: Mapping[str, Any] = condition
            return found
    return None


def _apply(api: k8s_client.ApiClient, objects: Sequence[Mapping[str, Any]]) -> None:
    """Create the rendered objects (flavors and PriorityClasses other tests made stay as they are)."""
    custom: Any = k8s_client.CustomObjectsApi(api)
    scheduling: Any = k8s_client.SchedulingV1Api(api)
    for obj in objects:
        try:
            if obj["kind"] == "PriorityClass":
                scheduling.create_priority_class(dict(obj))
            elif obj["kind"] == "LocalQueue":
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, obj["metadata"]["namespace"], "localqueues", dict(obj)
                )
            else:
                custom.create_cluster_custom_object(GROUP, VERSION, PLURALS[obj["kind"]], dict(obj))
        except ApiException as exc:
            if exc.status != _HTTP_CONFLICT or obj["kind"] not in (
                "PriorityClass",
                "ResourceFlavor",
            ):
                raise


def _active(api: k8s_client.ApiClient, objects: Sequence[Mapping[str, Any]]) -> None:
    """Wait until Kueue reports every ClusterQueue and LocalQueue Active. Its pod webhook
    defaults the queue name only for a LocalQueue it has seen: a pod created before that would
    not be queued at all."""
    custom: Any = k8s_client.CustomObjectsApi(api)
    queues = [o for o in objects if o["kind"] in ("ClusterQueue", "LocalQueue")]

    def probe() -> bool:
        for obj in queues:
            meta = obj["metadata"]
            if obj["kind"] == "LocalQueue":
                found = custom.get_namespaced_custom_object(
                    GROUP, VERSION, meta["namespace"], "localqueues", meta["name"]
                )
            else:
                found = custom.get_cluster_custom_object(
                    GROUP, VERSION, "clusterqueues", meta["name"]
                )
            active = _condition(found, "Active")
            if active is None or active["status"] != "True":
                return False
        return True

    wait_for(f"Kueue to report {len(queues)} queues Active", probe, _SETTLE)


@pytest.fixture
def cohort(
    kueue: Kueue, scheduling_lab: SchedulingLab, lab_plane: ControlPlane
) -> Iterator[Callable[[Mapping[str, str], int], Cohort]]:
    """Make a cohort: tenants (role -> the tenant's YAML fields, namespaces and name added) and
    a pool of 4-GPU nodes. Afterwards pods, Workloads and queues go (while Kueue runs, which
    holds finalizers on them), so the next test's cohort starts empty."""
    api = lab_plane.api_client()
    made: list[Cohort] = []

    def make(tenants: Mapping[str, str], nodes: int) -> Cohort:
        suffix = uuid.uuid4().hex[:6]
        names = {role: f"{role}-{suffix}" for role in tenants}
        lines = [
            f"    - {{name: {names[role]}, namespaces: [{names[role]}], {fields}}}"
            for role, fields in tenants.items()
        ]
        text = POLICY.format(suffix=suffix, tenants="\n".join(lines))
        policies = load_texts([("kueue.yaml", text)])
        core: Any = k8s_client.CoreV1Api(api)
        for name in names.values():
            core.create_namespace({"metadata": {"name": name}})
        rendering = render(policies, RenderOptions(quotas=False, queues=False, kueue=True))
        assert not rendering.errors and not rendering.warnings
        _apply(api, rendering.objects)
        _active(api, rendering.objects)
        scheduling_lab.add_pools(api, [GpuNodePool(f"kueue-{suffix}", nodes, 4)])
        made.append(Cohort(api, policies, names, kueue))
        return made[-1]

    try:
        yield make
    finally:
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(api.close)
            scheduling_lab.remove_nodes(api)  # every pod, then the nodes
            for made_cohort in made:
                _delete_queues(api, lab_plane, made_cohort.names.values())


def _delete_queues(api: k8s_client.ApiClient, plane: ControlPlane, names: Iterable[str]) -> None:
    custom: Any = k8s_client.CustomObjectsApi(api)
    names = list(names)
    for name in names:
        for workload in custom.list_namespaced_custom_object(GROUP, VERSION, name, "workloads")[
            "items"
        ]:
            with contextlib.suppress(ApiException):
                custom.delete_namespaced_custom_object(
                    GROUP, VERSION, name, "workloads", workload["metadata"]["name"]
                )
        with contextlib.suppress(ApiException):
            custom.delete_namespaced_custom_object(
                GROUP, VERSION, name, "localqueues", DEFAULT_LOCAL_QUEUE
            )
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)

    def gone() -> bool:
        for name in names:
            try:
                custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)
            except ApiException as exc:
                if exc.status == _HTTP_NOT_FOUND:
                    continue
                raise
            return False
        return True

    wait_for(f"ClusterQueues {', '.join(names)} to be deleted", gone, _SETTLE)


# --- what a tenant sees -------------------------------------------------------------------


def _running(cohort: Cohort, pods: Sequence[Mapping[str, Any]]) -> list[Obj]:
    """The pods once each runs on a node (Kueue admitted it, the scheduler bound it)."""

    def probe() -> list[Obj] | None:
        found = [
            read_pod(cohort.api, p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods
        ]
        running = [f for f in found if (f.get("status") or {}).get("phase") == "Running"]
        return found if len(running) == len(found) else None

    return wait_for(f"{len(pods)} pods to run", probe, _SETTLE)


def _some_running(cohort: Cohort, pods: Sequence[Mapping[str, Any]], count: int) -> list[Obj]:
    """Exactly ``count`` of the pods, once that many run."""

    def probe() -> list[Obj] | None:
        found = [
            p for p in _alive(cohort, pods) if (p.get("status") or {}).get("phase") == "Running"
        ]
        return found if len(found) == count else None

    return wait_for(f"{count} of {len(pods)} pods to run", probe, _SETTLE)


def _kept_out(cohort: Cohort, pod: Mapping[str, Any]) -> str:
    """The reason Kueue gives for not admitting a pod, once it has evaluated it; the pod is
    still gated (kube-scheduler never saw it)."""

    def probe() -> str | None:
        workload = cohort.workload(pod)
        reserved = _condition(workload, "QuotaReserved") if workload else None
        if reserved is None or reserved["status"] != "False" or not reserved.get("message"):
            return None
        return str(reserved["message"])

    message = wait_for(f"Kueue to keep {pod['metadata']['name']} out", probe, _SETTLE)
    current = read_pod(cohort.api, pod["metadata"]["namespace"], pod["metadata"]["name"])
    assert {"name": ADMISSION_GATE} in current["spec"]["schedulingGates"]
    assert not current["spec"].get("nodeName")
    return message


def _alive(cohort: Cohort, pods: Sequence[Mapping[str, Any]]) -> list[Obj]:
    out = []
    for pod in pods:
        try:
            out.append(read_pod(cohort.api, pod["metadata"]["namespace"], pod["metadata"]["name"]))
        except ApiException as exc:
            if exc.status != _HTTP_NOT_FOUND:
                raise
    return out


def _usage(queue: Mapping[str, Any]) -> dict[str, str]:
    """A ClusterQueue's whole-GPU usage: total and borrowed, as its status reports them."""
    for flavor in (queue.get("status") or {}).get("flavorsUsage") or []:
        if flavor["name"] == WHOLE_FLAVOR:
            (gpu,) = [r for r in flavor["resources"] if r["name"] == "nvidia.com/gpu"]
            return {"total": str(gpu.get("total", "0")), "borrowed": str(gpu.get("borrowed", "0"))}
    return {"total": "0", "borrowed": "0"}


def _usage_is(cohort: Cohort, role: str, total: int, borrowed: int) -> None:
    want = {"total": str(total), "borrowed": str(borrowed)}

    def probe() -> bool:
        return _usage(cohort.cluster_queue(role)) == want

    wait_for(f"ClusterQueue {cohort.names[role]} to report {want}", probe, _SETTLE)


# --- scenarios ----------------------------------------------------------------------------


def test_a_tenant_borrows_idle_gpus_and_the_owner_reclaims_them(
    cohort: Callable[[Mapping[str, str], int], Cohort],
) -> None:
    """(a) borrower's quota is 1 GPU, owner's 2 lie idle: borrower runs 3 pods. (b) owner's
    work arrives: Kueue preempts 2 of borrower's pods to give owner its quota back."""
    teams = cohort({"owner": "quota: {gpus: 2}", "borrower": "quota: {gpus: 1}"}, 1)
    borrowed = teams.pods("borrower", 3)
    running = _running(teams, borrowed)
    # Kueue admitted them to the whole-GPU pool: its node label is now the pods' nodeSelector.
    for pod in running:
        assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.sharing-strategy"] == "none"
        assert not pod["spec"].get("schedulingGates")
    _usage_is(teams, "borrower", total=3, borrowed=2)
    # The cohort has 3 GPUs: a fourth pod waits at Kueue though the node has a GPU free.
    extra = teams.pod("borrower")
    message = _kept_out(teams, extra)
    assert f"insufficient unused quota for nvidia.com/gpu in flavor {WHOLE_FLAVOR}" in message

    owned = teams.pods("owner", 2)
    _running(teams, owned)
    _usage_is(teams, "owner", total=2, borrowed=0)
    _usage_is(teams, "borrower", total=1, borrowed=0)
    survivors = [p for p in _alive(teams, borrowed) if not p["metadata"].get("deletionTimestamp")]
    assert len(survivors) == 1
    # The two that went were preempted by Kueue to reclaim the owner's quota.
    for pod in borrowed:
        if pod["metadata"]["name"] == survivors[0]["metadata"]["name"]:
            continue
        workload = teams.workload(pod)
        assert workload is not None
        preempted = _condition(workload, "Preempted")
        assert preempted is not None and preempted["status"] == "True"
        assert preempted["reason"] == "InCohortReclamation"
    # The borrower's extra pod is still waiting: it is back within its own quota of 1.
    assert "insufficient unused quota" in _kept_out(teams, extra)


def test_a_tenant_that_does_not_lend_keeps_its_quota_free(
    cohort: Callable[[Mapping[str, str], int], Cohort],
) -> None:
    """(c) keeper's guarantee is its whole quota (lendingLimit 0): the borrower gets the lender's
    idle GPU but not the keeper's two, and the keeper's pods start at once, preempting nobody."""
    teams = cohort(
        {
            "keeper": "queue: keeper, quota: {gpus: 2}, "
            'queueSpec: {guarantee: {nvidia.com/gpu: "2"}}',
            "lender": "quota: {gpus: 1}",
            "borrower": "quota: {gpus: 1}",
        },
        2,
    )
    (keeper,) = [
        q
        for q in render(teams.policies, RenderOptions(kueue=True)).of_kind("ClusterQueue")
        if q["metadata"]["name"] == teams.names["keeper"]
    ]
    (quota,) = keeper["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert quota["lendingLimit"] == "0"

    pods = teams.pods("borrower", 3)
    # Its own GPU and the lender's run; the third waits while the keeper's two lie idle.
    started = _some_running(teams, pods, 2)
    (waiting,) = [
        p for p in pods if p["metadata"]["name"] not in {s["metadata"]["name"] for s in started}
    ]
    assert "insufficient unused quota" in _kept_out(teams, waiting)
    _usage_is(teams, "borrower", total=2, borrowed=1)
    _usage_is(teams, "keeper", total=0, borrowed=0)

    kept = teams.pods("keeper", 2)
    _running(teams, kept)
    _usage_is(teams, "keeper", total=2, borrowed=0)
    # Nobody was preempted for them: the borrower's two still run.
    still = _alive(teams, started)
    assert [p["status"]["phase"] for p in still] == ["Running", "Running"]
    for pod in started:
        workload = teams.workload(pod)
        assert workload is not None and _condition(workload, "Preempted") is None


def test_weighted_fair_sharing_under_contention(
    cohort: Callable[[Mapping[str, str], int], Cohort],
) -> None:
    """Two tenants with no quota of their own borrow a third's 6 idle GPUs, weights 2:1. The
    lighter one got there first and holds all 6; when the heavier one's work arrives, Kueue's
    fair sharing preempts until the GPUs are split 4:2, and no further."""
    teams = cohort(
        {
            "pool": "quota: {gpus: 6}",
            "heavy": "queue: heavy, queueSpec: {weight: 2}",
            "light": "queue: light, queueSpec: {weight: 1}",
        },
        2,
    )
    light = teams.pods("light", 6)
    _running(teams, light)
    _usage_is(teams, "light", total=6, borrowed=6)
    heavy = teams.pods("heavy", 6)
    _usage_is(teams, "heavy", total=4, borrowed=4)
    _usage_is(teams, "light", total=2, borrowed=2)
    running = _some_running(teams, heavy, 4)
    for pod in heavy:
        if pod["metadata"]["name"] not in {r["metadata"]["name"] for r in running}:
            assert "insufficient unused quota" in _kept_out(teams, pod)
    reasons = []
    for pod in light:
        workload = teams.workload(pod)
        assert workload is not None
        preempted = _condition(workload, "Preempted")
        if preempted is not None and preempted["status"] == "True":
            reasons.append(preempted["reason"])
    assert reasons == ["InCohortFairSharing"] * 4
    # Settled: the split holds (usage read again after the waits above).
    assert _usage(teams.cluster_queue("heavy"))["total"] == "4"
    assert _usage(teams.cluster_queue("light"))["total"] == "2"
