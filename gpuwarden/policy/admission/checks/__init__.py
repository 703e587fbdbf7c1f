"""The validating checks, one module per family behind the ``Check`` interface (base.py).

``CHECKS`` is the order they run in, and so the order of a denial's messages; each runs only on
the requests it handles:

=====================  ================  =============================================
check                  enforcement       requests
=====================  ================  =============================================
quantities             quantities        CREATE
forged annotations     annotations       CREATE
gpuwarden claims       annotations       CREATE
tenant limits          tenant_limits     CREATE
resource claims        tenant_limits     CREATE
GPU routes             tenant_limits     CREATE
environment            environment       CREATE, UPDATE pods/ephemeralcontainers
runtime class          environment       CREATE
device list mounts     host_paths        CREATE, UPDATE pods/ephemeralcontainers
host path volumes      host_paths        CREATE
privilege              privileged        CREATE, UPDATE pods/ephemeralcontainers
host namespaces        host_namespaces   CREATE
profile mismatch       scheduling        CREATE
node name              scheduling        CREATE
foreign scheduler      scheduling        CREATE
GPU memory quota       gpu_memory_quota  CREATE
resize                 scheduling        UPDATE pods/resize
changed annotations    annotations       UPDATE
=====================  ================  =============================================
"""

from collections.abc import Mapping
from types import MappingProxyType

from gpuwarden.policy.admission.checks import escapes, limits, routes, scheduling, updates
from gpuwarden.policy.admission.checks.base import (
    Check,
    CheckContext,
    RequestKind,
    Violation,
    request_kind,
)

CHECKS: tuple[Check, ...] = (
    limits.QUANTITIES,
    updates.FORGED_ANNOTATIONS,
    escapes.GPUWARDEN_CLAIMS,
    limits.TENANT_LIMITS,
    limits.RESOURCE_CLAIMS,
    routes.GPU_ROUTES,
    escapes.ENVIRONMENT,
    escapes.RUNTIME_CLASS,
    escapes.DEVICE_LIST_MOUNT,
    escapes.HOST_PATH_VOLUMES,
    escapes.PRIVILEGE,
    escapes.HOST_NAMESPACES,
    scheduling.PROFILE_MISMATCH,
    scheduling.NODE_NAME,
    scheduling.FOREIGN_SCHEDULER,
    limits.GPU_MEMORY_QUOTA,
    updates.POD_RESIZE,
    updates.CHANGED_ANNOTATIONS,
)


# Every kind some check handles, with its checks in order: chosen once, not on every request.
_BY_KIND: Mapping[RequestKind, tuple[Check, ...]] = MappingProxyType(
    {
        kind: tuple(check for check in CHECKS if kind in check.handles)
        for kind in sorted({kind for check in CHECKS for kind in check.handles})
    }
)


def checks_for(kind: RequestKind) -> tuple[Check, ...]:
    """The checks a request of this kind runs, in order (none for a kind no check handles)."""
    return _BY_KIND.get(kind, ())


__all__ = [
    "CHECKS",
    "Check",
    "CheckContext",
    "RequestKind",
    "Violation",
    "checks_for",
    "request_kind",
]
