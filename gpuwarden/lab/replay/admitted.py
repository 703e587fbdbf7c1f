"""GPU memory admitted to each namespace's governed pods still alive, the webhook's view of them
(pure: kept up to date as pods are admitted and end, never summed again)."""

from __future__ import annotations

from decimal import Decimal


class AdmittedMemory:
    """Totals by namespace of the GPU memory admitted to live pods, by pod name."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, Decimal]] = {}
        self._totals: dict[str, Decimal] = {}
        self._counts: dict[str, int] = {}

    def admit(self, name: str, namespace: str, memory: Decimal) -> None:
        """The pod was admitted with ``memory`` (its GPU memory caps summed)."""
        self.end(name)
        self._pods[name] = (namespace, memory)
        self._totals[namespace] = self._totals.get(namespace, Decimal(0)) + memory
        self._counts[namespace] = self._counts.get(namespace, 0) + 1

    def end(self, name: str) -> None:
        """The pod ended or was refused (nothing if it was not admitted, or ended already)."""
        found = self._pods.pop(name, None)
        if found is None:
            return
        namespace, memory = found
        self._counts[namespace] -= 1
        if self._counts[namespace]:
            self._totals[namespace] -= memory
        else:  # a namespace without live pods is not in the view, as before it had any
            del self._counts[namespace], self._totals[namespace]

    def totals(self) -> dict[str, Decimal]:
        """A copy of each namespace's total."""
        return dict(self._totals)
