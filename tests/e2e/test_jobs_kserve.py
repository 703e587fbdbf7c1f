"""KServe InferenceServices and LLMInferenceServices governed at submit, through the real API
server (issue 30).

The CRDs are minimal structural ones with KServe's real group, versions, kinds and plurals
(pkg/apis/serving/v1beta1/inference_service.go; v1alpha1 and v1alpha2
llm_inference_service_types.go, v1alpha2 the storage version) whose spec keeps any fields
(``x-kubernetes-preserve-unknown-fields``): KServe's own CRDs type every field, which nothing here
needs, and their conversion webhook is KServe's. KServe's controller (which needs Knative, or
cert-manager in Standard mode) is not run: what its pods would be is what
`gpuwarden/policy/pod/jobs/kserve.py` predicts from its source.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.gpuwardenserver import POLICIES_DIR
from gpuwarden.lab.cluster.webhookstack import (
    KUBEFLOW_PROFILE_LABELS,
    Obj,
    WebhookStack,
    parse_warning,
)
from gpuwarden.policy.render.scope import job_needs_review

from .controlplane import REPO_ROOT
from .test_jobs import keeping_crd, predicted
from .webhook import api_error, serve_crd

GROUP = "serving.kserve.io"
ISVC = ("v1beta1", "inferenceservices")
LLMISVC = ("v1alpha2", "llminferenceservices")
ISVC_FILE = REPO_ROOT / "examples" / "jobs" / "inferenceservice.yaml"
LLMISVC_FILE = REPO_ROOT / "examples" / "jobs" / "llminferenceservice.yaml"
GITOPS_POLICY = Path(__file__).parent / "policies" / "01-e2e-gitops.yaml"


@pytest.fixture(scope="module")
def gpuwarden_policies() -> Sequence[Path]:
    return (GITOPS_POLICY, POLICIES_DIR)


@pytest.fixture(scope="module")
def kserve(gpuwarden: WebhookStack) -> Iterator[k8s_client.CustomObjectsApi]:
    """The InferenceService and LLMInferenceService CRDs, established and served."""
    extensions = k8s_client.ApiextensionsV1Api(gpuwarden.api)
    crds = (
        keeping_crd("InferenceService", ISVC[1], "v1beta1", GROUP),
        keeping_crd("LLMInferenceService", LLMISVC[1], ("v1alpha1", "v1alpha2"), GROUP),
    )
    for crd in crds:
        objects = serve_crd(gpuwarden.api, crd)
    yield objects
    for crd in crds:
        extensions.delete_custom_resource_definition(crd["metadata"]["name"])


def isvc_in(namespace: str, *, gpus: str = "1", mode: str | None = "Standard") -> Obj:
    obj: Obj = yaml.safe_load(ISVC_FILE.read_text())
    obj["metadata"]["namespace"] = namespace
    obj["metadata"]["name"] = f"llama-{uuid.uuid4().hex[:6]}"
    if mode is None:
        del obj["metadata"]["annotations"]
    else:
        obj["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] = mode
    resources = obj["spec"]["predictor"]["model"]["resources"]
    resources["limits"]["nvidia.com/gpu"] = resources["requests"]["nvidia.com/gpu"] = gpus
    return obj


def create(
    objects: k8s_client.CustomObjectsApi, obj: Obj, version_plural: tuple[str, str] = ISVC
) -> tuple[Obj, tuple[str, ...]]:
    """POST the object; the stored object and the response's warnings."""
    version, plural = version_plural
    response: Any = objects.create_namespaced_custom_object(
        GROUP, version, obj["metadata"]["namespace"], plural, obj, _preload_content=False
    )
    warnings = tuple(parse_warning(h) for h in response.headers.getlist("Warning"))
    return json.loads(response.data), warnings


def test_an_over_limit_isvc_is_refused_with_the_predictors_message(
    gpuwarden: WebhookStack, kserve: k8s_client.CustomObjectsApi
) -> None:
    ns = gpuwarden.tenant_namespace(name="tenant-b")
    obj = isvc_in(ns, gpus="8")
    with pytest.raises(ApiException) as refused:
        create(kserve, obj)
    status, text = api_error(refused.value)
    assert status == 403
    assert 'admission webhook "validate-jobs.gpuwarden.io" denied the request: predictor: ' in text
    assert "container kserve-container asks for 8 GPUs" in text
    assert text.endswith(predicted(gpuwarden, obj).validation.message)
    with pytest.raises(ApiException) as missing:
        kserve.get_namespaced_custom_object(GROUP, *ISVC[:1], ns, ISVC[1], obj["metadata"]["name"])
    assert missing.value.status == 404


def test_an_allowed_isvc_is_stored_mutated_as_predicted(
    gpuwarden: WebhookStack, kserve: k8s_client.CustomObjectsApi
) -> None:
    ns = gpuwarden.tenant_namespace(name="tenant-b")
    obj = isvc_in(ns)
    stored, warnings = create(kserve, copy.deepcopy(obj))
    expected = predicted(gpuwarden, obj)
    assert expected.allowed
    assert stored["spec"] == expected.pod["spec"]  # field for field what apply predicts
    predictor = stored["spec"]["predictor"]
    assert predictor["schedulerName"] == "volcano"
    assert predictor["model"]["resources"]["limits"]["volcano.sh/vgpu-number"] == "1"
    assert predictor["annotations"]["gpuwarden.io/profile"] == "inference"
    assert stored["metadata"]["annotations"] == obj["metadata"]["annotations"]
    assert any(
        w.startswith("gpuwarden: predictor: kserve-container: 1 shared GPU") for w in warnings
    )


