"""Replay a trace on a lab of its own, once per strategy, and record what happened to each pod.

Per strategy: a control plane, kube-scheduler, KWOK and the layout's nodes; the policy's
PriorityClasses; then the :class:`~gpuwarden.lab.ledger.Ledger` says when each row's pod is
created (time divided by ``scale``); gpuwarden's policy core decides it in this process (the
decision the webhook would return, byte for byte) and it is created through the API server. A
watch reports to the ledger when the scheduler bound each pod and which pods it deleted to
preempt them; when the work model says a pod's work is done, the replay marks it so and KWOK
turns it Succeeded, which frees its GPUs for the scheduler.

A strategy with tenant queues (:attr:`Strategy.kueue`) also runs Kueue on its lab
(:mod:`gpuwarden.lab.kueue`) with the objects ``gpuwarden render --kueue`` writes for it: Kueue
gates every pod until it admits it, and may preempt one to give a tenant its quota back (the pod
is deleted with Kueue's reason on it; its controller recreates it as after any preemption). The
replay deletes a deleted pod's Workload, the garbage collector's part (no
kube-controller-manager runs in the lab).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster import SchedulingLab, ensure_namespaces, lab_control_plane
from gpuwarden.lab.controlplane import Tools
from gpuwarden.lab.kueue import (
    Kueue,
    collect_workloads,
    kept_out_pod,
    preemption_reason,
    running_kueue,
)
from gpuwarden.lab.ledger import Action, Complete, Create, Ledger, Withdraw
from gpuwarden.lab.nodes import GPU_RESOURCE, SHARED_GPU_RESOURCE
from gpuwarden.lab.report import PodRecord, RowOutcome
from gpuwarden.lab.stages import WORK_DONE
from gpuwarden.lab.strategies import Layout, Strategy, queue_objects
from gpuwarden.lab.trace import TraceRow
from gpuwarden.lab.work import NodeGpus, WorkModel
from gpuwarden.lab.workloads import workload_pod
from gpuwarden.policy import AdmissionRequest, ClusterView, admit
from gpuwarden.policy.admission.manifests import NAMESPACE_NAME_LABEL, priority_class
from gpuwarden.policy.admission.mutate import admitted_gpu_memory
from gpuwarden.policy.pod.keys import ENV_MPS_THREAD_PERCENTAGE
from gpuwarden.policy.pod.quantity import parse_quantity
from gpuwarden.policy.render.kueue import KUEUE_API
from gpuwarden.policy.render.objects import render

#: Every replayed pod carries its trace row here (the watch selects on it).
ROW_LABEL = "lab.gpuwarden.io/trace-row"
_WATCH_SECONDS = 30
_HTTP_NOT_FOUND = 404
#: PodScheduled's reason for a pod behind a scheduling gate (Kueue's, until it admits the pod):
#: waiting, not found unschedulable.
_GATED = "SchedulingGated"


class Stopped(Exception):
    """The replay was asked to stop (Ctrl-C) before it finished."""


@dataclass
class Progress:
    """How far one strategy's replay is (read by the progress bar)."""

    started: bool = False  # its lab is up and the trace's clock runs
    done: float = 0.0  # simulated seconds replayed


def pod_devices(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(whole GPUs, MPS slices) the pod's containers ask for."""
    whole = slices = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        requests = (container.get("resources") or {}).get("requests") or {}
        count = limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE))
        shared = limits.get(SHARED_GPU_RESOURCE, requests.get(SHARED_GPU_RESOURCE))
        if count is not None:
            whole += int(parse_quantity(count))
        if shared is not None:
            slices += int(parse_quantity(shared))
    return whole, slices


def row_pod(row: TraceRow, name: str) -> dict[str, Any]:
    """The pod a trace row becomes, as its Kubeflow controller would create it."""
    return workload_pod(
        row.kind,
        name=name,
        namespace=row.namespace,
        workload=row.name,
        gpus=row.devices,
        labels={**row.labels, ROW_LABEL: str(row.row)},
        products=row.gpu_products,
    )


