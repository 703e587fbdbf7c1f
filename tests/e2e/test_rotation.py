"""Certificate rotation while pods are being created loses no request.

gpuwarden serve runs with --cert-dir, and the files there are rotated under it with the
project's own rotation steps (gpuwarden.certs.rotation, as `gpuwarden certs` runs them) while
two threads keep creating pods through the API server:

1. the serving certificate is renewed from the same CA;
2. a new CA is added to the bundle and the bundle published to the webhook configurations
   (gpuwarden.kube.webhooks.inject_ca_bundle, as `gpuwarden certs inject` does); then the
   serving certificate moves to the new CA; then the old CA is dropped from the published
   bundle, which makes the API server open new connections that only the new chain verifies.

Every creation must succeed and come back mutated. A control shows the stream would notice: a
bundle that does not verify the server makes the API server refuse the pods.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.certs.authority import new_ca
from gpuwarden.certs.rotation import (
    CertDirectory,
    bundle_pem,
    load_bundle,
    renew_serving,
    rotate_ca,
)
from gpuwarden.kube.webhooks import inject_ca_bundle
from gpuwarden.lab.cluster.gpuwardenserver import (
    presented_certificate,
    wait_for,
)
from gpuwarden.lab.cluster.webhookstack import (
    RELEASE_NAME,
    WebhookStack,
    create_pod,
    pod_annotations,
    wait_until_governed,
)

from .controlplane import ControlPlane
from .webhook import api_error, example_pod, place_pod


@dataclass(frozen=True)
class Outcome:
    name: str
    ok: bool
    mutated: bool = False
    error: str = ""


@dataclass
class PodStream:
    """Threads creating notebook pods back to back until stopped."""

    plane: ControlPlane
    namespace: str
    threads: int = 2
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def _run(self) -> None:
        api = self.plane.api_client()
        try:
            while not self._stop.is_set():
                pod = place_pod(example_pod("notebook"), self.namespace)
                name = pod["metadata"]["name"]
                try:
                    created = create_pod(api, pod)
                except ApiException as exc:
                    outcome = Outcome(name, ok=False, error=api_error(exc)[1])
                except Exception as exc:  # a lost request of any kind is a finding
                    outcome = Outcome(name, ok=False, error=f"{type(exc).__name__}: {exc}")
                else:
                    profile = pod_annotations(created.pod).get("gpuwarden.io/profile")
                    outcome = Outcome(name, ok=True, mutated=profile == "notebook")
                with self._lock:
                    self.outcomes.append(outcome)
        finally:
            api.close()  # type: ignore[no-untyped-call]

    def start(self) -> None:
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, name=f"pod-stream-{index}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for worker in self._workers:
            worker.join(30)
        with self._lock:
            return list(self.outcomes)

    def count(self) -> int:
        with self._lock:
            return len(self.outcomes)

    def wait_for_more(self, extra: int, what: str) -> None:
        """Until ``extra`` more creations have completed (so some ran in the new state)."""
        target = self.count() + extra
        wait_for(f"{extra} more pod creations {what}", lambda: self.count() >= target, 30)


@pytest.fixture
def stream(control_plane: ControlPlane, gpuwarden: WebhookStack) -> Iterator[PodStream]:
    namespace = gpuwarden.tenant_namespace("e2e-rotate")
    stream = PodStream(control_plane, namespace)
    stream.start()
    try:
        yield stream
    finally:
        stream.stop()


def _serving_der(stack: WebhookStack) -> bytes:
    cert = x509.load_pem_x509_certificate(
        CertDirectory(stack.server.cert_dir).tls_cert.read_bytes()
    )
    return cert.public_bytes(serialization.Encoding.DER)


def _wait_presented(stack: WebhookStack, der: bytes, cafile_pem: bytes, tmp: str) -> None:
    """Until the server hands new connections ``der`` (verified against ``cafile_pem``)."""
    cafile = Path(tmp) / f"trust-{time.monotonic_ns()}.pem"
    cafile.write_bytes(cafile_pem)
    wait_for(
        "gpuwarden serve to present the rotated certificate",
        lambda: presented_certificate(stack.server.port, cafile) == der,
        15,
    )


def test_rotation_during_a_stream_of_pod_creations_loses_nothing(
    gpuwarden: WebhookStack, stream: PodStream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = str(tmp_path_factory.mktemp("trust"))
    directory = CertDirectory(gpuwarden.server.cert_dir)
    reloads = gpuwarden.server.sample_sum("gpuwarden_certificate_reloads_total", result="ok")
    old_bundle = directory.ca_cert.read_bytes()
    stream.wait_for_more(10, "before any rotation")

    # 1. Renewal from the same CA.
    renew_serving(directory)
    _wait_presented(gpuwarden, _serving_der(gpuwarden), old_bundle, tmp)
    stream.wait_for_more(10, "after the renewal")

    # 2. CA rotation: new CA in the bundle, published; then the serving certificate moves.
    bundle = rotate_ca(directory)
    new_ca_pem = bundle_pem(bundle[:1])
    assert len(bundle) == 2
    inject_ca_bundle(gpuwarden.api, RELEASE_NAME, bundle_pem(bundle))
    stream.wait_for_more(10, "with both CAs published")
    renew_serving(directory)
    _wait_presented(gpuwarden, _serving_der(gpuwarden), new_ca_pem, tmp)
    stream.wait_for_more(10, "after the move to the new CA")
    # The old CA goes: the API server's clients for our webhooks are rebuilt with only the
    # new CA, so every connection from here on must verify the new chain.
    inject_ca_bundle(gpuwarden.api, RELEASE_NAME, new_ca_pem)
    stream.wait_for_more(20, "with only the new CA published")

    outcomes = stream.stop()
    failed = [o for o in outcomes if not o.ok]
    assert failed == [], f"{len(failed)} of {len(outcomes)} creations failed: {failed[:3]}"
    unmutated = [o.name for o in outcomes if not o.mutated]
    assert unmutated == [], f"{len(unmutated)} pods came back unmutated"
    # Nothing lost: every creation that returned is stored.
    core = k8s_client.CoreV1Api(gpuwarden.api)
    listed: Any = core.list_namespaced_pod(stream.namespace)
    stored = {p.metadata.name for p in listed.items}
    assert {o.name for o in outcomes} <= stored
    after = gpuwarden.server.sample_sum("gpuwarden_certificate_reloads_total", result="ok")
    assert after - reloads >= 2
    assert len(load_bundle(directory.ca_cert.read_bytes())) == 2


def test_a_bundle_that_does_not_verify_the_server_blocks_pods(gpuwarden: WebhookStack) -> None:
    """The control: what a broken rotation looks like (failurePolicy Fail)."""
    namespace = gpuwarden.tenant_namespace("e2e-rotate-bad")
    stranger = new_ca(common_name="not-gpuwarden", valid_for=timedelta(days=1))
    good = CertDirectory(gpuwarden.server.cert_dir).ca_cert.read_bytes()
    inject_ca_bundle(gpuwarden.api, RELEASE_NAME, stranger.cert_pem)
    try:

        def refused() -> str | None:
            try:
                create_pod(
                    gpuwarden.api, place_pod(example_pod("notebook"), namespace), dry_run=True
                )
            except ApiException as exc:
                text = api_error(exc)[1]
                return text if "failed calling webhook" in text else None
            return None

        text = wait_for("the API server to use the stranger's bundle", refused)
        assert "x509" in text or "certificate" in text
    finally:
        inject_ca_bundle(gpuwarden.api, RELEASE_NAME, good)
    wait_until_governed(gpuwarden.api, namespace, "kubeflow-profiles")
