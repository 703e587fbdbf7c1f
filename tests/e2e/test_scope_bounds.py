"""Issue 29 item 6 through the real API server: the chart's conditions look into bounded
collections only, and send a larger pod or ConfigMap to gpuwarden unread, exactly where their
Python twin says so. With gpuwarden down, a sent object is refused and one left out is created
(dry run), so each outcome shows what the API server's CEL decided."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.webhookstack import WebhookStack, create_pod
from gpuwarden.policy.render.scope import (
    MAX_CONFIG_MAP_KEYS,
    MAX_CONTAINER_ITEMS,
    MAX_CONTAINERS,
    MAX_ITEMS,
    config_map_needs_review,
    review_scope,
)

from .webhook import api_error

Obj = dict[str, Any]
BOUNDS = {
    "containers": MAX_CONTAINERS,
    "env": MAX_CONTAINER_ITEMS,
    "volumes": MAX_ITEMS,
    "labels": MAX_ITEMS,
    "annotations": MAX_ITEMS,
}


def sized(what: str, count: int, namespace: str) -> Obj:
    """A CPU pod with ``count`` of ``what`` (a ConfigMap of ``count`` keys for "keys")."""
    meta: Obj = {"name": f"bounds-{what}", "namespace": namespace}
    if what == "keys":
        data = {f"KEY_{i}": "1" for i in range(count)}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
    many = range(count if what in ("containers",) else 1)
    containers: list[Obj] = [{"name": f"c{i}", "image": "busybox"} for i in many]
    spec: Obj = {"containers": containers}
    if what == "env":
        containers[0]["env"] = [{"name": f"VAR_{i}", "value": "1"} for i in range(count)]
    elif what == "volumes":
        spec["volumes"] = [{"name": f"v{i}", "emptyDir": {}} for i in range(count)]
    elif what in ("labels", "annotations"):
        meta[what] = {f"example.com/k{i}": "x" for i in range(count)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@pytest.fixture(scope="module")
def governed(gpuwarden: WebhookStack) -> str:
    return gpuwarden.tenant_namespace("e2e-bounds")


@pytest.fixture(scope="module")
def down(gpuwarden: WebhookStack, governed: str) -> Iterator[WebhookStack]:
    """The module's gpuwarden, killed: every object the conditions send is refused."""
    gpuwarden.server.kill()
    yield gpuwarden


def _outcome(call: Callable[[], object]) -> str:
    """ "created", or the webhook whose failed call refused the object."""
    try:
        call()
    except ApiException as exc:
        _, text = api_error(exc)
        for hook in ("mutate.gpuwarden.io", "validate-configmaps.gpuwarden.io"):
            if f'failed calling webhook "{hook}"' in text:
                return hook
        raise
    return "created"


@pytest.mark.parametrize("what", sorted(BOUNDS))
def test_the_api_server_sends_a_pod_over_a_bound_as_the_twin_says(
    down: WebhookStack, governed: str, what: str
) -> None:
    scope = review_scope(down.policies)
    outcomes = []
    for size in (BOUNDS[what], BOUNDS[what] + 1):
        pod = sized(what, size, governed)
        expected = "mutate.gpuwarden.io" if scope.needs_review(pod) else "created"
        outcome = _outcome(partial(create_pod, down.api, pod, dry_run=True))
        assert outcome == expected, (what, size)
        outcomes.append(outcome)
    assert outcomes == ["created", "mutate.gpuwarden.io"]


def test_the_api_server_sends_a_config_map_over_the_bound_as_the_twin_says(
    down: WebhookStack, governed: str
) -> None:
    core: Any = k8s_client.CoreV1Api(down.api)
    outcomes = []
    for size in (MAX_CONFIG_MAP_KEYS, MAX_CONFIG_MAP_KEYS + 1):
        made = sized("keys", size, governed)
        expected = (
            "validate-configmaps.gpuwarden.io" if config_map_needs_review(made) else "created"
        )
        outcome = _outcome(
            partial(core.create_namespaced_config_map, governed, made, dry_run="All")
        )
        assert outcome == expected, size
        outcomes.append(outcome)
    assert outcomes == ["created", "validate-configmaps.gpuwarden.io"]
