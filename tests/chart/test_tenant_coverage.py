"""Every namespace a tenant names reaches the webhooks, checked by a real kube-apiserver.

The chart's webhooks select Kubeflow profile namespaces by label; a tenant that lists a
namespace by name which lacks the label gets a second entry per webhook selecting it by name.
No webhook server runs here, so every call fails, and with failurePolicy Fail the API server's
error names the entry it called: which entry (if any) selects a namespace is what it says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from .support import release_plane, template

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

from e2e.controlplane import ControlPlane  # noqa: E402

PROFILE_LABEL = {"app.kubernetes.io/part-of": "kubeflow-profile"}


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with release_plane() as control_plane:
        yield control_plane


def _namespace(plane: ControlPlane, name: str, labels: dict[str, str]) -> None:
    doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    plane.kubectl("apply", "-f", "-", input=json.dumps(doc))


def _gpu_pod(namespace: str) -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": gpu}}]},
    }


def _outcome(plane: ControlPlane, namespace: str) -> str:
    """The webhook entry the API server failed to call for a GPU pod, or 'created'."""
    result = plane.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(_gpu_pod(namespace)), check=False
    )
    if result.returncode == 0:
        return "created"
    marker = 'failed calling webhook "'
    assert marker in result.stderr, result.stderr
    return result.stderr.split(marker, 1)[1].split('"', 1)[0]


def test_namespaces_tenants_list_by_name_reach_the_webhooks(plane: ControlPlane) -> None:
    rendering = template(["tenants-quotas.yaml"])  # tenants list vision, vision-dev and nlp
    configs = [
        *rendering.all("MutatingWebhookConfiguration"),
        *rendering.all("ValidatingWebhookConfiguration"),
    ]
    for config in configs:
        for hook in config["webhooks"]:
            hook["failurePolicy"] = "Fail"
    _namespace(plane, "vision", {})  # listed, not a profile namespace
    _namespace(plane, "nlp", PROFILE_LABEL)  # listed and a profile namespace
    _namespace(plane, "new-user", PROFILE_LABEL)  # a profile namespace no tenant lists
    _namespace(plane, "elsewhere", {})
    items = {"apiVersion": "v1", "kind": "List", "items": configs}
    plane.kubectl("apply", "-f", "-", input=json.dumps(items))
    try:
        outcomes = {ns: _outcome(plane, ns) for ns in ("vision", "nlp", "new-user", "elsewhere")}
    finally:
        plane.kubectl("delete", "-f", "-", input=json.dumps(items))
    assert outcomes == {
        "vision": "mutate-named.gpuwarden.io",
        "nlp": "mutate.gpuwarden.io",  # sent once, through the label
        "new-user": "mutate.gpuwarden.io",
        "elsewhere": "created",
    }


def test_without_the_fix_a_listed_namespace_was_never_sent(plane: ControlPlane) -> None:
    """The entry selecting by name is what covers it: the label entries alone admit the pod."""
    rendering = template(["tenants-quotas.yaml"])
    configs = []
    for config in (
        *rendering.all("MutatingWebhookConfiguration"),
        *rendering.all("ValidatingWebhookConfiguration"),
    ):
        config["webhooks"] = [h for h in config["webhooks"] if "-named." not in h["name"]]
        for hook in config["webhooks"]:
            hook["failurePolicy"] = "Fail"
        configs.append(config)
    _namespace(plane, "vision", {})
    items = {"apiVersion": "v1", "kind": "List", "items": configs}
    plane.kubectl("apply", "-f", "-", input=json.dumps(items))
    try:
        assert _outcome(plane, "vision") == "created"
    finally:
        plane.kubectl("delete", "-f", "-", input=json.dumps(items))


def test_every_webhook_has_a_twin_for_the_listed_namespaces() -> None:
    """Pods, ConfigMaps and Kubeflow jobs alike: the entry selecting listed namespaces by name
    differs from its label twin in the name and the namespaceSelector only."""
    for config in (
        *template(["tenants-quotas.yaml"]).all("MutatingWebhookConfiguration"),
        *template(["tenants-quotas.yaml"]).all("ValidatingWebhookConfiguration"),
    ):
        hooks = {hook["name"]: hook for hook in config["webhooks"]}
        labelled = [name for name in hooks if "-named." not in name]
        assert labelled
        for name in labelled:
            first, rest = name.split(".", 1)
            twin = dict(hooks[f"{first}-named.{rest}"])
            selector = twin.pop("namespaceSelector")
            assert selector["matchExpressions"][0] == {
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": ["nlp", "vision", "vision-dev"],
            }
            twin["name"] = name
            original = {k: v for k, v in hooks[name].items() if k != "namespaceSelector"}
            assert twin == original
