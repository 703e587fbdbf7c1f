"""Strategies `gpuwarden simulate` compares: each a policy set (or none) and the GPU nodes the
lab gives it.

The lab runs kube-scheduler only, so every policy is simulated on the backends it can schedule
for real: a Volcano or HAMi backend becomes ``nvidia`` with shared slices advertised as
``nvidia.com/gpu.shared`` (NVIDIA's device plugin, MPS, ``renameByDefault``) on the lab's MPS
nodes, scheduled by the packing profile (:data:`~gpuwarden.policy.render.packing.BINPACK_SCHEDULER`):
the chart configures Volcano's ``binpack`` plugin to weigh GPUs, and HAMi's node policy packs by
default. What Volcano or HAMi would decide differently (queues, gang scheduling, packing by GPU
memory instead of a fixed replica count) is not simulated; the strategy's notes say so.

A strategy with **tenant queues** (``<strategy>+kueue``, :func:`kueue_variant`) is another
strategy's policy with each trace namespace made a tenant of its own, with the settings of the
tenant that had it, a ``quota`` (its nominal share of the cluster's GPUs, and of those the
share of the MPS nodes' GPUs, ``sharedGpus``) and a ``queueSpec``: the replay runs Kueue against
the lab's API server and applies what ``gpuwarden render --kueue`` writes for it, with the
layout's MPS replicas as the nvidia backends' ``mpsReplicas``, and Kueue admits every pod against
the tenants' ClusterQueues.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import yaml

from gpuwarden.lab.cluster.dradriver import CORES_CAPACITY, DEVICE_CLASS, MEMORY_CAPACITY
from gpuwarden.lab.cluster.nodes import SHARES_LABEL, GpuNodePool
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.policy import PolicySet, load_texts
from gpuwarden.policy.pod.keys import API_VERSION, POLICY_KIND
from gpuwarden.policy.render.objects import ANNOTATION_RENDERED_FROM, RenderOptions, render
from gpuwarden.policy.render.packing import BINPACK_SCHEDULER
from gpuwarden.policy.spec.loader import policy_files
from gpuwarden.policy.spec.precedence import NAMESPACE_NAME_LABEL

#: The backend every simulated policy runs on (see the module docstring).
LAB_BACKEND: Mapping[str, str] = {
    "type": "nvidia",
    "sharedResourceName": "nvidia.com/gpu.shared",
    "schedulerName": BINPACK_SCHEDULER,
}
_UNSCHEDULABLE_BACKENDS = ("volcano", "hami")

#: What stands in for Volcano's and HAMi's schedulers: MPS pools on NVIDIA's device plugin
#: (:data:`LAB_BACKEND`), or kube-scheduler's DRA allocator on the lab's DRA driver
#: (:data:`DRA_LAB_BACKEND`), where any GPU may be shared or whole.
StandIn = Literal["mps", "dra"]
STAND_INS: tuple[StandIn, ...] = ("mps", "dra")

#: The backend Volcano and HAMi policies run on with ``--stand-in dra``: shared profiles claim a
#: device of the lab's driver by memory and cores, whole ones ask nvidia.com/gpu, which the
#: DeviceClass maps onto the same devices.
DRA_LAB_BACKEND: Mapping[str, Any] = {
    "type": "dra",
    "deviceClassName": DEVICE_CLASS,
    "memoryCapacity": MEMORY_CAPACITY,
    "coresCapacity": CORES_CAPACITY,
    "schedulerName": BINPACK_SCHEDULER,
    # kube-scheduler scores a claim-only pod by CPU and memory alone: without a preference the
    # shares spread over every node (Volcano and HAMi pack them, binpack by default).
    "sharedNodeLabels": {SHARES_LABEL: "true"},
}
#: What the DRA stand-in replays of Volcano and HAMi, and what it does not (one note, whole).
DRA_APPROXIMATION = (
    "replayed: kube-scheduler's DRA allocator for Volcano's deviceshare / HAMi's scheduler "
    "(their memory and core sums; shares prefer nodes sized to them); not their scoring, "
    "queues, gangs, GPU preemption"
)

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
    demand needs, see :mod:`gpuwarden.lab.planning.sizing`; resolved in each strategy's plan)."""

    nodes: int = 8
    gpus_per_node: int = 8
    mps_nodes: int | None = None
    mps_replicas: int = 4
    gpu_memory_mib: int = 81559  # an H100 80GB as GFD reports it
    node_pools: tuple[GpuNodePool, ...] = ()
    # Every node a DRA node of the lab's driver: no MPS nodes, any GPU shared or whole.
    dra: bool = False
    # DRA: how many nodes (the first, in mps_candidates' order) carry SHARES_LABEL, which the
    # stand-in's shared claims prefer (resolved in each strategy's plan).
    shares_nodes: int = 0

    @property
    def physical_gpus(self) -> int:
        if self.node_pools:
            return sum(pool.physical_gpus for pool in self.node_pools)
        return self.nodes * self.gpus_per_node

    @property
    def mps_candidates(self) -> list[int]:
        """The GPUs of each node, in the order nodes become MPS nodes (see :meth:`pools`)."""
        if self.node_pools:
            return [
                pool.gpus_per_node
                for pool in sorted(self.node_pools, key=lambda p: (-p.count, p.name))
                for _ in range(pool.count)
            ]
        return [self.gpus_per_node] * self.nodes

    def mps_gpus(self, shares: bool) -> int:
        """Physical GPUs of the MPS nodes (``mps_nodes`` resolved)."""
        return sum(pool.physical_gpus for pool in self.pools(shares) if pool.shared)

    @property
    def node_count(self) -> int:
        return sum(p.count for p in self.node_pools) if self.node_pools else self.nodes

    def pools(self, shares: bool) -> list[GpuNodePool]:
        if self.dra:
            return self._dra_pools()
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

    def _dra_pools(self) -> list[GpuNodePool]:
        """DRA nodes; the first ``shares_nodes`` labelled for the shares, as pools named
        ``<pool>-shares``."""
        given = self.node_pools or (
            GpuNodePool("gpu", self.nodes, self.gpus_per_node, gpu_memory_mib=self.gpu_memory_mib),
        )
        return _first_nodes(
            given,
            self.shares_nodes,
            lambda rest: replace(rest, dra=True),
            lambda first: replace(
                first,
                name=f"{first.name}-shares",
                dra=True,
                labels={**first.labels, SHARES_LABEL: "true"},
            ),
        )

    def _split(self, shares: bool) -> list[GpuNodePool]:
        """The given pools; sharing, the first ``mps_nodes`` nodes become MPS pools named
        ``<pool>-mps``."""
        return _first_nodes(
            self.node_pools,
            min(self.mps_nodes or 0, self.node_count) if shares else 0,
            lambda rest: rest,
            lambda first: replace(
                first,
                name=f"{first.name}-mps",
                mps_replicas=self.mps_replicas,
                rename_shared=True,
            ),
        )


