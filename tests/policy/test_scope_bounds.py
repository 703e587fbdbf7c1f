"""Issue 29 item 6: the webhooks' conditions iterate bounded collections only (the API server's
CEL comprehensions cost it quadratic time); a larger object is sent to gpuwarden unread. The
Python twin says the same (tests/e2e/test_scope_bounds.py holds the CEL to it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuwarden.policy import load_paths
from gpuwarden.policy.render.scope import (
    MAX_CONFIG_MAP_KEYS,
    MAX_CONTAINER_ITEMS,
    MAX_CONTAINERS,
    MAX_ITEMS,
    ReviewScope,
    config_map_needs_review,
    review_scope,
)

from .support import POLICIES

Obj = dict[str, Any]


def cpu_pod(
    containers: int = 1, env: int = 0, volumes: int = 0, labels: int = 0, annotations: int = 0
) -> Obj:
    """A pod nothing in it makes gpuwarden act on, of the given sizes."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "cpu",
            "namespace": "team",
            "labels": {f"example.com/l{i}": "x" for i in range(labels)},
            "annotations": {f"example.com/a{i}": "x" for i in range(annotations)},
        },
        "spec": {
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "busybox",
                    "env": [
                        {"name": f"VAR_{j}", "value": "1"} for j in range(env if i == 0 else 0)
                    ],
                }
                for i in range(containers)
            ],
            "volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(volumes)],
        },
    }


def config_map(keys: int) -> Obj:
    data = {f"KEY_{i}": "1" for i in range(keys)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": data}


#: (what grows, the pod at a bound, the pod one over it)
BOUNDS: list[tuple[str, Callable[[int], Obj], int]] = [
    ("containers", lambda n: cpu_pod(containers=n), MAX_CONTAINERS),
    ("env variables", lambda n: cpu_pod(env=n), MAX_CONTAINER_ITEMS),
    ("volumes", lambda n: cpu_pod(volumes=n), MAX_ITEMS),
    ("labels", lambda n: cpu_pod(labels=n), MAX_ITEMS),
    ("annotations", lambda n: cpu_pod(annotations=n), MAX_ITEMS),
]


@pytest.fixture(scope="module")
def scope() -> ReviewScope:
    return review_scope(load_paths([POLICIES]))


@pytest.mark.parametrize(("what", "make", "bound"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_a_pod_over_a_bound_is_sent_unread(
    scope: ReviewScope, what: str, make: Callable[[int], Obj], bound: int
) -> None:
    assert not scope.needs_review(make(bound)), what
    assert scope.needs_review(make(bound + 1)), what


def test_items_count_across_containers(scope: ReviewScope) -> None:
    pod = cpu_pod(containers=2, env=MAX_CONTAINER_ITEMS // 2)
    pod["spec"]["containers"][1]["env"] = pod["spec"]["containers"][0]["env"]
    assert not scope.needs_review(pod)
    pod["spec"]["containers"][1]["volumeMounts"] = [{"name": "v0", "mountPath": "/data"}]
    assert scope.needs_review(pod)


def test_many_annotations_send_an_update(scope: ReviewScope) -> None:
    small, big = cpu_pod(annotations=MAX_ITEMS), cpu_pod(annotations=MAX_ITEMS + 1)
    assert not scope.needs_review(small, operation="UPDATE", old_pod=small)
    assert scope.needs_review(small, operation="UPDATE", old_pod=big)


def test_a_config_map_over_the_bound_is_sent_unread() -> None:
    assert not config_map_needs_review(config_map(MAX_CONFIG_MAP_KEYS))
    assert config_map_needs_review(config_map(MAX_CONFIG_MAP_KEYS + 1))
    small = config_map(3)
    small["data"]["CUDA_MPS_PIPE_DIRECTORY"] = "/tmp"
    assert config_map_needs_review(small)