def namespace_view_labels(
    namespaces: Mapping[str, Mapping[str, str]],
) -> dict[str, dict[str, str]]:
    """Each namespace's labels as the API server shows them (with its name label)."""
    return {ns: {**dict(labels), NAMESPACE_NAME_LABEL: ns} for ns, labels in namespaces.items()}


def mps_sm_share(pod: Mapping[str, Any]) -> float | None:
    """The share of SMs MPS lets the pod's GPU container use (its active thread percentage)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == ENV_MPS_THREAD_PERCENTAGE:
                try:
                    return min(1.0, max(0.0, float(env.get("value", "")) / 100))
                except ValueError:
                    return None
    return None


def pod_allocation(pod: Mapping[str, Any], replicas: int, gpu_memory: float) -> tuple[float, float]:
    """(physical GPUs, bytes of GPU memory) the pod's containers take while bound."""
    whole, slices = pod_devices(pod)
    gpus = whole + slices / replicas
    return gpus, gpus * gpu_memory


def _namespace_memory(
    records: Sequence[tuple[PodRecord, str | None, Decimal]],
) -> dict[str, Decimal]:
    """GPU memory admitted to each namespace's governed pods still alive (the webhook's view)."""
    out: dict[str, Decimal] = {}
    for record, tenant, memory in records:
        if tenant is not None and record.ended is None and record.refused is None:
            out[record.namespace] = out.get(record.namespace, Decimal(0)) + memory
    return out


