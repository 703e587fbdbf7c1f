"""InferenceService reviews through /validate (issue 30): one that no InferenceService could be
is refused naming the InferenceService's own field, not the pod built from it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .support import Webhook, review

KIND = {"group": "serving.kserve.io", "version": "v1beta1", "kind": "InferenceService"}
RESOURCE = {"group": "serving.kserve.io", "version": "v1beta1", "resource": "inferenceservices"}


def isvc() -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": "llama",
            "namespace": "team-a",
            "annotations": {"serving.kserve.io/deploymentMode": "Standard"},
        },
        "spec": {
            "predictor": {
                "model": {
                    "modelFormat": {"name": "huggingface"},
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            }
        },
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(predictor="x"), "spec.predictor must be an object"),
        (lambda s: s["predictor"].update(model=[]), "spec.predictor.model must be an object"),
        (
            lambda s: s["predictor"].update(containers={}),
            "spec.predictor.containers must be a list",
        ),
        (
            lambda s: s["predictor"]["model"].update(resources="x"),
            "request.object.spec.predictor.model.resources must be an object, not string",
        ),
        (
            lambda s: s["predictor"].update(containers=[{"name": "a", "env": "x"}]),
            "request.object.spec.predictor.containers[0].env must be an array, not string",
        ),
    ],
)
async def test_an_unreadable_isvc_is_refused_naming_its_field(
    webhook: Webhook, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    obj = isvc()
    change(obj["spec"])
    response = await webhook.admit("validate", review(obj, kind=KIND, resource=RESOURCE))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["message"] == (
        f"gpuwarden cannot read the InferenceService's replicas: {message}"
    )


async def test_an_allowed_isvc_is_mutated_through_its_predictor(webhook: Webhook) -> None:
    response = await webhook.admit("mutate", review(isvc(), kind=KIND, resource=RESOURCE))
    assert response["allowed"] is True
    assert response.get("patch")
