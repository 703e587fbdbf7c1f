"""Every row of the backend tables in docs/policies.md, through the webhook and a real API server.

The rows live in tests/policy/fixtures/backend-rows.yaml (also checked through `gpuwarden
apply`); here each row's pod is created in a namespace of the rows' tenant and the stored pod is
held to the row and to the policy core's own decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.lab.cluster.webhookstack import (
    KUBEFLOW_PROFILE_LABELS,
    WebhookStack,
    create_pod,
    gpu_probe_pod,
    pod_annotations,
)

from .webhook import read_pod

ROWS_FILE = Path(__file__).parents[1] / "policy" / "fixtures" / "backend-rows.yaml"
ROWS: dict[str, Any] = yaml.safe_load(ROWS_FILE.read_text())
TENANT_LABELS = {**KUBEFLOW_PROFILE_LABELS, "e2e.gpuwarden.io/tenant": "backend-rows"}


@pytest.fixture(scope="module")
def gpuwarden_policies(tmp_path_factory: pytest.TempPathFactory) -> Sequence[Path]:
    path = tmp_path_factory.mktemp("rows") / "backend-rows.yaml"
    path.write_text(yaml.safe_dump(ROWS["policy"]))
    return (path,)


@pytest.fixture(scope="module")
def rows_namespace(gpuwarden: WebhookStack) -> str:
    return gpuwarden.tenant_namespace("e2e-rows", TENANT_LABELS)


@pytest.mark.parametrize("row", ROWS["rows"], ids=lambda row: str(row["row"]))
def test_row_through_the_webhook(
    row: dict[str, Any], gpuwarden: WebhookStack, rows_namespace: str
) -> None:
    pod = gpu_probe_pod(rows_namespace)
    pod["metadata"]["labels"] = {"gpuwarden.io/profile": row["profile"]}
    expected = gpuwarden.expect(pod)

    create_pod(gpuwarden.api, pod)

    stored = read_pod(gpuwarden.api, rows_namespace, pod["metadata"]["name"])
    main = next(c for c in stored["spec"]["containers"] if c["name"] == "main")
    for section in ("limits", "requests"):
        gpu = {k: v for k, v in main["resources"][section].items() if "/" in k}
        assert gpu == row["resources"], section
    annotations = pod_annotations(stored)
    assert {k: annotations.get(k) for k in row.get("annotations") or {}} == (
        row.get("annotations") or {}
    )
    env = {e["name"]: e.get("value") for e in main.get("env") or []}
    assert {k: env.get(k) for k in row.get("env") or {}} == (row.get("env") or {})
    for key in row.get("absent") or ():
        assert key not in annotations and key not in main["resources"]["limits"], key
    wanted = row.get("requiredNodeExpression")
    if wanted is not None:
        required = stored["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert all(wanted in term["matchExpressions"] for term in required["nodeSelectorTerms"])
    # The API server defaults a schedulerName the webhook leaves alone.
    assert stored["spec"]["schedulerName"] == (row["schedulerName"] or "default-scheduler")
    assert pod_annotations(stored) == pod_annotations(expected.pod)
