"""Denials over HTTP, judged on the pod the mutation produced: each names the field to change."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from .support import Webhook, apply_response, notebook_pod, review

Edit = Callable[[dict[str, Any]], None]


def env(name: str, value: str) -> Edit:
    def edit(pod: dict[str, Any]) -> None:
        pod["spec"]["containers"][0].setdefault("env", []).append({"name": name, "value": value})

    return edit


def host_path(path: str) -> Edit:
    def edit(pod: dict[str, Any]) -> None:
        pod["spec"].setdefault("volumes", []).append({"name": "h", "hostPath": {"path": path}})
        pod["spec"]["containers"][0].setdefault("volumeMounts", []).append(
            {"name": "h", "mountPath": "/h"}
        )

    return edit


def privileged(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}


def host_ipc(pod: dict[str, Any]) -> None:
    pod["spec"]["hostIPC"] = True


def host_pid(pod: dict[str, Any]) -> None:
    pod["spec"]["hostPID"] = True


def init_container_env(pod: dict[str, Any]) -> None:
    pod["spec"]["initContainers"] = [
        {
            "name": "fetch",
            "image": "busybox",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        }
    ]


ESCAPES: list[tuple[str, Edit, str]] = [
    ("NVIDIA_VISIBLE_DEVICES", env("NVIDIA_VISIBLE_DEVICES", "all"), "NVIDIA_VISIBLE_DEVICES"),
    (
        "NVIDIA_DRIVER_CAPABILITIES",
        env("NVIDIA_DRIVER_CAPABILITIES", "all"),
        "NVIDIA_DRIVER_CAPABILITIES",
    ),
    (
        "CUDA_MPS_PIPE_DIRECTORY",
        env("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mine"),
        "CUDA_MPS_PIPE_DIRECTORY",
    ),
    ("init container env", init_container_env, "initContainers"),
    ("hostPath /dev/nvidia0", host_path("/dev/nvidia0"), "/dev/nvidia"),
    ("hostPath MPS pipe", host_path("/run/nvidia/mps"), "/run/nvidia/mps"),
    ("privileged", privileged, "privileged"),
    ("hostIPC", host_ipc, "hostIPC"),
    ("hostPID", host_pid, "hostPID"),
]


async def mutated_pod(hook: Webhook) -> dict[str, Any]:
    pod = notebook_pod()
    return apply_response(pod, await hook.admit("mutate", review(pod)))


@pytest.mark.parametrize(
    ("edit", "field"), [(e, f) for _, e, f in ESCAPES], ids=[n for n, _, _ in ESCAPES]
)
async def test_isolation_escapes_are_denied_naming_the_field(
    webhook: Webhook, edit: Edit, field: str
) -> None:
    pod = await mutated_pod(webhook)
    edit(pod)
    response = await webhook.admit("validate", review(pod))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert field in response["status"]["message"]
    assert "patch" not in response


async def test_kubectl_debug_ephemeral_container_is_checked(webhook: Webhook) -> None:
    running = await mutated_pod(webhook)
    debug = copy.deepcopy(running)
    debug["spec"]["ephemeralContainers"] = [
        {
            "name": "debugger-x7k2p",
            "image": "busybox",
            "targetContainerName": "alice-jupyter",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        }
    ]
    data = review(debug, operation="UPDATE", old=running, sub_resource="ephemeralcontainers")
    response = await webhook.admit("validate", data)
    assert response["allowed"] is False
    assert "ephemeralContainers" in response["status"]["message"]
    # A harmless debug container is allowed.
    del debug["spec"]["ephemeralContainers"][0]["env"]
    data = review(debug, operation="UPDATE", old=running, sub_resource="ephemeralcontainers")
    assert (await webhook.admit("validate", data))["allowed"] is True
