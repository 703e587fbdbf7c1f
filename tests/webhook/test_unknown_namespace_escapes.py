"""A namespace that cannot be read lets no escape through (issue 29, item 8).

Its tenant is unknown, and so is what the tenant's enforcement turns off: a pod there is checked
against every escape check, as in a namespace of no tenant, and a denial names the namespace
problem. Pods that try nothing are admitted, as before.
"""

from __future__ import annotations

import json
from typing import Any

from gpuwarden.policy import ClusterView, load_texts
from gpuwarden.webhook.decide import NAMESPACE_UNKNOWN_RULE, decide
from gpuwarden.webhook.review import decode

from .support import POLICY, cpu_pod, review

# team-a's tenant lets its pods mount host paths: in a namespace that cannot be read, nobody
# knows the pod is team-a's.
LENIENT = POLICY.replace(
    "    - {name: team-a, namespaces: [team-a]}",
    "    - {name: team-a, namespaces: [team-a], enforcement: {hostPaths: false}}",
)
ERROR = 'namespaces "team-a" is forbidden: the API server refused the read'


def device_mount_pod() -> dict[str, Any]:
    """A pod asking no GPU that mounts the host's first GPU device."""
    pod = cpu_pod("team-a")
    pod["spec"]["volumes"] = [{"name": "gpu", "hostPath": {"path": "/dev/nvidia0"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "gpu", "mountPath": "/dev/nvidia0"}]
    return pod


def decided(pod: dict[str, Any], endpoint: str, *, namespace_error: str | None = ERROR) -> Any:
    policies = load_texts([("policy.yaml", LENIENT)])
    body = review(pod, namespace="team-a")
    return decide(
        "validate" if endpoint == "validate" else "mutate",
        decode(json.dumps(body).encode()),
        policies,
        ClusterView(),
        namespace_error=namespace_error,
    )


def test_an_escape_is_denied_when_the_namespace_cannot_be_read() -> None:
    decision = decided(device_mount_pod(), "validate")
    assert decision.allowed is False
    assert decision.code == 403
    assert decision.rule == NAMESPACE_UNKNOWN_RULE
    assert "/dev/nvidia0" in decision.message
    assert "could not read namespace team-a" in decision.message
    assert ERROR in decision.message
    assert decision.audit_annotations["denied-by"] == "host_paths"


def test_with_the_namespace_known_its_tenant_may_allow_what_it_turns_off() -> None:
    known = decided(device_mount_pod(), "validate", namespace_error=None)
    assert "/dev/nvidia0" not in known.message
    assert known.audit_annotations.get("denied-by") != "host_paths"


def test_a_pod_that_tries_nothing_is_admitted_and_nothing_is_mutated() -> None:
    assert decided(cpu_pod("team-a"), "validate").allowed is True
    mutation = decided(device_mount_pod(), "mutate")
    assert mutation.allowed is True and not mutation.patch


def test_a_device_asked_by_another_route_waits_for_the_namespace_like_a_gpu() -> None:
    """The routes a tenant's limits judge (DRA device classes, other vendors' GPUs, CDI
    annotations) cannot be judged without the tenant: such a pod is refused for now, as a pod
    asking nvidia.com/gpu is, on both endpoints."""
    dra = cpu_pod("team-a")
    dra["spec"]["containers"][0]["resources"] = {
        "limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "8"}
    }
    amd = cpu_pod("team-a")
    amd["spec"]["containers"][0]["resources"] = {"limits": {"amd.com/gpu": "1"}}
    cdi = cpu_pod("team-a")
    cdi["metadata"]["annotations"] = {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}
    for pod in (dra, amd, cdi):
        for endpoint in ("mutate", "validate"):
            decision = decided(pod, endpoint)
            assert decision.allowed is False, (endpoint, pod)
            assert decision.code == 503
            assert "could not read namespace team-a" in decision.message
