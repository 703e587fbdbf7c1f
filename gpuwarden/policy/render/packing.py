"""The kube-scheduler profile that packs GPU pods, and Volcano's counterpart (pure data).

Spreading one-GPU pods over every node (the default scoring, LeastAllocated) leaves no node with
eight free GPUs for an eight-GPU job; packing them onto the fullest nodes that fit keeps whole
nodes free. The chart runs a second kube-scheduler with :func:`binpack_profile` (a chart test
checks its rendered configuration equals this one), the lab's kube-scheduler carries it beside
the default profile, and a policy selects it with ``backend: {type: nvidia, schedulerName:
gpuwarden-binpack}``. Volcano users get the same effect from Volcano's own ``binpack`` plugin,
with :func:`volcano_binpack_arguments`.
"""

from __future__ import annotations

from typing import Any

#: The scheduler name of the packing profile.
BINPACK_SCHEDULER = "gpuwarden-binpack"

#: The extended resources a GPU pod asks for, packed with these weights (1..100 each).
BINPACK_RESOURCES: tuple[tuple[str, int], ...] = (
    ("nvidia.com/gpu", 10),
    ("nvidia.com/gpu.shared", 10),
    ("cpu", 1),
    ("memory", 1),
)


def binpack_profile(scheduler_name: str = BINPACK_SCHEDULER) -> dict[str, Any]:
    """A KubeSchedulerProfile (kubescheduler.config.k8s.io/v1): NodeResourcesFit scoring with
    MostAllocated on the GPU resources, BalancedAllocation off (it would spread again), and every
    feasible node scored, so the fullest one is found on a large cluster too."""
    return {
        "schedulerName": scheduler_name,
        "percentageOfNodesToScore": 100,
        "plugins": {
            "score": {
                "disabled": [{"name": "NodeResourcesBalancedAllocation"}],
                "enabled": [{"name": "NodeResourcesFit", "weight": 5}],
            }
        },
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": "MostAllocated",
                        "resources": [
                            {"name": name, "weight": weight} for name, weight in BINPACK_RESOURCES
                        ],
                    }
                },
            }
        ],
    }


def volcano_binpack_arguments() -> dict[str, Any]:
    """The ``arguments`` of Volcano's ``binpack`` plugin (volcano-scheduler.conf) that weigh the
    same GPU resources (and Volcano's own vGPU count) as :func:`binpack_profile`."""
    gpu = [name for name, _ in BINPACK_RESOURCES if name not in ("cpu", "memory")]
    resources = [*gpu, "volcano.sh/vgpu-number"]
    weights = dict(BINPACK_RESOURCES)
    out: dict[str, Any] = {
        "binpack.weight": 10,
        "binpack.cpu": weights["cpu"],
        "binpack.memory": weights["memory"],
        "binpack.resources": ", ".join(resources),
    }
    for name in resources:
        out[f"binpack.resources.{name}"] = weights.get(name, 10)
    return out
