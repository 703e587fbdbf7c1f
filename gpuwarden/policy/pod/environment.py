"""The variables of a container's environment that steer NVIDIA's container toolkit and HAMi-core's
limiter, and what the keys of an ``envFrom`` source make of them.

:class:`SourceKeys` is what the environment check needs of a ConfigMap's keys, computed once per
version of the ConfigMap (the webhook's cache builds it when the watch delivers the ConfigMap):
for every ``envFrom`` prefix, the first keys it turns into denied variables and how many, found
by one dictionary lookup. A pod naming the same source a thousand times, or a source of forty
thousand keys, then costs the check no more than a small one (issue 29).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress

# Variables HAMi-core's limiter (libvgpu.so, preloaded on Volcano vGPU and HAMi nodes) reads: a
# container that sets them switches the limiter off or moves its caps. CUDA_DISABLE_CONTROL makes
# both device plugins skip /etc/ld.so.preload (Allocate in Project-HAMi/volcano-vgpu-device-plugin
# pkg/plugin/server.go and Project-HAMi/HAMi pkg/device-plugin/nvidiadevice/nvinternal/plugin/
# server.go); the others are read by Project-HAMi/HAMi-core src/multiprocess/
# multiprocess_memory_limit.c, and a pod's own env comes after the device plugin's, so it wins.
LIMITER_ENV = re.compile(
    r"^(CUDA_DISABLE_CONTROL|GPU_CORE_UTILIZATION_POLICY|CUDA_DEVICE_MEMORY_LIMIT(_\d+)?"
    r"|CUDA_DEVICE_SM_LIMIT(_\d+)?|CUDA_DEVICE_MEMORY_SHARED_CACHE|CUDA_OVERSUBSCRIBE"
    r"|CUDA_TASK_PRIORITY)$"
)
# NVIDIA's container toolkit also reads (internal/config/image/envvars.go in
# NVIDIA/nvidia-container-toolkit): NVIDIA_MIG_CONFIG_DEVICES and NVIDIA_MIG_MONITOR_DEVICES, MIG
# configuration and monitoring of the node's GPUs (the runtime hook refuses them outside privileged
# containers, cmd/nvidia-container-runtime-hook/container_config.go), and NVIDIA_IMEX_CHANNELS,
# the IMEX channels through which jobs share GPU memory across nodes (honoured unless the
# toolkit's ignore-imex-channel-requests feature is on).
FORBIDDEN_ENV = re.compile(
    r"^(NVIDIA_VISIBLE_DEVICES|NVIDIA_DRIVER_CAPABILITIES|NVIDIA_MIG_CONFIG_DEVICES"
    r"|NVIDIA_MIG_MONITOR_DEVICES|NVIDIA_IMEX_CHANNELS|CUDA_MPS_.*)$|" + LIMITER_ENV.pattern
)
# One name of each shape FORBIDDEN_ENV matches: what an envFrom prefix may be the start of.
FORBIDDEN_SHAPES = (
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
    "CUDA_MPS_",
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_SM_LIMIT_0",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_TASK_PRIORITY",
)
#: The names FORBIDDEN_ENV matches exactly, and the starts of the families it matches by a tail
#: (any text after CUDA_MPS_, digits after the two limits): every denied name is one of these or
#: begins with one, which is what lets SourceKeys find a prefix's keys without reading them all.
EXACT_NAMES = (
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_OVERSUBSCRIBE",
    "CUDA_TASK_PRIORITY",
)
ANY_TAIL = "CUDA_MPS_"
DIGIT_TAILS = ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_")
OPEN_STARTS = (ANY_TAIL, *DIGIT_TAILS)

#: How many of the keys a prefix turns into denied variables are named, per envFrom entry (a
#: denial shows its first five violations, checks/base.py MAX_SHOWN); the rest are counted.
LISTED = 5


def escape_effect(name: str) -> str:
    """What setting the denied variable ``name`` does, for a denial message."""
    if LIMITER_ENV.match(name):
        return "can lift the GPU caps HAMi-core's limiter holds the pod to"
    if name.startswith("NVIDIA_MIG_"):
        return "asks NVIDIA's container toolkit to configure or monitor MIG on the node's GPUs"
    if name == "NVIDIA_IMEX_CHANNELS":
        return "asks NVIDIA's container toolkit for IMEX channels, where jobs share GPU memory"
    return "can escape GPU isolation"


def prefix_reaches(prefix: str) -> bool:
    """Whether some key makes ``prefix + key`` a variable the environment check denies (the
    empty prefix reaches them all)."""
    if any(len(shape) > len(prefix) and shape.startswith(prefix) for shape in FORBIDDEN_SHAPES):
        return True
    # A prefix that already holds the start of an open name: CUDA_MPS_X, CUDA_DEVICE_SM_LIMIT_1.
    return any(FORBIDDEN_ENV.match(prefix + tail) for tail in ("X", "0"))


def reached_name(prefix: str) -> str:
    """A denied variable that ``prefix`` and some key make (for a prefix that reaches one)."""
    for shape in FORBIDDEN_SHAPES:
        if len(shape) > len(prefix) and shape.startswith(prefix):
            return shape if shape != "CUDA_MPS_" else "CUDA_MPS_PIPE_DIRECTORY"
    return prefix + ("X" if FORBIDDEN_ENV.match(prefix + "X") else "0")


@dataclass(frozen=True, slots=True)
class Formed:
    """The keys one prefix turns into denied variables: the first LISTED (sorted), and how many."""

    first: tuple[str, ...] = ()
    count: int = 0


NOTHING = Formed()


def _cuts() -> tuple[tuple[str, str, bool], ...]:
    """(prefix, rest, exact) for every prefix that ends inside, or at the end of, a denied
    name's fixed start: a key completes the name when it is ``rest`` (exact) or starts with it."""
    cuts = [(name[:i], name[i:], True) for name in EXACT_NAMES for i in range(len(name) + 1)]
    cuts += [(start[:i], start[i:], False) for start in OPEN_STARTS for i in range(len(start))]
    return tuple(cuts)


