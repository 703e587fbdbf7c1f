"""envFrom of a ConfigMap, judged with the watch-backed ConfigMap key cache of a real kube-apiserver."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import jsonpatch
import pytest
from kubernetes import client as k8s_client

from gpuwarden.kube.cluster import WatchedCluster
from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    Decision,
    PolicySet,
    load_texts,
    mutate,
    validate,
)
from gpuwarden.policy.pod.environment import SourceKeys

from .support import POLICY, notebook_pod
from .test_kube_cache import eventually

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(api_client: k8s_client.ApiClient) -> Iterator[WatchedCluster]:
    watched = WatchedCluster(api_client, watch_timeout=1, track_pods=False)
    assert "configmaps cache not synced" in watched.missing()
    watched.start()
    assert watched.wait_synced(20)
    assert watched.missing() == []
    yield watched
    watched.stop()


@pytest.fixture
def policies(namespace: str) -> PolicySet:
    return load_texts([("policy.yaml", POLICY.replace("[team-a]", f"[{namespace}]"))])


def config_map(
    cluster: WatchedCluster,
    api_client: k8s_client.ApiClient,
    namespace: str,
    data: Mapping[str, str],
) -> str:
    """Create a ConfigMap and wait for the watch to deliver it; its name."""
    name = f"env-{uuid.uuid4().hex[:8]}"
    k8s_client.CoreV1Api(api_client).create_namespaced_config_map(
        namespace,
        k8s_client.V1ConfigMap(metadata=k8s_client.V1ObjectMeta(name=name), data=dict(data)),
    )
    key = ("ConfigMap", namespace, name)
    eventually(lambda: key in cluster.view().env_source_keys, "the new ConfigMap")
    return name


def denied_keys(view: ClusterView, namespace: str, name: str) -> tuple[str, ...]:
    """The keys of a cached ConfigMap that an envFrom without a prefix makes denied variables."""
    kept = view.env_source_keys.get(("ConfigMap", namespace, name))
    return kept.formed("").first if isinstance(kept, SourceKeys) else ()


def judged(
    cluster: WatchedCluster, policies: PolicySet, namespace: str, env_from: dict[str, Any]
) -> Decision:
    """A GPU notebook pod with ``env_from``, mutated as the webhook would, then validated."""
    pod = notebook_pod(namespace)
    pod["spec"]["containers"][0]["envFrom"] = [env_from]
    mutated = mutate(AdmissionRequest("CREATE", namespace, pod), policies, cluster.view())
    assert mutated.allowed, mutated.message
    final = jsonpatch.apply_patch(pod, json.loads(mutated.patch_bytes()))
    return validate(AdmissionRequest("CREATE", namespace, final), policies, cluster.view())


def test_a_config_map_key_nvidia_visible_devices_is_denied(
    cluster: WatchedCluster, policies: PolicySet, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    name = config_map(cluster, api_client, namespace, {"NVIDIA_VISIBLE_DEVICES": "all"})
    verdict = judged(cluster, policies, namespace, {"configMapRef": {"name": name}})
    assert not verdict.allowed
    assert verdict.code == 403
    assert f"envFrom[{name}]" in verdict.message
    assert "ConfigMap key NVIDIA_VISIBLE_DEVICES" in verdict.message


def test_a_prefix_that_makes_cuda_mps_variables_is_denied(
    cluster: WatchedCluster, policies: PolicySet, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    name = config_map(cluster, api_client, namespace, {"PIPE_DIRECTORY": "/tmp/mine"})
    verdict = judged(
        cluster, policies, namespace, {"prefix": "CUDA_MPS_", "configMapRef": {"name": name}}
    )
    assert not verdict.allowed
    assert "ConfigMap key PIPE_DIRECTORY sets CUDA_MPS_PIPE_DIRECTORY" in verdict.message


def test_a_harmless_config_map_is_allowed_without_a_warning(
    cluster: WatchedCluster, policies: PolicySet, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    name = config_map(cluster, api_client, namespace, {"LOG_LEVEL": "debug", "MPS": "no"})
    verdict = judged(cluster, policies, namespace, {"configMapRef": {"name": name}})
    assert verdict.allowed, verdict.message
    # Its keys are known, so it is not among the sources gpuwarden says it could not check.
    assert not any(name in w for w in verdict.warnings), verdict.warnings
    # Values are never kept, nor harmless key names: only how many keys there are and, by
    # prefix, the few that would make denied variables (CUDA_MPS_ makes every key one).
    kept = cluster.view().env_source_keys[("ConfigMap", namespace, name)]
    assert isinstance(kept, SourceKeys)
    assert (kept.size, kept.near) == (2, {})
    assert kept.formed("CUDA_MPS_").first == ("LOG_LEVEL", "MPS")
    assert ("Secret", namespace, name) not in cluster.view().env_source_keys


def test_a_key_added_later_is_seen_once_the_watch_delivers_it(
    cluster: WatchedCluster, policies: PolicySet, api_client: k8s_client.ApiClient, namespace: str
) -> None:
    name = config_map(cluster, api_client, namespace, {"LOG_LEVEL": "debug"})
    ref = {"configMapRef": {"name": name}}
    assert judged(cluster, policies, namespace, ref).allowed
    view = cluster.view()  # taken before the change: the key cache is read live
    k8s_client.CoreV1Api(api_client).patch_namespaced_config_map(
        name, namespace, {"data": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}}
    )
    eventually(
        lambda: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in denied_keys(view, namespace, name),
        "the added key",
    )
    verdict = judged(cluster, policies, namespace, ref)
    assert not verdict.allowed
    assert "ConfigMap key CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in verdict.message
    # Deleted: unknown again (not harmless), so a pod must wait until it exists again.
    k8s_client.CoreV1Api(api_client).delete_namespaced_config_map(name, namespace)
    eventually(lambda: ("ConfigMap", namespace, name) not in view.env_source_keys, "the deletion")
    verdict = judged(cluster, policies, namespace, ref)
    assert not verdict.allowed
    assert f"gpuwarden does not know ConfigMap {name} yet" in verdict.message
