"""Prometheus metrics of the node agent, from its last tick, in a registry of its own.

Gauges are rebuilt from the last :class:`~gpuwarden.node.agent.TickReport` on every scrape, so a pod
that left the node leaves no stale series behind. Counters come from the agent's running totals.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwarden.node.agent import NodeAgent

PREFIX = "gpuwarden_node"


_GPU = ("node", "gpu")
_CONTAINER = ("node", "namespace", "pod", "container", "gpu")
_OWNER = ("node", "namespace", "pod", "container", "tenant", "profile")
_USE = (*_OWNER, "gpu", "estimated")
# name (after the prefix) -> (help, labels)
_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpu_memory_total_bytes": ("GPU memory.", ("node", "gpu", "uuid")),
    "gpu_memory_used_bytes": ("GPU memory in use (NVML).", _GPU),
    "gpu_memory_ceiling_bytes": (
        "MPS daemon default pinned-memory limit (the ceiling) per GPU.",
        _GPU,
    ),
    "gpu_mps_managed": (
        "1 where the agent applies MPS limits on the GPU, 0 where it refuses (MIG).",
        _GPU,
    ),
    "gpu_oversubscribed": (
        "1 while the caps of the pods on the GPU exceed its memory times their overcommit ratio.",
        _GPU,
    ),
    "gpu_memory_reserved_bytes": (
        "Sum of cap / overcommit ratio of the pods on an oversubscribed GPU.",
        _GPU,
    ),
    "gpu_unknown_processes": ("GPU processes that belong to no pod on this node.", _GPU),
    "pod_gpu_memory_used_bytes": ("GPU memory used by a pod's container on one GPU.", _CONTAINER),
    "pod_gpu_memory_cap_bytes": (
        "The container's GPU-memory cap (gpuwarden.io/gpu-memory-limit).",
        _CONTAINER,
    ),
    "pod_over_cap": ("1 while the container uses more GPU memory than its cap.", _CONTAINER),
    "pod_gpu_ungranted": (
        "1 while the container has processes on a GPU although nothing granted it one (no GPU "
        "resource, DRA claim or gpuwarden.io record of a GPU).",
        _CONTAINER,
    ),
    "pod_mps_thread_percentage": (
        "The pod's MPS active thread percentage (gpuwarden.io/mps-thread-percentage).",
        ("node", "namespace", "pod"),
    ),
    "pod_gpu_sm_utilization": (
        "Share (0-1) of the GPU's SM time the container's processes used since the last pass "
        '(NVML per-process samples; estimated="true": the device\'s figure apportioned by '
        "allocated share, as for MPS clients).",
        _USE,
    ),
    "pod_gpu_memory_bandwidth_utilization": (
        "Share (0-1) of the GPU's memory-bandwidth time the container's processes used "
        "(as pod_gpu_sm_utilization).",
        _USE,
    ),
    "container_gpus_allocated": (
        "GPUs the container holds, in whole-GPU units: its GPU count times its share of each "
        "(1 whole, 1/replicas for an MPS slice, the vGPU core or memory share; basis says which).",
        (*_OWNER, "basis"),
    ),
    "container_gpus_busy": (
        "GPUs the container keeps busy, in whole-GPU units: the sum of its SM shares over its "
        "GPUs (0 when it has no process on a GPU).",
        (*_OWNER, "estimated"),
    ),
    "container_gpu_memory_used_bytes": (
        "GPU memory the allocated container uses, over all its GPUs.",
        _OWNER,
    ),
    "pod_gpu_idle_seconds": (
        "How long the pod's GPUs have been idle by its profile's idle rule (busy below "
        "idle.below of those allocated); no series while they are not.",
        ("node", "namespace", "pod", "tenant", "profile"),
    ),
    "mps_daemon_healthy": (
        "1 when the MPS control daemon answered the last health check.",
        ("node",),
    ),
    "mps_servers": ("Running MPS servers (one per user ID).", ("node",)),
}


def _flag(value: bool) -> str:
    return "true" if value else "false"


class AgentCollector(Collector):
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        report = agent.last_report
        node = agent.config.node_name
        g = {
            name: GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=list(labels))
            for name, (text, labels) in _GAUGES.items()
        }
        if report is not None:
            over_gpus = {o.gpu: o for o in report.oversubscribed}
            unknown_count: dict[int, int] = {}
            for proc in report.unknown:
                unknown_count[proc.gpu] = unknown_count.get(proc.gpu, 0) + 1
            for status in report.gpus:
                gpu = str(status.device.index)
                g["gpu_memory_total_bytes"].add_metric(
                    [node, gpu, status.device.uuid], status.device.memory_total
                )
                if status.memory_used is not None:
                    g["gpu_memory_used_bytes"].add_metric([node, gpu], status.memory_used)
                if status.ceiling is not None:
                    g["gpu_memory_ceiling_bytes"].add_metric([node, gpu], status.ceiling)
                g["gpu_mps_managed"].add_metric([node, gpu], 1 if status.managed else 0)
                over = over_gpus.get(status.device.index)
                g["gpu_oversubscribed"].add_metric([node, gpu], 1 if over is not None else 0)
                if over is not None:
                    g["gpu_memory_reserved_bytes"].add_metric([node, gpu], over.reserved)
                g["gpu_unknown_processes"].add_metric(
                    [node, gpu], unknown_count.get(status.device.index, 0)
                )
            violating = {(v.pod.uid, v.container, v.gpu) for v in report.violations}
            threads_seen: set[str] = set()
            for usage in report.usage:
                labels = [
                    node,
                    usage.pod.namespace,
                    usage.pod.name,
                    usage.container,
                    str(usage.gpu),
                ]
                g["pod_gpu_memory_used_bytes"].add_metric(labels, usage.used)
                if usage.cap is not None:
                    g["pod_gpu_memory_cap_bytes"].add_metric(labels, usage.cap)
                    key = (usage.pod.uid, usage.container, usage.gpu)
                    g["pod_over_cap"].add_metric(labels, 1 if key in violating else 0)
                if usage.thread_percentage is not None and usage.pod.uid not in threads_seen:
                    threads_seen.add(usage.pod.uid)
                    g["pod_mps_thread_percentage"].add_metric(
                        [node, usage.pod.namespace, usage.pod.name], usage.thread_percentage
                    )
            for gpu_use in report.gpu_use:
                labels = [
                    node,
                    gpu_use.pod.namespace,
                    gpu_use.pod.name,
                    gpu_use.container,
                    gpu_use.tenant,
                    gpu_use.profile,
                    str(gpu_use.gpu),
                    _flag(gpu_use.estimated),
                ]
                g["pod_gpu_sm_utilization"].add_metric(labels, gpu_use.sm)
                g["pod_gpu_memory_bandwidth_utilization"].add_metric(
                    labels, gpu_use.memory_bandwidth
                )
            for held in report.containers:
                a = held.allocation
                owner = [node, a.pod.namespace, a.pod.name, a.container, a.tenant, a.profile]
                g["container_gpus_allocated"].add_metric([*owner, a.basis], a.allocated)
                g["container_gpus_busy"].add_metric([*owner, _flag(held.estimated)], held.busy)
                g["container_gpu_memory_used_bytes"].add_metric(owner, held.memory_used)
            for idle in report.idle:
                g["pod_gpu_idle_seconds"].add_metric(
                    [
                        node,
                        idle.pod.ref.namespace,
                        idle.pod.ref.name,
                        idle.pod.tenant or "",
                        idle.pod.profile or "",
                    ],
                    idle.idle_for,
                )
            for use in report.ungranted:
                labels = [node, use.pod.namespace, use.pod.name, use.container, str(use.gpu)]
                g["pod_gpu_ungranted"].add_metric(labels, 1)
            if report.mps_healthy is not None:
                g["mps_daemon_healthy"].add_metric([node], 1 if report.mps_healthy else 0)
                g["mps_servers"].add_metric([node], len(report.servers))
        yield from g.values()

        for name, text, counts in (
            (
                "violations",
                "Times a container was found above its GPU-memory cap",
                agent.violation_counts(),
            ),
            (
                "ungranted_gpu_use",
                "Times a container was found using a GPU it was not granted",
                agent.ungranted_counts(),
            ),
        ):
            counter = CounterMetricFamily(
                f"{PREFIX}_{name}",
                f"{text}, by the action taken (a pod's series ends when it leaves the node).",
                labels=["node", "namespace", "pod", "action"],
            )
            for (namespace, pod, action), count in sorted(counts.items()):
                counter.add_metric([node, namespace, pod, action], count)
            yield counter
        idle_acts = CounterMetricFamily(
            f"{PREFIX}_idle_actions",
            "Times a profile's idle rule acted on a pod whose GPUs sat idle: action stop (a "
            "Kubeflow Notebook stopped) or notify (an Event on the pod and its owner).",
            labels=["node", "namespace", "tenant", "profile", "action"],
        )
        for (namespace, tenant, profile, action), count in sorted(agent.idle_counts().items()):
            idle_acts.add_metric([node, namespace, tenant, profile, action], count)
        yield idle_acts
        restarts = CounterMetricFamily(
            f"{PREFIX}_mps_daemon_restarts",
            "Times the agent found the MPS control daemon restarted and set its limits again.",
            labels=["node"],
        )
        restarts.add_metric([node], agent.daemon_restarts)
        yield restarts


def agent_registry(agent: NodeAgent) -> CollectorRegistry:
    """A registry holding only the agent's metrics (never the process-global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    return registry
