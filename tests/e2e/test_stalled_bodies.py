"""Bodies declared but never sent do not stop admission (issue 29, item 1), through the API server.

While 24 connections to gpuwarden serve each declare the largest body (6 MiB) to /validate,
send one byte and wait, a 1-GPU pod is created through the real kube-apiserver and comes back
mutated as usual. Before the fix, the stalled bodies held the whole in-flight budget and the API
server's reviews were answered 503 at the deadline: the pod was refused.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import urllib.request
from collections.abc import Iterator

from gpuwarden.lab.cluster.gpuwardenserver import wait_for
from gpuwarden.lab.cluster.webhookstack import (
    WebhookStack,
    create_pod,
    gpu_probe_pod,
    pod_annotations,
)

ATTACKERS = 24
DECLARED = 6 * 1024 * 1024


@contextlib.contextmanager
def stalled_bodies(port: int, ca: str, count: int) -> Iterator[list[ssl.SSLSocket]]:
    """``count`` TLS connections (certificate verified), each a request whose body never comes."""
    ctx = ssl.create_default_context(cafile=ca)
    head = (
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {DECLARED}\r\n\r\n{{"
    ).encode()
    held: list[ssl.SSLSocket] = []
    try:
        for _ in range(count):
            conn = ctx.wrap_socket(
                socket.create_connection(("127.0.0.1", port), timeout=10),
                server_hostname="127.0.0.1",
            )
            conn.sendall(head)
            held.append(conn)
        yield held
    finally:
        for conn in held:
            conn.close()


def in_flight(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = re.search(r"^gpuwarden_admission_in_flight ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_gpu_pod_is_mutated_while_stalled_bodies_are_held(gpuwarden: WebhookStack) -> None:
    namespace = gpuwarden.tenant_namespace("e2e-stalled")
    server = gpuwarden.server
    with stalled_bodies(server.port, str(server.ca_bundle_path), ATTACKERS):
        wait_for(
            "the stalled requests are being handled",
            lambda: in_flight(server.metrics_port) >= ATTACKERS,
        )
        pod = gpu_probe_pod(namespace)
        created = create_pod(gpuwarden.api, pod)
        expected = gpuwarden.expect(pod)
        assert created.status == 201 and expected.allowed
        annotations = pod_annotations(created.pod)
        for key in ("gpuwarden.io/tenant", "gpuwarden.io/profile"):
            assert annotations.get(key) == pod_annotations(expected.pod)[key], key
        # Still stalled (each answered 408 only once its grace and declared size are spent).
        assert in_flight(server.metrics_port) >= ATTACKERS
