"""Decisions per second of the policy core, in one process, for realistic Kubeflow pods.

Prints the mutating decision rate, the full admission rate (mutate + patch + validate, what the
API server drives through both webhooks) and, as a baseline measured in the same run, the rate of
a bare deep copy of the same pod, so the figure can be read on a noisy machine.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.policy import AdmissionRequest, ClusterView, admit, load_paths, mutate, validate
from gpuwarden.policy.admission.pipeline import apply_patch

ROOT = Path(__file__).resolve().parent.parent
TARGET = 10_000


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn`` over at least ``seconds`` (after a short warm-up)."""
    for _ in range(200):
        fn()
    calls, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(100):
            fn()
        calls += 100
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per figure")
    args = parser.parse_args()

    policies = load_paths([ROOT / "policies"])
    namespaces = list(yaml.safe_load_all((ROOT / "examples" / "namespaces.yaml").read_text()))
    cluster = ClusterView(
        namespace_labels={ns["metadata"]["name"]: ns["metadata"]["labels"] for ns in namespaces}
    )
    pod: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "kfp-train-step.yaml").read_text())
    request = AdmissionRequest(operation="CREATE", namespace="tenant-a", pod=pod)
    mutated = apply_patch(pod, mutate(request, policies, cluster))
    final = AdmissionRequest(operation="CREATE", namespace="tenant-a", pod=mutated)

    rows = [
        ("baseline: deepcopy of the pod", rate(lambda: copy.deepcopy(pod), args.seconds)),
        (
            "mutate (KFP training step)",
            rate(lambda: mutate(request, policies, cluster), args.seconds),
        ),
        ("validate (mutated pod)", rate(lambda: validate(final, policies, cluster), args.seconds)),
        (
            "admit: mutate+patch+validate",
            rate(lambda: admit(request, policies, cluster), args.seconds),
        ),
    ]
    baseline = rows[0][1]
    print(f"policy engine, one process, pod {pod['metadata']['name'][:40]}...")
    print(f"{'measure':<34} {'per second':>12} {'vs baseline':>12}")
    for name, value in rows:
        print(f"{name:<34} {value:>12,.0f} {value / baseline:>11.2f}x")
    decisions = rows[1][1]
    verdict = "meets" if decisions >= TARGET else "MISSES"
    print(f"mutating decisions/s: {decisions:,.0f} ({verdict} the {TARGET:,}/s target)")


if __name__ == "__main__":
    main()