def _first_nodes(
    given: Sequence[GpuNodePool],
    count: int,
    rest: Callable[[GpuNodePool], GpuNodePool],
    first: Callable[[GpuNodePool], GpuNodePool],
) -> list[GpuNodePool]:
    """``given`` split after its first ``count`` nodes, taken from the largest pools (most nodes
    first, as :attr:`Layout.mps_candidates` orders them): each pool's first nodes as ``first``
    makes them, the others as ``rest`` does; sorted by name."""
    left = count
    out: list[GpuNodePool] = []
    for pool in sorted(given, key=lambda p: (-p.count, p.name)):
        taken = min(left, pool.count)
        left -= taken
        if pool.count - taken:
            out.append(rest(replace(pool, count=pool.count - taken)))
        if taken:
            out.append(first(replace(pool, count=taken)))
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
    # Tenant queues: each trace namespace's nominal quota in GPUs (None: no Kueue), and how many
    # of them are the MPS nodes' (its quota.sharedGpus; None: it shares nothing).
    queues: Mapping[str, int] | None = None
    shared_gpus: Mapping[str, int] | None = None
    # The MPS nodes the tenant queues were split for (None: as the layout resolves them).
    mps_nodes: int | None = None

    @property
    def shares(self) -> bool:
        if self.policies is None:
            return False
        return any(profile.gpu_share for profile in self.policies.profiles.values())

    @property
    def kueue(self) -> bool:
        return self.queues is not None


