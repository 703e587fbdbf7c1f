"""Property tests: for generated pods, the patch applies cleanly with `jsonpatch` to the original,
the decision on the result is an empty patch, and nothing ever raises.

The number of examples is modest by default; GPUWARDEN_FUZZ_EXAMPLES raises it (`make fuzz`).
"""

from __future__ import annotations

import copy
import json
import os
import re
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    admit,
    load_paths,
    mutate,
    validate,
)
from gpuwarden.policy.pod.quantity import QuantityError, parse_count
from gpuwarden.policy.pod.resources import GPU_COUNT_RESOURCES, GPU_RESOURCES
from gpuwarden.policy.pod.view import PodView

from .support import POLICIES, namespace_labels, policies_from
from .test_backends import SPEC as BACKENDS_SPEC

DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

DEFAULT = load_paths([POLICIES])
BACKENDS = policies_from(BACKENDS_SPEC)
LABELS = {**namespace_labels(), "carol": {"app.kubernetes.io/part-of": "kubeflow-profile"}}
CLUSTER = ClusterView(namespace_labels=LABELS)
NAMESPACES = ["tenant-a", "tenant-b", "carol", "team", "other", "default"]

# --- strategies ----------------------------------------------------------------------------

WF = "wf-x7k2p"
KUBEFLOW_LABELS: list[dict[str, str]] = [
    {},
    {"pipelines.kubeflow.org/v2_component": "true", "workflows.argoproj.io/workflow": WF},
    {
        "training.kubeflow.org/job-name": "bert",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
    },
    {"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/replicatedjob-name": "node"},
    {"katib.kubeflow.org/trial": "t-1", "katib.kubeflow.org/experiment": "random-search"},
    {"notebook-name": "main", "statefulset": "main"},
    {"serving.kserve.io/inferenceservice": "llm", "component": "predictor"},
    {"serving.kserve.io/inferenceservice": "llm", "component": "transformer"},
]
NODE_NAMES = [
    f"{WF}.root.train.executor",
    f"{WF}.root.train.executor(1)",
    f"{WF}.root.sub.load-data.executor",
    f"{WF}.root.evaluate.executor",
    f"{WF}.root.export-model.executor",
    f"{WF}.root.train-driver",
    f"{WF}.root.importer",
]
PROFILE_NAMES = sorted({*DEFAULT.profiles, *BACKENDS.profiles, "nope"})
CONTAINER_NAMES = [
    "main",
    "wait",
    "pytorch",
    "node",
    "kserve-container",
    "istio-proxy",
    "a/b",
    "x~y",
]
QUANTITIES = [
    "0",
    "1",
    "2",
    "8",
    "100m",
    "1.5",
    "1Gi",
    "16Gi",
    "500M",
    "1e3",
    "1GiB",
    "-1",
    "",
    " 1",
]
RESOURCE_NAMES = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/gpumem",
    "nvidia.com/mig-1g.5gb",
    "volcano.sh/vgpu-number",
    "volcano.sh/vgpu-memory",
    "example.com/foo",
]
ENV_NAMES = [
    "A",
    "PATH",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
]
SCHEDULERS = [
    None,
    "",
    "default-scheduler",
    "volcano",
    "hami-scheduler",
    "scheduler-plugins-scheduler",
]

text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
key_text = st.one_of(
    st.sampled_from(
        ["a~b", "a/b", "~1", "/", "~", "x~0y", "gpuwarden.io/profile", "gpuwarden.io/tenant"]
    ),
    st.from_regex(r"[a-z0-9.~/]{1,12}", fullmatch=True),
)
quantity = st.one_of(st.sampled_from(QUANTITIES), st.integers(0, 10))
# Whole-GPU counts as workloads ask for them (torchrun's nproc_per_node: 1 to 16 GPUs).
gpu_count = st.one_of(st.integers(1, 16), st.integers(1, 16).map(str))
resource_map = st.one_of(
    st.dictionaries(st.sampled_from(RESOURCE_NAMES), quantity, max_size=4),
    st.fixed_dictionaries(
        {"nvidia.com/gpu": gpu_count},
        optional={"cpu": quantity, "memory": quantity, "volcano.sh/vgpu-number": gpu_count},
    ),
)
env_entry = st.one_of(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(ENV_NAMES),
            "value": st.sampled_from(["0", "all", "50", "0,1", "x"]),
        }
    ),
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(ENV_NAMES),
            "valueFrom": st.just({"fieldRef": {"fieldPath": "metadata.name"}}),
        }
    ),
)


@st.composite
def containers(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"name": draw(st.sampled_from(CONTAINER_NAMES)), "image": "img"}
    resources = draw(
        st.one_of(
            st.none(),
            st.just({}),
            st.fixed_dictionaries({}, optional={"limits": resource_map, "requests": resource_map}),
            st.just({"limits": None}),
        )
    )
    if resources is not None or draw(st.booleans()):
        body["resources"] = resources
    env = draw(st.one_of(st.none(), st.lists(env_entry, max_size=3)))
    if env is not None or draw(st.booleans()):
        body["env"] = env
    return body


