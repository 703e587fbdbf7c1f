"""Helpers for the webhook tests: reviews, example pods, and a verifying HTTPS client."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
from cryptography import x509

from gpuwarden.certs.rotation import CertDirectory
from gpuwarden.webhook.app import Settings
from gpuwarden.webhook.server import ServeConfig, WebhookServer

POLICY = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: test}
spec:
  backend: volcano
  profiles:
    - {name: light-training, gpuShare: true, maxMemory: 16Gi, overcommitRatio: 1.5, priority: 100}
  workloads:
    - {name: notebooks, match: {kind: notebook}, profile: light-training}
  tenants:
    - {name: team-a, namespaces: [team-a]}
  defaultProfile: light-training
"""

# The same policy with a smaller GPU-memory cap: what a hot reload should start serving.
POLICY_8GI = POLICY.replace("maxMemory: 16Gi", "maxMemory: 8Gi")

BAD_POLICY = POLICY.replace("profile: light-training}", "profile: no-such-profile}")

NAMESPACES = """\
apiVersion: v1
kind: Namespace
metadata: {name: team-a, labels: {app.kubernetes.io/part-of: kubeflow-profile}}
---
apiVersion: v1
kind: Namespace
metadata: {name: plain}
"""


def notebook_pod(namespace: str = "team-a", *, gpus: str = "1") -> dict[str, Any]:
    """A Kubeflow Notebook server pod, as the Notebook controller's StatefulSet creates it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "alice-jupyter-0",
            "namespace": namespace,
            "labels": {
                "app": "alice-jupyter",
                "notebook-name": "alice-jupyter",
                "statefulset": "alice-jupyter",
                "statefulset.kubernetes.io/pod-name": "alice-jupyter-0",
            },
            "annotations": {"notebooks.kubeflow.org/server-type": "jupyter"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": "alice-jupyter",
                    "uid": "4e5f6a7b-8c9d-4e0f-a1b2-c3d4e5f6a7b8",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "serviceAccountName": "default-editor",
            "containers": [
                {
                    "name": "alice-jupyter",
                    "image": "ghcr.io/kubeflow/kubeflow/jupyter-pytorch-cuda-full:v1.9.2",
                    "env": [{"name": "NB_PREFIX", "value": f"/notebook/{namespace}/alice-jupyter"}],
                    "resources": {
                        "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": gpus},
                        "requests": {"cpu": "1", "memory": "4Gi"},
                    },
                }
            ],
        },
    }


def cpu_pod(namespace: str = "team-a") -> dict[str, Any]:
    pod = notebook_pod(namespace)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    return pod


def review(
    obj: Mapping[str, Any] | None,
    *,
    namespace: str = "team-a",
    operation: str = "CREATE",
    api_version: str = "admission.k8s.io/v1",
    kind: Mapping[str, str] | None = None,
    resource: Mapping[str, str] | None = None,
    dry_run: bool = False,
    old: Mapping[str, Any] | None = None,
    sub_resource: str | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """An AdmissionReview request as the API server sends it."""
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": dict(kind or {"group": "", "version": "v1", "kind": "Pod"}),
        "resource": dict(resource or {"group": "", "version": "v1", "resource": "pods"}),
        "requestKind": dict(kind or {"group": "", "version": "v1", "kind": "Pod"}),
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
        "object": copy.deepcopy(obj) if obj is not None else None,
        "oldObject": copy.deepcopy(old) if old is not None else None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if obj is not None and isinstance(obj.get("metadata"), Mapping):
        request["name"] = obj["metadata"].get("name", "")
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def decoded_patch(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    assert response.get("patchType") == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def apply_response(pod: Mapping[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    if "patch" not in response:
        return copy.deepcopy(dict(pod))
    result: dict[str, Any] = jsonpatch.apply_patch(
        copy.deepcopy(dict(pod)), decoded_patch(response)
    )
    return result


@dataclass
class Workdir:
    root: Path
    policies: Path
    namespaces: Path
    certs: CertDirectory

    def write_policy(self, text: str, name: str = "policy.yaml") -> None:
        tmp = self.policies / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(self.policies / name)


def client_context(ca: Path, *, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(*client)
    return ctx


@dataclass
class Webhook:
    """A started server and a verifying HTTPS client for it."""

    server: WebhookServer
    session: aiohttp.ClientSession
    ca: Path
    ssl: ssl.SSLContext
    log: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.metrics_port}"

    async def post(
        self, path: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        async with self.session.post(
            self.url + path,
            data=body,
            headers={"Content-Type": "application/json", **(headers or {})},
            ssl=self.ssl,
        ) as resp:
            return resp.status, await resp.text()

    async def admit(self, endpoint: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """POST a review and return its response part, checking the envelope."""
        status, text = await self.post(f"/{endpoint}", json.dumps(data).encode())
        assert status == 200, text
        out = json.loads(text)
        assert out["kind"] == "AdmissionReview"
        assert out["apiVersion"] == data["apiVersion"]
        assert out["response"]["uid"] == data["request"]["uid"]
        response: dict[str, Any] = out["response"]
        return response

    async def get(self, path: str, *, metrics_port: bool = False) -> tuple[int, str]:
        url = (self.metrics_url if metrics_port else self.url) + path
        async with self.session.get(url, ssl=None if metrics_port else self.ssl) as resp:
            return resp.status, await resp.text()

    async def serves(self) -> None:
        """The server still answers a good review correctly."""
        response = await self.admit("mutate", review(notebook_pod()))
        assert response["allowed"] is True
        assert "patch" in response


def base_config(work: Workdir, **changes: Any) -> ServeConfig:
    config = ServeConfig(
        policies=(work.policies,),
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        cert_dir=work.certs.root,
        namespaces_file=work.namespaces,
        # Tests drive the periodic work with server.tick(); the loop itself is tested apart.
        reload_interval=3600.0,
        shutdown_timeout=5.0,
        settings=Settings(),
    )
    return replace(config, **changes)


class RawConnection:
    """One HTTP/1.1 keep-alive connection over TLS, with access to the TLS session."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, ctx: ssl.SSLContext) -> RawConnection:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
        )
        return cls(reader, writer)

    @property
    def ssl_object(self) -> ssl.SSLObject:
        obj: ssl.SSLObject = self.writer.get_extra_info("ssl_object")
        return obj

    def peer_serial(self) -> int:
        der = self.ssl_object.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        return await self.response()

    async def response(self) -> tuple[int, bytes]:
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("connection closed before a response")
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await self.writer.wait_closed()
