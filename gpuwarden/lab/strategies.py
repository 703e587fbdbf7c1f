"""Strategies `gpuwarden simulate` compares: each a policy set (or none) and the GPU nodes the
lab gives it.

The lab runs kube-scheduler only, so every policy is simulated on the backends it can schedule
for real: a Volcano or HAMi backend becomes ``nvidia`` with shared slices advertised as
``nvidia.com/gpu.shared`` (NVIDIA's device plugin, MPS, ``renameByDefault``) on the lab's MPS
nodes, scheduled by the packing profile (:data:`~gpuwarden.policy.packing.BINPACK_SCHEDULER`):
the chart configures Volcano's ``binpack`` plugin to weigh GPUs, and HAMi's node policy packs by
default. What Volcano or HAMi would decide differently (queues, gang scheduling, packing by GPU
memory instead of a fixed replica count) is not simulated; the strategy's notes say so.

A strategy with **tenant queues** (``<strategy>+kueue``, :func:`kueue_variant`) is another
strategy's policy with each trace namespace made a tenant of its own, with the settings of the
tenant that had it, a ``quota`` (its nominal share of the cluster's GPUs) and a ``queueSpec``:
the replay runs Kueue against the lab's API server and applies what ``gpuwarden render --kueue``
writes for it, and Kueue admits every pod against the tenants' ClusterQueues.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.lab.nodes import GpuNodePool
from gpuwarden.lab.trace import TraceRow
from gpuwarden.policy import PolicySet, load_texts
from gpuwarden.policy.keys import API_VERSION, POLICY_KIND
from gpuwarden.policy.loader import policy_files
from gpuwarden.policy.manifests import NAMESPACE_NAME_LABEL
from gpuwarden.policy.packing import BINPACK_SCHEDULER
from gpuwarden.policy.render import ANNOTATION_RENDERED_FROM, RenderOptions, render

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


#: A strategy's name with this suffix is that strategy with tenant queues (Kueue).
KUEUE_SUFFIX = "+kueue"
#: The policy document that makes each trace namespace a Kueue-queued tenant.
TENANT_QUEUES_POLICY = "tenant-queues"


@dataclass(frozen=True)
class Strategy:
    name: str
    policies: PolicySet | None  # None: no gpuwarden at all
    notes: tuple[str, ...] = field(default_factory=tuple)
    sources: tuple[tuple[str, str], ...] = ()  # (source, YAML) the policies were loaded from
    # Tenant queues: each trace namespace's nominal quota in GPUs (None: no Kueue).
    queues: Mapping[str, int] | None = None

    @property
    def shares(self) -> bool:
        if self.policies is None:
            return False
        return any(profile.gpu_share for profile in self.policies.profiles.values())

    @property
    def kueue(self) -> bool:
        return self.queues is not None


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
    return Strategy(name, load_texts(converted), tuple(notes), tuple(converted))


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


# --- tenant queues (Kueue) -------------------------------------------------------------------


def entitled_quotas(demand: Mapping[str, float], gpus: int) -> dict[str, int]:
    """Each tenant's nominal quota: the cluster's ``gpus`` split in proportion to the GPU-hours
    it asks for (``demand``), whole GPUs by largest remainder, as a platform team sizes quotas
    to the demand it expects; all of them add up to ``gpus``."""
    total = sum(max(value, 0.0) for value in demand.values())
    if total <= 0:
        return {namespace: 0 for namespace in demand}
    exact = {ns: gpus * max(value, 0.0) / total for ns, value in demand.items()}
    quotas = {ns: math.floor(share) for ns, share in exact.items()}
    left = gpus - sum(quotas.values())
    for namespace in sorted(exact, key=lambda ns: (quotas[ns] - exact[ns], ns))[:left]:
        quotas[namespace] += 1
    return quotas


def offered_gpu_hours(rows: Iterable[TraceRow], horizon: float) -> dict[str, float]:
    """GPU-hours each namespace asks for, of the rows that arrive within the horizon."""
    out: dict[str, float] = {}
    for row in rows:
        if row.at < horizon:
            out[row.namespace] = out.get(row.namespace, 0.0) + row.gpus * row.duration / 3600
    return out


def tenant_queues_document(
    policies: PolicySet, namespaces: Mapping[str, Mapping[str, str]], quotas: Mapping[str, int]
) -> dict[str, Any]:
    """A GPUPolicy whose tenants are the namespaces, each with the settings of the tenant the
    policies give it (overrides, limits, enforcement), its quota and a queueSpec: a Kueue
    ClusterQueue each (a tenant that names a namespace wins over one that selects it)."""
    taken = {tenant.name for tenant in policies.tenants}
    tenants: list[dict[str, Any]] = []
    for namespace in sorted(quotas):
        labels = {**dict(namespaces.get(namespace, {})), NAMESPACE_NAME_LABEL: namespace}
        base = policies.tenant_for(namespace, labels)
        kept: dict[str, Any] = {}
        if base is not None:
            kept = base.model_dump(mode="json", by_alias=True, exclude_defaults=True)
            for key in ("name", "namespaces", "namespaceSelector", "queue", "quota", "queueSpec"):
                kept.pop(key, None)
        name = namespace if namespace not in taken else f"{namespace}-queue"
        tenants.append(
            {
                "name": name,
                "namespaces": [namespace],
                **kept,
                "queue": name,
                "quota": {"gpus": quotas[namespace]},
                "queueSpec": {"weight": 1},
            }
        )
    return {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": TENANT_QUEUES_POLICY},
        "spec": {"backend": dict(LAB_BACKEND), "tenants": tenants},
    }


def kueue_variant(
    base: Strategy,
    namespaces: Mapping[str, Mapping[str, str]],
    demand: Mapping[str, float],
    gpus: int,
) -> Strategy:
    """``base`` with tenant queues: each namespace its own tenant with a nominal quota of the
    ``gpus`` in proportion to its ``demand`` (GPU-hours), queued by Kueue."""
    if base.policies is None:
        raise ValueError(f"strategy {base.name} has no policy to add tenant queues to")
    quotas = entitled_quotas({ns: demand.get(ns, 0.0) for ns in namespaces}, gpus)
    document = tenant_queues_document(base.policies, namespaces, quotas)
    sources = (*base.sources, (TENANT_QUEUES_POLICY, yaml.safe_dump(document, sort_keys=False)))
    shares = ", ".join(f"{ns} {quota}" for ns, quota in sorted(quotas.items()))
    note = (
        f"tenant queues (Kueue v0.17, managing plain pods): each namespace a ClusterQueue in one "
        f"cohort, nominal quotas of the {gpus} GPUs in proportion to the GPU-hours each asks "
        f"for: {shares}"
    )
    return Strategy(
        base.name + KUEUE_SUFFIX,
        load_texts(list(sources)),
        (*base.notes, note),
        sources,
        quotas,
    )


def queue_objects(strategy: Strategy) -> list[dict[str, Any]]:
    """What ``gpuwarden render --kueue`` writes for the strategy's tenant queues, in apply
    order: the ResourceFlavors, then the ClusterQueues and LocalQueues of the tenants the
    strategy made for the trace's namespaces (other tenants of the policy have no pods here, and
    their quotas would lend the cohort GPUs the lab does not have)."""
    if strategy.policies is None or strategy.queues is None:
        return []
    rendering = render(
        strategy.policies,
        RenderOptions(priority_classes=False, quotas=False, queues=False, kueue=True),
    )
    # rendering.errors (a job template charged differently from its pods) is not read: the
    # replay's pods are plain pods, which Kueue charges as gpuwarden left them.
    mine = f"{TENANT_QUEUES_POLICY}/"
    return [
        obj
        for obj in rendering.objects
        if obj["kind"] == "ResourceFlavor"
        or (obj["metadata"].get("annotations") or {})
        .get(ANNOTATION_RENDERED_FROM, "")
        .startswith(mine)
    ]
