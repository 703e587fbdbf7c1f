"""The values the engine takes and returns: read-only request attributes in, a decision out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

import orjson

from gpuwarden.policy.pod.environment import SourceKeys

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
# Warnings are shorter than this (the "under 120 characters each").
MAX_WARNING = 120
# At most this many warning lines per answer, the last one counting those left out: a pod with
# thousands of containers would otherwise get a line each. 10 lines of under 120 characters stay
# well inside the 4096 characters the API server passes on before it cuts warnings short
# (truncateAtTotalRunes in k8s.io/apiserver pkg/endpoints/filters/warning.go).
MAX_WARNINGS = 10


@dataclass(frozen=True)
class PriorityClassInfo:
    value: int
    preemption_policy: str = "PreemptLowerPriority"


@dataclass(frozen=True)
class ClusterView:
    """What the engine may know of the cluster, gathered by the caller (cache or files)."""

    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    priority_classes: Mapping[str, PriorityClassInfo] = field(default_factory=dict)
    # GPU memory (sum of caps) admitted to the live pods of each namespace, this pod excluded.
    # Keyed by namespace, never by a pod's own tenant annotation: a pod is charged to the tenant
    # of the namespace it lives in, which the policies decide.
    namespace_gpu_memory: Mapping[str, Decimal] = field(default_factory=dict)
    # Keys of ConfigMaps and Secrets, by (kind, namespace, name), where the caller knows them:
    # their names, or what the environment check needs of them (SourceKeys, which the webhook's
    # cache and the manifests reader keep, computed once per ConfigMap).
    env_source_keys: Mapping[tuple[str, str, str], SourceKeys | frozenset[str]] = field(
        default_factory=dict
    )

    def labels_for(self, namespace: str) -> Mapping[str, str]:
        return self.namespace_labels.get(namespace, {})


class AdmissionRequest(NamedTuple):
    """The attributes of one admission request that a decision may depend on (read-only; a
    named tuple, as one is built for every review)."""

    operation: Operation
    namespace: str
    pod: Mapping[str, Any]  # the object under review: a Pod (a ConfigMap for validate_config_map)
    old_pod: Mapping[str, Any] | None = None
    sub_resource: str = ""
    uid: str = ""
    dry_run: bool = False


#: The audit annotations of a decision that adds none (read-only: every such decision shares it).
NO_ANNOTATIONS: Mapping[str, str] = MappingProxyType({})


class Decision(NamedTuple):
    """A complete answer: allowed or denied, the patch, and what to tell the user and the audit
    log (read-only; a named tuple, as every review builds one)."""

    allowed: bool = True
    patch: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    message: str = ""
    code: int = 200
    reason: str = ""
    audit_annotations: Mapping[str, str] = NO_ANNOTATIONS
    tenant: str | None = None
    profile: str | None = None
    rule: str | None = None
    # Under audit or dryrun (rollout.py): the check that would have denied, or "mutation" for a
    # patch only reported; None where the decision is enforced as it reads.
    audited: str | None = None

    def patch_bytes(self) -> bytes:
        """The JSON Patch exactly as both the webhook and `gpuwarden apply -o patch` emit it:
        compact, keys sorted, UTF-8."""
        return orjson.dumps(self.patch, option=orjson.OPT_SORT_KEYS)

    @property
    def verdict(self) -> str:
        return "allowed" if self.allowed else "denied"


def warning(text: str) -> str:
    """One warning line, kept under the API server's comfortable length."""
    text = " ".join(text.split())
    return text if len(text) < MAX_WARNING else text[: MAX_WARNING - 4] + "..."


def bounded_warnings(lines: Sequence[str]) -> tuple[str, ...]:
    """At most MAX_WARNINGS lines: the first ones, then one that counts the rest."""
    if len(lines) <= MAX_WARNINGS:
        return tuple(lines)
    kept = MAX_WARNINGS - 1
    return (*lines[:kept], f"gpuwarden: and {len(lines) - kept} more warnings like these")
