"""Strategies `gpuwarden simulate` compares: each a policy set (or none) and the GPU nodes the
lab gives it.

The lab runs kube-scheduler only, so every policy is simulated on the backends it can schedule
for real: a Volcano or HAMi backend becomes ``nvidia`` with shared slices advertised as
``nvidia.com/gpu.shared`` (NVIDIA's device plugin, MPS, ``renameByDefault``) on the lab's MPS
nodes, scheduled by the packing profile (:data:`~gpuwarden.policy.packing.BINPACK_SCHEDULER`):
the chart configures Volcano's ``binpack`` plugin to weigh GPUs, and HAMi's node policy packs by
default. What Volcano or HAMi would decide differently (queues, gang scheduling, packing by GPU
memory instead of a fixed replica count) is not simulated; the strategy's notes say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.lab.nodes import GpuNodePool
from gpuwarden.policy import PolicySet, load_texts
from gpuwarden.policy.loader import policy_files
from gpuwarden.policy.packing import BINPACK_SCHEDULER

#: The backend every simulated policy runs on (see the module docstring).
LAB_BACKEND: Mapping[str, str] = {
    "type": "nvidia",
    "sharedResourceName": "nvidia.com/gpu.shared",
    "schedulerName": BINPACK_SCHEDULER,
}
_UNSCHEDULABLE_BACKENDS = ("volcano", "hami")

#: Sharing without governance: notebooks and predictors share GPUs, nothing else changes
#: (no priorities, no limits; whole-GPU work keeps the count it asked for).
SHARING_ONLY_POLICY = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: sharing-only}
spec:
  backend: {type: nvidia, sharedResourceName: nvidia.com/gpu.shared}
  profiles:
    - {name: shared, gpuShare: true, maxMemory: 20Gi, threadPercentage: 50}
    - {name: whole, gpuShare: false, maxMemory: 80Gi}
  workloads:
    - {name: notebooks, match: {kind: notebook}, profile: shared, requireGpuRequest: true}
    - {name: predictors, match: {kind: kserve-predictor}, profile: shared, requireGpuRequest: true}
  defaultProfile: whole
  tenants:
    - name: kubeflow-profiles
      namespaceSelector:
        matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}
"""


@dataclass(frozen=True)
class Layout:
    """The simulated cluster: ``nodes`` nodes of ``gpus_per_node`` GPUs, or the given
    ``node_pools`` (a trace's node list); for a strategy that shares GPUs, ``mps_nodes`` of
    them share each GPU among ``mps_replicas`` pods (None: as many as the strategy's shared
    demand needs, see :mod:`gpuwarden.lab.sizing`; resolved per strategy before a replay)."""

    nodes: int = 8
    gpus_per_node: int = 8
    mps_nodes: int | None = None
    mps_replicas: int = 4
    gpu_memory_mib: int = 81559  # an H100 80GB as GFD reports it
    node_pools: tuple[GpuNodePool, ...] = ()

    @property
    def physical_gpus(self) -> int:
        if self.node_pools:
            return sum(pool.physical_gpus for pool in self.node_pools)
        return self.nodes * self.gpus_per_node

    @property
    def mps_gpus_per_node(self) -> int:
        """GPUs of each node that would become an MPS node first."""
        if self.node_pools:
            first = min(self.node_pools, key=lambda p: (-p.count, p.name))
            return first.gpus_per_node
        return self.gpus_per_node

    @property
    def node_count(self) -> int:
        return sum(p.count for p in self.node_pools) if self.node_pools else self.nodes

    def pools(self, shares: bool) -> list[GpuNodePool]:
        if self.node_pools:
            return self._split(shares)
        mps = min(self.mps_nodes or 0, self.nodes) if shares else 0
        pools = [
            GpuNodePool(
                "gpu", self.nodes - mps, self.gpus_per_node, gpu_memory_mib=self.gpu_memory_mib
            )
        ]
        if mps:
            pools.append(
                GpuNodePool(
                    "mps",
                    mps,
                    self.gpus_per_node,
                    gpu_memory_mib=self.gpu_memory_mib,
                    mps_replicas=self.mps_replicas,
                    rename_shared=True,
                )
            )
        return [pool for pool in pools if pool.count]

    def _split(self, shares: bool) -> list[GpuNodePool]:
        """The given pools; sharing, the first ``mps_nodes`` nodes of the largest pools
        (most nodes first) become MPS pools named ``<pool>-mps``."""
        left = min(self.mps_nodes or 0, self.node_count) if shares else 0
        out: list[GpuNodePool] = []
        for pool in sorted(self.node_pools, key=lambda p: (-p.count, p.name)):
            mps = min(left, pool.count)
            left -= mps
            if pool.count - mps:
                out.append(replace(pool, count=pool.count - mps))
            if mps:
                out.append(
                    replace(
                        pool,
                        name=f"{pool.name}-mps",
                        count=mps,
                        mps_replicas=self.mps_replicas,
                        rename_shared=True,
                    )
                )
        return sorted(out, key=lambda p: p.name)


