"""`gpuwarden lint --nodes`: profiles whose pods no node can hold, and tenant limits above
every node.

Facts: GPU Feature Discovery labels a node's GPUs ``nvidia.com/gpu.memory`` (total MiB),
``nvidia.com/gpu.count`` and ``nvidia.com/gpu.product`` (NVIDIA/k8s-device-plugin
internal/lm/resource.go); a T4 has 15,360 MiB, an A10 23,028 MiB. On Volcano vGPU and HAMi a
shared pod requests its cap; on dra its claim asks maxMemory of a device's memory capacity;
NVIDIA's MPS cap reserves nothing. A pod's GPUs all come from one node.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.cli import main
from gpuwarden.policy.render.nodefit import gpu_nodes, node_fit_warnings

from .support import POLICIES, policies_from


def node(
    name: str, product: str | None, memory: str | None, count: str | None = "4", **labels: str
) -> dict[str, Any]:
    found = dict(labels)
    for key, value in (("product", product), ("memory", memory), ("count", count)):
        if value is not None and product is not None:
            found[f"nvidia.com/gpu.{key}"] = value
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": found}}


T4 = node("t4-0", "Tesla-T4", "15360")
A10 = node("a10-0", "NVIDIA-A10", "23028", pool="a10")
H100 = node("h100-0", "NVIDIA-H100-80GB-HBM3", "81559", count="8", pool="h100")
CPU = node("cpu-0", None, None)


def warnings_for(spec: str, *nodes: dict[str, Any]) -> list[str]:
    return node_fit_warnings(policies_from(spec), gpu_nodes(nodes))


def test_a_volcano_share_larger_than_every_gpu_is_named_with_the_largest_gpu() -> None:
    spec = """
backend: {type: volcano}
profiles:
  - {name: hpo, gpuShare: true, maxMemory: 20Gi}
  - {name: notebook, gpuShare: true, maxMemory: 15Gi}
"""
    assert warnings_for(spec, T4, CPU) == [
        "profile hpo: its shared pods reserve 20Gi (20,480 MiB) of GPU memory per GPU on "
        "volcano, more than any GPU they may land on has (largest 15,360 MiB: Tesla-T4 on node "
        "t4-0), so they never schedule; lower maxMemory (one team's: in its override), or send "
        "the profile to larger GPUs (nodeSelector or gpuTypes)"
    ]
    # A larger GPU anywhere the pods may go is enough: the scheduler finds it.
    assert warnings_for(spec, T4, A10) == []


def test_overcommit_counts_the_scaling_it_asks_the_nodes_for() -> None:
    spec = """
backend: {type: hami}
profiles:
  - {name: fits, gpuShare: true, maxMemory: 16Gi, overcommitRatio: 1.5}
  - {name: short, gpuShare: true, maxMemory: 20Gi, overcommitRatio: 1.3}
"""
    (warning,) = warnings_for(spec, T4)
    # 16Gi fits 15,360 x 1.5; 20,480 MiB does not fit 15,360 x 1.3 = 19,968.
    assert warning.startswith("profile short: its shared pods reserve 20Gi (20,480 MiB) ")
    assert "(largest 15,360 MiB x 1.3 (deviceMemoryScaling, as overcommitRatio asks): " in warning


def test_whole_profiles_and_mps_caps_reserve_no_memory() -> None:
    spec = """
backend: {type: nvidia, mpsReplicas: 4}
profiles:
  - {name: mps, gpuShare: true, maxMemory: 40Gi}
  - {name: whole, gpuShare: false, maxMemory: 80Gi, backend: {type: volcano}}
"""
    assert warnings_for(spec, T4) == []


def test_dra_claims_ask_the_cap_without_scaling_and_read_no_gpu_types() -> None:
    spec = """
backend: {type: dra, deviceClassName: gpu.example.com}
profiles:
  - {name: shared, gpuShare: true, maxMemory: 16Gi}
  - {name: typed, gpuShare: true, maxMemory: 16Gi, gpuTypes: [T4]}
"""
    shared, typed = warnings_for(spec, T4)
    assert shared.startswith("profile shared: its shared pods reserve 16Gi (16,384 MiB) ")
    assert " on dra, " in shared
    assert typed.startswith("profile typed: its shared pods reserve 16Gi")
    # The dra backend writes no use-gputype, so the A10 is a GPU the typed pods may land on.
    assert warnings_for(spec, T4, A10) == []


def test_only_the_gpus_a_profile_may_land_on_count() -> None:
    spec = """
backend: {type: volcano}
profiles:
  - {name: on-t4, gpuShare: true, maxMemory: 20Gi, gpuTypes: [T4]}
  - {name: by-label, gpuShare: true, maxMemory: 20Gi, nodeSelector: {pool: a10}}
  - {name: on-a100, gpuShare: true, maxMemory: 8Gi, gpuTypes: [A100]}
"""
    warnings = warnings_for(spec, T4, A10)
    assert [line.split(":")[0] for line in warnings] == ["profile on-t4", "profile on-a100"]
    assert "(largest 15,360 MiB: Tesla-T4 on node t4-0)" in warnings[0]
    assert warnings[0].endswith("send the profile to larger GPUs (nodeSelector)")
    assert warnings[1] == (
        "profile on-a100: no node given with GPUs matches its gpuTypes A100: its pods never "
        "schedule"
    )


def test_a_tenant_override_is_named_where_it_changes_the_answer() -> None:
    spec = """
backend: {type: volcano}
profiles:
  - {name: small, gpuShare: true, maxMemory: 8Gi}
tenants:
  - {name: big, namespaces: [big], overrides: {small: {maxMemory: 20Gi}}}
  - {name: same, namespaces: [same], overrides: {small: {hostMemory: 4Gi}}}
