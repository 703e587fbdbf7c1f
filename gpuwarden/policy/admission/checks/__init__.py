"""The validating checks, one module per family behind the ``Check`` interface (base.py).

``CHECKS`` is the order they run in, and so the order of a denial's messages; each runs only on
the requests it handles:

=====================  ================  =============================================
check                  enforcement       requests
=====================  ================  =============================================
quantities             quantities        CREATE
forged annotations     annotations       CREATE
tenant limits          tenant_limits     CREATE
resource claims        tenant_limits     CREATE
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

from gpuwarden.policy.admission.checks import escapes, limits, scheduling, updates
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
    limits.TENANT_LIMITS,
    limits.RESOURCE_CLAIMS,
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


def checks_for(kind: RequestKind) -> tuple[Check, ...]:
    """The checks a request of this kind runs, in order."""
    return tuple(check for check in CHECKS if kind in check.handles)


__all__ = [
    "CHECKS",
    "Check",
    "CheckContext",
    "RequestKind",
    "Violation",
    "checks_for",
    "request_kind",
]