def test_a_knative_isvc_and_a_gitops_tenants_are_kept_byte_identical(
    gpuwarden: WebhookStack, kserve: k8s_client.CustomObjectsApi
) -> None:
    """Knative mode (no deploymentMode annotation) and a jobTemplates: keep tenant: the stored
    spec is the submitted one, the warnings say what the pods will get; over the limit is still
    refused."""
    knative = isvc_in(gpuwarden.tenant_namespace(name="tenant-b"), mode=None)
    gitops_ns = gpuwarden.tenant_namespace(
        "e2e-gitops", {**KUBEFLOW_PROFILE_LABELS, "e2e.gpuwarden.io/tenant": "gitops"}
    )
    gitops = isvc_in(gitops_ns)
    for obj, note in (
        (knative, "gpuwarden: the InferenceService is kept as written: Knative mode refuses"),
        (gitops, "gpuwarden: the InferenceService is kept as written (tenant jobTemplates: keep)"),
    ):
        stored, warnings = create(kserve, copy.deepcopy(obj))
        assert stored["spec"] == obj["spec"]
        assert stored["metadata"].get("annotations") == obj["metadata"].get("annotations")
        assert any(w.startswith(note) for w in warnings), warnings
    with pytest.raises(ApiException) as refused:
        create(kserve, isvc_in(gitops_ns, gpus="8"))
    assert (
        "denied the request: predictor: gpuwarden denied the pod: " in api_error(refused.value)[1]
    )


def test_an_llm_service_is_stored_mutated_as_predicted_in_either_version(
    gpuwarden: WebhookStack, kserve: k8s_client.CustomObjectsApi
) -> None:
    ns = gpuwarden.tenant_namespace(name="tenant-b")
    for version in ("v1alpha2", "v1alpha1"):
        obj: Obj = yaml.safe_load(LLMISVC_FILE.read_text())
        obj["apiVersion"] = f"{GROUP}/{version}"
        obj["metadata"] = {"name": f"qwen-{uuid.uuid4().hex[:6]}", "namespace": ns}
        stored, _ = create(kserve, copy.deepcopy(obj), (version, LLMISVC[1]))
        expected = predicted(gpuwarden, obj)
        assert expected.allowed
        assert stored["spec"] == expected.pod["spec"]
        assert stored["spec"]["template"]["schedulerName"] == "volcano"
        assert stored["spec"]["annotations"]["gpuwarden.io/profile"] == "inference-whole"


def test_the_api_server_sends_the_services_the_twin_says(
    gpuwarden: WebhookStack, kserve: k8s_client.CustomObjectsApi
) -> None:
    """The chart's job CEL against its Python twin: a CPU predictor never reaches gpuwarden, a
    GPU one and one carrying gpuwarden's labels do."""
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    cpu = isvc_in(ns)
    cpu["spec"]["predictor"]["model"]["resources"] = {"limits": {"cpu": "1"}}
    marked = copy.deepcopy(cpu)
    marked["metadata"]["name"] += "-marked"
    marked["spec"]["predictor"]["labels"] = {"gpuwarden.io/profile": "inference"}
    framework = isvc_in(ns)
    framework["spec"]["predictor"] = {"pytorch": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}
    llm: Obj = yaml.safe_load(LLMISVC_FILE.read_text())
    llm["metadata"] = {"name": f"qwen-{uuid.uuid4().hex[:6]}", "namespace": ns}
    llm_cpu = copy.deepcopy(llm)
    llm_cpu["metadata"]["name"] += "-cpu"
    llm_cpu["spec"]["template"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    llm_worker = copy.deepcopy(llm_cpu)
    llm_worker["metadata"]["name"] += "-worker"
    llm_worker["spec"]["worker"] = {
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    }
    llm_bare = copy.deepcopy(llm_cpu)
    llm_bare["metadata"]["name"] += "-bare"
    del llm_bare["spec"]["template"]
    llm_bare["spec"]["labels"] = {"gpuwarden.io/profile": "inference"}
    cases: list[tuple[Obj, tuple[str, str], bool]] = [
        (cpu, ISVC, False),
        (isvc_in(ns), ISVC, True),
        (marked, ISVC, True),
        (framework, ISVC, True),
        (llm_cpu, LLMISVC, False),
        (llm, LLMISVC, True),
        (llm_worker, LLMISVC, True),
        (llm_bare, LLMISVC, False),  # labels without a template of its own: the pods decide
    ]
    for obj, version_plural, sent in cases:
        assert job_needs_review(obj) is sent
        before = gpuwarden.server.requests_answered(endpoint="mutate")
        create(kserve, obj, version_plural)
        after = gpuwarden.server.requests_answered(endpoint="mutate")
        assert after - before == (1 if sent else 0), obj["metadata"]["name"]