def _name(body: dict[str, Any]) -> Any:
    return body["name"]


@st.composite
def pods(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    namespace = draw(st.sampled_from(NAMESPACES))
    labels = dict(draw(st.sampled_from(KUBEFLOW_LABELS)))
    labels |= draw(st.dictionaries(key_text, text, max_size=3))
    if draw(st.integers(0, 4)) == 0:
        labels["gpuwarden.io/profile"] = draw(st.sampled_from(PROFILE_NAMES))
    annotations: dict[str, Any] = draw(st.dictionaries(key_text, text, max_size=4))
    if "pipelines.kubeflow.org/v2_component" in labels:
        annotations["workflows.argoproj.io/node-name"] = draw(st.sampled_from(NODE_NAMES))
    meta: dict[str, Any] = {
        "name": draw(
            st.sampled_from(["p", f"{WF}-system-container-impl-1", f"{WF}-system-importer-2"])
        ),
        "namespace": namespace,
    }
    flags: list[bool] = draw(st.lists(st.booleans(), min_size=3, max_size=3))
    if labels or flags[0]:
        meta["labels"] = labels
    if annotations or flags[1]:
        meta["annotations"] = annotations if annotations or flags[2] else None
    # Container names are unique within a pod (the API server refuses duplicates).
    spec: dict[str, Any] = {
        "containers": draw(st.lists(containers(), min_size=1, max_size=4, unique_by=_name))
    }
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers(), max_size=2, unique_by=_name))
    scheduler = draw(st.sampled_from(SCHEDULERS))
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if draw(st.booleans()):
        spec["priority"] = draw(st.sampled_from([0, 100, 2_000_000_000]))
        spec["preemptionPolicy"] = draw(st.sampled_from(["PreemptLowerPriority", "Never"]))
    if draw(st.booleans()):
        spec["priorityClassName"] = draw(st.sampled_from(["", "high", "gpuwarden-inference"]))
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(
            st.one_of(st.none(), st.dictionaries(key_text, text, max_size=2))
        )
    if draw(st.booleans()):
        spec["tolerations"] = draw(
            st.one_of(st.none(), st.just([{"key": "spot", "operator": "Exists"}]))
        )
    return namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# --- properties ----------------------------------------------------------------------------


POLICY_SETS = {"default": DEFAULT, "backends": BACKENDS}


@pytest.mark.parametrize("policy_set", sorted(POLICY_SETS))
@FUZZ
@given(generated=pods())
def test_admit_decides_as_the_api_server_does(
    policy_set: str, generated: tuple[str, dict[str, Any]]
) -> None:
    """admit() reuses the mutation's reading of a pod it left unchanged: the decisions are those
    of the two webhook calls the API server makes, the second on the patched pod."""
    policies = POLICY_SETS[policy_set]
    namespace, pod = generated
    request = AdmissionRequest("CREATE", namespace, pod)
    mutation = mutate(request, policies, CLUSTER)
    final = jsonpatch.apply_patch(copy.deepcopy(pod), [dict(op) for op in mutation.patch])
    validation = validate(AdmissionRequest("CREATE", namespace, final), policies, CLUSTER)
    result = admit(request, policies, CLUSTER)
    assert (result.mutation, result.validation, result.pod) == (mutation, validation, final)


# A GPU-free profile (kfp-export) on a step whose GPU was asked by its second container: the
# record of which container it chose keeps the reinvocation's answer the same.
EXPORT_STEP_ON_SECOND_CONTAINER = (
    "tenant-a",
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "tenant-a",
            "labels": dict(KUBEFLOW_LABELS[1]),
            "annotations": {"workflows.argoproj.io/node-name": f"{WF}.root.export-model.executor"},
        },
        "spec": {
            "containers": [
                {"name": "pytorch", "image": "img"},
                {
                    "name": "worker",
                    "image": "img",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                },
            ]
        },
    },
)


