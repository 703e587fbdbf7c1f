"""Every example pod, as `gpuwarden apply -o json` prints it, is a valid Kubernetes Pod, and
applying twice equals applying once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate import utils as kv_utils

from gpuwarden.cli import main

from .support import EXAMPLE_PODS, NAMESPACES_FILE, POLICIES


def _newest_supported(ceiling: tuple[int, int] = (1, 37)) -> str:
    def minor(version: str) -> tuple[int, int]:
        major, minor_, *_ = version.split(".")
        return int(major), int(minor_)

    return str(max((v for v in kv_utils.all_versions() if minor(v) <= ceiling), key=minor))


K8S_VERSION = _newest_supported()


def apply_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    code = main(
        [
            "apply",
            "--policies",
            str(POLICIES),
            "--namespaces",
            str(NAMESPACES_FILE),
            "-o",
            "json",
            str(path),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    pod: dict[str, Any] = json.loads(out)
    return pod


def extended_resource_problems(pod: dict[str, Any]) -> list[str]:
    """The API server's rule for resources that cannot be overcommitted (every name outside the
    kubernetes.io namespace): whole numbers, a limit, and a request equal to it."""
    problems = []
    for field in ("initContainers", "containers"):
        for body in pod["spec"].get(field) or []:
            resources = body.get("resources") or {}
            limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
            for name in sorted({*limits, *requests}):
                if "/" not in name or name.split("/")[0].endswith("kubernetes.io"):
                    continue
                where = f"{field}[{body['name']}].{name}"
                if name not in limits:
                    problems.append(f"{where}: a request without a limit")
                elif name in requests and requests[name] != limits[name]:
                    problems.append(f"{where}: request {requests[name]} != limit {limits[name]}")
                if not str(limits.get(name, requests.get(name))).isdigit():
                    problems.append(f"{where}: not a whole number")
    return problems


@pytest.mark.parametrize("path", EXAMPLE_PODS, ids=[p.stem for p in EXAMPLE_PODS])
def test_mutated_example_is_a_valid_pod(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    pod = apply_json(capsys, path)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert extended_resource_problems(pod) == []
    annotations = pod["metadata"].get("annotations") or {}
    assert all(isinstance(value, str) for value in annotations.values())


@pytest.mark.parametrize("path", EXAMPLE_PODS, ids=[p.stem for p in EXAMPLE_PODS])
def test_applying_twice_equals_applying_once(
    capsys: pytest.CaptureFixture[str], path: Path, tmp_path: Path
) -> None:
    once = apply_json(capsys, path)
    (tmp_path / path.name).write_text(json.dumps(once))
    assert apply_json(capsys, tmp_path / path.name) == once


def test_the_checks_can_fail() -> None:
    """The validator and the extended-resource rule do reject a broken pod."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1"},
                        "requests": {"nvidia.com/gpu": "2", "volcano.sh/vgpu-memory": "0.5"},
                    },
                }
            ]
        },
    }
    assert extended_resource_problems(pod) == [
        "containers[c].nvidia.com/gpu: request 2 != limit 1",
        "containers[c].volcano.sh/vgpu-memory: a request without a limit",
        "containers[c].volcano.sh/vgpu-memory: not a whole number",
    ]
    pod["spec"]["schedulerNmae"] = "volcano"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
