"""Pods created through the real API server come back mutated, denied or untouched.

gpuwarden serve runs as a subprocess; the API server reaches it through the webhook
configurations the Helm chart renders. Every pod here is created with the kubernetes client (or
the real kubectl) and judged by what the API server returns and stores. Expectations come from
the policy core run on the same pod with the namespace's real labels, plus literal values that a
user of the default policies would check by hand.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.gpuwardenserver import (
    POLICIES_DIR,
    wait_for,
)
from gpuwarden.lab.cluster.webhookstack import (
    KUBEFLOW_PROFILE_LABELS,
    RELEASE_NAMESPACE,
    Obj,
    WebhookStack,
    api_defaults,
    create_namespace,
    create_pod,
    gpu_probe_pod,
    pod_annotations,
    webhook_names,
)
from gpuwarden.policy import Admission, AdmissionRequest, ClusterView, validate
from gpuwarden.policy.pod.quantity import parse_quantity

from .controlplane import ControlPlane
from .webhook import (
    KUBEFLOW_EXAMPLES,
    POLICY_TEST_PODS,
    AuditLog,
    api_error,
    comparable_spec,
    example_pod,
    exception_warnings,
    load_pod,
    place_pod,
    plain_pod,
    pod_exists,
    pod_labels,
    read_pod,
    scheduler_name,
    webhook_audit,
)

GPUWARDEN_PREFIX = "gpuwarden.io/"
MUTATION_AUDIT = "mutation.webhook.admission.k8s.io"


MPS_POLICY = Path(__file__).parent / "policies" / "00-e2e-mps.yaml"
MPS_TENANT_LABELS = {**KUBEFLOW_PROFILE_LABELS, "e2e.gpuwarden.io/tenant": "mps"}


@pytest.fixture(scope="module")
def gpuwarden_policies() -> Sequence[Path]:
    """The default policies, plus an MPS tenant (backend nvidia) for env and gpu.shared."""
    return (MPS_POLICY, POLICIES_DIR)


@pytest.fixture(scope="module")
def kubeflow_ns(gpuwarden: WebhookStack) -> str:
    """A Kubeflow profile namespace (generic tenant kubeflow-profiles), known to the webhook."""
    return gpuwarden.tenant_namespace("e2e-kf")


def _ours(pod: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for k, v in pod_annotations(pod).items() if k.startswith(GPUWARDEN_PREFIX)}


def assert_matches_policy_core(stored: Mapping[str, Any], expected: Admission) -> None:
    """The stored pod carries exactly the mutation the policy core computes for it."""
    want = expected.pod
    assert comparable_spec(stored) == comparable_spec(want)
    assert pod_annotations(stored) == pod_annotations(want)
    assert pod_labels(stored) == pod_labels(want)
    assert stored["metadata"].get("ownerReferences") == want["metadata"].get("ownerReferences")


def assert_priority_consistent(stored: Mapping[str, Any], stack: WebhookStack) -> None:
    """spec.priority and preemptionPolicy agree with the PriorityClass the pod names."""
    spec = stored["spec"]
    name = spec.get("priorityClassName")
    if name is None:
        # No class and no globalDefault class: the Priority plugin sets 0.
        assert spec.get("priority", 0) == 0
        return
    cls = k8s_client.SchedulingV1Api(stack.api).read_priority_class(name)
    assert spec["priority"] == cls.value
    assert spec["preemptionPolicy"] == (cls.preemption_policy or "PreemptLowerPriority")


@dataclass(frozen=True)
class Literal:
    """What a user of policies/default.yaml sees on the pod in a Kubeflow profile namespace."""

    profile: str
    container: str
    gpu: Mapping[str, str]  # resource -> quantity, on both requests and limits
    priority_class: str
    priority: int
    preemption: str
    extra_annotations: Mapping[str, str] = field(default_factory=dict)
    # Env entries of the original pod that must survive the mutation.
    kept_env: tuple[str, ...] = ()


LITERALS: Mapping[str, Literal | None] = {
    "kfp-train-step": Literal(
        "kfp-training",
        "main",
        {"nvidia.com/gpu": "1"},
        "gpuwarden-kfp-training",
        250,
        "Never",
        {"gpuwarden.io/gpu-count": "1"},
        kept_env=("ARGO_CONTAINER_NAME", "KFP_POD_NAME", "KFP_POD_UID"),
    ),
    "kfp-driver": None,
    "pytorchjob-worker": Literal(
        "heavy-training",
        "pytorch",
        {"nvidia.com/gpu": "1"},
        "gpuwarden-heavy-training",
        200,
        "PreemptLowerPriority",
        {"gpuwarden.io/gpu-memory-limit": "80Gi"},
        kept_env=("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK", "PYTHONUNBUFFERED"),
    ),
    "trainjob-node": Literal(
        "heavy-training",
        "node",
        {"nvidia.com/gpu": "1"},
        "gpuwarden-heavy-training",
        200,
        "PreemptLowerPriority",
        kept_env=("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR"),
    ),
    "katib-trial": Literal(
        "batch-hpo",
        "training-container",
        {
            "volcano.sh/vgpu-number": "1",
            "volcano.sh/vgpu-memory": "20480",
            "volcano.sh/vgpu-cores": "25",
        },
        "gpuwarden-batch-hpo",
        50,
        "Never",
        {"volcano.sh/preemptable": "true", "gpuwarden.io/preemptible": "true"},
    ),
    "notebook": Literal(
        "notebook",
        "alice-jupyter",
        {
            "volcano.sh/vgpu-number": "1",
            "volcano.sh/vgpu-memory": "15360",
            "volcano.sh/vgpu-cores": "20",
        },
        "gpuwarden-notebook",
        260,
        "PreemptLowerPriority",
        {"gpuwarden.io/gpu-memory-limit": "15Gi", "gpuwarden.io/gpu-shared": "true"},
        kept_env=("NB_PREFIX",),
    ),
    "kserve-predictor": Literal(
        "inference",
        "kserve-container",
        {
            "volcano.sh/vgpu-number": "1",
            "volcano.sh/vgpu-memory": "20480",
            "volcano.sh/vgpu-cores": "33",
        },
        "gpuwarden-inference",
        300,
        "PreemptLowerPriority",
        {"gpuwarden.io/gpu-memory-limit": "20Gi", "gpuwarden.io/gpu-shared": "true"},
        kept_env=("PORT", "STORAGE_URI"),
    ),
}


def _container(pod: Mapping[str, Any], name: str) -> Obj:
    for container in pod["spec"]["containers"]:
        if container["name"] == name:
            return dict(container)
    raise AssertionError(f"no container {name} in {[c['name'] for c in pod['spec']['containers']]}")


def _field_path(env: Mapping[str, Any]) -> str | None:
    ref = (env.get("valueFrom") or {}).get("fieldRef") or {}
    return ref.get("fieldPath")


@pytest.mark.parametrize("kind", KUBEFLOW_EXAMPLES)
def test_kubeflow_pod_comes_back_mutated(
    gpuwarden: WebhookStack, kubeflow_ns: str, audit_log: AuditLog, kind: str
) -> None:
    pod = place_pod(example_pod(kind), kubeflow_ns)
    expected = gpuwarden.expect(pod)
    assert expected.allowed, expected.validation.message

    created = create_pod(gpuwarden.api, pod)

    stored = read_pod(gpuwarden.api, kubeflow_ns, pod["metadata"]["name"])
    assert stored["metadata"]["uid"] == created.pod["metadata"]["uid"]
    assert_matches_policy_core(stored, expected)
    assert_priority_consistent(stored, gpuwarden)
    # Our warnings reach the client as HTTP Warning headers of the create response.
    assert set(expected.warnings) <= set(created.warnings)

    literal = LITERALS[kind]
    spec = stored["spec"]
    if literal is None:
        # A KFP driver is pipeline plumbing: no GPU, no profile, nothing changed.
        assert _ours(stored) == {}
        assert spec["schedulerName"] == "default-scheduler"
        assert "priorityClassName" not in spec
        assert created.warnings == ()
        return
    assert spec["schedulerName"] == "volcano"
    assert spec["priorityClassName"] == literal.priority_class
    assert spec["priority"] == literal.priority
    assert spec["preemptionPolicy"] == literal.preemption
    ours = pod_annotations(stored)
    assert ours["gpuwarden.io/profile"] == literal.profile
    assert ours["gpuwarden.io/tenant"] == "kubeflow-profiles"
    assert ours["gpuwarden.io/containers"] == literal.container
    assert ours["scheduling.volcano.sh/queue-name"] == "default"
    for key, value in literal.extra_annotations.items():
        assert ours[key] == value, key
    container = _container(stored, literal.container)
    for resource, quantity in literal.gpu.items():
        assert container["resources"]["limits"][resource] == quantity, resource
        assert container["resources"]["requests"][resource] == quantity, resource
    if "nvidia.com/gpu" not in literal.gpu:
        # A shared GPU is asked for through the backend's resources only.
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
        assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
    original_env = {e["name"]: e for e in _container(pod, literal.container).get("env") or []}
    stored_env = {e["name"]: e for e in container.get("env") or []}
    for name in literal.kept_env:
        kept, original = stored_env[name], original_env[name]
        assert kept.get("value") == original.get("value"), name
        assert _field_path(kept) == _field_path(original), name
    assert any(w.startswith(f"gpuwarden: profile {literal.profile} via ") for w in created.warnings)

    # The API server's own record: our mutating webhook changed this pod, once.
    event = audit_log.pod_creation(kubeflow_ns, pod["metadata"]["name"])
    rounds = webhook_audit(event, MUTATION_AUDIT)
    ours_called = [r for r in rounds.values() if r.get("configuration") == "gpuwarden"]
    assert [r["mutated"] for r in ours_called] == [True]
    # Our audit annotations, which the API server files under the webhook's name.
    assert event["annotations"]["mutate.gpuwarden.io/profile"] == literal.profile
    assert event["annotations"]["mutate.gpuwarden.io/tenant"] == "kubeflow-profiles"


def test_tenant_overrides_apply_in_tenant_a(gpuwarden: WebhookStack) -> None:
    """tenant-a's override: a KFP training step gets 8 whole GPUs and 64Gi, in queue tenant-a.

    A server-side dry run, so the 640Gi of GPU memory is never charged to the tenant.
    """
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    pod = place_pod(example_pod("kfp-train-step"), ns)
    created = create_pod(gpuwarden.api, pod, dry_run=True)
    main = _container(created.pod, "main")
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert main["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert main["resources"]["limits"]["memory"] == "64Gi"
    assert _container(created.pod, "wait").get("resources") in (None, {})
    assert pod_annotations(created.pod)["scheduling.volcano.sh/queue-name"] == "tenant-a"
    assert pod_annotations(created.pod)["gpuwarden.io/tenant"] == "tenant-a"
    assert created.pod["spec"]["priority"] == 250
    assert created.pod["spec"]["preemptionPolicy"] == "Never"
    assert any("tenant override of gpus, hostMemory" in w for w in created.warnings)
    assert not pod_exists(gpuwarden.api, ns, pod["metadata"]["name"])


@pytest.mark.parametrize(
    ("file", "container", "gpus", "profile"),
    [
        ("pytorchjob-worker-8-gpus.yaml", "pytorch", "8", "heavy-training-node"),
        ("trainjob-node-4-gpus.yaml", "node", "4", "heavy-training"),
    ],
)
def test_a_training_job_keeps_the_gpus_it_asks_for(
    gpuwarden: WebhookStack, file: str, container: str, gpus: str, profile: str
) -> None:
    """heavy-training and heavy-training-node (more than 4 GPUs, ranked above) set no count,
    so torchrun's 8 (or 4) ranks get their 8 (or 4) GPUs.

    In tenant-a (at most 8 GPUs a pod), as a server-side dry run: the API server runs both
    webhooks and returns the pod as it would store it, and the 640Gi of GPU memory an 8-GPU
    worker holds is never charged to the tenant's quota for the tests after this one.
    """
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    pod = place_pod(load_pod(POLICY_TEST_PODS / file), ns)
    expected = gpuwarden.expect(pod)
    assert expected.allowed
    created = create_pod(gpuwarden.api, pod, dry_run=True)
    stored = created.pod
    resources = _container(stored, container)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == gpus
    assert resources["requests"]["nvidia.com/gpu"] == gpus
    assert pod_annotations(stored)["gpuwarden.io/gpu-count"] == gpus
    assert pod_annotations(stored)["gpuwarden.io/profile"] == profile
    assert f"gpuwarden: {container}: {gpus} whole GPU(s) on volcano" in created.warnings
    assert_matches_policy_core(stored, expected)


def test_a_trainer_node_over_the_tenant_limit_is_denied_not_cut(gpuwarden: WebhookStack) -> None:
    """tenant-b allows 2 GPUs a pod: a 4-GPU Trainer node is refused with what to change."""
    ns = gpuwarden.tenant_namespace(name="tenant-b")
    pod = place_pod(load_pod(POLICY_TEST_PODS / "trainjob-node-4-gpus.yaml"), ns)
    with pytest.raises(ApiException) as refused:
        create_pod(gpuwarden.api, pod)
    status, text = api_error(refused.value)
    assert status == 403
    assert (
        "container node asks for 4 GPUs (profile heavy-training, rule/trainer-nodes) but tenant "
        "tenant-b allows at most 2 per pod; ask for at most 2 in spec.containers[node].resources"
    ) in text
    assert not pod_exists(gpuwarden.api, ns, pod["metadata"]["name"])


@pytest.mark.parametrize(
    ("file", "fragment"),
    [
        ("escape-visible-devices.yaml", "spec.containers[app].env[NVIDIA_VISIBLE_DEVICES]"),
        ("privileged-gpu.yaml", "privileged"),
    ],
)
def test_denied_pod_fails_with_our_message(
    gpuwarden: WebhookStack, kubeflow_ns: str, file: str, fragment: str
) -> None:
    pod = place_pod(load_pod(POLICY_TEST_PODS / file), kubeflow_ns)
    expected = gpuwarden.expect(pod)
    assert not expected.allowed
    message = expected.validation.message or expected.mutation.message
    assert fragment in message

    with pytest.raises(ApiException) as refused:
        create_pod(gpuwarden.api, pod)

    status, text = api_error(refused.value)
    assert status == (expected.validation.code if not expected.validation.allowed else 403)
    hooks = webhook_names(gpuwarden.configs, "ValidatingWebhookConfiguration") + webhook_names(
        gpuwarden.configs, "MutatingWebhookConfiguration"
    )
    assert any(f'admission webhook "{hook}" denied the request' in text for hook in hooks), text
    assert message in text
    assert not pod_exists(gpuwarden.api, kubeflow_ns, pod["metadata"]["name"])


def test_kubectl_server_side_dry_run_shows_the_mutation(
    gpuwarden: WebhookStack, control_plane: ControlPlane, kubeflow_ns: str, tmp_path: Path
) -> None:
    pod = place_pod(example_pod("notebook"), kubeflow_ns)
    manifest = tmp_path / "notebook.yaml"
    manifest.write_text(yaml.safe_dump(pod))
    before = gpuwarden.server.requests_answered(endpoint="mutate")

    result = control_plane.kubectl("apply", "--dry-run=server", "-f", str(manifest), "-o", "yaml")

    shown = yaml.safe_load(result.stdout)
    # kubectl apply records what it applied; that annotation is kubectl's, not ours.
    shown["metadata"]["annotations"].pop("kubectl.kubernetes.io/last-applied-configuration")
    expected = gpuwarden.expect(pod)
    assert_matches_policy_core(shown, expected)
    assert shown["spec"]["schedulerName"] == "volcano"
    limits = _container(shown, "alice-jupyter")["resources"]["limits"]
    assert limits["volcano.sh/vgpu-number"] == "1"
    assert "nvidia.com/gpu" not in limits
    # kubectl prints the webhook's Warning headers on stderr.
    printed = [line.removeprefix("Warning: ") for line in result.stderr.splitlines()]
    assert set(expected.warnings) <= set(printed), result.stderr
    # Nothing was stored, and the webhook was told it was a dry run.
    assert not pod_exists(gpuwarden.api, kubeflow_ns, pod["metadata"]["name"])
    assert gpuwarden.server.requests_answered(endpoint="mutate") == before + 1
    calls = gpuwarden.server.awaited_admissions(
        2, namespace=kubeflow_ns, pod=pod["metadata"]["name"]
    )
    assert {(c["endpoint"], c["dry_run"]) for c in calls} == {("mutate", True), ("validate", True)}


# --- scope ----------------------------------------------------------------------------------


@dataclass
class Counted:
    """Admission requests the server answered while the block ran."""

    stack: WebhookStack
    before: float = 0.0
    after: float = 0.0

    @property
    def delta(self) -> float:
        return self.after - self.before


@pytest.fixture
def counted(gpuwarden: WebhookStack) -> Iterator[Counted]:
    count = Counted(gpuwarden, before=gpuwarden.server.requests_answered())
    yield count


def _finish(count: Counted) -> float:
    count.after = count.stack.server.requests_answered()
    return count.delta


def _assert_untouched(
    stack: WebhookStack, stored: Mapping[str, Any], original: Mapping[str, Any]
) -> None:
    """Stored exactly as the API server alone makes it (its defaults, nothing of ours)."""
    assert _ours(stored) == {}
    assert scheduler_name(stored) == "default-scheduler"
    assert "priorityClassName" not in stored["spec"]
    defaulted = api_defaults(stack.api, original)
    assert comparable_spec(stored) == comparable_spec(defaulted)
    assert pod_annotations(stored) == pod_annotations(original)
    assert pod_labels(stored) == pod_labels(original)


@pytest.mark.parametrize("where", ["kube-system", RELEASE_NAMESPACE])
def test_system_namespaces_are_never_sent_to_us(
    gpuwarden: WebhookStack, audit_log: AuditLog, counted: Counted, where: str
) -> None:
    """Even labelled as a Kubeflow profile, kube-system and our own namespace are skipped.

    With the label, both the chart's namespaceSelector.matchLabels and the policies' tenant
    selector match them: only the chart's explicit exclusion keeps their pods from us.
    """
    _, stored_labels = create_namespace(gpuwarden.api, where, name=where)
    k8s_client.CoreV1Api(gpuwarden.api).patch_namespace(
        where, {"metadata": {"labels": dict(KUBEFLOW_PROFILE_LABELS)}}
    )
    assert gpuwarden.policies.tenant_for(where, {**stored_labels, **KUBEFLOW_PROFILE_LABELS})
    pod = gpu_probe_pod(where)
    created = create_pod(gpuwarden.api, pod)
    assert _finish(counted) == 0
    assert gpuwarden.server.admissions(namespace=where) == []
    _assert_untouched(gpuwarden, created.pod, pod)
    event = audit_log.pod_creation(where, pod["metadata"]["name"])
    assert webhook_audit(event, MUTATION_AUDIT) == {}


def test_pod_without_gpu_passes_unchanged(
    gpuwarden: WebhookStack, kubeflow_ns: str, counted: Counted
) -> None:
    pod = plain_pod(kubeflow_ns)
    created = create_pod(gpuwarden.api, pod)
    _assert_untouched(gpuwarden, created.pod, pod)
    assert created.warnings == ()
    assert (
        read_pod(gpuwarden.api, kubeflow_ns, pod["metadata"]["name"])["spec"] == created.pod["spec"]
    )


def test_opt_out_namespace_label(gpuwarden: WebhookStack, counted: Counted) -> None:
    """A Kubeflow profile namespace labelled gpuwarden.io/ignore is left alone entirely."""
    ns, stored_labels = create_namespace(
        gpuwarden.api, "e2e-ignored", {**KUBEFLOW_PROFILE_LABELS, "gpuwarden.io/ignore": "true"}
    )
    # The policies alone would govern it: it is a Kubeflow profile namespace.
    assert gpuwarden.policies.tenant_for(ns, stored_labels) is not None
    for pod in (place_pod(example_pod("notebook"), ns), gpu_probe_pod(ns)):
        created = create_pod(gpuwarden.api, pod)
        _assert_untouched(gpuwarden, created.pod, pod)
        assert created.warnings == ()
    assert _finish(counted) == 0
    assert gpuwarden.server.admissions(namespace=ns) == []


# --- ResourceQuota ----------------------------------------------------------------------------


def _quota_used(api: k8s_client.ApiClient, ns: str, name: str) -> dict[str, Decimal]:
    quota: Any = k8s_client.CoreV1Api(api).read_namespaced_resource_quota(name, ns)
    return {k: parse_quantity(v) for k, v in (quota.status.used or {}).items()}


def _write_quota(api: k8s_client.ApiClient, ns: str, name: str, hard: Mapping[str, str]) -> None:
    """A ResourceQuota, and its status as the (absent) controller-manager would write it."""
    core = k8s_client.CoreV1Api(api)
    core.create_namespaced_resource_quota(
        ns,
        k8s_client.V1ResourceQuota(
            metadata=k8s_client.V1ObjectMeta(name=name),
            spec=k8s_client.V1ResourceQuotaSpec(hard=dict(hard)),
        ),
    )
    quota = core.read_namespaced_resource_quota(name, ns)
    quota.status = k8s_client.V1ResourceQuotaStatus(hard=dict(hard), used=dict.fromkeys(hard, "0"))
    core.replace_namespaced_resource_quota_status(name, ns, quota)


def test_resource_quota_charges_the_mutated_resources(gpuwarden: WebhookStack) -> None:
    """Quota admission runs after our mutation, so it charges what the pod asks for now.

    A whole-GPU pod is charged requests.nvidia.com/gpu; a notebook that asked for nvidia.com/gpu
    and was given a shared slice is charged requests.volcano.sh/vgpu-number and no nvidia.com/gpu
    at all, so a second one is refused for vGPUs while whole GPUs are still free.
    """
    api = gpuwarden.api
    ns = gpuwarden.tenant_namespace("e2e-quota")
    name = "gpus"
    hard = {"requests.nvidia.com/gpu": "3", "requests.volcano.sh/vgpu-number": "1"}
    _write_quota(api, ns, name, hard)

    eight = place_pod(load_pod(POLICY_TEST_PODS / "pytorchjob-worker-8-gpus.yaml"), ns)

    def refused_for_quota() -> str | None:
        try:
            create_pod(api, eight, dry_run=True)
        except ApiException as exc:
            status, text = api_error(exc)
            return text if status == 403 and "exceeded quota" in text else None
        return None

    # The quota admission plugin reads quotas from its own cache: wait until it enforces ours.
    text = wait_for("the ResourceQuota to be enforced", refused_for_quota)
    assert "requested: requests.nvidia.com/gpu=8" in text
    assert "limited: requests.nvidia.com/gpu=3" in text

    create_pod(api, place_pod(example_pod("pytorchjob-worker"), ns))
    assert _quota_used(api, ns, name) == {
        "requests.nvidia.com/gpu": Decimal(1),
        "requests.volcano.sh/vgpu-number": Decimal(0),
    }
    notebook = create_pod(api, place_pod(example_pod("notebook"), ns))
    assert (
        "volcano.sh/vgpu-number"
        in _container(notebook.pod, "alice-jupyter")["resources"]["requests"]
    )
    assert _quota_used(api, ns, name) == {
        "requests.nvidia.com/gpu": Decimal(1),
        "requests.volcano.sh/vgpu-number": Decimal(1),
    }
    second = place_pod(example_pod("notebook"), ns)
    second["metadata"]["name"] = "second-notebook"
    with pytest.raises(ApiException) as refused:
        create_pod(api, second)
    status, text = api_error(refused.value)
    assert status == 403
    assert "exceeded quota: gpus" in text
    assert "requested: requests.volcano.sh/vgpu-number=1" in text


def test_warnings_on_a_refused_request_are_kept(gpuwarden: WebhookStack, kubeflow_ns: str) -> None:
    """A denied pod's response still carries the mutating webhook's warnings, if it gave any."""
    pod = place_pod(load_pod(POLICY_TEST_PODS / "privileged-gpu.yaml"), kubeflow_ns)
    expected = gpuwarden.expect(pod)
    with pytest.raises(ApiException) as refused:
        create_pod(gpuwarden.api, pod)
    assert set(expected.mutation.warnings) <= set(exception_warnings(refused.value))


def test_opt_out_pod_label_skips_mutation_but_not_validation(
    gpuwarden: WebhookStack, kubeflow_ns: str
) -> None:
    """The chart honours the pod label on the mutating webhook only (values podOptOut).

    Anyone who creates a pod can label it, so the label may skip gpuwarden's changes but not its
    checks: an unmutated GPU pod contradicts its profile and is denied with the reason.
    """
    opted_out = {"gpuwarden.io/ignore": "true"}
    gpu = place_pod(example_pod("notebook"), kubeflow_ns)
    gpu["metadata"]["labels"].update(opted_out)
    verdict = validate(
        AdmissionRequest(
            operation="CREATE", namespace=kubeflow_ns, pod=api_defaults(gpuwarden.api, gpu)
        ),
        gpuwarden.policies,
        ClusterView(namespace_labels={kubeflow_ns: gpuwarden.namespace_labels(kubeflow_ns)}),
    )
    assert not verdict.allowed

    with pytest.raises(ApiException) as refused:
        create_pod(gpuwarden.api, gpu)

    status, text = api_error(refused.value)
    assert status == verdict.code
    assert 'admission webhook "validate.gpuwarden.io" denied the request' in text
    assert verdict.message in text
    calls = gpuwarden.server.awaited_admissions(
        1, namespace=kubeflow_ns, pod=gpu["metadata"]["name"]
    )
    assert [c["endpoint"] for c in calls] == ["validate"]

    web = plain_pod(kubeflow_ns)
    web["metadata"]["labels"].update(opted_out)
    created = create_pod(gpuwarden.api, web)
    _assert_untouched(gpuwarden, created.pod, web)


# --- MPS sharing (backend nvidia): environment and a shared resource of its own -------------


def _mps_notebook(namespace: str) -> Obj:
    """A Kubeflow notebook whose owner asked for the MPS profile by label."""
    pod = place_pod(example_pod("notebook"), namespace)
    pod["metadata"]["labels"]["gpuwarden.io/profile"] = "mps-shared"
    return pod


def test_mps_profile_sets_cuda_mps_environment(gpuwarden: WebhookStack) -> None:
    ns = gpuwarden.tenant_namespace("e2e-mps", MPS_TENANT_LABELS)
    pod = _mps_notebook(ns)
    expected = gpuwarden.expect(pod)

    created = create_pod(gpuwarden.api, pod)

    stored = read_pod(gpuwarden.api, ns, pod["metadata"]["name"])
    assert_matches_policy_core(stored, expected)
    assert_priority_consistent(stored, gpuwarden)
    assert set(expected.warnings) <= set(created.warnings)
    container = _container(stored, "alice-jupyter")
    env = {e["name"]: e.get("value") for e in container["env"]}
    # The notebook's own variable stays; the MPS client limits come from the profile.
    assert env == {
        "NB_PREFIX": "/notebook/tenant-a/alice-jupyter",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12288M",
    }
    assert container["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu.shared"] == "1"
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    # NVIDIA's device plugin works with the default scheduler.
    assert stored["spec"]["schedulerName"] == "default-scheduler"
    assert stored["spec"]["priorityClassName"] == "gpuwarden-mps-shared"
    assert stored["spec"]["priority"] == 120
    assert pod_annotations(stored)["gpuwarden.io/tenant"] == "e2e-mps"
    assert pod_annotations(stored)["gpuwarden.io/gpu-memory-limit"] == "12Gi"


def test_resource_quota_charges_shared_gpus_under_their_own_name(gpuwarden: WebhookStack) -> None:
    """No whole GPU left in the quota, one MPS share: the notebook fits only because it is shared."""
    api = gpuwarden.api
    ns = gpuwarden.tenant_namespace("e2e-mps-quota", MPS_TENANT_LABELS)
    hard = {"requests.nvidia.com/gpu": "0", "requests.nvidia.com/gpu.shared": "1"}
    _write_quota(api, ns, "shares", hard)

    def refused_for_quota() -> bool:
        try:
            create_pod(api, place_pod(example_pod("pytorchjob-worker"), ns), dry_run=True)
        except ApiException as exc:
            return "exceeded quota: shares" in api_error(exc)[1]
        return False

    wait_for("the ResourceQuota to be enforced", refused_for_quota)
    create_pod(api, _mps_notebook(ns))
    assert _quota_used(api, ns, "shares") == {
        "requests.nvidia.com/gpu": Decimal(0),
        "requests.nvidia.com/gpu.shared": Decimal(1),
    }
    with pytest.raises(ApiException) as refused:
        create_pod(api, _mps_notebook(ns))
    status, text = api_error(refused.value)
    assert status == 403
    assert "requested: requests.nvidia.com/gpu.shared=1" in text
    assert "limited: requests.nvidia.com/gpu.shared=1" in text
