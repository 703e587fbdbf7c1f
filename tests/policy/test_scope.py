"""The webhooks' matchConditions: every pod the API server no longer sends is one the policy core
would have left untouched and allowed."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuwarden.policy import ClusterView, PolicySet, admit, load_paths
from gpuwarden.policy.pod.quantity import parse_quantity
from gpuwarden.policy.render.scope import KIND_EVIDENCE, ReviewScope, review_scope

from .support import (
    EXAMPLE_PODS,
    EXAMPLES,
    POLICIES,
    create,
    namespace_labels,
    policies_from,
    read_yaml,
)

TEST_PODS = sorted((POLICIES / "tests" / "pods").glob("*.yaml"))
POLICY_SETS = {
    "default": load_paths([POLICIES]),
    "classic": load_paths([EXAMPLES / "policies" / "kubeflow-classic.yaml"]),
    "selector": policies_from(
        """
profiles: [{name: p, gpus: 1, gpuShare: false}]
workloads:
  - {name: by-team, match: {kind: selector, labels: {matchLabels: {team: vision}}}, profile: p}
tenants: [{name: t, namespaceSelector: {matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}}}]
"""
    ),
}
CLUSTER = ClusterView(namespace_labels=namespace_labels())


def untouched(pod: dict[str, Any], policies: PolicySet) -> bool:
    result = admit(create(pod), policies, CLUSTER)
    return result.allowed and not result.mutation.patch and not result.mutation.warnings


def scope_of(name: str) -> ReviewScope:
    return review_scope(POLICY_SETS[name])


# --- the pods users create -----------------------------------------------------------------


@pytest.mark.parametrize("path", [*EXAMPLE_PODS, *TEST_PODS], ids=lambda p: p.stem)
@pytest.mark.parametrize("policy", sorted(POLICY_SETS))
def test_a_pod_left_out_is_one_gpuwarden_leaves_alone(path: Path, policy: str) -> None:
    pod = read_yaml(path)
    if not isinstance(pod, dict) or pod.get("kind") != "Pod":
        pytest.skip("not a pod")
    if not scope_of(policy).needs_review(pod):
        assert untouched(pod, POLICY_SETS[policy])


def test_cpu_pods_of_a_kubeflow_run_skip_the_webhook_but_gpu_pods_do_not() -> None:
    scope = scope_of("default")
    plain = read_yaml(POLICIES / "tests" / "pods" / "plain-web.yaml")
    assert not scope.needs_review(plain)
    gpu = copy.deepcopy(plain)
    gpu["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert scope.needs_review(gpu)


def test_rules_that_give_gpus_unasked_widen_the_scope() -> None:
    # The classic default gives pipeline steps GPUs by name: KFP pods are always sent.
    classic = scope_of("classic")
    assert "pipelines.kubeflow.org/v2_component" in classic.label_keys
    # A selector rule brings in its own label keys.
    assert scope_of("selector").label_keys == ("team",)
    cpu = {"metadata": {"labels": {"team": "vision"}}, "spec": {"containers": [{"name": "c"}]}}
    assert scope_of("selector").needs_review(cpu)
    # A rule that only acts on GPU requests narrows nothing.
    only_gpu = policies_from(
        "profiles: [{name: p, gpuShare: false}]\n"
        "workloads: [{name: r, match: {kind: notebook}, profile: p, requireGpuRequest: true}]\n"
    )
    assert review_scope(only_gpu) == ReviewScope()


def test_a_selector_gpuwarden_cannot_narrow_sends_every_pod() -> None:
    spec = """
profiles: [{name: p, gpuShare: false}]
workloads:
  - name: not-web
    match: {kind: selector, labels: {matchExpressions: [{key: app, operator: NotIn, values: [web]}]}}
    profile: p
