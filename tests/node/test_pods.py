"""Reading the webhook's annotations back from pods."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuwarden.node.pods import pod_info

from .conftest import GiB, container_id, make_pod


def test_annotations_become_limits() -> None:
    pod = make_pod(
        "train",
        uid="u1",
        cap="8Gi",
        threads=30,
        containers=("main", "sidecar"),
        gpus=2,
        ratio="1.5",
        run_as_user=1000,
        container_ids={container_id(1): "main"},
    )
    info = pod_info(pod)
    assert info is not None
    assert info.cap == 8 * GiB
    assert info.thread_percentage == 30
    assert info.containers == ("main", "sidecar")
    assert info.gpu_count == 2
    assert info.overcommit_ratio == Decimal("1.5")
    assert info.run_as_users == {1000}
    assert info.container_name(container_id(1)) == "main"
    assert info.tenant == "team-a" and info.profile == "shared-small"
    assert info.governed and info.uses_gpu and not info.problems
    # two GPU containers at 8Gi each, reserved at 1/1.5
    assert info.reserved_per_gpu() == Decimal(16 * GiB) / Decimal("1.5")


def test_container_run_as_user_overrides_the_pods() -> None:
    pod = make_pod("p", uid="u1", run_as_user=1000, containers=("main",))
    pod["spec"]["containers"][0]["securityContext"] = {"runAsUser": 2000}
    pod["spec"]["containers"].append(
        {"name": "not-gpu", "image": "x", "securityContext": {"runAsUser": 3000}}
    )
    info = pod_info(pod)
    assert info is not None and info.run_as_users == {2000}


def test_unreadable_annotations_are_reported_not_raised() -> None:
    pod = make_pod(
        "bad",
        uid="u1",
        cap="eight gigs",
        threads=None,
        ratio="0.5",
        extra_annotations={"gpuwarden.io/mps-thread-percentage": "150"},
    )
    info = pod_info(pod)
    assert info is not None
    assert info.cap is None and info.thread_percentage is None
    assert info.overcommit_ratio == 1
    text = " | ".join(info.problems)
    assert "gpuwarden.io/gpu-memory-limit='eight gigs'" in text
    assert "gpuwarden.io/mps-thread-percentage='150'" in text
    assert "gpuwarden.io/overcommit-ratio='0.5'" in text


def test_pod_without_gpuwarden_annotations_is_not_governed() -> None:
    info = pod_info(
        {"metadata": {"name": "web", "namespace": "x", "uid": "u9"}, "spec": {"containers": []}}
    )
    assert info is not None
    assert not info.governed and not info.uses_gpu and info.phase == "Pending"


def test_cpu_only_profile_uses_no_gpu() -> None:
    info = pod_info(make_pod("cpu", uid="u2", cap=None, threads=None, gpus=0))
    assert info is not None and not info.uses_gpu


def test_objects_without_identity_are_skipped() -> None:
    assert pod_info({"metadata": {"name": "x"}}) is None
    assert pod_info({}) is None


# Values the webhook never writes, each read one way by the agent and the webhook (see
# tests/policy/test_record.py): left unread, reported, never raised.
@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("gpuwarden.io/gpu-count", "\u00b2"),  # isdigit() but int() raised: the agent crashed
        ("gpuwarden.io/gpu-count", "9" * 5000),  # int() refuses more than 4300 digits
        ("gpuwarden.io/gpu-count", " 2"),
        ("gpuwarden.io/gpu-count", "+2"),
        ("gpuwarden.io/mps-thread-percentage", "\u00b3"),
        ("gpuwarden.io/mps-thread-percentage", " 50"),
        ("gpuwarden.io/overcommit-ratio", "1_5"),
        ("gpuwarden.io/overcommit-ratio", "NaN"),
        ("gpuwarden.io/gpu-memory-limit", "8Gi "),
    ],
)
def test_a_value_the_webhook_never_writes_is_reported_not_guessed(key: str, raw: str) -> None:
    pod = make_pod("odd", uid="u1", cap="8Gi", threads=30, gpus=2, ratio="1.5")
    pod["metadata"]["annotations"][key] = raw
    info = pod_info(pod)
    assert info is not None
    assert len(info.problems) == 1 and info.problems[0].startswith(f"annotation {key}={raw!r}: ")
    read = {
        "gpuwarden.io/gpu-count": info.gpu_count,
        "gpuwarden.io/mps-thread-percentage": info.thread_percentage,
        "gpuwarden.io/overcommit-ratio": info.overcommit_ratio,
        "gpuwarden.io/gpu-memory-limit": info.cap,
    }
    # The others are read as written; the malformed one as if absent (a ratio of 1).
    assert read == {
        "gpuwarden.io/gpu-count": 2,
        "gpuwarden.io/mps-thread-percentage": 30,
        "gpuwarden.io/overcommit-ratio": Decimal("1.5"),
        "gpuwarden.io/gpu-memory-limit": 8 * GiB,
    } | {key: Decimal(1) if key.endswith("overcommit-ratio") else None}


def test_an_unreadable_gpu_count_still_counts_a_capped_pod_as_a_gpu_user() -> None:
    info = pod_info(make_pod("odd", uid="u1", extra_annotations={"gpuwarden.io/gpu-count": "x"}))
    assert info is not None and info.gpu_count is None and info.uses_gpu


def test_unreadable_containers_cap_every_container() -> None:
    """ "main, sidecar" was read as two names by the agent and as "main" and " sidecar" by the
    webhook; now it is unreadable, and the agent caps the users of every container."""
    pod = make_pod(
        "odd",
        uid="u1",
        containers=("main", "sidecar"),
        extra_annotations={"gpuwarden.io/containers": "main, sidecar"},
    )
    pod["spec"]["containers"][0]["securityContext"] = {"runAsUser": 1000}
    pod["spec"]["containers"][1]["securityContext"] = {"runAsUser": 2000}
    pod["spec"]["containers"].append(
        {"name": "logs", "image": "x", "securityContext": {"runAsUser": 3000}}
    )
    info = pod_info(pod)
    assert info is not None
    assert info.containers == () and info.run_as_users == {1000, 2000, 3000}
    assert info.problems == (
        "annotation gpuwarden.io/containers='main, sidecar': "
        "must be container names separated by commas",
    )
