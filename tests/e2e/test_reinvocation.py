"""Reinvocation: a second mutating webhook changes the pod after us, and we are called again.

The second webhook is a tiny aiohttp HTTPS server in this module. Its configuration's name sorts
after the chart's, so the API server calls gpuwarden first, then it. It adds a label, which
makes the API server call gpuwarden again (the chart sets reinvocationPolicy: IfNeeded). That
second call must return an empty patch and the pod must carry gpuwarden's mutation exactly once.
When the second webhook undoes part of gpuwarden's decision (schedulerName), the second call
puts it back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client as k8s_client

from gpuwarden.certs.loopback import loopback_serving
from gpuwarden.lab.cluster.gpuwardenserver import (
    wait_for,
)
from gpuwarden.lab.cluster.webhookstack import (
    Obj,
    WebhookStack,
    create_pod,
    delete_webhook_configurations,
    install_webhook_configurations,
    pod_annotations,
)

from .controlplane import free_ports
from .webhook import AuditLog, comparable_spec, example_pod, place_pod, pod_labels, webhook_audit

LABEL = "e2e.gpuwarden.io/labelled"
# A pod with this label also gets its schedulerName reset by the second webhook.
UNDO_LABEL = "e2e.gpuwarden.io/reset-scheduler"
CONFIG_NAME = "zz-e2e-labeller"
MUTATION_AUDIT = "mutation.webhook.admission.k8s.io"


@dataclass
class Labeller:
    """An HTTPS mutating webhook on loopback that labels every pod it sees."""

    workdir: Path
    port: int = 0
    seen: list[Obj] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    def __post_init__(self) -> None:
        self.port = free_ports(1)[0]
        self.ca, serving = loopback_serving("e2e-labeller-ca")
        self.cert, self.key = serving.write(self.workdir, "tls.crt", "tls.key")

    async def _mutate(self, request: web.Request) -> web.Response:
        review = await request.json()
        pod = review["request"]["object"]
        self.seen.append(pod)
        meta = pod.get("metadata") or {}
        patch: list[Obj] = []
        if meta.get("labels"):
            patch.append(
                {
                    "op": "add",
                    "path": "/metadata/labels/" + LABEL.replace("/", "~1"),
                    "value": "true",
                }
            )
        else:
            patch.append({"op": "add", "path": "/metadata/labels", "value": {LABEL: "true"}})
        if UNDO_LABEL in (meta.get("labels") or {}):
            patch.append(
                {"op": "replace", "path": "/spec/schedulerName", "value": "default-scheduler"}
            )
        response = {
            "uid": review["request"]["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        }
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        )

    def start(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        ready = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def serve() -> None:
            app = web.Application()
            app.add_routes([web.post("/label", self._mutate)])
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=context).start()
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(serve())
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="e2e-labeller", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the labeller webhook did not start")

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        loop = self._loop
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        loop.close()

    def configuration(self, namespace: str) -> Obj:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIG_NAME},
            "webhooks": [
                {
                    "name": "label.e2e.gpuwarden.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                    "reinvocationPolicy": "Never",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.port}/label",
                        "caBundle": base64.b64encode(self.ca.cert_pem).decode(),
                    },
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                }
            ],
        }


@pytest.fixture(scope="module")
def labelled_ns(
    gpuwarden: WebhookStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Labeller]]:
    namespace = gpuwarden.tenant_namespace("e2e-reinvoke")
    labeller = Labeller(tmp_path_factory.mktemp("labeller"))
    labeller.start()
    config = labeller.configuration(namespace)
    install_webhook_configurations(gpuwarden.api, [config])
    try:
        # Until the API server calls the labeller too (its informer catches up asynchronously).
        wait_for(
            "the second mutating webhook to be called",
            lambda: (
                LABEL
                in pod_labels(
                    create_pod(
                        gpuwarden.api, place_pod(example_pod("notebook"), namespace), dry_run=True
                    ).pod
                )
            ),
        )
        yield namespace, labeller
    finally:
        delete_webhook_configurations(gpuwarden.api, [config])
        labeller.stop()


def _rounds(event: dict[str, Any]) -> list[tuple[str, str, bool]]:
    return [
        (key, value["configuration"], value["mutated"])
        for key, value in webhook_audit(event, MUTATION_AUDIT).items()
    ]


def test_mutated_exactly_once_and_our_second_call_is_an_empty_patch(
    gpuwarden: WebhookStack, labelled_ns: tuple[str, Labeller], audit_log: AuditLog
) -> None:
    namespace, labeller = labelled_ns
    pod = place_pod(example_pod("katib-trial"), namespace)
    name = pod["metadata"]["name"]
    expected = gpuwarden.expect(pod)
    labeller.seen.clear()

    created = create_pod(gpuwarden.api, pod)

    # Our mutation, once, and the labeller's label on top of it.
    stored = created.pod
    assert comparable_spec(stored) == comparable_spec(expected.pod)
    assert pod_annotations(stored) == pod_annotations(expected.pod)
    assert pod_labels(stored) == {**pod_labels(expected.pod), LABEL: "true"}
    # The labeller ran after us: it saw the pod already mutated.
    assert [pod_annotations(p).get("gpuwarden.io/profile") for p in labeller.seen] == ["batch-hpo"]
    # We were called twice; the second time (the reinvocation) we had nothing to change.
    # Two mutations and the validation.
    calls = gpuwarden.server.awaited_admissions(3, namespace=namespace, pod=name)
    assert [(c["endpoint"], c["patched"]) for c in calls if c["endpoint"] == "mutate"] == [
        ("mutate", True),
        ("mutate", False),
    ]
    # The API server's account agrees: round 0 both mutated, round 1 we did not.
    event = audit_log.pod_creation(namespace, name)
    assert _rounds(event) == [
        ("round_0_index_0", "gpuwarden", True),
        (f"round_0_index_{_labeller_index(gpuwarden.api)}", CONFIG_NAME, True),
        ("round_1_index_0", "gpuwarden", False),
    ]


def test_reinvocation_restores_what_a_later_webhook_undid(
    gpuwarden: WebhookStack, labelled_ns: tuple[str, Labeller], audit_log: AuditLog
) -> None:
    namespace, _ = labelled_ns
    pod = place_pod(example_pod("pytorchjob-worker"), namespace)
    pod["metadata"]["labels"][UNDO_LABEL] = "true"
    name = pod["metadata"]["name"]

    created = create_pod(gpuwarden.api, pod)

    assert created.pod["spec"]["schedulerName"] == "volcano"
    assert pod_annotations(created.pod)["gpuwarden.io/profile"] == "heavy-training"
    calls = gpuwarden.server.awaited_admissions(3, namespace=namespace, pod=name)
    assert [c["patched"] for c in calls if c["endpoint"] == "mutate"] == [True, True]
    event = audit_log.pod_creation(namespace, name)
    assert _rounds(event) == [
        ("round_0_index_0", "gpuwarden", True),
        (f"round_0_index_{_labeller_index(gpuwarden.api)}", CONFIG_NAME, True),
        ("round_1_index_0", "gpuwarden", True),
    ]


def _labeller_index(api: k8s_client.ApiClient) -> int:
    """The labeller's index in the API server's mutating round: it counts every webhook of the
    configurations named before the labeller's (gpuwarden's pod and job webhooks, and their
    twins for namespaces listed by name), as the API server orders them."""
    configs = k8s_client.AdmissionregistrationV1Api(api).list_mutating_webhook_configuration()
    return sum(
        len(config.webhooks or ()) for config in configs.items if config.metadata.name < CONFIG_NAME
    )
