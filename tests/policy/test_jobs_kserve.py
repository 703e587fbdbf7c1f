"""KServe InferenceServices and LLMInferenceServices admitted at submit (issue 30): each
component decided as the pod KServe will create from it, refused with the component's message,
the pod's patch written back onto the fields that make the pod."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.commands.review import review_for
from gpuwarden.policy import AdmissionRequest, ClusterView, PolicySet, admit
from gpuwarden.policy.admission.jobs import JobAdmission, admit_job
from gpuwarden.policy.admission.twins import twin_patch
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.pod.jobs import kserve
from gpuwarden.policy.pod.workloads import identify
from gpuwarden.policy.render.scope import job_needs_review

from .support import EXAMPLES, read_yaml
from .test_jobs_cli import DRY_RUN, run

ISVC_FILE = EXAMPLES / "jobs" / "inferenceservice.yaml"
LLMISVC_FILE = EXAMPLES / "jobs" / "llminferenceservice.yaml"
GPU = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}


def isvc() -> dict[str, Any]:
    found: dict[str, Any] = read_yaml(ISVC_FILE)
    return found


def llmisvc() -> dict[str, Any]:
    found: dict[str, Any] = read_yaml(LLMISVC_FILE)
    return found


def with_model_gpus(obj: dict[str, Any], gpus: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    resources = obj["spec"]["predictor"]["model"]["resources"]
    resources["limits"]["nvidia.com/gpu"] = resources["requests"]["nvidia.com/gpu"] = gpus
    return obj


def admitted(obj: dict[str, Any], policies: PolicySet, cluster: ClusterView) -> JobAdmission:
    return admit_job(
        AdmissionRequest("CREATE", obj["metadata"]["namespace"], obj), policies, cluster
    )


def replica(obj: dict[str, Any], name: str) -> jobs.ReplicaTemplate:
    return next(r for r in jobs.replica_templates(obj) if r.name == name)


def pod_of(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return jobs.replica_pod(obj, replica(obj, name), obj["metadata"]["namespace"])


# --- InferenceService -------------------------------------------------------------------------


def test_an_over_limit_predictor_is_refused_with_the_components_message(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    obj = with_model_gpus(isvc(), "8")
    result = admitted(obj, default_policies, cluster)
    assert not result.allowed
    assert result.validation.message.startswith(
        "predictor: gpuwarden denied the pod: container kserve-container asks for 8 GPUs"
    )
    # The predictor's pod, as KServe creates it, gets the very same denial, which names the
    # pod's container where the InferenceService's message names the field to change.
    alone = admit(
        AdmissionRequest("CREATE", "tenant-b", pod_of(obj, "predictor")), default_policies, cluster
    )
    assert "ask for at most 2 in spec.containers[kserve-container].resources" in (
        alone.validation.message
    )
    assert result.validation.message == "predictor: " + alone.validation.message.replace(
        "spec.containers[kserve-container]", "spec.predictor.model"
    )


def test_the_predicted_predictor_pod_is_what_kserve_builds(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """predictor.go buildObjectMeta and buildPodSpec: the object's and the predictor's labels and
    annotations, KServe's own labels, the model container named kserve-container, then the
    predictor's transformer-container and its other containers."""
    obj = isvc()
    obj["metadata"]["labels"] = {"team": "nlp", "tier": "gold"}
    predictor = obj["spec"]["predictor"]
    predictor["labels"] = {"tier": "platinum"}
    predictor["annotations"] = {"note": "x"}
    predictor["containers"] = [
        {"name": "sidecar", "image": "s"},
        {"name": "transformer-container", "image": "t"},
    ]
    pod = pod_of(obj, "predictor")
    assert pod["metadata"]["labels"] == {
        "team": "nlp",
        "tier": "platinum",
        "serving.kserve.io/inferenceservice": "llama-chat",
        "component": "predictor",
        "app": "isvc.llama-chat-predictor",
    }
    assert pod["metadata"]["annotations"] == {
        "serving.kserve.io/deploymentMode": "Standard",
        "note": "x",
    }
    assert pod["metadata"]["generateName"] == "llama-chat-predictor-"
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["kserve-container", "transformer-container", "sidecar"]
    model = pod["spec"]["containers"][0]
    assert set(model) == {"name", "args", "resources"}  # not modelFormat, storageUri
    assert "minReplicas" not in pod["spec"] and "labels" not in pod["spec"]
    workload = identify(pod)
    assert workload is not None
    assert (workload.kind, workload.name, workload.container) == (
        "kserve-predictor",
        "llama-chat",
        "kserve-container",
    )


