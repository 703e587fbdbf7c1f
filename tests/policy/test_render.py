"""`gpuwarden render` and gpuwarden.policy.render.objects: the objects a policy set implies."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.cli import main as gpuwarden
from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    PolicySet,
    load_paths,
    load_texts,
    mutate,
)
from gpuwarden.policy.render.objects import (
    VOLCANO_OVERCOMMIT_NOTE,
    RenderOptions,
    quota_key_warnings,
    render,
)
from gpuwarden.policy.spec.schema import crd_yaml, policy_field_table

from .support import NO_DRA_GPUS

REPO = Path(__file__).resolve().parents[2]
DEFAULT_POLICIES = REPO / "policies"


def _policy(spec: str) -> PolicySet:
    text = "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: p}\nspec:\n" + spec
    return load_texts([("p.yaml", text)])


QUOTA_POLICY = """
  backend: {type: volcano}
  profiles:
    - {name: shared, maxMemory: 8Gi, overcommitRatio: 2, priority: 100, preemptible: true}
    - {name: whole, gpuShare: false, gpus: 2, priority: 500}
  tenants:
    - {name: vision, namespaces: [vision, vision-dev], queue: vision, limits: {gpuMemoryQuota: 40Gi, maxGpusPerPod: 2}}
    - {name: profiles, namespaceSelector: {matchLabels: {app.kubernetes.io/part-of: kubeflow-profile}}, limits: {gpuMemoryQuota: 8Gi}}
