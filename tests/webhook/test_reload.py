"""Policy hot reload: good sets swap in, bad sets never replace the last good one."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .support import (
    BAD_POLICY,
    POLICY,
    POLICY_8GI,
    Webhook,
    Workdir,
    apply_response,
    cpu_pod,
    notebook_pod,
    review,
)

CAP = "gpuwarden.io/gpu-memory-limit"


async def cap_served(hook: Webhook) -> str:
    pod = notebook_pod()
    mutated = apply_response(pod, await hook.admit("mutate", review(pod)))
    cap: str = mutated["metadata"]["annotations"][CAP]
    return cap


async def test_a_good_policy_is_picked_up(webhook: Webhook, workdir: Workdir) -> None:
    assert await cap_served(webhook) == "16Gi"
    workdir.write_policy(POLICY_8GI)
    webhook.server.tick()
    assert await cap_served(webhook) == "8Gi"
    _, metrics = await webhook.get("/metrics")
    assert 'gpuwarden_policy_reloads_total{result="ok"} 2.0' in metrics


async def test_a_bad_policy_keeps_the_last_good_one(
    webhook: Webhook, workdir: Workdir, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="gpuwarden.webhook")
    workdir.write_policy(BAD_POLICY)
    webhook.server.tick()
    assert await cap_served(webhook) == "16Gi"
    _, metrics = await webhook.get("/metrics")
    assert 'gpuwarden_policy_reloads_total{result="failed"} 1.0' in metrics
    assert "gpuwarden_policy_last_reload_failed 1.0" in metrics
    status, ready = await webhook.get("/readyz")
    assert status == 200  # the last good set still serves
    assert "last policy reload failed" in ready
    assert "spec.workloads[0].profile" in ready and "no-such-profile" in ready
    errors = [r for r in caplog.records if r.getMessage().startswith("policy reload failed")]
    assert len(errors) == 1
    assert str(workdir.policies / "policy.yaml") in errors[0].fields["error"]  # type: ignore[attr-defined]
    # Fixing the file clears the failure.
    workdir.write_policy(POLICY_8GI)
    webhook.server.tick()
    assert await cap_served(webhook) == "8Gi"
    _, metrics = await webhook.get("/metrics")
    assert "gpuwarden_policy_last_reload_failed 0.0" in metrics
    assert "last policy reload failed" not in (await webhook.get("/readyz"))[1]


def configmap_volume(root: Path, text: str, generation: int) -> None:
    """Write files the way the kubelet updates a ConfigMap volume: new dir, swap ..data."""
    data = root / f"..2026_01_01_00_00_0{generation}.000000000"
    data.mkdir()
    (data / "policy.yaml").write_text(text)
    link = root / "..data_tmp"
    link.symlink_to(data.name)
    link.replace(root / "..data")
    if not (root / "policy.yaml").is_symlink():
        (root / "policy.yaml").symlink_to("..data/policy.yaml")


async def test_a_configmap_volume_swap_is_picked_up(
    make_webhook: Callable[..., Any], workdir: Workdir
) -> None:
    volume = workdir.root / "volume"
    volume.mkdir()
    configmap_volume(volume, POLICY, 1)
    hook: Webhook = await make_webhook(policies=(volume,))
    assert await cap_served(hook) == "16Gi"
    configmap_volume(volume, POLICY_8GI, 2)
    hook.server.tick()
    assert await cap_served(hook) == "8Gi"


async def test_the_reload_loop_runs_on_its_interval(
    make_webhook: Callable[..., Any], workdir: Workdir
) -> None:
    hook: Webhook = await make_webhook(reload_interval=0.05)
    workdir.write_policy(POLICY_8GI)
    deadline = time.monotonic() + 10
    while await cap_served(hook) != "8Gi":
        assert time.monotonic() < deadline, "policy change not picked up"
        await asyncio.sleep(0.05)


async def test_no_valid_policy_denies_gpu_pods_and_allows_the_rest(
    make_webhook: Callable[..., Any], workdir: Workdir
) -> None:
    workdir.write_policy(BAD_POLICY)
    hook: Webhook = await make_webhook()
    for endpoint in ("mutate", "validate"):
        response = await hook.admit(endpoint, review(notebook_pod()))
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        message = response["status"]["message"]
        assert "no valid GPU policy" in message and "no-such-profile" in message
        assert (await hook.admit(endpoint, review(cpu_pod())))["allowed"] is True
    status, ready = await hook.get("/readyz")
    assert status == 503
    assert "no valid policy loaded" in ready
    _, metrics = await hook.get("/metrics")
    assert "gpuwarden_policy_loaded 0.0" in metrics
    # A good policy arriving later is served.
    workdir.write_policy(POLICY)
    hook.server.tick()
    assert await cap_served(hook) == "16Gi"
    assert (await hook.get("/readyz"))[0] == 200


async def test_missing_policy_path_fails_closed(
    make_webhook: Callable[..., Any], workdir: Workdir
) -> None:
    hook: Webhook = await make_webhook(policies=(workdir.root / "absent",))
    response = await hook.admit("mutate", review(notebook_pod()))
    assert response["allowed"] is False
    assert "no such file or directory" in response["status"]["message"]
    os.makedirs(workdir.root / "absent")
    (workdir.root / "absent" / "p.yaml").write_text(POLICY)
    hook.server.tick()
    assert (await hook.admit("mutate", review(notebook_pod())))["allowed"] is True