"""
    (warning,) = warnings_for(spec, T4)
    assert warning.startswith(
        "tenant big: its override of profile small: its shared pods reserve 20Gi (20,480 MiB)"
    )
    assert "; lower maxMemory in the override, or send" in warning


def test_a_gpu_count_no_node_has_is_named_where_the_policy_sets_it() -> None:
    spec = """
backend: {type: volcano}
profiles:
  - {name: node-size, gpuShare: false, gpus: 8}
  - {name: asked, gpuShare: false}
  - {name: shared-pair, gpuShare: true, gpus: 2, maxMemory: 8Gi}
  - {name: mps-eight, gpuShare: true, gpus: 8, maxMemory: 8Gi, backend: {type: nvidia, mpsReplicas: 4}}
tenants:
  - {name: big, namespaces: [big], overrides: {asked: {gpus: 8}}, limits: {maxGpusPerPod: 8}}
  - {name: fits, namespaces: [fits], limits: {maxGpusPerPod: 4}}
"""
    warnings = warnings_for(spec, T4, A10)
    assert warnings == [
        "profile node-size: its pods get 8 GPUs each (set by profile node-size), more than any "
        "node they may land on has (largest 4 GPUs: node t4-0), so they never schedule; lower "
        "gpus (one team's: in its override), or send the profile to nodes of 8 GPUs "
        "(nodeSelector)",
        "tenant big: its override of profile asked: its pods get 8 GPUs each (set by tenant big's "
        "override), more than any node they may land on has (largest 4 GPUs: node t4-0), so "
        "they never schedule; lower gpus in the override, or send the profile to nodes of 8 GPUs "
        "(nodeSelector)",
        "tenant big: maxGpusPerPod 8 admits pods of more GPUs than any node has (largest 4 GPUs: "
        "node t4-0), which then stay Pending; set maxGpusPerPod 4, so that they are denied with "
        "a message instead",
    ]
    # A node of eight anywhere settles all three; a node without the count label settles none.
    assert warnings_for(spec, T4, H100) == []
    unlabelled = node("x-0", "Tesla-T4", "15360", count=None)
    assert warnings_for(spec, unlabelled) == []


def test_a_tenant_override_that_repeats_the_profiles_problem_is_not_named_again() -> None:
    spec = """
backend: {type: volcano}
profiles:
  - {name: hpo, gpuShare: true, maxMemory: 20Gi}
tenants:
  - {name: team, namespaces: [team], overrides: {hpo: {hostMemory: 4Gi}}}
"""
    (warning,) = warnings_for(spec, T4)
    assert warning.startswith("profile hpo: its shared pods reserve 20Gi")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_nodes(path: Path, *nodes: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(nodes)}))
    return path


def test_lint_nodes_warns_about_the_default_policy_on_small_gpus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    nodes = write_nodes(tmp_path / "nodes.yaml", T4, CPU)
    code, out, err = run(capsys, "lint", str(POLICIES), "--nodes", str(nodes))
    assert code == 0
    flagged = [line.split(" (")[0] for line in err.splitlines() if "never schedule" in line]
    # batch-hpo asks 20Gi at 1.0, inference 20Gi at 1.3 (19,968 MiB on a T4); tenant-b trains
    # on 40Gi shares, tenant-a on 8 GPUs. The notebook (15Gi) and light training (16Gi at 1.5)
    # fit.
    assert flagged == [
        "warning: profile inference: its shared pods reserve 20Gi",
        "warning: profile batch-hpo: its shared pods reserve 20Gi",
        "warning: tenant tenant-a: its override of profile kfp-training: its pods get 8 GPUs each",
        "warning: tenant tenant-b: its override of profile kfp-training: its shared pods reserve "
        "40Gi",
        "warning: tenant tenant-a: its override of profile kfp-training-node: its pods get 8 GPUs "
        "each",
        "warning: tenant tenant-b: its override of profile kfp-training-node: its shared pods "
        "reserve 40Gi",
    ]
    limits = [line.split(" admits")[0] for line in err.splitlines() if "admits pods" in line]
    assert limits == [
        "warning: tenant tenant-a: maxGpusPerPod 8",
        "warning: tenant kubeflow-profiles: maxGpusPerPod 8",
    ]
    assert out.endswith(", 1 GPU nodes checked\n")
    assert run(capsys, "lint", "--strict", str(POLICIES), "--nodes", str(nodes))[0] == 1


def test_lint_nodes_reads_kubectls_json_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [T4, CPU]}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(listed)))
    code, out, err = run(capsys, "lint", str(POLICIES), "--nodes", "-")
    assert code == 0
    assert "warning: profile batch-hpo: its shared pods reserve 20Gi" in err
    assert out.endswith(", 1 GPU nodes checked\n")


def test_lint_nodes_says_when_no_node_has_the_label(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    nodes = write_nodes(tmp_path / "nodes.yaml", CPU)
    code, out, err = run(capsys, "lint", str(POLICIES), "--nodes", str(nodes))
    assert code == 0
    assert (
        "info: --nodes: none of the 1 nodes given has nvidia.com/gpu.memory or "
        "nvidia.com/gpu.count (GPU Feature Discovery's labels), so nothing was checked against "
        "them"
    ) in err
    assert out.endswith(", 0 GPU nodes checked\n")


def test_lint_nodes_refuses_what_is_not_a_node(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump_all([T4, {"apiVersion": "v1", "kind": "Pod"}]))
    code, out, err = run(capsys, "lint", str(POLICIES), "--nodes", str(path))
    assert code == 1
    assert out == ""
    assert err == f"error: {path}: document 2: not a Node (kind 'Pod')\n"
