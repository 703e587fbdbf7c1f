"""Replay a trace on a lab of its own, once per strategy, and record what happened to each pod.

Per strategy: a control plane, kube-scheduler, KWOK and the layout's nodes; the policy's
PriorityClasses; then the :class:`~gpuwarden.lab.replay.ledger.Ledger` says when each row's pod is
created (time divided by ``scale``). The pod is the one its
:class:`~gpuwarden.lab.planning.plan.StrategyPlan` decided for the row, validated again by the
policy core in this process against the GPU memory the tenant's live pods hold (together the
decision the webhook would return, byte for byte), and it is created through the API server. An
informer (:mod:`gpuwarden.kube.informer`) on the replayed pods reports to the ledger when the
scheduler bound each pod and which pods it deleted to preempt them; when the work model says a
pod's work is done, the replay marks it so and KWOK turns it Succeeded, which frees its GPUs for
the scheduler. A notebook whose idle tail outlasts the idle rule (``action: stop``) recorded on its
pod is deleted, as its controller does once the node agent stops the Notebook.

A strategy with tenant queues (:attr:`Strategy.kueue`) also runs Kueue on its lab
(:mod:`gpuwarden.lab.cluster.kueue`) with the objects ``gpuwarden render --kueue`` writes for it:
Kueue gates every pod until it admits it, and may preempt one to give a tenant its quota back
(the pod is deleted with Kueue's reason on it; its controller recreates it as after any
preemption). The replay deletes a deleted pod's Workload, the garbage collector's part (no
kube-controller-manager runs in the lab).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.informer import Informer, Obj
from gpuwarden.lab.cluster.controllermanager import running_controller_manager
from gpuwarden.lab.cluster.controlplane import ControlPlane, Process, Tools, json_log_records
from gpuwarden.lab.cluster.deviceplugin import ENDPOINT_STOP_GRACE, DevicePluginEmulation
from gpuwarden.lab.cluster.dradriver import (
    DRA_CONTROLLERS,
    apply_claim_templates,
    claimed_gpus,
    pod_claim_names,
    publish,
    reservation,
)
from gpuwarden.lab.cluster.kueue import (
    Kueue,
    collect_workloads,
    kept_out_pod,
    preemption_reason,
    running_kueue,
)
from gpuwarden.lab.cluster.nodes import (
    SHARED_CONFIG,
    WHOLE_CONFIG,
    GpuNodePool,
    mps_sm_share,
    pod_devices,
)
from gpuwarden.lab.cluster.poolcontroller import (
    check_running,
    start_pool_controller,
    write_policies,
)
from gpuwarden.lab.cluster.schedulinglab import SchedulingLab, ensure_namespaces, lab_control_plane
from gpuwarden.lab.cluster.stages import WORK_DONE
from gpuwarden.lab.inputs.trace import ROW_LABEL, TraceRow, row_pod
from gpuwarden.lab.planning.follow import FollowPools, pools_policy_texts
from gpuwarden.lab.planning.plan import StrategyPlan, attempt_pod, idle_stop_rules
from gpuwarden.lab.planning.strategies import queue_objects
from gpuwarden.lab.replay.admitted import AdmittedMemory
from gpuwarden.lab.replay.ledger import Action, Complete, Create, IdleStop, Ledger, Withdraw
from gpuwarden.lab.replay.records import PodRecord, RowOutcome
from gpuwarden.lab.replay.work import NodeGpus, WorkModel
from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    admitted_gpu_memory,
    validate,
)
from gpuwarden.policy.render.kueue import KUEUE_API

_WATCH_SECONDS = 30
_RETRY_SECONDS = 0.2  # after a broken watch: the lab's API server is on loopback
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


def pod_allocation(pod: Mapping[str, Any], replicas: int, gpu_memory: float) -> tuple[float, float]:
    """(physical GPUs, bytes of GPU memory) the pod's containers take while bound."""
    whole, slices = pod_devices(pod)
    gpus = whole + slices / replicas
    return gpus, gpus * gpu_memory


@dataclass(frozen=True)
class PodState:
    """What the replay reads of a replayed pod, as the API server last showed it."""

    name: str
    namespace: str
    uid: str
    node: str | None
    unschedulable: bool  # the scheduler found no node for it (not merely gated)
    evicted_by: str | None  # Kueue's preemption reason on it
    claims: tuple[str, ...] = ()  # the ResourceClaims its devices come from (DRA)


