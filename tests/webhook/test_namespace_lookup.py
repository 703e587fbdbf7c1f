"""A namespace the watch cache has not seen is read live, not taken for a tenant-less one.

Against the real kube-apiserver: a cache that is synced and then stops watching namespaces
(so a namespace created afterwards is deterministically missing from it), a namespace created
and used at once with a live cache, and namespaces that cannot be read (absent, API server
refusing connections, API server not answering).
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client as k8s_client

from gpuwarden.certs.rotation import ServingNames, issue_directory
from gpuwarden.kube.cluster import ClusterSource, WatchedCluster
from gpuwarden.policy.pod import keys
from gpuwarden.webhook.app import Settings
from gpuwarden.webhook.server import ServeConfig, WebhookServer

from .support import Webhook, apply_response, client_context, cpu_pod, notebook_pod, review
from .test_kube_cache import QUOTA_POLICY

pytestmark = pytest.mark.e2e

# A tenant chosen by namespace labels: what a namespace missing from the cache would lose.
POLICY = QUOTA_POLICY


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, tenant: str, cluster: ClusterSource, **settings: Any
) -> AsyncIterator[Webhook]:
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "p.yaml").write_text(POLICY.replace("TENANT", tenant))
    certs = issue_directory(tmp_path / "certs", ServingNames((), ("127.0.0.1",)))
    config = ServeConfig(
        policies=(policies,),
        host="127.0.0.1",
        port=0,
        metrics_port=None,
        cert_dir=certs.root,
        reload_interval=3600,
        settings=Settings(**settings),
    )
    server = WebhookServer(config, cluster=cluster)
    await server.start()
    hook = Webhook(server, aiohttp.ClientSession(), certs.ca_cert, client_context(certs.ca_cert))
    try:
        yield hook
    finally:
        await hook.session.close()
        await server.stop()


def lookups(hook: Webhook, result: str) -> float:
    """gpuwarden_namespace_lookups_total{result=...} as /metrics reports it."""
    value = hook.server.metrics.registry.get_sample_value(
        "gpuwarden_namespace_lookups_total", {"result": result}
    )
    return float(value or 0)


def create_namespace(api: k8s_client.ApiClient, tenant: str) -> str:
    name = f"lookup-{uuid.uuid4().hex[:8]}"
    k8s_client.CoreV1Api(api).create_namespace(
        k8s_client.V1Namespace(
            metadata=k8s_client.V1ObjectMeta(name=name, labels={"gpuwarden-test": tenant})
        )
    )
    return name


@pytest.fixture
def frozen_cluster(api_client: k8s_client.ApiClient) -> Iterator[WatchedCluster]:
    """A synced cache whose namespace watch is then stopped: it learns of no new namespace."""
    watched = WatchedCluster(api_client, track_pods=False, watch_timeout=5)
    watched.start()
    assert watched.wait_synced(20)
    watched.informers["namespaces"].stop()
    yield watched
    watched.stop()


async def test_a_namespace_the_cache_has_not_seen_is_read_live_and_cached(
    frozen_cluster: WatchedCluster, api_client: k8s_client.ApiClient, tmp_path: Path
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    namespace = create_namespace(api_client, tenant)
    assert namespace not in frozen_cluster.view().namespace_labels
    async with serving(tmp_path, tenant, frozen_cluster) as hook:
        pod = notebook_pod(namespace)
        response = await hook.admit("mutate", review(pod, namespace=namespace))
        assert response["allowed"] is True, response
        mutated = apply_response(pod, response)
        assert mutated["metadata"]["annotations"][keys.ANNOTATION_TENANT] == tenant
        labels = frozen_cluster.view().namespace_labels[namespace]
        assert labels["gpuwarden-test"] == tenant
        verdict = await hook.admit("validate", review(mutated, namespace=namespace))
        assert verdict["allowed"] is True, verdict
        assert (lookups(hook, "found"), lookups(hook, "failed")) == (1, 0), "read once, then cached"


async def test_a_namespace_created_and_used_at_once_gets_its_tenant(
    api_client: k8s_client.ApiClient, tmp_path: Path
) -> None:
    """With a live watch: whichever of the watch event and the request comes first."""
    watched = WatchedCluster(api_client, track_pods=False, watch_timeout=5)
    tenant = f"t{uuid.uuid4().hex[:8]}"
    async with serving(tmp_path, tenant, watched) as hook:
        assert watched.wait_synced(20)
        for _ in range(5):
            namespace = create_namespace(api_client, tenant)
            pod = notebook_pod(namespace)
            response = await hook.admit("mutate", review(pod, namespace=namespace))
            mutated = apply_response(pod, response)
            assert mutated["metadata"]["annotations"][keys.ANNOTATION_TENANT] == tenant


def assert_refused_with_retry(response: dict[str, Any], namespace: str) -> None:
    assert response["allowed"] is False, response
    status = response["status"]
    assert status["code"] == 503 and status["reason"] == "ServiceUnavailable", status
    assert f"could not read namespace {namespace}" in status["message"]
    assert "retry" in status["message"]


async def test_gpu_pods_in_a_namespace_that_cannot_be_read_are_refused_others_admitted(
    frozen_cluster: WatchedCluster, tmp_path: Path
) -> None:
    namespace = f"absent-{uuid.uuid4().hex[:8]}"
    async with serving(tmp_path, "nobody", frozen_cluster) as hook:
        gpu = await hook.admit("mutate", review(notebook_pod(namespace), namespace=namespace))
        assert_refused_with_retry(gpu, namespace)
        assert "404" in gpu["status"]["message"]
        validated = await hook.admit(
            "validate", review(notebook_pod(namespace), namespace=namespace)
        )
        assert_refused_with_retry(validated, namespace)
        cpu = await hook.admit("mutate", review(cpu_pod(namespace), namespace=namespace))
        assert cpu["allowed"] is True and "patch" not in cpu, cpu
        # Not cached as known: each request tries again (one may succeed once it exists).
        assert lookups(hook, "failed") == 3
        assert namespace not in frozen_cluster.view().namespace_labels


def _client(port: int) -> k8s_client.ApiClient:
    configuration = k8s_client.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    configuration.verify_ssl = False
    return k8s_client.ApiClient(configuration)


async def test_an_api_server_refusing_connections_refuses_gpu_pods(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = _client(port)
    try:
        async with serving(tmp_path, "nobody", WatchedCluster(api, track_pods=False)) as hook:
            gpu = await hook.admit("mutate", review(notebook_pod("team-x"), namespace="team-x"))
            assert_refused_with_retry(gpu, "team-x")
            cpu = await hook.admit("mutate", review(cpu_pod("team-x"), namespace="team-x"))
            assert cpu["allowed"] is True
    finally:
        api.close()  # type: ignore[no-untyped-call]


async def test_an_api_server_that_never_answers_costs_only_the_lookup_timeout(
    tmp_path: Path,
) -> None:
    """The read runs off the event loop: the server keeps answering while it hangs."""
    with socket.socket() as silent:  # accepts connections (backlog) and never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        api = _client(silent.getsockname()[1])
        try:
            cluster = WatchedCluster(api, track_pods=False)
            async with serving(tmp_path, "nobody", cluster, namespace_lookup_timeout=0.5) as hook:
                started = time.monotonic()
                gpu = await hook.admit("mutate", review(notebook_pod("team-y"), namespace="team-y"))
                took = time.monotonic() - started
                assert_refused_with_retry(gpu, "team-y")
                assert took < hook.server.config.settings.deadline, took
                status, text = await hook.get("/healthz")
                assert status == 200, text
                # Resets the connections still waiting, so the informers' reads end too.
                silent.close()
        finally:
            api.close()  # type: ignore[no-untyped-call]
