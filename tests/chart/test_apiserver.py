"""The chart's and `gpuwarden render`'s objects against a real kube-apiserver (etcd + apiserver).

The API server is the judge of what kubernetes-validate can only approximate: structural CRD
schemas and their CEL rules, webhook matchConditions (CEL), selectors, and which ResourceQuota
keys it really charges.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.policy import load_paths
from gpuwarden.policy.render.objects import render
from gpuwarden.policy.spec.schema import CRD_NAME

from .support import CHART, release_plane, template

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

from e2e.controlplane import ControlPlane  # noqa: E402

# Kinds this bare control plane does not serve (their CRDs belong to other projects).
FOREIGN = {"Certificate", "Issuer", "ServiceMonitor", "PodMonitor", "PrometheusRule", "Queue"}


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with release_plane() as control_plane:
        yield control_plane


def _apply(plane: ControlPlane, objects: list[dict[str, Any]], *extra: str) -> Any:
    return plane.kubectl(
        "apply",
        "-f",
        "-",
        *extra,
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        check=False,
    )


def test_the_api_server_accepts_every_chart_object(plane: ControlPlane) -> None:
    for values in ([], ["self-managed-tls.yaml"], ["tenants-quotas.yaml"]):
        rendering = template(values)
        crds = rendering.all("CustomResourceDefinition")
        result = _apply(plane, crds)
        assert result.returncode == 0, result.stderr
        plane.wait_established(CRD_NAME)
        served = [o for o in rendering.objects if o["kind"] not in FOREIGN and o not in crds]
        result = _apply(plane, served, "--dry-run=server")
        assert result.returncode == 0, f"{values}: {result.stderr}"


def _policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "gpuwarden.io/v1alpha1",
        "kind": "GPUPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_gpupolicy_crd_schema_and_cel_rules_hold_in_the_api_server(plane: ControlPlane) -> None:
    result = _apply(plane, [yaml.safe_load((CHART / "crds" / f"{CRD_NAME}.yaml").read_text())])
    assert result.returncode == 0, result.stderr
    plane.wait_established(CRD_NAME)
    policy = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "policies" / "default.yaml").read_text()
    )
    result = _apply(plane, [policy])
    assert result.returncode == 0, result.stderr
    stored = json.loads(
        plane.kubectl("get", "gpupolicy", policy["metadata"]["name"], "-o", "json").stdout
    )
    assert stored["spec"] == policy["spec"]  # nothing pruned, nothing defaulted
    bad = _policy(
        "bad",
        {
            "backend": {"type": "hami", "queue": "q"},
            "profiles": [{"name": "a", "gpus": 65}],
            "workloads": [
                {"name": "r", "match": {"kind": "notebook", "taskNames": ["x"]}, "profile": "a"}
            ],
        },
    )
    result = _apply(plane, [bad])
    assert result.returncode != 0
    assert "queue applies only to type volcano" in result.stderr
    assert "taskNames applies only to kind kfp-step" in result.stderr
    assert "spec.profiles[0].gpus" in result.stderr


def test_the_api_server_asks_a_dra_backend_for_its_device_class(plane: ControlPlane) -> None:
    result = _apply(plane, [yaml.safe_load((CHART / "crds" / f"{CRD_NAME}.yaml").read_text())])
    assert result.returncode == 0, result.stderr
    plane.wait_established(CRD_NAME)
    result = _apply(plane, [_policy("dra-bare", {"backend": {"type": "dra"}})])
    assert result.returncode != 0
    assert "type dra needs deviceClassName" in result.stderr
    backend = {"type": "dra", "deviceClassName": "gpu.example.com", "coresCapacity": "cores"}
    result = _apply(plane, [_policy("dra", {"backend": backend})])
    assert result.returncode == 0, result.stderr


def test_rendered_quota_is_charged_and_limits_keys_are_not(
    plane: ControlPlane, tmp_path: Path
) -> None:
    (tmp_path / "p.yaml").write_text(
        yaml.safe_dump(
            _policy(
                "quota",
                {
                    "backend": {"type": "volcano"},
                    "profiles": [
                        {"name": "shared", "maxMemory": "8Gi", "overcommitRatio": 2, "priority": 7}
                    ],
                    "tenants": [
                        {"name": "qt", "namespaces": ["qt"], "limits": {"gpuMemoryQuota": "1Gi"}}
                    ],
                },
            )
        )
    )
    rendering = render(load_paths([tmp_path]))
    plane.kubectl("create", "namespace", "qt")
    (quota,) = rendering.of_kind("ResourceQuota")
    # A key the lint warns about, to show it stays uncharged.
    quota["spec"]["hard"]["limits.volcano.sh/vgpu-memory"] = "1"
    result = _apply(plane, [*rendering.of_kind("PriorityClass"), quota])
    assert result.returncode == 0, result.stderr
    # No controller runs here: seed status as the quota controller would.
    hard = quota["spec"]["hard"]
    status = {"status": {"hard": hard, "used": {key: "0" for key in hard}}}
    plane.kubectl(
        "patch",
        "resourcequota",
        quota["metadata"]["name"],
        "-n",
        "qt",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )

    def pod(mib: int) -> dict[str, Any]:
        resources = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": str(mib)}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "p-", "namespace": "qt"},
            "spec": {
                "priorityClassName": "gpuwarden-shared",
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {"limits": resources, "requests": resources},
                    }
                ],
            },
        }

    # Pods request their cap; the quota admits caps up to 1Gi x the ratio 2 = 2048 MiB.
    first = plane.kubectl("create", "-f", "-", input=json.dumps(pod(1100)), check=False)
    assert first.returncode == 0, first.stderr
    over = plane.kubectl("create", "-f", "-", input=json.dumps(pod(1100)), check=False)
    assert "exceeded quota" in over.stderr and "requests.volcano.sh/vgpu-memory" in over.stderr
    used = json.loads(plane.kubectl("get", "resourcequota", "-n", "qt", "-o", "json").stdout)[
        "items"
    ][0]["status"]["used"]
    assert used["requests.volcano.sh/vgpu-memory"] == "1100"
    assert used["limits.volcano.sh/vgpu-memory"] == "0"  # accepted, never charged
