"""Fixtures: a real gpuwarden webhook on loopback TLS, and a client that verifies it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuwarden.certs.loopback import loopback_directory
from gpuwarden.kube.cluster import StaticCluster
from gpuwarden.webhook.server import WebhookServer

from .support import NAMESPACES, POLICY, Webhook, Workdir, base_config, client_context


@pytest.fixture
def workdir(tmp_path: Path) -> Workdir:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "policy.yaml").write_text(POLICY)
    namespaces = tmp_path / "namespaces.yaml"
    namespaces.write_text(NAMESPACES)
    certs = loopback_directory(tmp_path / "certs")
    return Workdir(tmp_path, policies, namespaces, certs)


@pytest.fixture
async def make_webhook(workdir: Workdir) -> AsyncIterator[Callable[..., Any]]:
    """Start a webhook with ServeConfig changes; every one is stopped at the end of the test."""
    started: list[Webhook] = []

    async def start(**changes: Any) -> Webhook:
        config = base_config(workdir, **changes)
        server = WebhookServer(config, cluster=StaticCluster(workdir.namespaces))
        await server.start()
        ctx = client_context(workdir.certs.ca_cert)
        hook = Webhook(server, aiohttp.ClientSession(), workdir.certs.ca_cert, ctx)
        started.append(hook)
        return hook

    yield start
    for hook in started:
        await hook.session.close()
        await hook.server.stop()


@pytest.fixture
async def webhook(make_webhook: Callable[..., Any]) -> Webhook:
    hook: Webhook = await make_webhook()
    return hook
