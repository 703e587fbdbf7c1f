"""The lab's emulated DRA driver ``gpu.lab.gpuwarden.io``: GPUs any pod may share or hold whole,
as Volcano's and HAMi's device plugins count them, published for kube-scheduler's own allocator.

Per GPU node one ResourceSlice (pool = the node's name, ``nodeName`` set) with devices ``gpu-0``
.. ``gpu-<n-1>``, each ``allowMultipleAllocations: true`` with two consumable capacities: ``memory``
(the node's GPU memory) and ``cores`` (100): a shared claim consumes what its request names; of a
capacity it names none of, the capacity's ``requestPolicy.default`` or else all of it
(k8s.io/dynamic-resource-allocation@v0.37.2 structured/internal/incubating/consumable_capacity.go,
``fillEmptyRequest``). ``cores`` defaults to 0, as Volcano's and HAMi's core request does, so a
share by memory alone reserves no cores, and a whole-GPU claim (naming nothing) takes all the
memory: the device whole. That is Volcano's
and HAMi's per-device accounting: memory and a core share of 100 per GPU (Volcano
pkg/scheduler/api/devices/nvidia/vgpu/utils.go, HAMi pkg/device/nvidia/device.go). The DeviceClass
``gpuwarden-lab-gpu`` maps whole-GPU pods' ``nvidia.com/gpu`` onto these devices
(``extendedResourceName``; DRAExtendedResource, GA in 1.37): on a node whose allocatable has none
of the resource the scheduler allocates it through DRA (a node that advertises it is left to the
device plugin: extendeddynamicresources.go), creates a claim for the pod in PreBind and records
it in ``pod.status.extendedResourceClaimStatus``.

What the allocator does not do for these devices, in kube-scheduler v1.37.2: preempt. The
DynamicResources plugin has no PreFilterExtensions (it cannot see a victim's devices freed) and
returns UnschedulableAndUnresolvable when a node's devices do not fit
(pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go), so preemption never
picks victims for GPUs on these nodes. Claims are released by kube-controller-manager's
resourceclaim controller: once a pod is Succeeded, Failed or gone, its reservation and then its
allocation are removed, and a claim generated for it is deleted
(pkg/controller/resourceclaim/controller.go, ``syncClaim``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.nodes import GPU_RESOURCE, GpuNodePool
from gpuwarden.policy.pod.quantity import parse_quantity

DRIVER = "gpu.lab.gpuwarden.io"
DEVICE_CLASS = "gpuwarden-lab-gpu"
MEMORY_CAPACITY = "memory"
CORES_CAPACITY = "cores"
#: A device's core share: what Volcano's vgpu-cores and HAMi's gpucores add up to per GPU.
CORES_PER_DEVICE = 100
DEVICE_PREFIX = "gpu-"
RESOURCE_API = "resource.k8s.io/v1"
_HTTP_NOT_FOUND = 404

#: kube-controller-manager's controllers a DRA lab runs: the resourceclaim controller (claims
#: from templates, released when pods end) and the garbage collector (claims whose pod is gone).
DRA_CONTROLLERS = ("resourceclaim-controller", "garbage-collector-controller")


def device_class() -> dict[str, Any]:
    """The DeviceClass of the lab's GPUs, which whole-GPU pods reach through nvidia.com/gpu."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
            "extendedResourceName": GPU_RESOURCE,
        },
    }


def device_name(index: int) -> str:
    return f"{DEVICE_PREFIX}{index}"


def device_index(name: str) -> int | None:
    """The GPU index a device name stands for (None: not one of this driver's)."""
    if not name.startswith(DEVICE_PREFIX):
        return None
    rest = name[len(DEVICE_PREFIX) :]
    return int(rest) if rest.isdigit() else None


def resource_slice(pool: GpuNodePool, node: str) -> dict[str, Any]:
    """The ResourceSlice the driver publishes for one node of ``pool``."""
    memory = f"{pool.gpu_memory_mib}Mi"
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": device_name(index),
                    "allowMultipleAllocations": True,
                    "attributes": {"productName": {"string": pool.gpu_product}},
                    "capacity": {
                        MEMORY_CAPACITY: {"value": memory},
                        CORES_CAPACITY: {
                            "value": str(CORES_PER_DEVICE),
                            # A claim naming no cores reserves none, as Volcano's and HAMi's
                            # default core request of 0; without a default it would take all
                            # 100 (fillEmptyRequest), and a share by memory alone a whole GPU.
                            "requestPolicy": {
                                "default": "0",
                                "validRange": {"min": "0", "max": str(CORES_PER_DEVICE)},
                            },
                        },
                    },
                }
                for index in range(pool.gpus_per_node)
            ],
        },
    }


def resource_slices(pools: Iterable[GpuNodePool]) -> list[dict[str, Any]]:
    return [resource_slice(pool, node) for pool in pools for node in pool.node_names]


def publish(api: k8s_client.ApiClient, pools: Iterable[GpuNodePool]) -> None:
    """Create the DeviceClass and every node's ResourceSlice (as the driver's kubelet plugin
    would once its node registered)."""
    resource: Any = k8s_client.ResourceV1Api(api)
    resource.create_device_class(device_class())
    for manifest in resource_slices(pools):
        resource.create_resource_slice(manifest)


