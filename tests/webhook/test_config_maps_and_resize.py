"""ConfigMap and pods/resize reviews reach the policy core through /validate, and the admission
log line stays short whatever the request carries (issue 19, items 6, 8 and 11)."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest

from gpuwarden.webhook.logs import AdmissionLog

from .support import POLICY, Webhook, Workdir, apply_response, notebook_pod, review

CONFIG_MAP_KIND = {"group": "", "version": "v1", "kind": "ConfigMap"}
CONFIG_MAPS = {"group": "", "version": "v1", "resource": "configmaps"}


def config_map(data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "team-a"},
        "data": data,
    }


def config_map_review(data: dict[str, str], operation: str = "UPDATE") -> dict[str, Any]:
    return review(
        config_map(data),
        operation=operation,
        kind=CONFIG_MAP_KIND,
        resource=CONFIG_MAPS,
        old=config_map({}) if operation == "UPDATE" else None,
    )


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
async def test_a_config_map_that_would_set_a_denied_variable_is_refused(
    webhook: Webhook, operation: str
) -> None:
    data = config_map_review({"LOG_LEVEL": "info", "CUDA_MPS_PIPE_DIRECTORY": "/x"}, operation)
    response = await webhook.admit("validate", data)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"] == (
        "gpuwarden denied the ConfigMap: data[CUDA_MPS_PIPE_DIRECTORY]: a pod's envFrom would set "
        "CUDA_MPS_PIPE_DIRECTORY, which can escape GPU isolation; rename or remove the key "
        "[policy test, check environment]"
    )
    # The mutating endpoint never patches a ConfigMap.
    mutation = await webhook.admit("mutate", data)
    assert mutation["allowed"] is True
    assert "patch" not in mutation


async def test_a_harmless_config_map_goes_ahead(webhook: Webhook) -> None:
    response = await webhook.admit("validate", config_map_review({"LOG_LEVEL": "debug"}))
    assert response["allowed"] is True
    assert "warnings" not in response


async def test_a_resize_of_the_profiles_host_memory_is_refused(
    make_webhook: Any, workdir: Workdir
) -> None:
    workdir.write_policy(POLICY.replace("priority: 100}", "priority: 100, hostMemory: 8Gi}"))
    webhook: Webhook = await make_webhook()
    pod = notebook_pod()
    old = apply_response(pod, await webhook.admit("mutate", review(pod)))
    assert old["spec"]["containers"][0]["resources"]["requests"]["memory"] == "8Gi"
    new = json.loads(json.dumps(old))
    resources = new["spec"]["containers"][0]["resources"]
    resources["limits"]["memory"] = resources["requests"]["memory"] = "32Gi"
    data = review(new, operation="UPDATE", old=old, sub_resource="resize")
    response = await webhook.admit("validate", data)
    assert response["allowed"] is False
    assert response["status"]["message"].startswith(
        "gpuwarden denied the pod: spec.containers[alice-jupyter].resources.limits[memory]: "
        "profile light-training (rule/notebooks) sets it to 8Gi, and a resize may not change "
        "what gpuwarden set"
    )
    # A resize of what the profile leaves to the pod goes ahead.
    cpu = json.loads(json.dumps(old))
    cpu["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "4"
    data = review(cpu, operation="UPDATE", old=old, sub_resource="resize")
    assert (await webhook.admit("validate", data))["allowed"] is True


async def test_the_log_line_cuts_what_the_request_makes_long(
    webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuwarden.admission")  # as --log-level info does
    stream = io.StringIO()
    assert webhook.server.context is not None
    webhook.server.context.admission_log = AdmissionLog(stream)
    pod = notebook_pod()
    pod["metadata"]["name"] = "n" * 100_000
    uid = "u" * 3_000_000
    response = await webhook.admit("mutate", review(pod, uid=uid))  # the answer echoes it whole
    assert response["allowed"] is True
    (line,) = stream.getvalue().splitlines()
    assert len(line) < 2000
    entry = json.loads(line)
    assert entry["uid"] == "u" * 256 + "...(3000000 characters)"
    assert entry["pod"] == "n" * 256 + "...(100000 characters)"
    assert (entry["namespace"], entry["tenant"], entry["decision"]) == (
        "team-a",
        "team-a",
        "allowed",
    )
