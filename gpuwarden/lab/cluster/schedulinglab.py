"""The lab's cluster: a ControlPlane plus the real kube-scheduler and KWOK's simulated nodes.

kube-scheduler runs with its default plugins (NodeResourcesFit, TaintToleration, NodeAffinity,
DefaultPreemption, ...): it binds pods, preempts for them and writes why a pod stays Pending,
exactly as in a cluster. KWOK stands in for the kubelets: it keeps the GPU nodes Ready and moves
bound pods through Running to Succeeded (see :mod:`gpuwarden.lab.cluster.stages`). The lab
itself never chooses a node.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.controlplane import (
    ControlPlane,
    Process,
    Tools,
    ToolsMissingError,
    free_ports,
    self_signed_ok,
)
from gpuwarden.lab.cluster.nodes import POOL_LABEL, GpuNodePool
from gpuwarden.lab.cluster.stages import NODE_ANNOTATION, NODE_ANNOTATION_VALUE, lab_stages
from gpuwarden.policy.render.packing import binpack_profile

SCHEDULER_CONFIG_API = "kubescheduler.config.k8s.io/v1"
#: API server flags of a lab control plane. TaintNodesByCondition taints every new node
#: node.kubernetes.io/not-ready until kube-controller-manager's node lifecycle controller sees it
#: Ready and lifts the taint; no controller-manager runs here, so the taint would keep every pod
#: off every node.
LAB_APISERVER_ARGS = ("--disable-admission-plugins=TaintNodesByCondition",)
_POLL = 0.1
_HTTP_NOT_FOUND = 404
_HTTP_CONFLICT = 409


def scheduler_configuration(kubeconfig: Path) -> dict[str, Any]:
    """KubeSchedulerConfiguration: the default profile and gpuwarden's packing profile (the one
    the chart's second scheduler runs), no leader election, and short backoff, so a pod that
    became schedulable (a GPU freed) is retried within about a second."""
    return {
        "apiVersion": SCHEDULER_CONFIG_API,
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": False},
        "podInitialBackoffSeconds": 1,
        "podMaxBackoffSeconds": 1,
        "profiles": [{"schedulerName": "default-scheduler"}, binpack_profile()],
    }


def _required(path: Path | None, name: str) -> Path:
    if path is None:
        raise ToolsMissingError(
            f"tools.env names no {name}; run hack/build-tools.sh (it builds it for the lab)"
        )
    return path


def node_ready(node: Any) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


@dataclass
class SchedulingLab:
    """kube-scheduler and KWOK on ``plane`` (started already); start() and stop() them."""

    plane: ControlPlane
    tools: Tools
    startup_timeout: float = 90.0

    def __post_init__(self) -> None:
        self._scheduler: Process | None = None
        self._kwok: Process | None = None

    @property
    def processes(self) -> list[Process]:
        return [p for p in (self._scheduler, self._kwok) if p is not None]

    def start(self) -> None:
        scheduler = _required(self.tools.kube_scheduler, "KUBE_SCHEDULER")
        kwok = _required(self.tools.kwok, "KWOK")
        workdir = self.plane.workdir
        deadline = time.monotonic() + self.startup_timeout
        config = workdir / "kube-scheduler.yaml"
        config.write_text(yaml.safe_dump(scheduler_configuration(self.plane.kubeconfig_path)))
        (port,) = free_ports(1)
        self._scheduler = self.plane.spawn(
            "kube-scheduler",
            [
                str(scheduler),
                f"--config={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={workdir / 'kube-scheduler-certs'}",
                "-v=1",
            ],
        )
        stages = workdir / "kwok-stages.yaml"
        stages.write_text(yaml.safe_dump_all(lab_stages(), sort_keys=False))
        self._kwok = self.plane.spawn(
            "kwok",
            [
                str(kwok),
                f"--kubeconfig={self.plane.kubeconfig_path}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}={NODE_ANNOTATION_VALUE}",
            ],
        )
        # /readyz says the scheduler has synced its informers and is scheduling.
        self.plane.poll(
            "kube-scheduler /readyz",
            lambda: self_signed_ok(f"https://127.0.0.1:{port}/readyz"),
            self.processes,
            deadline,
        )

    def stop(self) -> None:
        """Stop KWOK, then the scheduler (the control plane stays up)."""
        for process in (self._kwok, self._scheduler):
            if process is not None:
                process.terminate(self.plane.stop_timeout)
        self._kwok = self._scheduler = None

    # -- nodes ------------------------------------------------------------------------------

    def add_pools(self, api: k8s_client.ApiClient, pools: Iterable[GpuNodePool]) -> list[str]:
        """Create the pools' nodes and wait until KWOK reports every one Ready."""
        core: Any = k8s_client.CoreV1Api(api)
        names: list[str] = []
        for pool in pools:
            for manifest in pool.manifests():
                core.create_node(manifest)
                names.append(manifest["metadata"]["name"])
        wanted = set(names)

        def all_ready() -> bool:
            nodes = core.list_node(label_selector=POOL_LABEL).items
            ready = {n.metadata.name for n in nodes if node_ready(n)}
            return wanted <= ready

        self.plane.poll(
            f"KWOK to report {len(wanted)} nodes Ready",
            all_ready,
            self.processes,
            time.monotonic() + self.startup_timeout,
        )
        return names

    def remove_nodes(self, api: k8s_client.ApiClient) -> None:
        """Delete every pod bound to a lab node, wait until they are gone, delete the nodes.

        Pods first: with no pod garbage collector running, a pod whose node is gone would stay.
        """
        core: Any = k8s_client.CoreV1Api(api)
        for pod in core.list_pod_for_all_namespaces().items:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)

        def no_pods() -> bool:
            return not core.list_pod_for_all_namespaces().items

        self.plane.poll("every pod to be deleted", no_pods, self.processes, _deadline(60))
        for node in core.list_node(label_selector=POOL_LABEL).items:
            with contextlib.suppress(ApiException):
                core.delete_node(node.metadata.name)


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def lab_control_plane(tools: Tools, *, keep_workdir: bool = False) -> ControlPlane:
    """A control plane for the lab (not started)."""
    return ControlPlane(tools, extra_apiserver_args=LAB_APISERVER_ARGS, keep_workdir=keep_workdir)


@contextlib.contextmanager
def running_lab(plane: ControlPlane, tools: Tools) -> Iterator[SchedulingLab]:
    lab = SchedulingLab(plane, tools)
    lab.start()
    try:
        yield lab
    finally:
        lab.stop()


# -- what the scheduler said about a pod ----------------------------------------------------


def pod_scheduled_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's PodScheduled condition (wire format), where the scheduler explains Pending."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            found: Mapping[str, Any] = condition
            return found
    return None


def ensure_namespaces(
    api: k8s_client.ApiClient, names: Sequence[str], labels: Mapping[str, str]
) -> None:
    core: Any = k8s_client.CoreV1Api(api)
    for name in names:
        try:
            core.create_namespace({"metadata": {"name": name, "labels": dict(labels)}})
        except ApiException as exc:
            if exc.status != _HTTP_CONFLICT:
                raise
