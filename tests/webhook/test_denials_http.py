"""Every validating rule, denied over HTTPS by the running server, with a message naming the field.

The engine-level twins are in tests/policy/test_validate.py; here each pod goes through /mutate,
the patch is applied as the API server would, and /validate judges the result.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpuwarden.policy.pod import keys

from .support import Webhook, apply_response, notebook_pod, review

POLICY = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: limits}
spec:
  backend: volcano
  profiles:
    - {name: light-training, gpuShare: true, maxMemory: 16Gi, overcommitRatio: 1.5, priority: 100}
    - {name: big, gpuShare: false, gpus: 4, maxMemory: 80Gi, priority: 200}
    - {name: whole, gpuShare: false, gpus: 1, maxMemory: 80Gi, priority: 150}
    - {name: forbidden, gpuShare: true, maxMemory: 8Gi, priority: 10}
    - {name: huge-share, gpuShare: true, gpus: 2, maxMemory: 40Gi, priority: 10}
  workloads:
    - {name: notebooks, match: {kind: notebook}, profile: light-training}
  tenants:
    - name: team-a
      namespaces: [team-a]
      limits:
        allowedProfiles: [light-training, big, whole, huge-share]
        maxGpusPerPod: 2
        maxGpuMemoryPerPod: 64Gi
        requireShared: true
        gpuMemoryQuota: 20Gi
  defaultProfile: light-training
"""

Pod = dict[str, Any]


def _main(pod: Pod) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def _labelled(profile: str) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        pod["metadata"]["labels"][keys.PROFILE_LABEL] = profile

    return change


def _env(field: str, name: str, value: str = "all") -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        if field == "containers":
            _main(pod)["env"].append({"name": name, "value": value})
        else:
            pod["spec"][field] = [
                {"name": "init", "image": "busybox", "env": [{"name": name, "value": value}]}
            ]

    return change


def _host_path(path: str) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        pod["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]

    return change


def _set(field: str, value: Any) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        pod["spec"][field] = value

    return change


def _privileged(pod: Pod) -> None:
    _main(pod)["securityContext"] = {"privileged": True}


def _bad_quantity(pod: Pod) -> None:
    _main(pod)["resources"]["limits"]["memory"] = "8GiB"


# (name, change before /mutate, change after /mutate, text the denial must contain)
CASES: list[tuple[str, Callable[[Pod], None] | None, Callable[[Pod], None] | None, str]] = [
    ("profile not allowed", _labelled("forbidden"), None, "not allowed for tenant team-a"),
    ("too many GPUs", _labelled("big"), None, "allows at most 2 per pod"),
    ("too much GPU memory", _labelled("huge-share"), None, "allows at most 64Gi per pod"),
    ("whole GPU where the tenant shares", _labelled("whole"), None, "must share GPUs"),
    ("GPU-memory quota with overcommit", _labelled("huge-share"), None, "past its quota 20Gi"),
    (
        "NVIDIA_VISIBLE_DEVICES",
        _env("containers", "NVIDIA_VISIBLE_DEVICES"),
        None,
        "spec.containers[alice-jupyter].env[NVIDIA_VISIBLE_DEVICES]",
    ),
    (
        "NVIDIA_DRIVER_CAPABILITIES in an init container",
        _env("initContainers", "NVIDIA_DRIVER_CAPABILITIES"),
        None,
        "spec.initContainers[init].env[NVIDIA_DRIVER_CAPABILITIES]",
    ),
    (
        "CUDA_MPS_PIPE_DIRECTORY",
        _env("containers", "CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps"),
        None,
        "env[CUDA_MPS_PIPE_DIRECTORY]",
    ),
    (
        "CUDA_VISIBLE_DEVICES widening",
        _env("containers", "CUDA_VISIBLE_DEVICES", "0,1,2"),
        None,
        "env[CUDA_VISIBLE_DEVICES]: it lists 3 devices",
    ),
    (
        "hostPath to the MPS pipes",
        _host_path("/run/nvidia/mps"),
        None,
        "spec.volumes[host].hostPath",
    ),
    ("hostPath to a GPU device", _host_path("/dev/nvidia0"), None, "reaches /dev/nvidia*"),
    ("privileged", _privileged, None, "securityContext.privileged"),
    ("hostIPC", _set("hostIPC", True), None, "spec.hostIPC"),
    ("hostPID", _set("hostPID", True), None, "spec.hostPID"),
    (
        "schedulerName changed after us",
        None,
        _set("schedulerName", "default-scheduler"),
        "schedulerName",
    ),
    ("invalid quantity", _bad_quantity, None, "resources.limits[memory]"),
]


@pytest.fixture
async def strict(make_webhook: Callable[..., Any], workdir: Any) -> Webhook:
    workdir.write_policy(POLICY)
    hook: Webhook = await make_webhook()
    return hook


@pytest.mark.parametrize(
    ("before", "after", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_denied_over_https(
    strict: Webhook,
    before: Callable[[Pod], None] | None,
    after: Callable[[Pod], None] | None,
    text: str,
) -> None:
    pod = notebook_pod()
    if before is not None:
        before(pod)
    mutated = apply_response(pod, await strict.admit("mutate", review(pod)))
    if after is not None:
        after(mutated)
    response = await strict.admit("validate", review(mutated))
    assert response["allowed"] is False, response
    assert response["status"]["code"] == 403
    assert text in response["status"]["message"]
    assert "patch" not in response


async def test_the_plain_notebook_is_allowed(strict: Webhook) -> None:
    """The control: without any of the changes above, the same pod passes."""
    pod = notebook_pod()
    mutated = apply_response(pod, await strict.admit("mutate", review(pod)))
    response = await strict.admit("validate", review(mutated))
    assert response["allowed"] is True, response


async def test_an_ephemeral_debug_container_cannot_escape(strict: Webhook) -> None:
    pod = notebook_pod()
    mutated = apply_response(pod, await strict.admit("mutate", review(pod)))
    debugged = copy.deepcopy(mutated)
    debugged["spec"]["ephemeralContainers"] = [
        {
            "name": "debugger",
            "image": "busybox",
            "env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/x"}],
        }
    ]
    response = await strict.admit(
        "validate",
        review(debugged, operation="UPDATE", old=mutated, sub_resource="ephemeralcontainers"),
    )
    assert response["allowed"] is False
    assert (
        "spec.ephemeralContainers[debugger].env[CUDA_MPS_PIPE_DIRECTORY]"
        in response["status"]["message"]
    )


async def test_a_harmless_ephemeral_container_is_allowed(strict: Webhook) -> None:
    pod = notebook_pod()
    mutated = apply_response(pod, await strict.admit("mutate", review(pod)))
    debugged = copy.deepcopy(mutated)
    debugged["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox"}]
    response = await strict.admit(
        "validate",
        review(debugged, operation="UPDATE", old=mutated, sub_resource="ephemeralcontainers"),
    )
    assert response["allowed"] is True, response


async def test_gpuwarden_annotations_cannot_be_changed_on_update(strict: Webhook) -> None:
    pod = notebook_pod()
    mutated = apply_response(pod, await strict.admit("mutate", review(pod)))
    raised = copy.deepcopy(mutated)
    raised["metadata"]["annotations"][keys.ANNOTATION_GPU_MEMORY_LIMIT] = "80Gi"
    response = await strict.admit("validate", review(raised, operation="UPDATE", old=mutated))
    assert response["allowed"] is False
    assert (
        f"metadata.annotations[{keys.ANNOTATION_GPU_MEMORY_LIMIT}]" in response["status"]["message"]
    )
