"""A pod read once per decision: what placement, the patch and the checks read of it.

A decision reads the same few things of a pod many times over (its labels and annotations, its
containers, their GPU counts); ``PodView.of`` reads them once, at the start of the decision, and
every step after receives the view. The view never changes the pod, and the pod must not change
while the view is in use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gpuwarden.policy.pod.quantity import QuantityError
from gpuwarden.policy.pod.resources import (
    ContainerRef,
    annotations_of,
    containers,
    labels_of,
    spec_of,
)


@dataclass(frozen=True, eq=False)
class PodView:
    """The read-only facts of one pod, read once."""

    pod: Mapping[str, Any]
    spec: Mapping[str, Any]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    #: Every container, init containers first, then containers, then ephemeral containers.
    all_containers: tuple[ContainerRef, ...]
    # Each container's asked_gpus(), or the error it raises, read when first asked for.
    _asked: dict[int, int | QuantityError | None] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView:
        return cls(pod, spec_of(pod), labels_of(pod), annotations_of(pod), tuple(containers(pod)))

    def containers(self, *fields: str) -> tuple[ContainerRef, ...]:
        """The containers of these fields (all of them when none is named), in spec order."""
        if not fields:
            return self.all_containers
        return tuple(ref for ref in self.all_containers if ref.field in fields)

    @cached_property
    def main_containers(self) -> tuple[ContainerRef, ...]:
        """spec.containers, the ones a profile can give GPUs to."""
        return self.containers("containers")

    @cached_property
    def main_by_name(self) -> Mapping[str, ContainerRef]:
        """spec.containers by name; of a repeated name (which the API server refuses after the
        webhooks), the last."""
        return {ref.name: ref for ref in self.main_containers}

    def first_named(self, name: str) -> ContainerRef:
        """The first of spec.containers with this name (which must exist)."""
        return next(ref for ref in self.main_containers if ref.name == name)

    @cached_property
    def main_names(self) -> tuple[str, ...]:
        return tuple(ref.name for ref in self.main_containers)

    def asked_gpus(self, ref: ContainerRef) -> int | None:
        """``ref.asked_gpus()``, parsed once per container."""
        key = id(ref.body)
        if key not in self._asked:
            try:
                self._asked[key] = ref.asked_gpus()
            except QuantityError as exc:
                self._asked[key] = exc
        asked = self._asked[key]
        if isinstance(asked, QuantityError):
            raise asked
        return asked

    @cached_property
    def asks_for_gpu(self) -> bool:
        """Whether any container asks for a GPU (as resources.requests_gpu reads it)."""
        return any(ref.asks_for_gpu() for ref in self.all_containers)

    @cached_property
    def largest_gpu_request(self) -> int | None:
        """The most GPUs any one container asks for: 0 when none names a count (only GPU memory
        or cores, say), None when a count is not whole (the grant names that field)."""
        try:
            counts = [self.asked_gpus(ref) for ref in self.all_containers]
        except QuantityError:
            return None
        return max((c for c in counts if c is not None), default=0)