@pytest.mark.parametrize("policy_set", sorted(POLICY_SETS))
@FUZZ
@example(generated=EXPORT_STEP_ON_SECOND_CONTAINER)
@given(generated=pods())
def test_patch_applies_and_is_idempotent(
    policy_set: str, generated: tuple[str, dict[str, Any]]
) -> None:
    policies = POLICY_SETS[policy_set]
    namespace, pod = generated
    original = copy.deepcopy(pod)
    request = AdmissionRequest("CREATE", namespace, pod)
    result = admit(request, policies, CLUSTER)
    assert pod == original  # nothing is modified in place

    decision = result.mutation
    ops = json.loads(decision.patch_bytes())
    assert ops == [dict(op) for op in decision.patch]
    patched = jsonpatch.apply_patch(copy.deepcopy(original), ops)
    assert patched == result.pod

    again = mutate(AdmissionRequest("CREATE", namespace, patched), policies, CLUSTER)
    # A container name that is no DNS label (a/b) makes the API server refuse the pod after
    # mutation, and gpuwarden's record of it is read back as absent: only a pod that can be
    # stored is owed the same answer on reinvocation.
    if all(DNS_LABEL.fullmatch(str(c.get("name"))) for c in patched["spec"]["containers"]):
        assert again.patch == ()
    assert all(len(line) < 120 for line in decision.warnings + again.warnings)

    # The validator never denies the mutator's own work.
    assert "contradicts profile" not in result.validation.message

    # Extended resources of governed containers: request equals limit.
    governed = (patched["metadata"].get("annotations") or {}).get("gpuwarden.io/containers", "")
    for body in patched["spec"]["containers"]:
        if decision.patch and body.get("name") in governed.split(","):
            resources = body.get("resources") or {}
            limits = {
                k: v for k, v in (resources.get("limits") or {}).items() if k in GPU_RESOURCES
            }
            requests = {
                k: v for k, v in (resources.get("requests") or {}).items() if k in GPU_RESOURCES
            }
            assert limits == requests


# Anything JSON can hold, where a pod's fields would be.
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), text),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(text, children, max_size=3)
    ),
    max_leaves=12,
)


container_fields = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.sampled_from(CONTAINER_NAMES), json_values),
        "resources": st.one_of(
            st.fixed_dictionaries({}, optional={"limits": json_values, "requests": json_values}),
            st.fixed_dictionaries({"limits": resource_map}),
            json_values,
        ),
        "env": st.one_of(st.lists(st.one_of(env_entry, json_values), max_size=3), json_values),
        "envFrom": json_values,
        "securityContext": json_values,
    },
)
spec_fields = st.fixed_dictionaries(
    {},
    optional={
        "containers": st.one_of(
            st.lists(st.one_of(container_fields, json_values), max_size=3), json_values
        ),
        "initContainers": st.one_of(st.lists(container_fields, max_size=2), json_values),
        "ephemeralContainers": st.lists(container_fields, max_size=2),
        "volumes": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "name": text,
                        "hostPath": st.one_of(
                            st.fixed_dictionaries({"path": json_values}), json_values
                        ),
                    }
                ),
                max_size=2,
            ),
            json_values,
        ),
        "schedulerName": json_values,
        "priority": json_values,
        "hostIPC": json_values,
        "nodeSelector": json_values,
        "tolerations": json_values,
    },
)
metadata_fields = st.fixed_dictionaries(
    {},
    optional={
        "labels": st.one_of(st.sampled_from(KUBEFLOW_LABELS), st.dictionaries(text, json_values)),
        "annotations": st.dictionaries(key_text, json_values, max_size=3),
        "name": json_values,
    },
)
broken_pods = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["Pod", "Pod", "Pod", "Deployment"]),
        "metadata": st.one_of(metadata_fields, json_values),
        "spec": st.one_of(spec_fields, spec_fields, json_values),
    }
)


@pytest.mark.parametrize("policy_set", sorted(POLICY_SETS))
@FUZZ
@given(pod=broken_pods, namespace=st.sampled_from(NAMESPACES), data=st.data())
def test_malformed_pods_never_raise(
    policy_set: str, pod: dict[str, Any], namespace: str, data: st.DataObject
) -> None:
    policies = POLICY_SETS[policy_set]
    original = copy.deepcopy(pod)
    for operation in ("CREATE", "UPDATE"):
        old = data.draw(st.one_of(st.none(), st.just(original), broken_pods))
        sub = data.draw(st.sampled_from(["", "ephemeralcontainers", "status"]))
        request = AdmissionRequest(operation, namespace, pod, old_pod=old, sub_resource=sub)
        mutation = mutate(request, policies, CLUSTER)
        json.loads(mutation.patch_bytes())
        validation = validate(request, policies, CLUSTER)
        assert validation.allowed or validation.message
        admit(request, policies, CLUSTER)
    assert pod == original


@FUZZ
@given(body=containers())
def test_a_pod_view_reads_gpu_resources_as_the_container_does(body: dict[str, Any]) -> None:
    """PodView parses each GPU value once; what it reads is what ContainerRef reads."""
    view = PodView.of({"spec": {"containers": [body]}})
    (ref,) = view.all_containers
    gpus = view.gpus(ref)
    assert gpus.asks == ref.asks_for_gpu()
    try:
        asked: int | str | None = ref.asked_gpus()
    except QuantityError as exc:
        asked = str(exc)
    assert (str(gpus.asked) if isinstance(gpus.asked, QuantityError) else gpus.asked) == asked
    devices = 0
    for name, value in ref.gpu_resources().items():
        if name in GPU_COUNT_RESOURCES:
            try:
                devices += parse_count(value)
            except QuantityError:
                continue
    assert gpus.devices == devices