"""
    assert review_scope(policies_from(spec)).every_pod
    assert review_scope(policies_from(spec)).cel().endswith(": (true)")


def test_updates_are_sent_only_where_gpuwarden_checks_them() -> None:
    scope = scope_of("default")
    plain: dict[str, Any] = {"metadata": {"annotations": {"argo": "x"}}, "spec": {}}
    governed = {"metadata": {"annotations": {"gpuwarden.io/profile": "p"}}, "spec": {}}
    assert not scope.needs_review(plain, operation="UPDATE", old_pod=plain)
    assert scope.needs_review(plain, operation="UPDATE", old_pod=governed)
    assert scope.needs_review(plain, operation="UPDATE", sub_resource="ephemeralcontainers")


def test_every_kind_has_evidence() -> None:
    from gpuwarden.policy.spec.model import Matcher

    kinds = {member.model_fields["kind"].default for member in Matcher.__origin__.__args__}  # type: ignore[attr-defined]
    assert kinds - {"selector"} == set(KIND_EVIDENCE)


# --- hypothesis: pods built from every feature the scope reads -----------------------------

GPU_NAMES = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "volcano.sh/vgpu-number",
    "cpu",
    "memory",
    # Routes that pass by the profiles (issue 29 items 3 and 11): denied to tenants.
    "deviceclass.resource.kubernetes.io/gpu.nvidia.com",
    "deviceclass.resource.kubernetes.io/dranet",
    "amd.com/gpu",
    "gpu.intel.com/xe",
]
ENV_NAMES = ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_DISABLE_CONTROL", "HOME"]
LABEL_KEYS = [
    *{key for labels, _ in KIND_EVIDENCE.values() for key in labels},
    "gpuwarden.io/profile",
    "team",
    "app",
]

containers = st.fixed_dictionaries(
    {"name": st.sampled_from(["main", "side"]), "image": st.just("x")},
    optional={
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "limits": st.dictionaries(
                    st.sampled_from(GPU_NAMES), st.sampled_from(["0", "1", "2"]), max_size=2
                ),
                "requests": st.dictionaries(
                    st.sampled_from(GPU_NAMES), st.sampled_from(["1", "4"]), max_size=2
                ),
            },
        ),
        "env": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(ENV_NAMES), "value": st.sampled_from(["all", "0", "x"])}
            ),
            max_size=2,
        ),
        "securityContext": st.sampled_from(
            [
                {},
                {"privileged": False},
                {"privileged": True},
                {"capabilities": {"add": ["SYS_ADMIN"]}},
            ]
        ),
        "volumeMounts": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.just("v"),
                    "mountPath": st.sampled_from(
                        ["/data", "/var/run/nvidia-container-devices/x", "/run/nvidia/mps"]
                    ),
                }
            ),
            max_size=1,
        ),
    },
)
pods = st.fixed_dictionaries(
    {
        "apiVersion": st.just("v1"),
        "kind": st.just("Pod"),
        "metadata": st.fixed_dictionaries(
            {
                "name": st.just("p"),
                "namespace": st.sampled_from(["tenant-a", "tenant-b", "team-x", "default"]),
            },
            optional={
                "labels": st.dictionaries(
                    st.sampled_from(LABEL_KEYS),
                    st.sampled_from(["vision", "predictor", "web", "t"]),
                    max_size=3,
                ),
                "annotations": st.dictionaries(
                    st.sampled_from(
                        [
                            "pipelines.kubeflow.org/runtime-role",
                            "gpuwarden.io/tenant",
                            "cdi.k8s.io/gpu",
                            "other",
                        ]
                    ),
                    st.sampled_from(["driver", "launcher", "x"]),
                    max_size=2,
                ),
            },
        ),
        "spec": st.fixed_dictionaries(
            {
                "containers": st.lists(
                    containers, min_size=1, max_size=2, unique_by=lambda c: c["name"]
                )
            },
            optional={
                "initContainers": st.lists(containers, max_size=1),
                "hostPID": st.booleans(),
                "runtimeClassName": st.sampled_from(["nvidia", "kata-qemu"]),
                "volumes": st.lists(
                    st.sampled_from(
                        [
                            {"name": "v", "emptyDir": {}},
                            {"name": "v", "hostPath": {"path": "/run/nvidia/mps"}},
                        ]
                    ),
                    max_size=1,
                ),
            },
        ),
    }
)


def api_server_accepts(pod: dict[str, Any]) -> bool:
    """The API server's own validation, which runs before any validating webhook: no request
    above its limit."""
    for field in ("containers", "initContainers"):
        for container in pod["spec"].get(field, []):
            resources = container.get("resources", {})
            limits = resources.get("limits", {})
            for name, value in resources.get("requests", {}).items():
                if name in limits and parse_quantity(value) > parse_quantity(limits[name]):
                    return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pods, policy=st.sampled_from(sorted(POLICY_SETS)))
def test_no_pod_left_out_would_have_been_changed_or_denied(
    pod: dict[str, Any], policy: str
) -> None:
    assume(api_server_accepts(pod))
    if not scope_of(policy).needs_review(pod):
        assert untouched(pod, POLICY_SETS[policy])
