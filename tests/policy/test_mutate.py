"""The mutating decision: what each example pod becomes, and the properties every patch keeps."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    PolicySet,
    PriorityClassInfo,
    admit,
    mutate,
)
from gpuwarden.policy.admission.decision import MAX_WARNING
from gpuwarden.policy.admission.placement import place

from .support import (
    EXAMPLE_PODS,
    apply_ops,
    container,
    create,
    example,
    gpu_pod,
    mutated,
    policies_from,
    read_yaml,
)

EXAMPLE_IDS = [path.stem for path in EXAMPLE_PODS]
GOVERNED = [name for name in EXAMPLE_IDS if name != "kfp-driver"]


@pytest.mark.parametrize(
    ("name", "profile", "target", "gpu", "priority", "preemption"),
    [
        (
            "kfp-train-step",
            "kfp-training",
            "main",
            {"nvidia.com/gpu": "8"},
            ("gpuwarden-kfp-training", 250),
            "Never",
        ),
        (
            "notebook",
            "notebook",
            "alice-jupyter",
            {
                "volcano.sh/vgpu-number": "1",
                "volcano.sh/vgpu-memory": "15360",
                "volcano.sh/vgpu-cores": "20",
            },
            ("gpuwarden-notebook", 260),
            "PreemptLowerPriority",
        ),
        (
            "kserve-predictor",
            "inference",
            "kserve-container",
            {
                "volcano.sh/vgpu-number": "1",
                "volcano.sh/vgpu-memory": "20480",
                "volcano.sh/vgpu-cores": "33",
            },
            ("gpuwarden-inference", 300),
            "PreemptLowerPriority",
        ),
        (
            "katib-trial",
            "batch-hpo",
            "training-container",
            {
                "volcano.sh/vgpu-number": "1",
                "volcano.sh/vgpu-memory": "20480",
                "volcano.sh/vgpu-cores": "25",
            },
            ("gpuwarden-batch-hpo", 50),
            "Never",
        ),
        (
            "pytorchjob-worker",
            "heavy-training",
            "pytorch",
            {"nvidia.com/gpu": "1"},
            ("gpuwarden-heavy-training", 200),
            "PreemptLowerPriority",
        ),
        (
            "trainjob-node",
            "heavy-training",
            "node",
            {"nvidia.com/gpu": "1"},
            ("gpuwarden-heavy-training", 200),
            "PreemptLowerPriority",
        ),
    ],
)
def test_example_pods_get_their_profile(
    name: str,
    profile: str,
    target: str,
    gpu: dict[str, str],
    priority: tuple[str, int],
    preemption: str,
    default_policies: PolicySet,
    cluster: ClusterView,
) -> None:
    pod = example(name)
    decision = mutate(create(pod), default_policies, cluster)
    assert decision.allowed
    assert decision.profile == profile
    out = apply_ops(pod, decision)
    resources = container(out, target)["resources"]
    for section in ("limits", "requests"):
        assert {k: v for k, v in resources[section].items() if "/" in k} == gpu
    spec = out["spec"]
    assert (spec["schedulerName"], spec["priorityClassName"], spec["priority"]) == (
        "volcano",
        *priority,
    )
    assert spec["preemptionPolicy"] == preemption
    annotations = out["metadata"]["annotations"]
    assert annotations["gpuwarden.io/profile"] == profile
    assert annotations["gpuwarden.io/tenant"] == pod["metadata"]["namespace"]
    assert annotations["gpuwarden.io/containers"] == target
    assert annotations["scheduling.volcano.sh/queue-name"] == pod["metadata"]["namespace"]
    # Only the target container changed.
    for other in pod["spec"]["containers"]:
        if other["name"] != target:
            assert container(out, other["name"]) == other
    assert out["spec"].get("initContainers") == pod["spec"].get("initContainers")
    assert decision.audit_annotations["profile"] == profile


def test_kfp_driver_is_untouched(default_policies: PolicySet, cluster: ClusterView) -> None:
    decision = mutate(create(example("kfp-driver")), default_policies, cluster)
    assert (decision.allowed, decision.patch, decision.warnings) == (True, (), ())
    assert decision.rule == "skip"


def test_tenant_a_training_override(default_policies: PolicySet, cluster: ClusterView) -> None:
    out = mutated(example("kfp-train-step"), default_policies, cluster)
    main = container(out, "main")["resources"]
    assert main["limits"] == {"memory": "64Gi", "nvidia.com/gpu": "8"}
    assert main["requests"] == {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "8"}
    assert out["metadata"]["annotations"]["gpuwarden.io/gpu-count"] == "8"


def test_tenant_b_training_override_shares_two_gpus(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("kfp-train-step")
    pod["metadata"]["namespace"] = "tenant-b"
    decision = mutate(create(pod), default_policies, cluster)
    assert decision.tenant == "tenant-b"
    out = apply_ops(pod, decision)
    main = container(out, "main")["resources"]
    assert main["limits"] == {
        "memory": "16Gi",
        "volcano.sh/vgpu-number": "2",
        "volcano.sh/vgpu-memory": "40960",
    }
    assert main["requests"]["memory"] == "16Gi"
    annotations = out["metadata"]["annotations"]
    assert (annotations["gpuwarden.io/gpu-shared"], annotations["gpuwarden.io/gpu-count"]) == (
        "true",
        "2",
    )
    assert annotations["gpuwarden.io/gpu-memory-limit"] == "40Gi"
    assert any("tenant override of" in line for line in decision.warnings)


def test_a_profile_without_gpus_removes_the_gpu(
    classic_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("kfp-train-step")
    pod["metadata"]["annotations"]["workflows.argoproj.io/node-name"] = "wf.root.load-data.executor"
    out = mutated(pod, classic_policies, cluster)
    main = container(out, "main")["resources"]
    assert main == {"requests": {"cpu": "4", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert out["metadata"]["annotations"]["gpuwarden.io/gpu-count"] == "0"
    assert "schedulerName" not in out["spec"]


# --- priority ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "preset",
    [
        {},
        {"priority": 0, "preemptionPolicy": "PreemptLowerPriority"},  # the Priority plugin's
        {"priority": 1000, "priorityClassName": "high", "preemptionPolicy": "Never"},
    ],
)
def test_priority_fields_change_together(
    preset: dict[str, Any], default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("katib-trial")
    pod["spec"].update(preset)
    out = mutated(pod, default_policies, cluster)
    spec = out["spec"]
    assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (
        "gpuwarden-batch-hpo",
        50,
        "Never",
    )


def test_a_profile_may_rank_first_without_preempting(cluster: ClusterView) -> None:
    """preemptionPolicy: Never with a high priority: first in the queue, never evicting."""
    policies = policies_from(
        """