"""


def test_one_priority_class_per_profile_as_the_webhook_writes_it() -> None:
    policies = load_paths([DEFAULT_POLICIES])
    classes = {o["metadata"]["name"]: o for o in render(policies).of_kind("PriorityClass")}
    # A profile's own class, or the one it names (notebook shares light-training's).
    assert set(classes) == {
        profile.derived_priority_class for profile in policies.profiles.values()
    }
    for profile in policies.profiles.values():
        obj = classes[profile.derived_priority_class]
        assert obj["value"] == profile.priority
        # A profile's own preemptionPolicy, else preemptible work waits rather than evicts.
        expected = profile.preemption_policy or (
            "Never" if profile.preemptible else "PreemptLowerPriority"
        )
        assert obj["preemptionPolicy"] == expected
        assert obj["globalDefault"] is False
    # Pipeline training steps keep no checkpoint: they rank with node-size training and never
    # preempt (policies/default.yaml, kfp-training).
    kfp = classes[policies.profiles["kfp-training"].derived_priority_class]
    assert (kfp["value"], kfp["preemptionPolicy"]) == (250, "Never")


@pytest.mark.parametrize("example", ["notebook", "katib-trial"])
def test_priority_class_agrees_with_the_mutated_pod(example: str) -> None:
    """The Priority admission plugin refuses a pod whose priority disagrees with its class."""
    policies = load_paths([DEFAULT_POLICIES])
    pod = yaml.safe_load((REPO / "examples" / f"{example}.yaml").read_text())
    namespaces = {
        doc["metadata"]["name"]: doc["metadata"].get("labels") or {}
        for doc in yaml.safe_load_all((REPO / "examples" / "namespaces.yaml").read_text())
    }
    request = AdmissionRequest("CREATE", pod["metadata"]["namespace"], pod)
    decision = mutate(request, policies, ClusterView(namespace_labels=namespaces))
    ops = {op["path"]: op.get("value") for op in decision.patch}
    (obj,) = [
        o
        for o in render(policies).of_kind("PriorityClass")
        if o["metadata"]["name"] == ops["/spec/priorityClassName"]
    ]
    assert (ops["/spec/priority"], ops["/spec/preemptionPolicy"]) == (
        obj["value"],
        obj["preemptionPolicy"],
    )


def test_shared_and_differing_priority_classes() -> None:
    same = _policy(
        "  profiles:\n    - {name: a, gpuShare: false, priority: 5}\n"
        "    - {name: b, gpuShare: false, priority: 5, priorityClassName: gpuwarden-a}\n"
        "    - {name: c, gpuShare: false, priorityClassName: system-node-critical}\n"
    )
    rendering = render(same)
    (obj,) = rendering.of_kind("PriorityClass")
    assert obj["metadata"]["name"] == "gpuwarden-a"
    assert obj["description"] == "gpuwarden profile a, b (policy p)"
    assert any("system-node-critical" in note for note in rendering.notes)
    clash = _policy(
        "  profiles:\n    - {name: a, gpuShare: false, priority: 5}\n"
        "    - {name: b, gpuShare: false, priority: 6, priorityClassName: gpuwarden-a}\n"
    )
    (error,) = render(clash).errors
    assert "profiles a and b share PriorityClass gpuwarden-a" in error


def test_tenant_quota_charges_only_requests_keys_in_mebibytes() -> None:
    rendering = render(_policy(QUOTA_POLICY))
    quotas = {o["metadata"]["namespace"]: o for o in rendering.of_kind("ResourceQuota")}
    assert set(quotas) == {"vision", "vision-dev"}
    for quota in quotas.values():
        assert quota["metadata"]["name"] == "gpuwarden-vision"
        # Pods request their 8Gi cap; the quota of 40Gi admits caps up to 40Gi x the ratio 2.
        assert quota["spec"]["hard"] == {"requests.volcano.sh/vgpu-memory": str(80 * 1024)}
    assert not rendering.warnings
    # Tenants defined by a label selector have no namespace to put a quota in: said, with what
    # applies it instead (the tenant controller, issue 32 item 2), not skipped silently.
    (note,) = [n for n in rendering.notes if "selects its namespaces by label" in n]
    assert "tenant profiles selects its namespaces by label" in note
    assert "the tenant controller" in note and "resourceQuotaSpec" in note
    assert any("each of its 2 namespaces gets the whole tenant quota" in n for n in rendering.notes)
    assert any("maxGpusPerPod is enforced by the validating webhook" in n for n in rendering.notes)
    assert rendering.of_kind("LimitRange") == []


def test_quota_rounds_up_to_whole_mebibytes_and_follows_the_backends() -> None:
    hami = _policy(
        "  backend: {type: hami}\n  profiles:\n    - {name: s, maxMemory: 4Gi}\n"
        "  tenants:\n    - {name: t, namespaces: [t], limits: {gpuMemoryQuota: 1000001k}}\n"
    )
    (quota,) = render(hami).of_kind("ResourceQuota")
    mib = str(-(-1000001000 // 2**20))
    assert quota["spec"]["hard"] == {
        "requests.nvidia.com/gpumem": mib,
        "limits.nvidia.com/gpumem": mib,
    }
    native = _policy(
        "  backend: {type: native}\n  profiles:\n    - {name: s, gpuShare: false}\n"
        "  tenants:\n    - {name: t, namespaces: [t], limits: {gpuMemoryQuota: 10Gi}}\n"
    )
    rendering = render(native)
    assert rendering.of_kind("ResourceQuota") == []
    assert any("gpuMemoryQuota has no ResourceQuota form" in note for note in rendering.notes)


def test_hami_quota_keys_are_rendered_for_hamis_scheduler_and_not_flagged() -> None:
    hami = _policy(
        "  backend: {type: hami}\n"
        "  profiles:\n    - {name: s, maxMemory: 4Gi, overcommitRatio: 2, threadPercentage: 25}\n"
        "  tenants:\n"
        "    - {name: t, namespaces: [t], limits: {gpuMemoryQuota: 16Gi}, quota: {gpus: 3}}\n"
    )
    rendering = render(hami)
    (quota,) = rendering.of_kind("ResourceQuota")
    # HAMi's QuotaManager charges limits.<memory|cores resource> per device; the API server
    # charges the requests.* keys: 3 GPUs of HAMi's default 10 slices each, 100 cores each.
    assert quota["spec"]["hard"] == {
        "requests.nvidia.com/gpumem": str(32 * 1024),
        "limits.nvidia.com/gpumem": str(32 * 1024),
        "requests.nvidia.com/gpu": "30",
        "limits.nvidia.com/gpucores": "300",
        **NO_DRA_GPUS,
    }
    assert not rendering.warnings
    assert any("by HAMi's scheduler" in note for note in rendering.notes)
    assert any(
        "profile s: overcommitRatio 2 needs deviceMemoryScaling: 2 in HAMi's chart value "
        "devicePlugin.deviceMemoryScaling" in note
        for note in rendering.notes
    )
    assert quota_key_warnings({"limits.nvidia.com/gpumem": "1"}, "q") == []


def test_volcano_queue_has_only_real_fields_and_says_where_overcommit_lives() -> None:
    rendering = render(_policy(QUOTA_POLICY))
    (queue,) = rendering.of_kind("Queue")
    assert queue["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert queue["metadata"]["name"] == "vision"
    assert queue["spec"] == {
        "weight": 1,
        "reclaimable": True,
        "capability": {"volcano.sh/vgpu-memory": str(80 * 1024)},
    }
    assert "overcommit" not in yaml.safe_dump(queue["spec"])
    assert VOLCANO_OVERCOMMIT_NOTE in rendering.notes
    assert "overcommit-factor" in VOLCANO_OVERCOMMIT_NOTE
    without = render(_policy(QUOTA_POLICY), RenderOptions(queues=False, priority_classes=False))
    assert {o["kind"] for o in without.objects} == {"ResourceQuota"}


def test_render_says_where_gang_scheduled_jobs_get_their_queue() -> None:
    rendering = render(_policy(QUOTA_POLICY))
    assert (
        "tenant vision: gang-scheduled jobs are queued by their PodGroup, not the pod annotation: "
        "set runPolicy.schedulingPolicy.queue: vision on the job, or annotate the namespace once "
        "so Volcano's PodGroup webhook fills it in: kubectl annotate namespace vision vision-dev "
        "scheduling.volcano.sh/queue-name=vision"
    ) in rendering.notes


def test_the_builtin_default_queue_is_not_rendered() -> None:
    policies = load_paths([DEFAULT_POLICIES])  # backend.queue: default, tenants tenant-a/-b
    queues = [o["metadata"]["name"] for o in render(policies).of_kind("Queue")]
    assert queues == ["tenant-a", "tenant-b"]


@pytest.mark.parametrize(
    ("hard", "flagged"),
    [
        ({"requests.nvidia.com/gpu": "4", "requests.cpu": "8", "limits.memory": "1Gi"}, []),
        ({"limits.nvidia.com/gpu": "4"}, ["limits.nvidia.com/gpu"]),
        ({"nvidia.com/gpu": "4", "count/pods": "10", "pods": "3"}, ["nvidia.com/gpu"]),
        ({"limits.volcano.sh/vgpu-memory": "1"}, ["limits.volcano.sh/vgpu-memory"]),
    ],
)
def test_quota_keys_that_are_accepted_but_never_charged(
    hard: Mapping[str, str], flagged: list[str]
) -> None:
    warnings = quota_key_warnings(hard, "ResourceQuota x/y")
    assert [w.split("quota key ")[1].split(" ")[0] for w in warnings] == flagged
    for warning in warnings:
        assert warning.startswith("ResourceQuota x/y: ")
        assert "use requests." in warning


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = gpuwarden(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_validated_objects_and_speaks_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p.yaml").write_text(
        "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: p}\nspec:\n"
        + QUOTA_POLICY
    )
    code, out, err = _run(["render", "--policies", str(tmp_path)], capsys)
    assert code == 0
    objects = [doc for doc in yaml.safe_load_all(out) if doc]
    assert [o["kind"] for o in objects] == ["PriorityClass"] * 2 + ["ResourceQuota"] * 2 + ["Queue"]
    assert "# Volcano has no per-queue overcommit field" in out
    assert "note: tenant profiles selects its namespaces by label" in err
    assert "note: Queue vision not schema-checked" in err
    assert "PriorityClass gpuwarden-shared not schema-checked" not in err
    code, out, _ = _run(["render", "--policies", str(tmp_path), "-o", "json"], capsys)
    listed = yaml.safe_load(out)
    assert code == 0 and listed["kind"] == "List" and len(listed["items"]) == 5


def test_cli_lints_kubeflow_profiles_and_quotas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Profile",
        "metadata": {"name": "alice"},
        "spec": {"resourceQuotaSpec": {"hard": {"limits.nvidia.com/gpu": "2", "cpu": "8"}}},
    }
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q", "namespace": "n"},
        "spec": {"hard": {"nvidia.com/gpu": "1"}},
    }
    lint = tmp_path / "quotas.yaml"
    lint.write_text(yaml.safe_dump_all([profile, quota]))
    code, _, err = _run(
        ["render", "--policies", str(DEFAULT_POLICIES), "--check-quotas", str(lint)], capsys
    )
    assert code == 0
    assert (
        "document 1: Profile alice: quota key limits.nvidia.com/gpu is accepted but never charged"
        in err
    )
    assert (
        "document 2: ResourceQuota n/q: quota key nvidia.com/gpu is accepted but never charged"
        in err
    )
    code, _, err = _run(
        [
            "render",
            "--policies",
            str(DEFAULT_POLICIES),
            "--check-quotas",
            str(tmp_path / "nope.yaml"),
        ],
        capsys,
    )
    assert code == 2 and "nope.yaml: no such file" in err


def test_cli_bad_input_names_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: p}\nspec:\n  profiles:\n    - {name: a, gpus: 99}\n"
    )
    code, out, err = _run(["render", "--policies", str(bad)], capsys)
    assert (code, out) == (2, "")
    assert "bad.yaml" in err and "spec.profiles[0].gpus" in err and "Traceback" not in err
    code, _, err = _run(["render"], capsys)
    assert code == 2 and "--policies PATH is required" in err
    clash = tmp_path / "clash.yaml"
    clash.write_text(
        "apiVersion: gpuwarden.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: p}\nspec:\n  profiles:\n    - {name: a, gpuShare: false, priority: 1}\n    - {name: b, gpuShare: false, priority: 2, priorityClassName: gpuwarden-a}\n"
    )
    code, out, err = _run(["render", "--policies", str(clash)], capsys)
    assert (code, out) == (2, "") and "share PriorityClass gpuwarden-a" in err


def test_cli_crd_and_field_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["render", "--crd"], capsys)
    assert code == 0 and out == crd_yaml()
    code, out, _ = _run(["render", "--field-table"], capsys)
    assert code == 0 and out == policy_field_table()


def test_schema_problems_are_reported_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwarden.commands.render import validate_objects

    broken: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "x"},
        "value": "high",
    }
    failed, unchecked = validate_objects([broken], "1.37")
    assert (failed, unchecked) == (1, 0)
    assert "PriorityClass x fails the Kubernetes 1.37 schema: value:" in capsys.readouterr().err