_CUTS = _cuts()


def open_class(prefix: str) -> str | None:
    """For a prefix that holds a family's whole start: a prefix that every key turns into a
    denied variable exactly when it does ``prefix`` (None when no key can)."""
    if prefix.startswith(ANY_TAIL):
        # CUDA_MPS_.* then the end, or a final newline: a newline inside is never matched.
        return None if "\n" in prefix[len(ANY_TAIL) :] else ANY_TAIL
    for start in DIGIT_TAILS:
        if prefix.startswith(start):
            tail = prefix[len(start) :]
            if not tail:
                return start
            return start + "0" if tail.isdecimal() else None  # \d is Unicode's Nd, isdecimal's
    return None


def _first_and_count(matching: Iterable[str], limit: int = LISTED) -> Formed:
    keys = matching if isinstance(matching, list) else list(matching)
    return Formed(tuple(keys[:limit]), len(keys)) if keys else NOTHING


@dataclass(frozen=True)
class SourceKeys:
    """What the environment check needs of an envFrom source's keys (never a value).

    ``near``: prefixes that end inside a denied name's fixed start (the empty prefix too) and the
    keys that complete a denied name behind them; ``open``: for the classes of :func:`open_class`,
    the keys that make a denied name behind a prefix holding a family's start (CUDA_MPS_ makes
    every key one). Only prefixes that form some key are kept, so a harmless source of forty
    thousand keys is a few entries.
    """

    size: int = 0
    near: Mapping[str, Formed] = field(default_factory=dict)
    open: Mapping[str, Formed] = field(default_factory=dict)

    @classmethod
    def of(cls, keys: Iterable[str]) -> SourceKeys:
        ordered = sorted({str(key) for key in keys})
        count = len(ordered)
        found: dict[str, list[list[str]]] = {}
        for prefix, rest, exact in _CUTS:
            if exact:
                candidates = [k for k in (rest, rest + "\n") if k and _contains(ordered, k)]
            else:
                candidates = _starting_with(ordered, rest)
            # The expression over every candidate, in C: a source of many keys that all start
            # like a denied name's end (_1, _2, ...) costs milliseconds, not a Python loop.
            formed = list(
                compress(candidates, map(FORBIDDEN_ENV.match, map(prefix.__add__, candidates)))
            )
            if formed:
                found.setdefault(prefix, []).append(formed)
        near = {
            prefix: _first_and_count(lists[0] if len(lists) == 1 else sorted(set().union(*lists)))
            for prefix, lists in found.items()
        }
        # Keys without a newline all follow CUDA_MPS_; a digit family needs a digit (or a final
        # newline) first. Only the few candidates go through the expression itself.
        opens = {
            ANY_TAIL: _first_and_count(
                k for k in ordered if "\n" not in k or FORBIDDEN_ENV.match(ANY_TAIL + k)
            )
        }
        leading_digit = [k for k in ordered if k[:1].isdecimal() or k[:1] == "\n"]
        for start in DIGIT_TAILS:
            for representative in (start, start + "0"):
                opens[representative] = _first_and_count(
                    k for k in leading_digit if FORBIDDEN_ENV.match(representative + k)
                )
        return cls(
            size=count,
            near=near,
            open={r: formed for r, formed in opens.items() if formed.count},
        )

    def formed(self, prefix: str) -> Formed:
        """The keys that ``prefix`` turns into denied variables."""
        if prefix.startswith(OPEN_STARTS):
            representative = open_class(prefix)
            return self.open.get(representative, NOTHING) if representative else NOTHING
        return self.near.get(prefix, NOTHING)


def _contains(ordered: list[str], key: str) -> bool:
    at = bisect_left(ordered, key)
    return at < len(ordered) and ordered[at] == key


def _starting_with(ordered: list[str], start: str) -> list[str]:
    """The keys that start with ``start`` (not empty): those from ``start`` up to the first string
    past every such key, ``start`` with its last character the next one."""
    after = start[:-1] + chr(ord(start[-1]) + 1)
    return ordered[bisect_left(ordered, start) : bisect_left(ordered, after)]