def pod_state(pod: Obj) -> PodState:
    meta = pod.get("metadata") or {}
    conditions = (pod.get("status") or {}).get("conditions") or []
    return PodState(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=str(meta.get("uid", "")),
        node=(pod.get("spec") or {}).get("nodeName") or None,
        unschedulable=any(
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") != _GATED
            for c in conditions
        ),
        evicted_by=preemption_reason(conditions),
        claims=pod_claim_names(pod),
    )


T = TypeVar("T")


class Observed(Generic[T]):
    """An informer's sink that hands each change to ``observe``: every state an object takes,
    and its last one when it is deleted (``deleted`` True), gone during a relist included."""

    def __init__(self, observe: Callable[[T, bool], None]) -> None:
        self._last: dict[str, T] = {}
        self._observe = observe

    def replace(self, items: Mapping[str, T]) -> None:
        gone = [item for key, item in self._last.items() if key not in items]
        self._last = dict(items)
        for item in items.values():
            self._observe(item, False)
        for item in gone:
            self._observe(item, True)

    def upsert(self, key: str, item: T) -> None:
        if self._last.get(key) == item:
            return
        self._last[key] = item
        self._observe(item, False)

    def delete(self, key: str) -> None:
        item = self._last.pop(key, None)
        if item is not None:
            self._observe(item, True)


@dataclass
class Following:
    """What makes a replay's pools follow demand: the device plugin's emulation and the
    controller's process, and the JSON lines of its log once it stopped."""

    emulation: DevicePluginEmulation
    controller: Process
    log: list[dict[str, Any]] = field(default_factory=list)