def _on_lab_backend(backend: Any, where: str, notes: list[str], stand_in: StandIn) -> Any:
    if stand_in == "dra":
        return _on_dra(backend, where, notes)
    if isinstance(backend, Mapping) and backend.get("type") in _UNSCHEDULABLE_BACKENDS:
        notes.append(
            f"{where}: backend {backend['type']} simulated as nvidia (MPS replicas as "
            f"nvidia.com/gpu.shared) on kube-scheduler's packing profile {BINPACK_SCHEDULER}; "
            f"the {backend['type']} scheduler itself is not run"
        )
        return dict(LAB_BACKEND)
    return backend


def _on_dra(backend: Any, where: str, notes: list[str]) -> Any:
    kind = backend.get("type") if isinstance(backend, Mapping) else backend
    if kind in _UNSCHEDULABLE_BACKENDS:
        notes.append(
            f"{where}: backend {kind} replayed as dra (any GPU shared or whole) on the lab's DRA "
            f"driver and kube-scheduler's packing profile {BINPACK_SCHEDULER}"
        )
        if DRA_APPROXIMATION not in notes:
            notes.append(DRA_APPROXIMATION)
        return dict(DRA_LAB_BACKEND)
    if kind == "nvidia":
        notes.append(
            f"{where}: backend nvidia on DRA nodes: its whole GPUs are served through "
            f"{DEVICE_CLASS}'s nvidia.com/gpu; no node advertises MPS replicas"
        )
    return backend


def _rewrite_backends(docs: Iterable[Any], source: str, change: Callable[[Any, str], Any]) -> None:
    """Replace each backend the policy documents set (the policy's and its profiles') by
    ``change(backend, where)``, in place."""
    for doc in docs:
        spec = doc.get("spec") if isinstance(doc, Mapping) else None
        if not isinstance(spec, dict):
            continue
        name = (doc.get("metadata") or {}).get("name", source)
        if "backend" in spec:
            spec["backend"] = change(spec["backend"], f"policy {name}")
        for profile in spec.get("profiles") or []:
            if isinstance(profile, dict) and "backend" in profile:
                profile["backend"] = change(profile["backend"], f"profile {profile.get('name')}")


def lab_documents(
    docs: Iterable[Any], source: str, stand_in: StandIn = "mps"
) -> tuple[list[Any], list[str]]:
    """The policy documents with Volcano/HAMi backends replaced by the lab's (and notes)."""
    out = list(docs)
    notes: list[str] = []
    _rewrite_backends(
        out, source, lambda backend, where: _on_lab_backend(backend, where, notes, stand_in)
    )
    return out, notes


def with_mps_replicas(text: str, source: str, replicas: int) -> str:
    """A policy file's YAML with ``mpsReplicas`` on every nvidia backend: the lab's MPS nodes
    share each GPU ``replicas`` ways, which is what Kueue's shared quotas must count."""
    return with_nvidia_fields(text, source, {"mpsReplicas": replicas})


def with_nvidia_fields(text: str, source: str, fields: Mapping[str, Any]) -> str:
    """A policy file's YAML with ``fields`` set on every nvidia backend."""

    def change(backend: Any, where: str) -> Any:
        del where
        if backend == "nvidia":
            backend = {"type": "nvidia"}
        if isinstance(backend, Mapping) and backend.get("type") == "nvidia":
            return {**backend, **fields}
        return backend

    docs = list(yaml.safe_load_all(text))
    _rewrite_backends(docs, source, change)
    return yaml.safe_dump_all(docs, sort_keys=False)


def strategy_from_texts(
    name: str, texts: Sequence[tuple[str, str]], stand_in: StandIn = "mps"
) -> Strategy:
    """A strategy from (source, YAML) pairs; PolicyError (from the loader) when they are bad."""
    converted: list[tuple[str, str]] = []
    notes: list[str] = []
    for source, text in texts:
        docs, found = lab_documents(list(yaml.safe_load_all(text)), source, stand_in)
        notes += found
        converted.append((source, yaml.safe_dump_all(docs, sort_keys=False)))
    return Strategy(name, load_texts(converted), tuple(notes), tuple(converted))


def strategy_from_paths(name: str, paths: Sequence[Path], stand_in: StandIn = "mps") -> Strategy:
    files = policy_files(paths)
    return strategy_from_texts(name, [(str(f), f.read_text()) for f in files], stand_in)