profiles:
  - {name: notebook, maxMemory: 16Gi, priority: 250, preemptionPolicy: Never}
workloads:
  - {name: notebooks, match: {kind: notebook}, profile: notebook}
"""
    )
    out = mutated(example("notebook"), policies, cluster)
    spec = out["spec"]
    assert (spec["priority"], spec["preemptionPolicy"]) == (250, "Never")
    assert out["metadata"]["annotations"]["gpuwarden.io/preemptible"] == "false"


def test_priority_class_known_to_the_cluster_wins(default_policies: PolicySet) -> None:
    cluster = ClusterView(
        priority_classes={"gpuwarden-inference": PriorityClassInfo(4242, "Never")}
    )
    out = mutated(example("kserve-predictor"), default_policies, cluster)
    assert (out["spec"]["priority"], out["spec"]["preemptionPolicy"]) == (4242, "Never")


def test_profile_can_name_its_priority_class() -> None:
    policies = policies_from(
        "profiles: [{name: a, maxMemory: 1Gi, priority: 7, priorityClassName: team-gpu}]"
    )
    out = mutated(gpu_pod(labels={"gpuwarden.io/profile": "a"}), policies, ClusterView())
    assert (out["spec"]["priorityClassName"], out["spec"]["priority"]) == ("team-gpu", 7)


# --- scheduler names -----------------------------------------------------------------------

GANG = "scheduler-plugins-scheduler"


@pytest.mark.parametrize("current", [None, "", "default-scheduler", "volcano"])
def test_default_scheduler_is_replaced_by_the_backend(
    current: str | None, default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("pytorchjob-worker")
    if current is not None:
        pod["spec"]["schedulerName"] = current
    assert mutated(pod, default_policies, cluster)["spec"]["schedulerName"] == "volcano"


def test_foreign_scheduler_is_kept_by_default(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("pytorchjob-worker")
    pod["spec"]["schedulerName"] = GANG
    decision = mutate(create(pod), default_policies, cluster)
    assert apply_ops(pod, decision)["spec"]["schedulerName"] == GANG
    assert f"gpuwarden: kept schedulerName {GANG} set by another controller (policy: keep)" in (
        decision.warnings
    )
    assert admit(create(pod), default_policies, cluster).allowed


def test_foreign_scheduler_is_replaced_when_the_policy_says_so() -> None:
    policies = policies_from(
        "backend: {type: volcano, foreignScheduler: replace}\nprofiles: [{name: a, maxMemory: 1Gi}]"
    )
    pod = gpu_pod(labels={"gpuwarden.io/profile": "a"}, extra={})
    pod["spec"]["schedulerName"] = GANG
    decision = mutate(create(pod), policies, ClusterView())
    assert apply_ops(pod, decision)["spec"]["schedulerName"] == "volcano"
    assert f"gpuwarden: replaced schedulerName {GANG} with volcano" in decision.warnings


# --- placement fields ----------------------------------------------------------------------


def test_node_selector_and_tolerations_are_added_once() -> None:
    policies = policies_from(
        """
