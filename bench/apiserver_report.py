"""What bench/apiserver.py prints: the runs, CPU per created pod, the comparisons with the targets
of issue 13, the offline CLIs, and where Kyverno's pods differ from gpuwarden's (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.apiserver_pods import Obj
from bench.apiserver_stats import (
    Added,
    CliTiming,
    RunStats,
    added_latency,
    control_name,
    ratio,
    verdict,
)

#: Targets of issue 13.
TARGET_ADDED_RATIO = 0.5

TARGET_THROUGHPUT_RATIO = 0.9


def format_runs(runs: Sequence[RunStats]) -> list[str]:
    lines = [f"{'webhooks':<18}{'clients':>8}{'pods/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"]
    for run in runs:
        lines.append(
            f"{run.peer:<18}{run.clients:>8}{run.rate:>9.0f}{run.p50:>9.2f}{run.p99:>9.2f}"
            f"{run.errors:>8}"
        )
    return lines


CPU_GROUPS = ("kube-apiserver", "etcd", "webhook", "clients")


def format_cpu(runs: Sequence[RunStats]) -> list[str]:
    """CPU milliseconds per created pod, per group of processes (others' processes excluded)."""
    lines = [f"{'CPU ms per pod':<16}{'clients':>8}" + "".join(f"{g:>15}" for g in CPU_GROUPS)]
    for run in runs:
        if not run.cpu_ms:
            continue
        cells = "".join(
            f"{'-' if math.isnan(v := run.cpu_per_pod(g)) else f'{v:.2f}':>15}" for g in CPU_GROUPS
        )
        lines.append(f"{run.peer:<16}{run.clients:>8}{cells}")
    return lines


def comparisons(runs: Sequence[RunStats]) -> list[str]:
    """Added latency per webhook and concurrency, the gpuwarden/Kyverno ratios, the verdicts."""
    by_key = {(run.peer, run.clients): run for run in runs}
    clients = sorted({run.clients for run in runs})
    lines = [
        f"{'added vs control':<17}{'clients':>8}{'p50 +ms':>9}{'p99 +ms':>9}{'pods/s ratio':>14}"
    ]
    added: dict[tuple[str, int], Added] = {}
    for peer in ("echo", "gpuwarden", "kyverno"):
        for n in clients:
            # The control run interleaved with this webhook's runs, else the no-webhook run.
            run = by_key.get((peer, n))
            base = by_key.get((control_name(peer), n)) or by_key.get(("none", n))
            if run is None or base is None:
                continue
            a = added_latency(run, base)
            added[(peer, n)] = a
            lines.append(
                f"{peer:<17}{n:>8}{a.p50_ms:>9.2f}{a.p99_ms:>9.2f}{a.throughput_ratio:>13.2f}x"
            )
    for n in clients:
        echo, gw, ky = (added.get((p, n)) for p in ("echo", "gpuwarden", "kyverno"))
        if echo is not None:
            lines.append(
                f"{n} clients: a webhook that only answers allowed (echo) keeps "
                f"{echo.throughput_ratio:.2f}x the no-webhook throughput and adds "
                f"{echo.p50_ms:.2f} ms at p50: the floor of any webhook pair here"
            )
        if gw is not None:
            lines.append(
                f"{n} clients: gpuwarden keeps {gw.throughput_ratio:.2f}x the no-webhook "
                f"throughput (target >= {TARGET_THROUGHPUT_RATIO}): "
                f"{verdict(gw.throughput_ratio, TARGET_THROUGHPUT_RATIO, at_most=False)}"
            )
        if gw is not None and ky is not None:
            r50, r99 = ratio(gw.p50_ms, ky.p50_ms), ratio(gw.p99_ms, ky.p99_ms)
            lines.append(
                f"{n} clients: gpuwarden adds {r50:.2f}x Kyverno's added latency at p50, "
                f"{r99:.2f}x at p99 (target <= {TARGET_ADDED_RATIO}): "
                f"p50 {verdict(r50, TARGET_ADDED_RATIO, at_most=True)}, "
                f"p99 {verdict(r99, TARGET_ADDED_RATIO, at_most=True)}"
            )
    return lines


def format_cli(timings: Sequence[CliTiming]) -> list[str]:
    if not timings:
        return []
    pods = timings[0].pods
    lines = [
        f"{f'offline, {pods:,} pods':<22}{'wall s':>8}{'pods/s':>9}{'1-pod s':>9}"
        f"{'decisions/s':>13}"
    ]
    for t in timings:
        lines.append(
            f"{t.name:<22}{t.seconds:>8.2f}{t.rate:>9.0f}{t.startup_seconds:>9.2f}"
            f"{t.marginal_rate:>13.0f}"
        )
    if len(timings) == 2:
        lines.append(
            f"{timings[0].name} / {timings[1].name}: {ratio(timings[0].rate, timings[1].rate):.1f}x "
            f"pods/s, {ratio(timings[0].marginal_rate, timings[1].marginal_rate):.1f}x decisions/s"
        )
    return lines


def comparable(pod: Mapping[str, Any]) -> Obj:
    """What both policies set: gpuwarden.io/* and Volcano annotations, scheduler, priority,
    container resources (quantities as the API server canonicalises them)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k.startswith(("gpuwarden.io/", "scheduling.volcano.sh/", "volcano.sh/"))
    }
    return {
        "annotations": annotations,
        "schedulerName": spec.get("schedulerName"),
        "priorityClassName": spec.get("priorityClassName"),
        "priority": spec.get("priority"),
        "preemptionPolicy": spec.get("preemptionPolicy"),
        "resources": {c["name"]: c.get("resources") for c in spec.get("containers") or []},
    }


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """Where two comparable() views differ: field names, annotation keys, container names."""
    out: list[str] = []
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key), theirs.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}[{k}]" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            out.append(key)
    return out


def compare_outputs(ours: Mapping[str, Obj], theirs: Mapping[str, Obj]) -> list[str]:
    same = [name for name, pod in ours.items() if not differences(pod, theirs.get(name) or {})]
    lines = [
        f"Kyverno's pods equal gpuwarden's on {len(same)} of {len(ours)} examples "
        "(gpuwarden.io/* and Volcano annotations, scheduler, priority, resources)"
    ]
    for name, pod in ours.items():
        diff = differences(pod, theirs.get(name) or {})
        if diff:
            lines.append(f"  {name}: {', '.join(diff)} differ")
    return lines