def test_an_allowed_standard_isvc_carries_what_its_pods_will_get(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    result = admitted(isvc(), default_policies, cluster)
    assert result.allowed
    predictor = result.pod["spec"]["predictor"]
    limits = predictor["model"]["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits and limits["volcano.sh/vgpu-number"] == "1"
    assert predictor["schedulerName"] == "volcano"
    assert predictor["annotations"]["gpuwarden.io/profile"] == "inference"
    assert predictor["model"]["modelFormat"] == {"name": "huggingface"}  # untouched
    assert "annotations" not in result.pod["metadata"] or result.pod["metadata"]["annotations"] == {
        "serving.kserve.io/deploymentMode": "Standard"
    }
    # The pod KServe builds from the stored object needs nothing more from the pod webhook.
    again = admit(
        AdmissionRequest("CREATE", "tenant-b", pod_of(dict(result.pod), "predictor")),
        default_policies,
        cluster,
    )
    assert again.allowed and again.mutation.patch == ()
    assert "gpuwarden: predictor: profile inference via rule/kserve-predictors" in " ".join(
        result.mutation.warnings
    )


def test_a_predictor_of_containers_is_written_back_onto_them(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """A predictor of containers (no model): KServe's defaulter names its only container
    kserve-container (predictor_custom.go, Default), so the pod's is; the pod's patch lands on
    spec.predictor.containers, whose name stays as written."""
    obj = isvc()
    predictor = obj["spec"]["predictor"]
    model = predictor.pop("model")
    predictor["containers"] = [{"name": "main", "image": "m", "resources": model["resources"]}]
    (container,) = pod_of(obj, "predictor")["spec"]["containers"]
    assert container["name"] == "kserve-container"
    result = admitted(obj, default_policies, cluster)
    assert result.allowed
    (server,) = result.pod["spec"]["predictor"]["containers"]
    assert server["name"] == "main"
    assert server["resources"]["limits"]["volcano.sh/vgpu-number"] == "1"
    assert result.pod["spec"]["predictor"]["annotations"]["gpuwarden.io/containers"] == (
        "kserve-container"
    )
    assert all(op["path"].startswith("/spec/predictor/") for op in result.mutation.patch)
    # Two containers keep their names (the defaulter names only an unnamed first one).
    predictor["containers"].append({"name": "proxy", "image": "p"})
    names = [c["name"] for c in pod_of(obj, "predictor")["spec"]["containers"]]
    assert names == ["main", "proxy"]


def test_knative_mode_is_judged_but_kept_as_written(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """Knative's webhook refuses schedulerName and friends without its feature flags: the
    object stays as written, the warnings say what the pods get, over-limit is still refused."""
    for mode in (None, "Knative", "Serverless"):
        obj = isvc()
        if mode is None:
            del obj["metadata"]["annotations"]
        else:
            obj["metadata"]["annotations"][kserve.DEPLOYMENT_MODE] = mode
        result = admitted(obj, default_policies, cluster)
        assert result.allowed and result.mutation.patch == () and result.pod == obj
        assert any(
            w.startswith("gpuwarden: the InferenceService is kept as written: Knative mode refuses")
            for w in result.mutation.warnings
        )
        assert not admitted(with_model_gpus(obj, "8"), default_policies, cluster).allowed


def test_the_workers_share_the_predictors_labels_and_annotations(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """spec.predictor.workerSpec: its own PodSpec, the predictor's labels and annotations. The
    two pods get different gpuwarden.io/containers there, so the object cannot carry both: it is
    judged and kept as written, and the pod webhook gives each pod its own."""
    obj = isvc()
    obj["spec"]["predictor"]["workerSpec"] = {
        "tensorParallelSize": 2,
        "containers": [{"name": "worker-container", "image": "w", "resources": GPU}],
    }
    assert pod_of(obj, "worker")["metadata"]["labels"]["component"] == "predictor"
    result = admitted(obj, default_policies, cluster)
    assert [r.replica.name for r in result.replicas] == ["predictor", "worker"]
    assert result.allowed and result.mutation.patch == () and result.pod == obj
    assert result.mutation.warnings[0] == (
        "gpuwarden: the InferenceService is kept as written: predictor, worker pods differ in "
        "spec.predictor.annotations"
    )


def test_an_llm_leader_without_gpus_keeps_its_shared_metadata_clean(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """A CPU leader and GPU workers share spec.annotations: writing the workers' gpuwarden
    annotations there would put them on the leader's pods too, which the validation then
    refuses (only gpuwarden writes them, and it gives the leader no profile). The object is
    kept as written and stays valid."""
    obj = llmisvc()
    obj["spec"]["template"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    obj["spec"]["worker"] = {"containers": [{"name": "main", "resources": GPU}]}
    result = admitted(obj, default_policies, cluster)
    assert result.allowed and result.mutation.patch == ()
    assert result.mutation.warnings[0].endswith("leader, worker pods differ in spec.annotations")
    assert admitted(dict(result.pod), default_policies, cluster).validation.allowed


def test_transformer_and_explainer_are_replicas(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    obj = isvc()
    obj["spec"]["transformer"] = {"containers": [{"name": "kserve-container", "image": "t"}]}
    obj["spec"]["explainer"] = {
        "containers": [{"name": "kserve-container", "image": "e", "resources": GPU}]
    }
    names = [r.name for r in jobs.replica_templates(obj)]
    assert names == ["predictor", "transformer", "explainer"]
    explainer = pod_of(obj, "explainer")
    assert explainer["metadata"]["labels"]["component"] == "explainer"
    assert explainer["metadata"]["generateName"] == "llama-chat-explainer-"
    over = copy.deepcopy(obj)
    over["spec"]["explainer"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "16"}}
    denied = admitted(over, default_policies, cluster)
    assert denied.validation.message.startswith("explainer: gpuwarden denied the pod: ")
    # The ART shorthand (explainer_art.go) holds the explainer's container fields.
    art = copy.deepcopy(obj)
    art["spec"]["explainer"] = {"art": {"type": "SquareAttack", "resources": GPU}}
    (container,) = pod_of(art, "explainer")["spec"]["containers"]
    assert container == {"resources": GPU, "name": "kserve-container"}
    assert job_needs_review(art)


def test_modelmesh_services_are_decided_pod_by_pod(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    obj = with_model_gpus(isvc(), "8")
    obj["metadata"]["annotations"][kserve.DEPLOYMENT_MODE] = "ModelMesh"
    assert jobs.replica_templates(obj) == ()
    assert admitted(obj, default_policies, cluster).allowed


def test_the_job_scope_sends_gpu_services_only() -> None:
    obj = isvc()
    assert job_needs_review(obj)
    cpu = copy.deepcopy(obj)
    cpu["spec"]["predictor"]["model"]["resources"] = {"limits": {"cpu": "1"}}
    assert not job_needs_review(cpu)
    marked = copy.deepcopy(cpu)
    marked["spec"]["predictor"]["labels"] = {"gpuwarden.io/profile": "inference"}
    assert job_needs_review(marked)
    framework = copy.deepcopy(cpu)
    framework["spec"]["predictor"] = {"pytorch": {"resources": GPU}}
    assert job_needs_review(framework)
    llm = llmisvc()
    assert job_needs_review(llm)
    llm["spec"]["template"]["containers"][0]["resources"] = {}
    assert not job_needs_review(llm)
    llm["spec"]["labels"] = {"gpuwarden.io/profile": "inference"}
    assert job_needs_review(llm)
    # As in the CEL, the workload's labels are looked at only where it has a template.
    del llm["spec"]["template"]
    assert not job_needs_review(llm)


# --- LLMInferenceService ----------------------------------------------------------------------


def test_an_llm_service_template_is_mutated_in_place(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    obj = llmisvc()
    pod = pod_of(obj, "main")
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/component": "llminferenceservice-workload",
        "app.kubernetes.io/name": "qwen-chat",
        "app.kubernetes.io/part-of": "llminferenceservice",
        "kserve.io/component": "workload",
        "llm-d.ai/role": "both",
    }
    assert pod["metadata"]["generateName"] == "qwen-chat-kserve-"
    result = admitted(obj, default_policies, cluster)
    assert result.allowed
    stored = dict(result.pod)
    assert stored["spec"]["template"]["schedulerName"] == "volcano"
    assert stored["spec"]["annotations"]["gpuwarden.io/profile"] == "inference-whole"
    again = admit(
        AdmissionRequest("CREATE", "tenant-b", pod_of(stored, "main")), default_policies, cluster
    )
    assert again.mutation.patch == ()


def test_llm_multi_node_and_prefill_replicas_are_labelled_as_kserve_labels_them(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """workload_multi_node.go and workload_single_node.go: leader, worker and prefill pods."""
    obj = llmisvc()
    obj["spec"]["worker"] = {"containers": [{"name": "main", "resources": GPU}]}
    obj["spec"]["prefill"] = {"template": {"containers": [{"name": "main", "resources": GPU}]}}
    assert [r.name for r in jobs.replica_templates(obj)] == ["leader", "worker", "prefill"]
    components = {
        name: pod_of(obj, name)["metadata"]["labels"] for name in ("leader", "worker", "prefill")
    }
    assert components["leader"]["app.kubernetes.io/component"] == (
        "llminferenceservice-workload-leader"
    )
    assert components["leader"]["llm-d.ai/role"] == "decode"
    assert "kserve.io/component" not in components["worker"]
    assert components["prefill"]["llm-d.ai/role"] == "prefill"
    assert pod_of(obj, "worker")["metadata"]["generateName"] == "qwen-chat-kserve-mn-"
    for labels in components.values():
        assert identify({"metadata": {"labels": labels}}) is not None
    over = copy.deepcopy(obj)
    over["spec"]["prefill"]["template"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "16"}
    }
    denied = admitted(over, default_policies, cluster)
    assert denied.validation.message.startswith("prefill: gpuwarden denied the pod: ")


def test_both_served_llm_versions_are_read() -> None:
    obj = llmisvc()
    obj["apiVersion"] = "serving.kserve.io/v1alpha1"
    kind = jobs.job_kind(obj)
    assert kind is not None and kind.version == "v1alpha1"
    assert [r.name for r in jobs.replica_templates(obj)] == ["main"]


# --- the CLI ----------------------------------------------------------------------------------


def test_apply_explain_and_review_take_inference_services(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "apply", *DRY_RUN, "-o", "pods", str(ISVC_FILE))
    assert code == 0, err
    assert (
        "tenant-b/llama-chat predictor: allowed (profile inference via rule/kserve-predictors)"
        in err
    )
    (pod,) = yaml.safe_load_all(out)
    assert pod["metadata"]["generateName"] == "llama-chat-predictor-"
    assert pod["metadata"]["labels"]["serving.kserve.io/inferenceservice"] == "llama-chat"
    over = tmp_path / "over.yaml"
    over.write_text(yaml.safe_dump(with_model_gpus(isvc(), "8")))
    code, out, _ = run(capsys, "explain", *DRY_RUN, str(over))
    assert code == 1
    assert "InferenceService tenant-b/llama-chat" in out
    assert "  replica predictor: pod llama-chat-predictor-<random>\n" in out
    assert "  verdict:  denied: predictor: gpuwarden denied the pod: " in out
    request = review_for(isvc(), "isvc.yaml", None)["request"]
    assert request["kind"] == {
        "group": "serving.kserve.io",
        "version": "v1beta1",
        "kind": "InferenceService",
    }
    assert request["resource"]["resource"] == "inferenceservices"
    code, out, err = run(capsys, "apply", *DRY_RUN, str(LLMISVC_FILE))
    assert code == 0, err
    assert "tenant-b/qwen-chat main: allowed" in err
    assert yaml.safe_load(out)["spec"]["template"]["schedulerName"] == "volcano"
    llm = llmisvc()
    llm["apiVersion"] = "serving.kserve.io/v1alpha1"
    request = review_for(llm, "llm.yaml", None)["request"]
    assert request["kind"]["version"] == "v1alpha1"
    assert request["resource"]["resource"] == "llminferenceservices"


def test_an_update_is_judged_again_only_when_a_component_changes(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    """KServe's controller adds finalizers and status to a stored object: not judged again (a
    tightened policy must not block its updates); a new model resource is."""
    stored = dict(admitted(isvc(), default_policies, cluster).pod)
    finalized = copy.deepcopy(stored)
    finalized["metadata"]["finalizers"] = ["inferenceservice.finalizers"]
    update = AdmissionRequest("UPDATE", "tenant-b", finalized, old_pod=stored)
    result = admit_job(update, default_policies, cluster)
    assert result.replicas == () and result.allowed
    grown = copy.deepcopy(stored)
    grown["spec"]["predictor"]["model"]["resources"]["limits"]["nvidia.com/gpu"] = "8"
    update = AdmissionRequest("UPDATE", "tenant-b", grown, old_pod=stored)
    result = admit_job(update, default_policies, cluster)
    assert [r.replica.name for r in result.replicas] == ["predictor"]
    assert result.validation.message.startswith("predictor: gpuwarden denied the pod: ")


def test_twin_patch_creates_parents_merges_maps_and_names_what_has_no_twin() -> None:
    job = {"spec": {"predictor": {"model": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}}}
    twins = (
        ("/metadata/annotations", "/spec/predictor/annotations"),
        ("/metadata/labels", "/spec/predictor/labels"),
        ("/spec/containers/0", "/spec/predictor/model"),
        ("/spec", "/spec/predictor"),
    )
    pod_patch = [
        {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"},
        {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1"}},
        {"op": "add", "path": "/metadata/annotations/c", "value": "2"},
        {"op": "add", "path": "/metadata/annotations", "value": {"d": "3"}},
        {"op": "replace", "path": "/spec/schedulerName", "value": "volcano"},
        {"op": "remove", "path": "/metadata/annotations/from-the-object"},
        {"op": "add", "path": "/metadata/labels/x", "value": "y"},
        {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
    ]
    ops, lost = twin_patch(job, twins, pod_patch)
    assert ops == [
        {"op": "remove", "path": "/spec/predictor/model/resources/limits/nvidia.com~1gpu"},
        {"op": "add", "path": "/spec/predictor/annotations", "value": {"a/b": "1"}},
        {"op": "add", "path": "/spec/predictor/annotations/c", "value": "2"},
        {"op": "add", "path": "/spec/predictor/annotations/d", "value": "3"},
        {"op": "add", "path": "/spec/predictor/schedulerName", "value": "volcano"},
        {"op": "add", "path": "/spec/predictor/labels", "value": {}},
        {"op": "add", "path": "/spec/predictor/labels/x", "value": "y"},
    ]
    assert lost == ["/metadata/annotations/from-the-object", "/metadata/finalizers"]