def apply_claim_templates(
    api: k8s_client.ApiClient, namespace: str, templates: Sequence[Mapping[str, Any]]
) -> None:
    """Create the ResourceClaimTemplates in ``namespace`` (their own namespace is set to it)."""
    resource: Any = k8s_client.ResourceV1Api(api)
    for template in templates:
        body = {**template, "metadata": {**template.get("metadata", {}), "namespace": namespace}}
        resource.create_namespaced_resource_claim_template(namespace, body)


# -- what a pod was given ------------------------------------------------------------------------


def pod_claim_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceClaims a pod's devices come from: those made from its templates
    (``status.resourceClaimStatuses``) and the scheduler's claim for its extended resources
    (``status.extendedResourceClaimStatus``)."""
    status = pod.get("status") or {}
    names = [
        str(entry["resourceClaimName"])
        for entry in status.get("resourceClaimStatuses") or []
        if entry.get("resourceClaimName")
    ]
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        names.append(str(extended))
    return tuple(names)


def allocated_shares(
    claim: Mapping[str, Any], node: str, gpu_memory: float
) -> list[tuple[int, float]]:
    """(GPU index on ``node``, share of it) for each of the driver's devices the claim was
    allocated (see :func:`consumed_share`)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    out: list[tuple[int, float]] = []
    for result in results:
        index = device_index(str(result.get("device", "")))
        if result.get("driver") != DRIVER or result.get("pool") != node or index is None:
            continue
        out.append((index, consumed_share(result.get("consumedCapacity") or {}, gpu_memory)))
    return out


def consumed_share(consumed: Mapping[str, Any], gpu_memory: float) -> float:
    """The share of a device a claim holds: the cores it consumed out of 100, or where it
    consumed none its share of the device's memory (the API server lists every capacity,
    0 where none was consumed); a claim that names nothing consumed the device whole."""
    cores = float(parse_quantity(str(consumed.get(CORES_CAPACITY, "0"))))
    if cores > 0:
        return min(1.0, cores / CORES_PER_DEVICE)
    memory = float(parse_quantity(str(consumed.get(MEMORY_CAPACITY, "0"))))
    if memory > 0 and gpu_memory > 0:
        return min(1.0, memory / gpu_memory)
    return 1.0


def claimed_gpus(
    api: k8s_client.ApiClient,
    namespace: str,
    claims: Iterable[str],
    node: str,
    gpu_memory: float,
) -> list[tuple[int, float]]:
    """(GPU index, share) of every device ``claims`` (a pod's, :func:`pod_claim_names`) were
    allocated on ``node`` (claims already gone are skipped)."""
    resource: Any = k8s_client.ResourceV1Api(api)
    out: list[tuple[int, float]] = []
    for name in claims:
        try:
            response = resource.read_namespaced_resource_claim(
                name, namespace, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == _HTTP_NOT_FOUND:
                continue
            raise
        out += allocated_shares(json.loads(response.data), node, gpu_memory)
    return out


def template_capacity(template: Mapping[str, Any]) -> Mapping[str, Any]:
    """The capacity a claim from ``template`` asks of its device (its first request's)."""
    requests = ((template.get("spec") or {}).get("spec") or {}).get("devices", {}).get("requests")
    for request in requests or []:
        capacity: Mapping[str, Any] = ((request.get("exactly") or {}).get("capacity") or {}).get(
            "requests"
        ) or {}
        return capacity
    return {}


def template_share(template: Mapping[str, Any], gpu_memory: float) -> float:
    """The share of one GPU a claim from ``template`` reserves (see :func:`consumed_share`)."""
    return consumed_share(template_capacity(template), gpu_memory)


@dataclass(frozen=True)
class Reservation:
    """What a claim from a template sets aside on its device."""

    share: float  # of the device (see consumed_share)
    memory: float  # bytes of its GPU memory
    sm_share: float | None  # the SMs it may use, when it reserved cores (None: no cap)


def reservation(template: Mapping[str, Any], gpu_memory: float) -> Reservation:
    """A claim from ``template`` on a device of ``gpu_memory`` bytes: a share reserved by cores
    caps the pod's SMs at it, as Volcano's vgpu-cores and HAMi's gpucores do (0 cores: no cap,
    as their default)."""
    capacity = template_capacity(template)
    share = consumed_share(capacity, gpu_memory)
    memory = capacity.get(MEMORY_CAPACITY)
    cores = float(parse_quantity(str(capacity.get(CORES_CAPACITY, "0"))))
    return Reservation(
        share=share,
        memory=float(parse_quantity(str(memory))) if memory is not None else share * gpu_memory,
        sm_share=share if cores > 0 else None,
    )


def delete_published(api: k8s_client.ApiClient) -> None:
    """Remove the driver's slices and class (tests that share one lab)."""
    resource: Any = k8s_client.ResourceV1Api(api)
    with contextlib.suppress(ApiException):
        resource.delete_collection_resource_slice(field_selector=f"spec.driver={DRIVER}")
    with contextlib.suppress(ApiException):
        resource.delete_device_class(DEVICE_CLASS)
