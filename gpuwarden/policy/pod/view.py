"""A pod read once per decision: what placement, the patch and the checks read of it.

A decision reads the same few things of a pod many times over (its labels and annotations, its
containers, their GPU counts); ``PodView.of`` reads them once, at the start of the decision, and
every step after receives the view. The view never changes the pod, and the pod must not change
while the view is in use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import QuantityError, parse_count
from gpuwarden.policy.pod.record import CHARGE_FIELDS, DECISION_FIELDS, PodRecord
from gpuwarden.policy.pod.resources import (
    GPU_COUNT_RESOURCES,
    ContainerRef,
    annotations_of,
    containers,
    is_gpu_resource,
    labels_of,
    spec_of,
)

# What placement and the quota charge read of the recorded decision, each field once.
_RECORD_FIELDS: Final = tuple(dict.fromkeys((*DECISION_FIELDS, *CHARGE_FIELDS)))


class ContainerGPUs(NamedTuple):
    """A container's GPU resources, each value parsed once."""

    #: ContainerRef.asks_for_gpu(): a GPU resource at anything but zero (or a count that does
    #: not parse).
    asks: bool
    #: ContainerRef.asked_gpus(), or the QuantityError it raises.
    asked: int | QuantityError | None
    #: The devices its count resources give it, limits over requests; counts that do not parse
    #: add none (the quantities check names them).
    devices: int


def _count(value: Any) -> int | QuantityError:
    """The count ``parse_count`` reads, or the error it raises."""
    try:
        return parse_count(value)
    except QuantityError as exc:
        return exc


# A container without resources (an init or sidecar container, often): no GPU.
_NO_GPUS: Final = ContainerGPUs(False, None, 0)


def names_gpuwarden_claim(entries: Any) -> bool:
    """Whether a list of claim entries (a container's resources.claims, or the pod's
    spec.resourceClaims) has one named gpuwarden-gpu, the dra backend's shared GPU."""
    return isinstance(entries, list) and any(
        isinstance(entry, dict) and entry.get("name") == keys.DRA_CLAIM_NAME for entry in entries
    )


def _gpus_of(ref: ContainerRef) -> ContainerGPUs:
    resources = ref.body.get("resources")
    if not resources or not isinstance(resources, dict):
        return _NO_GPUS
    if names_gpuwarden_claim(resources.get("claims")):
        # One GPU, shared through the claim, as a count resource of 1 would read: a pod the dra
        # backend mutated is placed again on validation and reinvocation as the one it was.
        found = _gpus_of(ref._replace(body={**ref.body, "resources": _without_claims(resources)}))
        held = found.asked if isinstance(found.asked, QuantityError) else max(found.asked or 0, 1)
        return ContainerGPUs(True, held, found.devices + 1)
    asks, asked, best = False, None, 0
    devices: dict[Any, int | QuantityError] = {}
    for section in ("limits", "requests"):
        for name, value in ref.resources(section).items():
            if not is_gpu_resource(str(name)):
                continue
            parsed = _count(value)
            asks = asks or isinstance(parsed, QuantityError) or parsed != 0
            if name not in GPU_COUNT_RESOURCES:
                continue
            devices.setdefault(name, parsed)  # limits first: they win
            if asked is not None:
                continue
            if isinstance(parsed, QuantityError):
                asked = QuantityError(f"resources.{section}[{name}]: {parsed}")
            else:
                best = max(best, parsed)
    return ContainerGPUs(
        asks,
        asked if asked is not None else best or None,
        sum(n for n in devices.values() if not isinstance(n, QuantityError)),
    )


def _without_claims(resources: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in resources.items() if key != "claims"}


def _largest_request(found: Iterable[ContainerGPUs]) -> int | None:
    best = 0
    for gpus in found:
        if isinstance(gpus.asked, QuantityError):
            return None
        if gpus.asked is not None and gpus.asked > best:
            best = gpus.asked
    return best


class PodView(NamedTuple):
    """The read-only facts of one pod, read once (a named tuple: a decision builds one per pod,
    and a frozen dataclass costs a call per field to build)."""

    pod: Mapping[str, Any]
    spec: Mapping[str, Any]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    #: Every container, init containers first, then containers, then ephemeral containers.
    all_containers: tuple[ContainerRef, ...]
    #: spec.containers, the ones a profile can give GPUs to.
    main_containers: tuple[ContainerRef, ...]
    main_names: tuple[str, ...]
    #: What gpuwarden recorded on the pod, as far as placement and the quota charge read it.
    record: PodRecord
    #: Each container's GPU resources, by the identity of its body.
    gpus_by_body: Mapping[int, ContainerGPUs]
    #: Whether any container asks for a GPU (as resources.requests_gpu reads it).
    asks_for_gpu: bool
    #: The most GPUs any one container asks for: 0 when none names a count (only GPU memory or
    #: cores, say), None when a count is not whole (the grant names that field).
    largest_gpu_request: int | None
    #: spec.containers by name; of a repeated name (which the API server refuses after the
    #: webhooks), the last.
    main_by_name: Mapping[str, ContainerRef]

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView:
        annotations = annotations_of(pod)
        refs = tuple(containers(pod))
        main = tuple(ref for ref in refs if ref.field == "containers")
        gpus = {id(ref.body): _gpus_of(ref) for ref in refs}
        return cls(
            pod,
            spec_of(pod),
            labels_of(pod),
            annotations,
            refs,
            main,
            tuple(ref.name for ref in main),
            PodRecord.from_annotations(annotations, _RECORD_FIELDS),
            gpus,
            any(found.asks for found in gpus.values()),
            _largest_request(gpus.values()),
            {ref.name: ref for ref in main},
        )

    def containers(self, *fields: str) -> tuple[ContainerRef, ...]:
        """The containers of these fields (all of them when none is named), in spec order."""
        if not fields:
            return self.all_containers
        return tuple(ref for ref in self.all_containers if ref.field in fields)

    def first_named(self, name: str) -> ContainerRef:
        """The first of spec.containers with this name (which must exist)."""
        return next(ref for ref in self.main_containers if ref.name == name)

    def gpus(self, ref: ContainerRef) -> ContainerGPUs:
        """The GPU resources of one of the view's containers, read when the view was made."""
        found = self.gpus_by_body.get(id(ref.body))
        return found if found is not None else _gpus_of(ref)

    def asked_gpus(self, ref: ContainerRef) -> int | None:
        """``ref.asked_gpus()``, read once."""
        asked = self.gpus(ref).asked
        if isinstance(asked, QuantityError):
            raise asked
        return asked