class Replay:
    """One strategy's replay (run() blocks until the horizon, or raises Stopped)."""

    def __init__(
        self,
        plan: StrategyPlan,
        rows: Sequence[TraceRow],
        *,
        tools: Tools,
        namespaces: Mapping[str, Mapping[str, str]],
        horizon: float,
        scale: float,
        stop: threading.Event,
    ) -> None:
        self.plan = plan
        self.strategy = strategy = plan.strategy
        self.rows = rows
        self.tools = tools
        self.layout = plan.layout
        self.namespaces = namespaces
        self.horizon = horizon
        self.scale = scale
        self.stop = stop
        self.progress = Progress()
        self.pools = self.layout.pools(strategy.shares)
        self.shapes = {name: pool for pool in self.pools for name in pool.node_names}
        self.model = WorkModel(
            {
                name: NodeGpus(pool.gpus_per_node, pool.mps_replicas)
                for name, pool in self.shapes.items()
            }
        )
        # --mps-nodes follow: the device plugin's emulation and the pool controller, while
        # the replay runs.
        self.following: Following | None = None
        self.rejected: set[str] = set()  # pods the kubelet refused at admission
        self.ledger = Ledger(rows, self.model, horizon, idle_rules=idle_stop_rules(plan, rows))
        self.outcomes: list[RowOutcome] = []
        self._admitted = AdmittedMemory()
        # DRA: the pods whose claims' devices were read (once, at their binding).
        self._placed: set[str] = set()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._t0 = 0.0

    @property
    def records(self) -> Mapping[str, PodRecord]:
        return self.ledger.records

    @property
    def started_at(self) -> float:
        """When the trace's clock started (time.monotonic())."""
        return self._t0

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
                    if self.layout.dra:
                        # Claims from templates, and released when their pods end.
                        queues.enter_context(
                            running_controller_manager(plane, self.tools, DRA_CONTROLLERS)
                        )
                    api = plane.api_client()
                    try:
                        follow = self.plan.follow
                        if follow is not None:
                            self.following = queues.enter_context(self._follow(plane, api, follow))
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
        for manifest in self.plan.priority_classes:
            scheduling.create_priority_class(manifest)
        for namespace, labels in self.namespaces.items():
            ensure_namespaces(api, [namespace], labels)
        if kueue is not None:
            kueue.apply_queues(api, queue_objects(self.strategy))
        if self.layout.dra:
            publish(api, self.pools)
            for namespace, templates in self.plan.claim_templates.items():
                apply_claim_templates(api, namespace, templates)
        lab.add_pools(api, self.pools)

    @contextlib.contextmanager
    def _follow(
        self, plane: ControlPlane, api: k8s_client.ApiClient, follow: FollowPools
    ) -> Iterator[Following]:
        """The device plugin's emulation on every node, and ``gpuwarden pool-controller`` with
        the strategy's policy and ``pools`` on its nvidia backend (started before the nodes
        exist: its start overlaps theirs)."""
        emulation = DevicePluginEmulation(
            api,
            self.shapes,
            {WHOLE_CONFIG: 1, SHARED_CONFIG: self.layout.mps_replicas},
            WHOLE_CONFIG,
            grace=ENDPOINT_STOP_GRACE / self.scale,
            on_change=self._configured,
        )
        texts = pools_policy_texts(
            self.strategy.sources, self.layout.mps_replicas, follow, self.scale
        )
        policies = write_policies(plane.workdir / "pool-controller-policies", texts)
        emulation.start()
        try:
            following = Following(
                emulation, start_pool_controller(plane, policies, follow.interval)
            )
            try:
                yield following
            finally:
                following.controller.terminate(plane.stop_timeout)
                following.log = json_log_records(following.controller.log_path)
        finally:
            emulation.stop()

    def _configured(self, node: str, pool: GpuNodePool) -> None:
        """The node's device plugin now runs ``pool``'s config: pods bound from now on get its
        devices."""
        with self._lock:
            at = min(self.now(), self.horizon) if self._t0 else 0.0
            self.model.configure(node, NodeGpus(pool.gpus_per_node, pool.mps_replicas), at)

    def _cluster_view(self) -> ClusterView:
        """The plan's view with the GPU memory admitted to the pods alive now."""
        with self._lock:
            memory = self._admitted.totals()
        return replace(self.plan.view, namespace_gpu_memory=memory)

    # -- the replay ---------------------------------------------------------------------------

    def _replay(self, api: k8s_client.ApiClient) -> None:
        self._t0 = time.monotonic()
        self.progress.started = True
        informers = self._informers(api)
        for informer in informers:
            informer.start()
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
                        if not isinstance(action, Create):  # the ledger ended the pod
                            self._admitted.end(action.name)
                for action in actions:
                    self._act(core, action)
                if not actions:
                    self._wait()
        finally:
            for informer in informers:
                informer.stop(timeout=0)  # its stream ends with the lab
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
        if self.following is not None:
            check_running(self.following.controller)

    def _act(self, core: Any, action: Action) -> None:
        if isinstance(action, Create):
            self._submit(core, action)
            return
        try:
            if isinstance(action, Complete):
                # KWOK's lab-pod-work-done stage turns it Succeeded, as its kubelet would.
                patch = {"metadata": {"annotations": {WORK_DONE: f"{self.now():.0f}"}}}
                core.patch_namespaced_pod(action.name, action.namespace, patch)
            elif isinstance(action, Withdraw | IdleStop):
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
        policies = self.strategy.policies
        if policies is not None:
            # The mutating answer was decided in the plan; the validating one depends on the
            # GPU memory admitted to the tenant's live pods, so it is asked now.
            decided = self.plan.decisions[row.row]
            pod = attempt_pod(decided.pod, action.name)
            request = AdmissionRequest(operation="CREATE", namespace=row.namespace, pod=pod)
            validation = validate(request, policies, self._cluster_view())
            if not (decided.mutation.allowed and validation.allowed):
                record.refused = validation.message or decided.mutation.message or "denied"
                with self._lock:
                    self.ledger.created(record)
                return
            found = policies.tenant_for(row.namespace, self.namespaces.get(row.namespace, {}))
            tenant = found.name if found is not None else None
        gpu_memory = float(self.layout.gpu_memory_mib * 2**20)
        record.whole, record.slices = pod_devices(pod)
        record.sm_share = mps_sm_share(pod) if record.slices else None
        record.gpus, record.memory_allocated = pod_allocation(
            pod, self.layout.mps_replicas, gpu_memory
        )
        if self.layout.dra:
            self._claim_allocation(record, pod, gpu_memory)
        # The trace's use is per GPU: n whole GPUs use n times it; a slice at most its share.
        used = float(row.memory_used) * math.ceil(record.gpus)
        record.memory_used = min(used, record.memory_allocated)
        with self._lock:
            # Known before it exists, so the watch can report its binding however soon.
            if tenant is not None:
                self._admitted.admit(record.name, record.namespace, admitted_gpu_memory(pod))
            self.ledger.created(record)
        try:
            core.create_namespaced_pod(row.namespace, pod)
        except ApiException as exc:
            with self._lock:
                self.ledger.refuse(action.name, f"API server: {exc.status} {exc.reason}")
                if record.refused is not None:
                    self._admitted.end(record.name)

    def _claim_allocation(
        self, record: PodRecord, pod: Mapping[str, Any], gpu_memory: float
    ) -> None:
        """A pod on DRA nodes holds, besides its whole GPUs, the share of a GPU each of its
        claim templates reserves; a share reserved by cores caps its SMs at them, as
        Volcano's vgpu-cores and HAMi's gpucores do."""
        templates = {
            str(t["metadata"]["name"]): t
            for t in self.plan.claim_templates.get(record.namespace, ())
        }
        for claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            template = templates.get(str(claim.get("resourceClaimTemplateName")))
            if template is None:
                continue
            reserved = reservation(template, gpu_memory)
            record.gpus += reserved.share
            record.memory_allocated += reserved.memory
            if reserved.sm_share is not None:
                record.sm_share = reserved.sm_share

    def _claimed(self, api: k8s_client.ApiClient, pod: PodState) -> list[tuple[int, float]] | None:
        """DRA: (GPU index, share) of the devices the pod's claims were allocated, read once
        when it is first seen bound (None: not a DRA lab, not bound, or read already)."""
        if not self.layout.dra or pod.node is None or pod.name in self._placed:
            return None
        shape = self.shapes.get(pod.node)
        gpu_memory = float((shape.gpu_memory_mib if shape else 0) * 2**20)
        devices = claimed_gpus(api, pod.namespace, pod.claims, pod.node, gpu_memory)
        self._placed.add(pod.name)
        return devices

    # -- what the cluster did -----------------------------------------------------------------

    def _informers(self, api: k8s_client.ApiClient) -> list[Informer[Any]]:
        """The replayed pods (and with Kueue its Workloads), listed then watched."""
        core: Any = k8s_client.CoreV1Api(api)
        pods: Informer[PodState] = Informer(
            "lab-pods",
            functools.partial(core.list_pod_for_all_namespaces, label_selector=ROW_LABEL),
            pod_state,
            Observed(functools.partial(self._observe, api)),
            watch_timeout=_WATCH_SECONDS,
            backoff=_RETRY_SECONDS,
            max_backoff=_RETRY_SECONDS,
        )
        if not self.strategy.kueue:
            return [pods]
        custom: Any = k8s_client.CustomObjectsApi(api)
        group, version = KUEUE_API.split("/")
        workloads: Informer[str] = Informer(
            "lab-workloads",
            functools.partial(custom.list_cluster_custom_object, group, version, "workloads"),
            kept_out_pod,
            Observed(self._kept_out),
            watch_timeout=_WATCH_SECONDS,
            backoff=_RETRY_SECONDS,
            max_backoff=_RETRY_SECONDS,
        )
        return [pods, workloads]

    def _observe(self, api: k8s_client.ApiClient, pod: PodState, deleted: bool) -> None:
        reject = False
        try:
            devices = None if deleted else self._claimed(api, pod)
        except ApiException:
            return  # its claims are read again at its next change (KWOK runs it at once)
        with self._lock:
            now = min(self.now(), self.horizon)
            if pod.name not in self.ledger.records:
                return
            if pod.unschedulable:
                self.ledger.unschedulable(pod.name)
            if pod.node and self._kubelet_rejects(pod.name, pod.node):
                reject = pod.name not in self.rejected
                self.rejected.add(pod.name)
            elif pod.node:
                self.ledger.bound(pod.name, now, pod.node, devices)
            if self.strategy.kueue:
                self.ledger.evicted(pod.name, pod.evicted_by)
            if deleted:
                # Only the scheduler, or Kueue, deletes pods the ledger has not ended: a
                # preemption.
                self.ledger.gone(pod.name, now)
                self._admitted.end(pod.name)
            self._changed.notify_all()
        if reject:
            # The kubelet fails the pod (UnexpectedAdmissionError) and its controller recreates
            # it, as after a preemption.
            with contextlib.suppress(ApiException):
                k8s_client.CoreV1Api(api).delete_namespaced_pod(pod.name, pod.namespace)
        if deleted and self.strategy.kueue:
            collect_workloads(api, pod.namespace, pod.uid)

    def _kubelet_rejects(self, name: str, node: str) -> bool:
        """Whether the node's kubelet refuses the pod at admission: bound in the moment its
        config changed, before the device plugin advertised the new config (the scheduler saw
        the old resource), it asks devices the plugin no longer has (the device manager's
        "requested number of devices unavailable"). Only a node that moves can."""
        record = self.ledger.records[name]
        if self.following is None or record.bound is not None:
            return False
        replicas = self.model.replicas(node)
        return bool(record.whole and replicas > 1) or bool(record.slices and replicas == 1)

    def _kept_out(self, name: str, deleted: bool) -> None:
        """Kueue's side of a wait: a pod whose Workload Kueue found no room for did not get in
        at its first try, as one the scheduler called unschedulable."""
        if not deleted:
            with self._lock:
                self.ledger.unschedulable(name)
