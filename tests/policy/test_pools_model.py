"""The nvidia backend's `pools` (issue 33 item 4): how it loads, and that no admission answer
reads it."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.policy import ClusterView, PolicyError, PolicySet, load_texts, mutate, validate
from gpuwarden.policy.spec.model import NvidiaBackend

from .support import EXAMPLE_PODS, create, gpu_pod, policies_from, policy_text, read_yaml

POOLS = "{wholeConfig: whole, sharedConfig: mps, sharedHeadroom: 2, holdSeconds: 0.5}"
SPEC = """
backend: {{type: nvidia, sharedResourceName: nvidia.com/gpu.shared, mpsReplicas: 4{pools}}}
defaultProfile: shared
profiles:
  - {{name: whole, gpuShare: false}}
  - {{name: shared, maxMemory: 16Gi, threadPercentage: 50}}
  - name: shared-own
    maxMemory: 8Gi
    backend: {{type: nvidia, mpsReplicas: 4, failRequestsGreaterThanOne: false{pools}}}
workloads:
  - {{name: kfp, match: {{kind: kfp-step}}, profile: shared}}
  - {{name: train, match: {{kind: training-job}}, profile: whole}}
tenants:
  - {{name: team, namespaces: [team, kubeflow-user], limits: {{maxGpusPerPod: 4}}}}
"""


def load_errors(spec: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        load_texts([("p.yaml", policy_text(spec))])
    return [str(issue) for issue in err.value.issues]


def test_pools_load_with_their_defaults() -> None:
    policies = policies_from(SPEC.format(pools=f", pools: {POOLS}"))
    backend = policies.policies[0].spec.backend
    assert isinstance(backend, NvidiaBackend) and backend.pools is not None
    assert backend.pools.config_label == "nvidia.com/device-plugin.config"
    assert (backend.pools.shared_headroom, backend.pools.hold_seconds) == (2, 0.5)
    assert (backend.pools.min_shared_nodes, backend.pools.min_whole_nodes) == (0, 0)


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        (
            "{type: nvidia, pools: {wholeConfig: whole, sharedConfig: mps}}",
            "spec.backend: pools needs mpsReplicas",
        ),
        (
            "{type: nvidia, mpsReplicas: 4, pools: {wholeConfig: mps, sharedConfig: mps}}",
            "spec.backend.pools: wholeConfig and sharedConfig must name two configs, both are "
            "'mps'",
        ),
        (
            "{type: nvidia, mpsReplicas: 4, pools: {wholeConfig: whole}}",
            "spec.backend.pools.sharedConfig: Field required",
        ),
        (
            "{type: nvidia, mpsReplicas: 4, pools: {wholeConfig: a, sharedConfig: b, holdSecs: 5}}",
            "spec.backend.pools.holdSecs: Extra inputs are not permitted; did you mean "
            "holdSeconds?",
        ),
        (
            "{type: nvidia, mpsReplicas: 4, pools: {wholeConfig: a, sharedConfig: b, "
            "sharedHeadroom: -1}}",
            "spec.backend.pools.sharedHeadroom: Input should be greater than or equal to 0",
        ),
        (
            "{type: nvidia, mpsReplicas: 4, pools: {wholeConfig: 'not a name', sharedConfig: b}}",
            "spec.backend.pools.wholeConfig: String should match pattern",
        ),
    ],
)
def test_bad_pools_name_the_field(backend: str, expected: str) -> None:
    [message] = load_errors(f"backend: {backend}")
    assert message.startswith(f"p.yaml: document 1: {expected}"), message


def pods() -> list[dict[str, Any]]:
    examples = [read_yaml(path) for path in EXAMPLE_PODS]
    plain = [gpu_pod(gpus=count) for count in ("1", "2", "8")]
    labelled = [
        gpu_pod(labels={"gpuwarden.io/profile": profile}, gpus="2")
        for profile in ("whole", "shared", "shared-own")
    ]
    return [pod for pod in (*examples, *plain, *labelled) if pod.get("kind") == "Pod"]


def answers(policies: PolicySet) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for pod in pods():
        request = create(pod, "team")
        for decision in (
            mutate(request, policies, ClusterView()),
            validate(request, policies, ClusterView()),
        ):
            out.append(
                (decision.allowed, decision.patch_bytes(), decision.warnings, decision.message)
            )
    return out


def test_pools_change_no_admission_answer() -> None:
    without = policies_from(SPEC.format(pools=""))
    with_pools = policies_from(SPEC.format(pools=f", pools: {POOLS}"))
    found = answers(with_pools)
    assert len(found) > 20 and any(patch != b"[]" for _, patch, _, _ in found)
    assert found == answers(without)