def sharing_only_policy(stand_in: StandIn = "mps") -> str:
    """:data:`SHARING_ONLY_POLICY` on the stand-in's nodes: with DRA, its shared profiles claim
    the lab driver's devices (scheduled by the default profile, as on MPS)."""
    if stand_in == "mps":
        return SHARING_ONLY_POLICY
    doc = yaml.safe_load(SHARING_ONLY_POLICY)
    doc["spec"]["backend"] = {k: v for k, v in DRA_LAB_BACKEND.items() if k != "schedulerName"}
    return yaml.safe_dump(doc, sort_keys=False)


def builtin_strategies(default_policies: Path, stand_in: StandIn = "mps") -> list[Strategy]:
    """No governance, sharing only, and the shipped default policy (``default_policies``)."""
    free = "pods as their controllers made them: whole GPUs"
    if stand_in == "dra":
        free += f" (nvidia.com/gpu, served by {DEVICE_CLASS}'s devices)"
    return [
        Strategy("no-governance", None, (free,)),
        strategy_from_texts(
            "sharing-only", [("sharing-only", sharing_only_policy(stand_in))], stand_in
        ),
        strategy_from_paths("default-policy", [default_policies], stand_in),
    ]


# --- without idle rules ----------------------------------------------------------------------

#: A strategy's name with this suffix is that strategy with its profiles' idle rules removed.
NO_IDLE_SUFFIX = "-no-idle"


def without_idle_rules(base: Strategy) -> Strategy:
    """``base`` with no profile's ``idle`` rule: the same policy, its idle notebooks left
    holding their GPUs until their users close them."""
    if base.policies is None:
        raise ValueError(f"strategy {base.name} has no policy to remove idle rules from")
    sources: list[tuple[str, str]] = []
    for source, text in base.sources:
        docs = list(yaml.safe_load_all(text))
        for doc in docs:
            spec = doc.get("spec") if isinstance(doc, Mapping) else None
            if not isinstance(spec, dict):
                continue
            for profile in spec.get("profiles") or []:
                if isinstance(profile, dict):
                    profile.pop("idle", None)
        sources.append((source, yaml.safe_dump_all(docs, sort_keys=False)))
    note = "its profiles' idle rules removed: idle notebooks keep their GPUs until closed"
    return replace(
        base,
        name=base.name + NO_IDLE_SUFFIX,
        policies=load_texts(sources),
        notes=(*base.notes, note),
        sources=tuple(sources),
    )


# --- tenant queues (Kueue) -------------------------------------------------------------------


def _largest_remainder(exact: Mapping[str, Fraction], total: int) -> dict[str, int]:
    """Whole numbers that add up to ``total``, from exact shares that do: each share's floor, and
    one more for the largest remainders (ties by name)."""
    out = {key: math.floor(share) for key, share in exact.items()}
    left = total - sum(out.values())
    for key in sorted(exact, key=lambda k: (out[k] - exact[k], k))[:left]:
        out[key] += 1
    return out


def entitled_quotas(demand: Mapping[str, float], gpus: int) -> dict[str, int]:
    """Each tenant's nominal quota: the cluster's ``gpus`` split in proportion to the GPU-hours
    it asks for (``demand``), whole GPUs by largest remainder, as a platform team sizes quotas
    to the demand it expects; all of them add up to ``gpus``."""
    weights = {ns: Fraction(max(value, 0.0)) for ns, value in demand.items()}
    total = sum(weights.values())
    if total <= 0:
        return {namespace: 0 for namespace in demand}
    return _largest_remainder({ns: gpus * w / total for ns, w in weights.items()}, gpus)


def shared_quotas(
    quotas: Mapping[str, int], demand: Mapping[str, float], gpus: int
) -> dict[str, int]:
    """Each tenant's ``quota.sharedGpus``: the MPS nodes' ``gpus`` split in proportion to the
    shared demand (MPS slice-hours) each asks for, never above the tenant's quota, whole GPUs
    by largest remainder; they add up to ``gpus``, and the rest of the quotas to the whole
    GPUs. What a tenant's demand would take past its quota goes to the others by their demand,
    and where none is left by the room left in their quotas."""
    if gpus > sum(quotas.values()):
        raise ValueError(f"{gpus} shared GPUs do not fit in quotas of {sum(quotas.values())}")
    exact = {ns: Fraction(0) for ns in quotas}
    open_ = set(quotas)
    left = Fraction(gpus)
    while left > 0:
        weights = {ns: Fraction(max(demand.get(ns, 0.0), 0.0)) for ns in open_}
        if not any(weights.values()):
            weights = {ns: Fraction(quotas[ns]) for ns in open_}
        total = sum(weights.values())
        share = {ns: left * w / total for ns, w in weights.items()}
        full = {ns for ns in share if share[ns] >= quotas[ns]}
        if not full:
            exact.update(share)
            break
        for ns in full:  # capped at its quota; the rest is shared again
            exact[ns] = Fraction(quotas[ns])
            left -= quotas[ns]
            open_.discard(ns)
    return _largest_remainder(exact, gpus)