class Replay:
    """One strategy's replay (run() blocks until the horizon, or raises Stopped)."""

    def __init__(
        self,
        strategy: Strategy,
        rows: Sequence[TraceRow],
        *,
        tools: Tools,
        layout: Layout,
        namespaces: Mapping[str, Mapping[str, str]],
        horizon: float,
        scale: float,
        stop: threading.Event,
    ) -> None:
        self.strategy = strategy
        self.rows = rows
        self.tools = tools
        self.layout = layout
        self.namespaces = namespaces
        self.horizon = horizon
        self.scale = scale
        self.stop = stop
        self.progress = Progress()
        self.pools = layout.pools(strategy.shares)
        self.model = WorkModel(
            {
                name: NodeGpus(pool.gpus_per_node, pool.mps_replicas)
                for pool in self.pools
                for name in pool.node_names
            }
        )
        self.ledger = Ledger(rows, self.model, horizon)
        self.outcomes: list[RowOutcome] = []
        self._admitted: list[tuple[PodRecord, str | None, Decimal]] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._t0 = 0.0
        self._watching = True
        # The PriorityClasses the policy implies, as `gpuwarden render` writes them (once).
        self._classes = (
            []
            if strategy.policies is None
            else [o for o in render(strategy.policies).objects if o["kind"] == "PriorityClass"]
        )
        self._class_infos = {
            str(m["metadata"]["name"]): info
            for m in self._classes
            if (info := priority_class(m)) is not None
        }

    @property
    def records(self) -> Mapping[str, PodRecord]:
        return self.ledger.records

    def now(self) -> float:
        """Simulated seconds since the replay started."""
        return (time.monotonic() - self._t0) * self.scale

    def run(self) -> list[PodRecord]:
        plane = lab_control_plane(self.tools)
        with plane:
            lab = SchedulingLab(plane, self.tools)
            lab.start()
            try:
                with contextlib.ExitStack() as queues:
                    kueue = None
                    if self.strategy.kueue:
                        kueue = queues.enter_context(running_kueue(plane, self.tools))
                    api = plane.api_client()
                    try:
                        self._prepare(lab, api, kueue)
                        self._replay(api)
                    finally:
                        api.close()  # type: ignore[no-untyped-call]
            finally:
                lab.stop()
        with self._lock:
            return list(self.records.values())

    # -- setup --------------------------------------------------------------------------------

    def _prepare(self, lab: SchedulingLab, api: k8s_client.ApiClient, kueue: Kueue | None) -> None:
        scheduling: Any = k8s_client.SchedulingV1Api(api)
        for manifest in self._classes:
            scheduling.create_priority_class(manifest)
        for namespace, labels in self.namespaces.items():
            ensure_namespaces(api, [namespace], labels)
        if kueue is not None:
            kueue.apply_queues(api, queue_objects(self.strategy))
        lab.add_pools(api, self.pools)

    def _cluster_view(self) -> ClusterView:
        labels = namespace_view_labels(self.namespaces)
        with self._lock:
            memory = _namespace_memory(self._admitted)
        return ClusterView(
            namespace_labels=labels, priority_classes=self._class_infos, namespace_gpu_memory=memory
        )

    # -- the replay ---------------------------------------------------------------------------

    def _replay(self, api: k8s_client.ApiClient) -> None:
        self._t0 = time.monotonic()
        self.progress.started = True
        watcher = threading.Thread(target=self._watch, args=(api,), daemon=True)
        watcher.start()
        if self.strategy.kueue:
            threading.Thread(target=self._watch_workloads, args=(api,), daemon=True).start()
        core: Any = k8s_client.CoreV1Api(api)
        try:
            while True:
                with self._lock:
                    now = min(self.now(), self.horizon)
                    actions = self.ledger.due(now)
                    if not actions and now >= self.horizon:
                        self.outcomes = self.ledger.finish()
                        break
                for action in actions:
                    self._act(core, action)
                if not actions:
                    self._wait()
        finally:
            self._watching = False
        self.progress.done = self.horizon

    def _wait(self) -> None:
        """Until the ledger's next due time, or a change the watch reports (a bind, a
        preemption), in short steps so Ctrl-C stops the replay promptly."""
        with self._lock:
            now = self.now()
            self.progress.done = min(now, self.horizon)
            ahead = (self.ledger.next_time() - now) / self.scale
            if ahead > 0:
                self._changed.wait(min(ahead, 0.25))
        if self.stop.is_set():
            raise Stopped

    def _act(self, core: Any, action: Action) -> None:
        if isinstance(action, Create):
            self._submit(core, action)
            return
        try:
            if isinstance(action, Complete):
                # KWOK's lab-pod-work-done stage turns it Succeeded, as its kubelet would.
                patch = {"metadata": {"annotations": {WORK_DONE: f"{self.now():.0f}"}}}
                core.patch_namespaced_pod(action.name, action.namespace, patch)
            elif isinstance(action, Withdraw):
                core.delete_namespaced_pod(action.name, action.namespace)
        except ApiException as exc:
            if exc.status != _HTTP_NOT_FOUND:  # preempted meanwhile: nothing left to end
                raise

    def _submit(self, core: Any, action: Create) -> None:
        row = action.row
        pod = row_pod(row, action.name)
        record = PodRecord(
            name=action.name,
            namespace=row.namespace,
            row=row.row,
            kind=row.kind,
            created=self.now(),
            asked=row.gpus,
            attempt=action.attempt,
        )
        tenant: str | None = None
        if self.strategy.policies is not None:
            policies = self.strategy.policies
            request = AdmissionRequest(operation="CREATE", namespace=row.namespace, pod=pod)
            result = admit(request, policies, self._cluster_view())
            if not result.allowed:
                record.refused = result.validation.message or result.mutation.message or "denied"
                with self._lock:
                    self.ledger.created(record)
                return
            pod = dict(result.pod)
            found = policies.tenant_for(row.namespace, self.namespaces.get(row.namespace, {}))
            tenant = found.name if found is not None else None
        gpu_memory = float(self.layout.gpu_memory_mib * 2**20)
        record.whole, record.slices = pod_devices(pod)
        record.sm_share = mps_sm_share(pod) if record.slices else None
        record.gpus, record.memory_allocated = pod_allocation(
            pod, self.layout.mps_replicas, gpu_memory
        )
        # The trace's use is per GPU: n whole GPUs use n times it; a slice at most its share.
        used = float(row.memory_used) * math.ceil(record.gpus)
        record.memory_used = min(used, record.memory_allocated)
        with self._lock:
            # Known before it exists, so the watch can report its binding however soon.
            self._admitted.append((record, tenant, admitted_gpu_memory(pod)))
            self.ledger.created(record)
        try:
            core.create_namespaced_pod(row.namespace, pod)
        except ApiException as exc:
            with self._lock:
                self.ledger.refuse(action.name, f"API server: {exc.status} {exc.reason}")

    # -- what the cluster did -----------------------------------------------------------------

    def _observe(self, event_type: str, pod: Any) -> None:
        name = pod.metadata.name
        with self._lock:
            now = min(self.now(), self.horizon)
            if name not in self.ledger.records:
                return
            conditions = (pod.status.conditions if pod.status else None) or []
            if any(
                c.type == "PodScheduled" and c.status == "False" and c.reason != _GATED
                for c in conditions
            ):
                self.ledger.unschedulable(name)
            if pod.spec.node_name:
                self.ledger.bound(name, now, pod.spec.node_name)
            if self.strategy.kueue:
                reason = preemption_reason(
                    [
                        {
                            "type": c.type,
                            "status": c.status,
                            "reason": c.reason,
                            "message": c.message,
                        }
                        for c in conditions
                    ]
                )
                self.ledger.evicted(name, reason)
            if event_type == "DELETED":
                # Only the scheduler, or Kueue, deletes pods the ledger has not ended: a
                # preemption.
                self.ledger.gone(name, now)
            self._changed.notify_all()

    def _watch_workloads(self, api: k8s_client.ApiClient) -> None:
        """Kueue's side of a wait: a pod whose Workload Kueue found no room for did not get in
        at its first try, as one the scheduler called unschedulable."""
        custom: Any = k8s_client.CustomObjectsApi(api)
        group, version = KUEUE_API.split("/")

        def kept_out(workload: Mapping[str, Any]) -> None:
            name = kept_out_pod(workload)
            if name is not None:
                with self._lock:
                    self.ledger.unschedulable(name)

        while self._watching and not self.stop.is_set():
            try:
                listed = custom.list_cluster_custom_object(group, version, "workloads")
                for item in listed["items"]:
                    kept_out(item)
                stream: Callable[..., Any] = k8s_watch.Watch().stream  # type: ignore[no-untyped-call]
                for event in stream(
                    custom.list_cluster_custom_object,
                    group,
                    version,
                    "workloads",
                    resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=_WATCH_SECONDS,
                ):
                    kept_out(event["object"])
                    if not self._watching or self.stop.is_set():
                        break
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):
                if self.stop.wait(0.2):
                    return

    def _watch(self, api: k8s_client.ApiClient) -> None:
        core: Any = k8s_client.CoreV1Api(api)
        while self._watching and not self.stop.is_set():
            try:
                listed = core.list_pod_for_all_namespaces(label_selector=ROW_LABEL)
                for pod in listed.items:
                    self._observe("ADDED", pod)
                stream: Callable[..., Any] = k8s_watch.Watch().stream  # type: ignore[no-untyped-call]
                for event in stream(
                    core.list_pod_for_all_namespaces,
                    label_selector=ROW_LABEL,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=_WATCH_SECONDS,
                ):
                    self._observe(str(event["type"]), event["object"])
                    if event["type"] == "DELETED" and self.strategy.kueue:
                        meta = event["object"].metadata
                        collect_workloads(api, meta.namespace, meta.uid)
                    if not self._watching or self.stop.is_set():
                        break
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):
                # The watch broke (or the API server is going away at the end): list again.
                if self.stop.wait(0.2):
                    return