@dataclass(frozen=True)
class Strategy:
    name: str
    policies: PolicySet | None  # None: no gpuwarden at all
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def shares(self) -> bool:
        if self.policies is None:
            return False
        return any(profile.gpu_share for profile in self.policies.profiles.values())


def _on_lab_backend(backend: Any, where: str, notes: list[str]) -> Any:
    if isinstance(backend, Mapping) and backend.get("type") in _UNSCHEDULABLE_BACKENDS:
        notes.append(
            f"{where}: backend {backend['type']} simulated as nvidia (MPS replicas as "
            f"nvidia.com/gpu.shared) on kube-scheduler's packing profile {BINPACK_SCHEDULER}; "
            f"the {backend['type']} scheduler itself is not run"
        )
        return dict(LAB_BACKEND)
    return backend


def lab_documents(docs: Iterable[Any], source: str) -> tuple[list[Any], list[str]]:
    """The policy documents with Volcano/HAMi backends replaced by the lab's (and notes)."""
    out: list[Any] = []
    notes: list[str] = []
    for doc in docs:
        spec = doc.get("spec") if isinstance(doc, Mapping) else None
        if isinstance(spec, dict):
            name = (doc.get("metadata") or {}).get("name", source)
            if "backend" in spec:
                spec["backend"] = _on_lab_backend(spec["backend"], f"policy {name}", notes)
            for profile in spec.get("profiles") or []:
                if isinstance(profile, dict) and "backend" in profile:
                    profile["backend"] = _on_lab_backend(
                        profile["backend"], f"profile {profile.get('name')}", notes
                    )
        out.append(doc)
    return out, notes


def strategy_from_texts(name: str, texts: Sequence[tuple[str, str]]) -> Strategy:
    """A strategy from (source, YAML) pairs; PolicyError (from the loader) when they are bad."""
    converted: list[tuple[str, str]] = []
    notes: list[str] = []
    for source, text in texts:
        docs, found = lab_documents(list(yaml.safe_load_all(text)), source)
        notes += found
        converted.append((source, yaml.safe_dump_all(docs, sort_keys=False)))
    return Strategy(name, load_texts(converted), tuple(notes))


def strategy_from_paths(name: str, paths: Sequence[Path]) -> Strategy:
    files = policy_files(paths)
    return strategy_from_texts(name, [(str(f), f.read_text()) for f in files])


def builtin_strategies(default_policies: Path) -> list[Strategy]:
    """No governance, sharing only, and the shipped default policy (``default_policies``)."""
    return [
        Strategy("no-governance", None, ("pods as their controllers made them: whole GPUs",)),
        strategy_from_texts("sharing-only", [("sharing-only", SHARING_ONLY_POLICY)]),
        strategy_from_paths("default-policy", [default_policies]),
    ]