def offered_gpu_hours(rows: Iterable[TraceRow], horizon: float) -> dict[str, float]:
    """GPU-hours each namespace asks for, of the rows that arrive within the horizon."""
    out: dict[str, float] = {}
    for row in rows:
        if row.at < horizon:
            out[row.namespace] = out.get(row.namespace, 0.0) + row.gpus * row.duration / 3600
    return out


def tenant_queues_document(
    policies: PolicySet,
    namespaces: Mapping[str, Mapping[str, str]],
    quotas: Mapping[str, int],
    shared: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A GPUPolicy whose tenants are the namespaces, each with the settings of the tenant the
    policies give it (overrides, limits, enforcement), its quota (``quotas`` GPUs, ``shared``
    of them as quota.sharedGpus) and a queueSpec: a Kueue ClusterQueue each (a tenant that
    names a namespace wins over one that selects it)."""
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
                "quota": {
                    "gpus": quotas[namespace],
                    **({"sharedGpus": shared[namespace]} if shared is not None else {}),
                },
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
    layout: Layout,
    shared_demand: Mapping[str, float],
) -> Strategy:
    """``base`` with tenant queues: each namespace its own tenant with a nominal quota of the
    ``layout``'s GPUs in proportion to its ``demand`` (GPU-hours), queued by Kueue. Where
    ``base`` shares GPUs, ``layout`` has its MPS nodes resolved (as ``gpuwarden simulate``
    sizes them for ``base``): their GPUs are split by ``shared_demand`` (MPS slice-hours) as the
    tenants' ``sharedGpus``, and every nvidia backend gets the layout's MPS replicas."""
    if base.policies is None:
        raise ValueError(f"strategy {base.name} has no policy to add tenant queues to")
    gpus = layout.physical_gpus
    quotas = entitled_quotas({ns: demand.get(ns, 0.0) for ns in namespaces}, gpus)
    shared: dict[str, int] | None = None
    mps_gpus = 0
    sources = base.sources
    if base.shares:
        if layout.mps_nodes is None:
            raise ValueError(f"strategy {base.name} shares GPUs: resolve its MPS nodes first")
        mps_gpus = layout.mps_gpus(shares=True)
        # Quotas add up to the cluster's GPUs, which hold the MPS nodes' (unless no one asks
        # for any GPU: then every quota is 0).
        shared = shared_quotas(quotas, shared_demand, min(mps_gpus, sum(quotas.values())))
        if layout.mps_replicas > 1:  # else no node shares (mpsReplicas must be 2 or more)
            sources = tuple(
                (source, with_mps_replicas(text, source, layout.mps_replicas))
                for source, text in base.sources
            )
    document = tenant_queues_document(base.policies, namespaces, quotas, shared)
    sources = (*sources, (TENANT_QUEUES_POLICY, yaml.safe_dump(document, sort_keys=False)))
    shares = ", ".join(
        f"{ns} {quota}" + (f" ({shared[ns]} on MPS)" if shared else "")
        for ns, quota in sorted(quotas.items())
    )
    note = (
        f"tenant queues (Kueue v0.17, managing plain pods): each namespace a ClusterQueue in one "
        f"cohort, nominal quotas of the {gpus} GPUs in proportion to the GPU-hours each asks "
        f"for: {shares}"
    )
    if shared is not None:
        note += (
            f"; the {mps_gpus} GPUs of the MPS nodes ({layout.mps_replicas} replicas each) split "
            "by the MPS slice-hours each asks for"
        )
    return Strategy(
        base.name + KUEUE_SUFFIX,
        load_texts(list(sources)),
        (*base.notes, note),
        sources,
        quotas,
        shared,
        layout.mps_nodes if base.shares else None,
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
