"""Every row of the backend tables in docs/policies.md, through `gpuwarden apply` (the dry-run CLI).

The rows live in fixtures/backend-rows.yaml, which the e2e suite replays through the webhook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.cli import main

ROWS_FILE = Path(__file__).parent / "fixtures" / "backend-rows.yaml"
ROWS: dict[str, Any] = yaml.safe_load(ROWS_FILE.read_text())


def row_pod(profile: str, namespace: str) -> dict[str, Any]:
    """A pod that asks for one GPU and names its profile, as a user would."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"row-{profile}",
            "namespace": namespace,
            "labels": {"gpuwarden.io/profile": profile},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda:12.4",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = pod["spec"].get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms: list[dict[str, Any]] = required.get("nodeSelectorTerms") or []
    return terms


def row_violations(row: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    """What the mutated pod gets wrong about the row (empty: the row holds)."""
    wrong: list[str] = []
    main = next(c for c in pod["spec"]["containers"] if c["name"] == "main")
    resources = main.get("resources", {})
    for section in ("limits", "requests"):
        got = {k: str(v) for k, v in resources.get(section, {}).items() if "/" in k}
        if got != row["resources"]:
            wrong.append(f"{section}: {got} != {row['resources']}")
    annotations = pod["metadata"].get("annotations", {})
    for key, value in (row.get("annotations") or {}).items():
        if annotations.get(key) != value:
            wrong.append(f"annotation {key}: {annotations.get(key)!r} != {value!r}")
    env = {e["name"]: e.get("value") for e in main.get("env", [])}
    for key, value in (row.get("env") or {}).items():
        if env.get(key) != value:
            wrong.append(f"env {key}: {env.get(key)!r} != {value!r}")
    for key in row.get("absent") or ():
        if key in annotations or key in resources.get("limits", {}) or key in env:
            wrong.append(f"{key} is on the pod")
    wanted = row.get("requiredNodeExpression")
    if wanted is not None and not all(
        wanted in term.get("matchExpressions", []) for term in required_terms(pod)
    ):
        wrong.append(f"node affinity {required_terms(pod)} lacks {wanted}")
    if wanted is not None and not required_terms(pod):
        wrong.append("no required node affinity")
    if pod["spec"].get("schedulerName") != row["schedulerName"]:
        wrong.append(f"schedulerName {pod['spec'].get('schedulerName')!r}")
    return wrong


@pytest.mark.parametrize("row", ROWS["rows"], ids=lambda row: str(row["row"]))
def test_row_through_apply(
    row: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(ROWS["policy"]))
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(row_pod(row["profile"], "rows")))
    code = main(["apply", "--policies", str(policy), "-o", "yaml", str(pod)])
    out, err = capsys.readouterr()
    assert code == 0, err
    mutated = next(doc for doc in yaml.safe_load_all(out) if doc and doc.get("kind") == "Pod")
    assert row_violations(row, mutated) == []
