"""The interface every validating check implements, and the facts of one decision it reads.

Like a Kubernetes admission plugin, a check is one concern: a name, the requests it handles
(operation and subresource), the enforcement switch that governs it, and a function from the
decision's context to the violations it finds. The validator runs the checks that handle the
request, in the order of ``checks.CHECKS``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuwarden.policy.admission.decision import AdmissionRequest, ClusterView
from gpuwarden.policy.admission.placement import Placement
from gpuwarden.policy.pod.resources import ContainerRef
from gpuwarden.policy.pod.view import PodView
from gpuwarden.policy.spec.model import Tenant
from gpuwarden.policy.spec.policyset import PolicySet

#: The enforcement switch a check's violations fall under (a field of the tenant's enforcement).
Switch = Literal[
    "quantities",
    "annotations",
    "tenant_limits",
    "environment",
    "host_paths",
    "privileged",
    "host_namespaces",
    "scheduling",
    "gpu_memory_quota",
]

#: (operation, subresource) of a request a check handles.
RequestKind = tuple[str, str]
#: A new pod (whatever subresource a CREATE names, the whole pod is new).
CREATE: RequestKind = ("CREATE", "")
#: A change to a pod's own fields (labels, annotations, image): only annotations can change.
UPDATE: RequestKind = ("UPDATE", "")
#: kubectl debug adding ephemeral containers: only the new containers can open a hole.
DEBUG: RequestKind = ("UPDATE", "ephemeralcontainers")
#: pods/resize changing the cpu and memory of running containers.
RESIZE: RequestKind = ("UPDATE", "resize")


def request_kind(request: AdmissionRequest) -> RequestKind:
    """The kind of request the checks are chosen by."""
    if request.operation == "UPDATE":
        return ("UPDATE", request.sub_resource)
    return (request.operation, "")


@dataclass(frozen=True)
class Violation:
    check: str  # the enforcement switch that governs it
    reason: str  # machine-readable, for status.reason and metrics
    message: str


@dataclass(frozen=True)
class CheckContext:
    """The read-only facts of one validating decision."""

    request: AdmissionRequest
    view: PodView  # the final (mutated) pod, read once
    placement: Placement
    cluster: ClusterView
    policies: PolicySet
    #: The mutation placed this very pod as ``placement`` and left it as it was, so re-applying
    #: the placement would change nothing.
    settled: bool = False

    @property
    def tenant(self) -> Tenant | None:
        return self.placement.tenant


@dataclass(frozen=True)
class Check:
    """One validating check."""

    name: str
    switch: Switch
    handles: frozenset[RequestKind]
    find: Callable[[CheckContext], Iterator[Violation]]


MAX_SHOWN = 5


def listed(items: Sequence[str], limit: int = MAX_SHOWN) -> str:
    """Items for a message: the first few, then how many more."""
    if len(items) <= limit:
        return ", ".join(items)
    return f"{', '.join(items[:limit])} and {len(items) - limit} more"


def container_path(ref: ContainerRef) -> str:
    return f"spec.{ref.field}[{ref.name}]"
