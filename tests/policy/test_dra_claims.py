"""The dra backend's ResourceClaimTemplates: claim_templates, `gpuwarden render`, the tenant
controller's objects, and the dry-run CLI's mutated pod."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuwarden.cli import main
from gpuwarden.commands.render import schema_problems
from gpuwarden.policy import PolicySet, load_texts
from gpuwarden.policy.lint import lint_warnings
from gpuwarden.policy.render.claims import claim_templates
from gpuwarden.policy.render.tenants import namespace_objects

from .support import EXAMPLES, example, gpu_pod

SPEC = """
  backend: {type: dra, deviceClassName: gpuwarden-lab-gpu, coresCapacity: cores}
  profiles:
    - {name: notebook, maxMemory: 16Gi, threadPercentage: 25}
    - {name: small, maxMemory: 4Gi}
    - {name: train, gpuShare: false, gpus: 4}
    - {name: two, maxMemory: 8Gi, gpus: 2}
  tenants:
    - name: vision
      namespaces: [vision, vision-dev]
      overrides: {notebook: {maxMemory: 24Gi}}
      quota: {gpus: 8}
    - name: profiles
      namespaceSelector: {matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}}
"""
PROFILE_NS = {"app.kubernetes.io/part-of": "kubeflow-profile"}
POLICY = "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: lab}\nspec:\n"


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return load_texts([("p.yaml", POLICY + SPEC)])


def _request(template: dict[str, Any]) -> dict[str, Any]:
    requests: list[dict[str, Any]] = template["spec"]["spec"]["devices"]["requests"]
    assert len(requests) == 1
    return requests[0]


def test_one_template_per_shared_dra_profile_with_the_tenants_overrides(
    policies: PolicySet,
) -> None:
    templates = claim_templates(policies, "vision")
    assert [t["metadata"]["name"] for t in templates] == ["gpuwarden-notebook", "gpuwarden-small"]
    notebook = templates[0]
    assert notebook["apiVersion"] == "resource.k8s.io/v1"
    assert notebook["kind"] == "ResourceClaimTemplate"
    assert notebook["metadata"]["namespace"] == "vision"
    assert notebook["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpuwarden"
    assert _request(notebook) == {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpuwarden-lab-gpu",
            "allocationMode": "ExactCount",
            "count": 1,
            "capacity": {"requests": {"memory": "24Gi", "cores": "25"}},
        },
    }
    # No threadPercentage: no cores reserved, but named (a capacity a claim does not name is
    # consumed whole).
    assert _request(templates[1])["exactly"]["capacity"] == {
        "requests": {"memory": "4Gi", "cores": "0"}
    }
    # A namespace of no tenant gets the profiles as they are.
    elsewhere = claim_templates(policies, "elsewhere")
    assert _request(elsewhere[0])["exactly"]["capacity"]["requests"]["memory"] == "16Gi"
    # A label-selected namespace, by its labels.
    assert [t["metadata"]["namespace"] for t in claim_templates(policies, "bob", PROFILE_NS)] == [
        "bob",
        "bob",
    ]


def test_every_template_passes_the_kubernetes_schema(policies: PolicySet) -> None:
    for template in claim_templates(policies, "vision"):
        assert schema_problems(template, "1.37") == []


def test_the_tenant_controller_applies_them_in_label_selected_namespaces(
    policies: PolicySet,
) -> None:
    objects = namespace_objects(policies, "bob", PROFILE_NS, with_kueue=False)
    assert objects == claim_templates(policies, "bob", PROFILE_NS)
    assert namespace_objects(policies, "vision", {}, with_kueue=False) == []


def test_render_writes_them_for_listed_namespaces_and_says_how_quota_counts_claims(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p.yaml").write_text(POLICY + SPEC)
    code = main(["render", "--policies", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    objects = [doc for doc in yaml.safe_load_all(out) if doc]
    templates = [
        f"{o['metadata']['namespace']}/{o['metadata']['name']}"
        for o in objects
        if o["kind"] == "ResourceClaimTemplate"
    ]
    assert templates == [
        "vision/gpuwarden-notebook",
        "vision/gpuwarden-small",
        "vision-dev/gpuwarden-notebook",
        "vision-dev/gpuwarden-small",
    ]
    quota = next(o for o in objects if o["kind"] == "ResourceQuota")
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "8"
    assert "ResourceClaimTemplate vision/gpuwarden-notebook not schema-checked" not in err
    assert "gpuwarden-lab-gpu.deviceclass.resource.k8s.io/devices" in err
    assert "tenant profiles selects namespaces by label: the tenant controller" in err
    main(["render", "--policies", str(tmp_path), "--no-claim-templates"])
    out, _ = capsys.readouterr()
    assert "ResourceClaimTemplate" not in out


def test_the_dry_run_cli_prints_the_pod_with_the_claim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p.yaml").write_text(POLICY + SPEC)
    pod = gpu_pod(namespace="vision", labels={"gpuwarden.io/profile": "notebook"})
    (tmp_path / "pod.json").write_text(json.dumps(pod))
    code = main(
        ["apply", "--policies", str(tmp_path / "p.yaml"), "-o", "json", str(tmp_path / "pod.json")]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    mutated = json.loads(out)
    assert mutated["spec"]["resourceClaims"] == [
        {"name": "gpuwarden-gpu", "resourceClaimTemplateName": "gpuwarden-notebook"}
    ]
    resources = mutated["spec"]["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpuwarden-gpu"}]
    assert "nvidia.com/gpu" not in json.dumps(resources)
    assert "nvidia.com/gpu 1 replaced by claim gpuwarden-gpu" in err


def test_the_example_policy_lints_clean_and_its_shared_notebook_is_a_valid_pod(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = EXAMPLES / "policies" / "dra.yaml"
    assert main(["lint", "--strict", str(policy)]) == 0
    capsys.readouterr()
    notebook = example("notebook")
    notebook["metadata"]["namespace"] = "team-vision"
    source = tmp_path / "notebook.json"
    source.write_text(json.dumps(notebook))
    assert main(["apply", "--policies", str(policy), "-o", "json", str(source)]) == 0
    pod = json.loads(capsys.readouterr().out)
    kubernetes_validate.validate(pod, "1.37", strict=True)
    main_container = pod["spec"]["containers"][0]
    assert main_container["resources"]["claims"] == [{"name": "gpuwarden-gpu"}]
    assert "nvidia.com/gpu" not in json.dumps(pod["spec"]["containers"])
    # Applying twice equals applying once.
    source.write_text(json.dumps(pod))
    assert main(["apply", "--policies", str(policy), "-o", "json", str(source)]) == 0
    assert json.loads(capsys.readouterr().out) == pod


def test_lint_says_what_a_dra_claim_cannot_carry(tmp_path: Path) -> None:
    text = POLICY + (
        "  backend: {type: dra, deviceClassName: gpu.example.com}\n"
        "  profiles:\n"
        "    - {name: two, maxMemory: 8Gi, gpus: 2, overcommitRatio: 2, threadPercentage: 50}\n"
    )
    warnings = lint_warnings(load_texts([("p.yaml", text)]))
    assert any("gpus: 2 on the dra backend" in w and "set gpus: 1" in w for w in warnings)
    assert any("overcommitRatio 2 has no form on the dra backend" in w for w in warnings)
    assert any("threadPercentage 50 is not reserved on the dra backend" in w for w in warnings)


def test_lint_says_when_a_tenant_override_asks_for_shared_gpus_a_claim_cannot_hold() -> None:
    text = POLICY + (
        "  backend: {type: dra, deviceClassName: gpu.example.com}\n"
        "  profiles:\n"
        "    - {name: train, gpuShare: false, gpus: 4}\n"
        "  tenants:\n"
        "    - name: tenant-b\n"
        "      namespaces: [tenant-b]\n"
        "      overrides: {train: {gpus: 2, gpuShare: true, maxMemory: 40Gi}}\n"
    )
    warnings = lint_warnings(load_texts([("p.yaml", text)]))
    assert (
        "tenant tenant-b: its override of profile train asks for 2 shared GPUs on the dra "
        "backend, where a shared pod gets one claim on a share of one device, so its pods are "
        "denied; override gpus: 1 or gpuShare: false"
    ) in warnings
