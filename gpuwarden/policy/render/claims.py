"""The ResourceClaimTemplates of the dra backend: one per shared profile, in each tenant namespace.

A shared profile on the dra backend gives its pod the claim ``gpuwarden-gpu`` from the template
``gpuwarden-<profile>`` of the pod's namespace (admission/mutate.py); the template asks for one
device of the backend's DeviceClass and a share of its capacity: ``maxMemory`` of the memory
capacity, and ``threadPercentage`` (0 where the profile sets none) of the cores capacity where
the backend names one. Kubernetes
v1.37 (resource.k8s.io/v1, DRAConsumableCapacity) allocates such a share of a device whose
ResourceSlice sets ``allowMultipleAllocations: true``, and the sum of the shares stays within
the device's capacity (k8s.io/dynamic-resource-allocation structured/internal/incubating/
consumable_capacity.go).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuwarden.policy.pod import keys
from gpuwarden.policy.render.objects import ANNOTATION_RENDERED_FROM, MANAGED_BY, Rendering
from gpuwarden.policy.spec.backends import claim_template_name
from gpuwarden.policy.spec.model import DraBackend
from gpuwarden.policy.spec.policyset import PolicySet
from gpuwarden.policy.spec.resolved import ResolvedProfile

RESOURCE_API = "resource.k8s.io/v1"
#: The name of the one request in each template (ResourceClaim spec.devices.requests[].name).
REQUEST_NAME = "gpu"


def claim_request(profile: ResolvedProfile, backend: DraBackend) -> dict[str, Any]:
    """The device request of a shared profile's claim (ResourceClaim spec.devices.requests[])."""
    capacity: dict[str, str] = {}
    if profile.max_memory_text is not None:
        capacity[backend.memory_capacity] = profile.max_memory_text
    if backend.cores_capacity is not None:
        # A capacity the claim does not name is consumed whole (CapacityRequirements.Requests in
        # k8s.io/api resource/v1 types.go), so a profile without a core share asks for none, as
        # Volcano and HAMi reserve no cores for a pod that names none.
        capacity[backend.cores_capacity] = str(profile.thread_percentage or 0)
    exactly: dict[str, Any] = {
        "deviceClassName": backend.device_class_name,
        "allocationMode": "ExactCount",
        "count": 1,
    }
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": REQUEST_NAME, "exactly": exactly}


def claim_template(profile: ResolvedProfile, namespace: str) -> dict[str, Any] | None:
    """The ResourceClaimTemplate a shared dra profile's pods in ``namespace`` claim from; None
    for a profile that takes no claim."""
    backend = profile.backend
    # A shared profile of more than one GPU is denied at admission: no pod claims from it.
    if not isinstance(backend, DraBackend) or not profile.gpu_share or profile.gpus != 1:
        return None
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": claim_template_name(profile.name),
            "namespace": namespace,
            "labels": {**MANAGED_BY, keys.ANNOTATION_PROFILE: profile.name},
            "annotations": {ANNOTATION_RENDERED_FROM: f"{profile.policy}/profiles/{profile.name}"},
        },
        "spec": {"spec": {"devices": {"requests": [claim_request(profile, backend)]}}},
    }


def claim_templates(
    policies: PolicySet, namespace: str, labels: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """One ResourceClaimTemplate per shared profile on the dra backend, as the namespace's tenant
    gets the profile (its overrides applied), for ``namespace``; ``labels``: the namespace's,
    for tenants that select it by label."""
    tenant = policies.tenant_for(namespace, labels or {})
    templates = (
        claim_template(policies.resolve(name, tenant), namespace) for name in policies.profiles
    )
    return [template for template in templates if template is not None]


# Where ResourceQuota charges a claim (kubernetes v1.37.2 pkg/quota/v1/evaluator/core/
# resource_claims.go: V1ResourceByDeviceClass, and addExtendedResourceQuota under
# DRAExtendedResource): each device a claim requests counts under this key of its class, and
# under requests.<extendedResourceName> where the DeviceClass maps one.
DEVICE_CLASS_QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"


def _shared_classes(policies: PolicySet) -> dict[str, list[str]]:
    """Each DeviceClass shared dra profiles claim from, and those profiles."""
    found: dict[str, list[str]] = {}
    for name in policies.profiles:
        profile = policies.resolve(name, None)
        if claim_template(profile, "") is not None:
            assert isinstance(profile.backend, DraBackend)
            found.setdefault(profile.backend.device_class_name, []).append(name)
    return found


def with_claim_templates(rendering: Rendering, policies: PolicySet) -> Rendering:
    """The rendering with the ResourceClaimTemplates of every namespace a tenant lists by name,
    and notes on label-selected tenants and on how ResourceQuota counts the claims."""
    classes = _shared_classes(policies)
    if not classes:
        return rendering
    objects: list[dict[str, Any]] = []
    notes: list[str] = []
    for tenant in policies.tenants:
        for namespace in tenant.namespaces:
            if policies.tenant_by_namespace.get(namespace) is tenant:
                objects += claim_templates(policies, namespace)
        if tenant.namespace_selector is not None:
            notes.append(
                f"tenant {tenant.name} selects namespaces by label: the tenant controller "
                "(`gpuwarden tenant-controller`) applies the ResourceClaimTemplates of shared "
                "dra profiles in each of them; without it, pods of those profiles there wait "
                "for a template that does not exist"
            )
    for device_class, names in sorted(classes.items()):
        notes.append(
            f"profiles {', '.join(names)} claim shares of DeviceClass {device_class}: a "
            f"ResourceQuota counts each claim as one device, {device_class}"
            f"{DEVICE_CLASS_QUOTA_SUFFIX}, whatever its share, and as one "
            "requests.<extendedResourceName> where the DeviceClass sets one (so quota.gpus "
            "counts each shared pod as a whole GPU there)"
        )
    return replace(
        rendering,
        objects=(*rendering.objects, *objects),
        notes=(*rendering.notes, *notes),
    )
