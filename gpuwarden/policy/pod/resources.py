"""Read-only views of a pod's GPU-related resources, as plain data.

Pods are JSON data as an AdmissionReview carries them (dicts and lists); anything else where an
object belongs reads as absent, which the validator then reports as it finds it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from gpuwarden.policy.pod.quantity import QuantityError, parse_count

# Every extended resource by which a container can ask for (part of) an NVIDIA GPU, across the
# backends gpuwarden knows; a governed container keeps only the ones its backend sets.
GPU_RESOURCES: frozenset[str] = frozenset(
    {
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory",
        "volcano.sh/vgpu-memory-percentage",
        "volcano.sh/vgpu-cores",
        "volcano.sh/gpu-memory",
        "volcano.sh/gpu-number",
    }
)
# Resources that count devices (whole or shared); the rest size a share of one device.
GPU_COUNT_RESOURCES: frozenset[str] = frozenset(
    {"nvidia.com/gpu", "nvidia.com/gpu.shared", "volcano.sh/vgpu-number", "volcano.sh/gpu-number"}
)

#: Pod phases in which a pod holds nothing: its containers have stopped for good.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


# Prefixes of device-plugin resources that hand out (parts of) NVIDIA GPUs, renamed ones included
# (nvidia.com/gpu.shared, a sharing config's custom nvidia.com/gpu-<name>, MIG profiles).
_GPU_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-", "volcano.sh/vgpu-", "volcano.sh/gpu-")


def is_gpu_resource(name: str) -> bool:
    return name in GPU_RESOURCES or name.startswith(_GPU_PREFIXES)


# Extended resources backed by Dynamic Resource Allocation (KEP-5004, feature DRAExtendedResource):
# every DeviceClass is also the extended resource deviceclass.resource.kubernetes.io/<class name>
# (ResourceDeviceClassPrefix in kubernetes/kubernetes staging/src/k8s.io/api/resource/v1/
# types.go), and the scheduler's dynamicresources plugin maps both names to the class
# (pkg/scheduler/framework/plugins/dynamicresources/extended/cache.go, "always add the default
# mapping") and turns a container's request into a ResourceClaim of that many devices
# (extendeddynamicresources.go). kube-apiserver 1.37.2 admits the name as it is, and its
# quota charges only requests.deviceclass.resource.kubernetes.io/<class name>.
DEVICE_CLASS_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
# GPUs of other vendors, which no profile governs: AMD's device plugin (amd.com/gpu, and
# amd.com/<partition> under its mixed naming) and Intel's (gpu.intel.com/i915, gpu.intel.com/xe,
# with millicores, memory.max and tiles beside them).
OTHER_GPU_PREFIXES = ("amd.com/", "gpu.intel.com/")
#: Every resource-name prefix by which a container may reach an accelerator: NVIDIA's (governed),
#: DRA's device classes and other vendors' (denied to tenants unless their policy allows them).
ACCELERATOR_PREFIXES = (*_GPU_PREFIXES, DEVICE_CLASS_RESOURCE_PREFIX, *OTHER_GPU_PREFIXES)
#: Annotations asking a CDI-aware runtime to inject devices (AnnotationPrefix in
#: cncf-tags/container-device-interface pkg/cdi/annotations.go).
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"


def device_class_of(name: str) -> str | None:
    """The DeviceClass a DRA-backed extended resource name stands for (None for another name)."""
    if name.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
        return name[len(DEVICE_CLASS_RESOURCE_PREFIX) :]
    return None


class ContainerRef(NamedTuple):
    """A container of the pod and where it sits in the spec (a tuple: made many times a decision)."""

    field: str  # "containers", "initContainers" or "ephemeralContainers"
    position: int  # index in that list
    body: Mapping[str, Any]

    @property
    def name(self) -> str:
        name = self.body.get("name")
        return name if isinstance(name, str) else f"#{self.position}"

    @property
    def path(self) -> list[str | int]:
        return ["spec", self.field, self.position]

    def resources(self, kind: str) -> Mapping[str, Any]:
        resources = self.body.get("resources")
        if not isinstance(resources, dict):
            return {}
        section = resources.get(kind)
        return section if isinstance(section, dict) else {}

    def gpu_resources(self) -> dict[str, Any]:
        """GPU resources from limits, then requests (limits win, as Kubernetes defaults them)."""
        found = {k: v for k, v in self.resources("requests").items() if is_gpu_resource(str(k))}
        found.update({k: v for k, v in self.resources("limits").items() if is_gpu_resource(str(k))})
        return found

    def asks_for_gpu(self) -> bool:
        """Whether it names a GPU resource at anything but zero (``nvidia.com/gpu: "0"`` asks
        for none and stays a CPU container; a count that does not parse asks, so the checks
        name it), without building gpu_resources()."""
        resources = self.body.get("resources")
        if not isinstance(resources, dict):
            return False
        for kind in ("limits", "requests"):
            section = resources.get(kind)
            if isinstance(section, dict) and any(
                is_gpu_resource(str(k)) and not _is_zero(v) for k, v in section.items()
            ):
                return True
        return False

    def asked_gpus(self) -> int | None:
        """The GPUs the container asks for: its largest GPU count resource, None when it names
        none (or 0). Raises QuantityError, naming the field, for a count that is not whole."""
        best = 0
        for section in ("limits", "requests"):
            for name, value in self.resources(section).items():
                if name not in GPU_COUNT_RESOURCES:
                    continue
                try:
                    best = max(best, parse_count(value))
                except QuantityError as exc:
                    raise QuantityError(f"resources.{section}[{name}]: {exc}") from None
        return best or None

    def env(self) -> list[Mapping[str, Any]]:
        env = self.body.get("env")
        return [e for e in env if isinstance(e, dict)] if isinstance(env, list) else []


CONTAINER_FIELDS = ("initContainers", "containers", "ephemeralContainers")


def spec_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, dict) else {}


def metadata_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, dict) else {}


def string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def labels_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return string_map(metadata_of(pod).get("labels"))


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return string_map(metadata_of(pod).get("annotations"))


def containers(pod: Mapping[str, Any], *fields: str) -> Iterator[ContainerRef]:
    spec = spec_of(pod)
    for field in fields or CONTAINER_FIELDS:
        items = spec.get(field)
        if not isinstance(items, list):
            continue
        for index, body in enumerate(items):
            if isinstance(body, dict):
                yield ContainerRef(field, index, body)


def _is_zero(value: Any) -> bool:
    try:
        return parse_count(value) == 0
    except QuantityError:
        return False


def requests_gpu(pod: Mapping[str, Any]) -> bool:
    return any(ref.asks_for_gpu() for ref in containers(pod))


def reaches_accelerator(pod: Mapping[str, Any]) -> bool:
    """Whether the pod may get a device by any route the policies govern or deny: a GPU it
    asks for, any resource under ACCELERATOR_PREFIXES (zero or not), or a CDI annotation."""
    if requests_gpu(pod) or any(k.startswith(CDI_ANNOTATION_PREFIX) for k in annotations_of(pod)):
        return True
    return any(
        str(name).startswith(ACCELERATOR_PREFIXES)
        for ref in containers(pod)
        for kind in ("limits", "requests")
        for name in ref.resources(kind)
    )
