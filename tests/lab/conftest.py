"""The scheduling lab's fixtures: a control plane of its own with kube-scheduler, KWOK and
gpuwarden serve registered through the chart's webhooks (one per session).

The lab gets its own API server, apart from the e2e suites' one: a running scheduler would bind
their pods, which those suites expect to stay unscheduled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from gpuwarden.lab.cluster.controlplane import REPO_ROOT, ControlPlane, Tools
from gpuwarden.lab.cluster.nodes import GpuNodePool
from gpuwarden.lab.cluster.schedulinglab import SchedulingLab, lab_control_plane, running_lab
from gpuwarden.lab.cluster.webhookstack import (
    KUBEFLOW_PROFILE_LABELS,
    WebhookStack,
    plane_webhook_stack,
)

LAB_POLICIES = Path(__file__).resolve().parent / "policies"


@pytest.fixture(scope="session")
def lab_plane(e2e_tools: Tools) -> Iterator[ControlPlane]:
    plane = lab_control_plane(e2e_tools, keep_workdir=bool(os.environ.get("GPUWARDEN_E2E_KEEP")))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def scheduling_lab(lab_plane: ControlPlane, e2e_tools: Tools) -> Iterator[SchedulingLab]:
    with running_lab(lab_plane, e2e_tools) as lab:
        yield lab


@pytest.fixture(scope="session")
def lab_gpuwarden(
    lab_plane: ControlPlane, e2e_tools: Tools, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookStack]:
    with plane_webhook_stack(
        lab_plane,
        helm=e2e_tools.helm,
        workdir=tmp_path_factory.mktemp("lab-gpuwarden"),
        policies=(LAB_POLICIES,),
    ) as stack:
        yield stack


@dataclass
class Lab:
    """One test's view of the lab: the admin client, gpuwarden, and the nodes it asked for."""

    api: k8s_client.ApiClient
    lab: SchedulingLab
    gpuwarden: WebhookStack
    add_pools: Callable[[Sequence[GpuNodePool]], list[str]]

    def tenant_namespace(self, prefix: str = "lab", **kwargs: Any) -> str:
        """A Kubeflow Profile namespace (tenant ``lab`` unless named for another), governed."""
        return self.gpuwarden.tenant_namespace(prefix, KUBEFLOW_PROFILE_LABELS, **kwargs)


@pytest.fixture
def lab(
    scheduling_lab: SchedulingLab, lab_gpuwarden: WebhookStack, lab_plane: ControlPlane
) -> Iterator[Lab]:
    """The lab with no nodes; the test adds its pools. Afterwards every pod and node goes, so the
    next test starts on an empty cluster."""
    api = lab_plane.api_client()
    try:
        yield Lab(
            api=api,
            lab=scheduling_lab,
            gpuwarden=lab_gpuwarden,
            add_pools=lambda pools: scheduling_lab.add_pools(api, pools),
        )
    finally:
        scheduling_lab.remove_nodes(api)
        api.close()  # type: ignore[no-untyped-call]


def simulate_json(*args: str, timeout: float = 180) -> dict[str, Any]:
    """`gpuwarden simulate ARGS -o json` run as a user would; its JSON, once it exited cleanly."""
    result = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "simulate", *args, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, "the labs' shutdown is quiet"
    body: dict[str, Any] = json.loads(result.stdout)
    return body