profiles:
  - name: a100
    maxMemory: 40Gi
    nodeSelector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
    tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
"""
    )
    pod = gpu_pod(labels={"gpuwarden.io/profile": "a100"})
    pod["spec"]["nodeSelector"] = {"zone": "a"}
    pod["spec"]["tolerations"] = [{"key": "spot", "operator": "Exists"}]
    out = mutated(pod, policies, ClusterView())
    assert out["spec"]["nodeSelector"] == {
        "zone": "a",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    }
    assert out["spec"]["tolerations"] == [
        {"key": "spot", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert mutate(create(out), policies, ClusterView()).patch == ()


# --- properties of every decision ----------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLE_PODS, ids=EXAMPLE_IDS)
def test_idempotent_on_every_example(
    path: Any, default_policies: PolicySet, cluster: ClusterView
) -> None:
    once = mutated(read_yaml(path), default_policies, cluster)
    again = mutate(create(once), default_policies, cluster)
    assert again.patch == ()
    assert again.allowed


@pytest.mark.parametrize("namespace", ["tenant-a", "tenant-b", "carol", "no-tenant"])
@pytest.mark.parametrize("name", GOVERNED)
def test_idempotent_in_every_kind_of_namespace(
    name: str, namespace: str, default_policies: PolicySet
) -> None:
    cluster = ClusterView(
        namespace_labels={"carol": {"app.kubernetes.io/part-of": "kubeflow-profile"}}
    )
    once = mutated(example(name), default_policies, cluster, namespace)
    assert mutate(create(once, namespace), default_policies, cluster).patch == ()


@pytest.mark.parametrize("path", EXAMPLE_PODS, ids=EXAMPLE_IDS)
def test_mutate_never_modifies_its_input(
    path: Any, default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = read_yaml(path)
    frozen = copy.deepcopy(pod)
    result = admit(create(pod), default_policies, cluster)
    assert pod == frozen
    # The pipeline's pod is what the patch makes of the original.
    assert result.pod == apply_ops(frozen, result.mutation)


@pytest.mark.parametrize("path", EXAMPLE_PODS, ids=EXAMPLE_IDS)
def test_warnings_are_short(path: Any, default_policies: PolicySet, cluster: ClusterView) -> None:
    decision = mutate(create(read_yaml(path)), default_policies, cluster)
    assert all(len(line) < 120 for line in decision.warnings)


def test_long_warnings_are_cut_below_120_characters(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("pytorchjob-worker")
    pod["spec"]["schedulerName"] = "a-very-long-scheduler-name-" + "x" * 120
    decision = mutate(create(pod), default_policies, cluster)
    long = [line for line in decision.warnings if "kept schedulerName" in line]
    assert long and long[0].endswith("...")
    assert all(len(line) < 120 for line in decision.warnings), MAX_WARNING


def test_pod_without_gpu_and_rule_is_untouched(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = gpu_pod("web", "tenant-a", gpus=None, labels={"app": "web"})
    decision = mutate(create(pod), default_policies, cluster)
    assert (decision.allowed, decision.patch, decision.warnings, decision.profile) == (
        True,
        (),
        (),
        None,
    )
    assert decision.patch_bytes() == b"[]"


def test_gpu_pod_matching_no_rule_gets_the_default_profile(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    decision = mutate(create(gpu_pod("x", "tenant-a")), default_policies, cluster)
    assert (decision.profile, decision.rule) == ("light-training", "default")


@pytest.mark.parametrize(
    "request_",
    [
        AdmissionRequest("UPDATE", "tenant-a", example("notebook"), old_pod=example("notebook")),
        AdmissionRequest("DELETE", "tenant-a", example("notebook")),
        AdmissionRequest("CONNECT", "tenant-a", example("notebook")),
        AdmissionRequest("CREATE", "tenant-a", example("notebook"), sub_resource="binding"),
        AdmissionRequest("CREATE", "tenant-a", {"kind": "Deployment", "spec": {}}),
        AdmissionRequest("CREATE", "tenant-a", {"kind": "Pod", "spec": None}),
        AdmissionRequest("CREATE", "tenant-a", {}),
    ],
    ids=["update", "delete", "connect", "subresource", "deployment", "null-spec", "empty"],
)
def test_only_pod_creation_is_mutated(
    request_: AdmissionRequest, default_policies: PolicySet, cluster: ClusterView
) -> None:
    assert mutate(request_, default_policies, cluster).patch == ()


def test_profile_label_problem_is_a_warning_not_a_patch(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = gpu_pod("x", "tenant-a", labels={"gpuwarden.io/profile": "nope"})
    decision = mutate(create(pod), default_policies, cluster)
    assert decision.patch == ()
    (line,) = decision.warnings
    assert line.startswith(
        "gpuwarden: label gpuwarden.io/profile=nope names no profile; use one of: batch-hpo, "
    )
    assert len(line) < 120


def test_annotation_keys_with_slash_and_tilde_survive(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("notebook")
    pod["metadata"]["annotations"] = {"a~b/c": "1", "gpuwarden.io/profile": "stale~/"}
    out = mutated(pod, default_policies, cluster)
    assert out["metadata"]["annotations"]["a~b/c"] == "1"
    assert out["metadata"]["annotations"]["gpuwarden.io/profile"] == "notebook"


def test_idempotent_when_a_gpu_free_profile_removes_the_only_evidence(
    classic_policies: PolicySet, cluster: ClusterView
) -> None:
    """A profile with gpus: 0 takes the GPU away from the container that asked for it; the second
    decision must pick the same container, not the first one, although nothing asks any more."""
    pod = gpu_pod("etl", "tenant-a", labels={"gpuwarden.io/profile": "kfp-data-loading"})
    pod["spec"]["containers"].insert(0, {"name": "logger", "image": "fluent-bit"})
    decision = mutate(create(pod), classic_policies, cluster)
    once = apply_ops(pod, decision)
    assert container(once, "main")["resources"] == {
        "limits": {"memory": "4Gi"},
        "requests": {"memory": "4Gi"},
    }
    assert container(once, "logger") == {"name": "logger", "image": "fluent-bit"}
    assert mutate(create(once), classic_policies, cluster).patch == ()
    assert admit(create(once), classic_policies, cluster).allowed


def test_recorded_containers_never_widen_a_gpu_grant(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """A user-set gpuwarden.io/containers annotation does not choose who gets GPUs."""
    pod = gpu_pod(
        "x",
        "tenant-a",
        gpus=None,
        labels={"gpuwarden.io/profile": "light-training"},
        annotations={
            "gpuwarden.io/containers": "main,other",
            "gpuwarden.io/profile": "light-training",
        },
    )
    pod["spec"]["containers"].append({"name": "other", "image": "x"})
    out = mutated(pod, default_policies, cluster)
    assert out["metadata"]["annotations"]["gpuwarden.io/containers"] == "main"
    assert "resources" not in container(out, "other")


def test_katib_labels_added_after_us_are_picked_up_on_reinvocation(
    classic_policies: PolicySet, cluster: ClusterView
) -> None:
    """Katib's webhook may add the trial labels after ours; the reinvoked decision then gives the
    trial its batch profile, with no trace left of the first profile."""
    labeled = example("katib-trial")
    pod = copy.deepcopy(labeled)
    trial_labels = {
        key: pod["metadata"]["labels"].pop(key)
        for key in ("katib.kubeflow.org/trial", "katib.kubeflow.org/experiment")
    }
    first = mutated(pod, classic_policies, cluster)
    assert first["metadata"]["annotations"]["gpuwarden.io/profile"] == "light-training"
    first["metadata"]["labels"].update(trial_labels)  # Katib's webhook
    second = mutated(first, classic_policies, cluster)
    assert second == mutated(labeled, classic_policies, cluster)
    assert "gpuwarden.io/mps-thread-percentage" not in second["metadata"]["annotations"]
    assert admit(create(second), classic_policies, cluster).allowed


def test_stale_decision_annotations_are_removed(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    pod = example("pytorchjob-worker")  # heavy-training: exclusive, no thread percentage
    pod["metadata"]["annotations"] = {
        "gpuwarden.io/mps-thread-percentage": "100",
        "example.com/keep": "yes",
    }
    out = mutated(pod, default_policies, cluster)
    assert "gpuwarden.io/mps-thread-percentage" not in out["metadata"]["annotations"]
    assert out["metadata"]["annotations"]["example.com/keep"] == "yes"


def test_reinvocation_across_backends_leaves_no_mps_env() -> None:
    policies = policies_from(
        """
