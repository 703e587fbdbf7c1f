"""What the e2e suites expect of pods, and the API server's audit log.

The webhook stack itself (``gpuwarden serve`` against the control plane, the chart's webhook
configurations, PriorityClasses, namespaces, pod creation) is :mod:`gpuwarden.lab.cluster.webhookstack`,
which ``bench/apiserver.py`` uses too. Here is only what the tests assert with:

* Pods: the Kubeflow examples moved into test namespaces, reading them back, refusals and their
  warnings, and the parts of a pod gpuwarden changes, in a form that compares across the API
  server's canonical spelling.
* The API server's audit log: which webhook mutated a pod in which round, or failed open.
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.controlplane import json_log_records
from gpuwarden.lab.cluster.gpuwardenserver import (
    POLICIES_DIR,
    WebhookStackError,
    wait_for,
)
from gpuwarden.lab.cluster.webhookstack import (
    Obj,
    parse_warning,
)
from gpuwarden.policy.pod.quantity import parse_quantity

from .controlplane import REPO_ROOT

EXAMPLES_DIR = REPO_ROOT / "examples"
POLICY_TEST_PODS = POLICIES_DIR / "tests" / "pods"

KUBEFLOW_EXAMPLES = (
    "kfp-train-step",
    "kfp-driver",
    "pytorchjob-worker",
    "trainjob-node",
    "katib-trial",
    "notebook",
    "kserve-predictor",
)


# --- pods ------------------------------------------------------------------------------------


def load_pod(path: Path) -> Obj:
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("kind") != "Pod":
        raise WebhookStackError(f"{path}: not a Pod manifest")
    return doc


def example_pod(name: str) -> Obj:
    return load_pod(EXAMPLES_DIR / f"{name}.yaml")


def place_pod(pod: Mapping[str, Any], namespace: str, *, suffix: str | None = None) -> Obj:
    """A copy of ``pod`` in ``namespace``, its name made unique with a suffix.

    Owner references stay: the API server accepts references to owners that do not exist
    (there is no garbage collector here to act on them).
    """
    placed = copy.deepcopy(dict(pod))
    meta = placed.setdefault("metadata", {})
    meta["namespace"] = namespace
    suffix = suffix if suffix is not None else uuid.uuid4().hex[:5]
    base = str(meta.get("name", "pod"))[: 62 - len(suffix)]
    meta["name"] = f"{base}-{suffix}" if suffix else base
    return placed


def read_pod(api: k8s_client.ApiClient, namespace: str, name: str) -> Obj:
    core = k8s_client.CoreV1Api(api)
    response: Any = core.read_namespaced_pod(name, namespace, _preload_content=False)
    pod: Obj = json.loads(response.data)
    return pod


def pod_exists(api: k8s_client.ApiClient, namespace: str, name: str) -> bool:
    try:
        read_pod(api, namespace, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def api_error(exc: ApiException) -> tuple[int, str]:
    """The HTTP status and Status.message of a refused request."""
    message = str(exc.body or "")
    with contextlib.suppress(ValueError, TypeError):
        message = str(json.loads(exc.body or "").get("message", message))
    return int(exc.status or 0), message


def exception_warnings(exc: ApiException) -> tuple[str, ...]:
    headers = exc.headers
    if headers is None:
        return ()
    getlist = getattr(headers, "getlist", None)
    values = getlist("Warning") if getlist is not None else [headers.get("Warning", "")]
    return tuple(parse_warning(v) for v in values if v)


def plain_pod(namespace: str, *, name: str | None = None) -> Obj:
    """A pod without any GPU."""
    pod = load_pod(POLICY_TEST_PODS / "plain-web.yaml")
    pod["metadata"]["name"] = name or f"web-{uuid.uuid4().hex[:8]}"
    pod["metadata"]["namespace"] = namespace
    return pod


def pod_labels(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("labels") or {})


# --- what the policy core expects ------------------------------------------------------------


def quantities(resources: Mapping[str, Any] | None) -> dict[str, Decimal]:
    """A resources map with each quantity as a number (the API server canonicalizes spelling)."""
    return {name: parse_quantity(value) for name, value in (resources or {}).items()}


def comparable_spec(pod: Mapping[str, Any]) -> Obj:
    """spec with every resource quantity as a number (the API server canonicalizes spelling)."""
    spec = copy.deepcopy(dict(pod.get("spec") or {}))
    for field_name in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(field_name) or []:
            resources = container.get("resources") or {}
            for part in ("requests", "limits"):
                if part in resources:
                    resources[part] = quantities(resources[part])
    return spec


def scheduler_name(pod: Mapping[str, Any]) -> str:
    """spec.schedulerName, with the API server's default for an unset one."""
    return str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")


# --- the API server's audit log --------------------------------------------------------------

#: Metadata-level events for pod creations: enough for the admission webhooks' annotations
#: (mutation.webhook.admission.k8s.io/round_<r>_index_<i>: which webhook mutated the pod in which
#: round; failed-open.*: a webhook that failed under failurePolicy Ignore).
AUDIT_POLICY: Obj = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["create"],
            "resources": [{"group": "", "resources": ["pods"]}],
        },
        {"level": "None"},
    ],
}


@dataclass(frozen=True)
class AuditLog:
    path: Path

    def events(self) -> list[Obj]:
        return json_log_records(self.path)

    def pod_creation(self, namespace: str, name: str, timeout: float = 10.0) -> Obj:
        """The ResponseComplete event of the (last) creation of pod namespace/name."""

        def find() -> Obj | None:
            for event in reversed(self.events()):
                ref = event.get("objectRef") or {}
                if (
                    event.get("stage") == "ResponseComplete"
                    and event.get("verb") == "create"
                    and ref.get("resource") == "pods"
                    and ref.get("namespace") == namespace
                    and ref.get("name") == name
                ):
                    return event
            return None

        return wait_for(f"the audit event of creating pod {namespace}/{name}", find, timeout)


def webhook_audit(event: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The audit annotations ``<prefix>/round_R_index_I`` of an event, by suffix.

    Values that are JSON (mutation.webhook.admission.k8s.io) are decoded; others (the webhook
    name of failed-open.*) are kept as text.
    """
    out: dict[str, Any] = {}
    for key, value in (event.get("annotations") or {}).items():
        if key.startswith(prefix + "/"):
            try:
                out[key.split("/", 1)[1]] = json.loads(value)
            except ValueError:
                out[key.split("/", 1)[1]] = value
    return dict(sorted(out.items()))


def serve_crd(api: k8s_client.ApiClient, crd: Mapping[str, Any]) -> Any:
    """Create ``crd`` (one already there is kept) and wait until the API server serves each of
    its versions; the custom objects client."""
    extensions = k8s_client.ApiextensionsV1Api(api)
    try:
        extensions.create_custom_resource_definition(crd)
    except ApiException as exc:
        if exc.status != 409:
            raise
    spec = crd["spec"]
    group, plural = spec["group"], spec["names"]["plural"]
    versions = [v["name"] for v in spec["versions"] if v.get("served", True)]
    objects: Any = k8s_client.CustomObjectsApi(api)

    def served() -> bool:
        for version in versions:
            objects.list_cluster_custom_object(group, version, plural)
        return True

    wait_for(f"the {spec['names']['kind']} CRD to be served", served, timeout=30)
    return objects