backend: nvidia
profiles:
  - {name: shared, maxMemory: 8Gi, threadPercentage: 50}
  - {name: trial, gpuShare: false, backend: volcano}
workloads: [{name: trials, match: {kind: katib-trial}, profile: trial}]
defaultProfile: shared
tenants: [{name: team, namespaces: [team]}]
"""
    )
    first = mutated(gpu_pod(labels={"job-name": "t"}), policies, ClusterView())
    first["metadata"]["labels"]["katib.kubeflow.org/trial"] = "t"  # Katib's webhook, after ours
    result = admit(create(first), policies, ClusterView())
    assert result.allowed, result.validation.message


def test_a_count_set_by_the_tenant_keeps_the_rule_that_chose_it(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """tenant-a's override gives a 1-GPU train step 8 GPUs; re-admitted, the pod asks for 8, past
    the rule for steps of at most 4 that chose it, and keeps that rule and its priority."""
    once = mutated(example("kfp-train-step"), default_policies, cluster)
    assert container(once, "main")["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert once["metadata"]["annotations"]["gpuwarden.io/rule"] == "rule/kfp-training"
    # kfp-training's class, not kfp-training-node's (which preempts).
    assert (once["spec"]["priority"], once["spec"]["preemptionPolicy"]) == (250, "Never")
    assert mutate(create(once), default_policies, cluster).patch == ()
    assert admit(create(once), default_policies, cluster).allowed
    # `explain` says why the rule holds for a pod past its count.
    placement = place(once, "tenant-a", cluster.labels_for("tenant-a"), default_policies)
    (kept,) = [o for o in placement.outcomes if o.name == "kfp-training"]
    assert kept.result.matched and kept.lost is None
    assert "kept as recorded in gpuwarden.io/rule: tenant tenant-a's override sets the 8 GPUs" in (
        kept.result.reason
    )


def _forged(pod: dict[str, Any], rule: str, profile: str) -> dict[str, Any]:
    pod["metadata"].setdefault("annotations", {}).update(
        {"gpuwarden.io/rule": f"rule/{rule}", "gpuwarden.io/profile": profile}
    )
    return pod


def test_a_recorded_rule_is_kept_only_for_the_count_its_profile_fixes(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """A forged record gets a pod nothing that asking for another count would not."""
    worker = example("pytorchjob-worker")
    worker["metadata"]["namespace"] = "kubeflow-user-carol"
    container(worker, "pytorch")["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    # heavy-training-node sets no count: the record is not what decides.
    out = mutated(
        _forged(worker, "training-jobs-node", "heavy-training-node"), default_policies, cluster
    )
    assert out["metadata"]["annotations"]["gpuwarden.io/profile"] == "heavy-training"
    assert out["spec"]["priority"] == 200
    # tenant-a's kfp-training-node fixes 8 GPUs; a step asking for 1 is not that.
    step = _forged(example("kfp-train-step"), "kfp-training-node", "kfp-training-node")
    out = mutated(step, default_policies, cluster)
    assert out["metadata"]["annotations"]["gpuwarden.io/rule"] == "rule/kfp-training"
    # kfp-training's class, which never preempts; the forged kfp-training-node's does.
    assert (out["spec"]["priority"], out["spec"]["preemptionPolicy"]) == (250, "Never")


def test_a_step_given_the_profiles_one_gpu_keeps_the_rule_that_gave_it(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """A train step that asks for no GPU gets kfp-training's one GPU by name; re-admitted, it
    asks for one and so matches the rule for steps of at most 4 too, yet keeps its rule, and the
    validating webhook allows gpuwarden's own patch."""
    step = example("kfp-train-step")
    step["metadata"]["namespace"] = "kubeflow-user-carol"
    del container(step, "main")["resources"]
    once = mutated(step, default_policies, cluster)
    assert container(once, "main")["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert once["metadata"]["annotations"]["gpuwarden.io/rule"] == "rule/kfp-training-by-name"
    assert mutate(create(once), default_policies, cluster).patch == ()
    result = admit(create(once), default_policies, cluster)
    assert result.allowed, result.validation.message
    labels = cluster.labels_for("kubeflow-user-carol")
    placement = place(once, "kubeflow-user-carol", labels, default_policies)
    (kept,) = [o for o in placement.outcomes if o.name == "kfp-training-by-name"]
    assert "kept as recorded in gpuwarden.io/rule: it asks for the 1 GPU(s) profile " in (
        kept.result.reason
    )


def test_a_forged_record_never_chooses_what_asking_for_no_gpu_would_not(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """kfp-training-node (which preempts) fixes no count for this tenant, and a step that asks
    for no GPU would not get it: a forged record of it on a 1-GPU step is not honoured."""
    step = example("kfp-train-step")
    step["metadata"]["namespace"] = "kubeflow-user-carol"
    container(step, "main")["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    out = mutated(
        _forged(step, "kfp-training-node", "kfp-training-node"), default_policies, cluster
    )
    assert out["metadata"]["annotations"]["gpuwarden.io/rule"] == "rule/kfp-training"
    assert out["metadata"]["annotations"]["gpuwarden.io/profile"] == "kfp-training"
    assert (out["spec"]["priority"], out["spec"]["preemptionPolicy"]) == (250, "Never")
