"""Hostile and broken AdmissionReviews against the running webhook (hypothesis).

Every answer is a valid AdmissionReview (whose patch applies to the object it came with) or a
4xx with a message; never a 5xx, never an internal error, and the server stays healthy.
Examples per property: 100 by default; ``GPUWARDEN_FUZZ_EXAMPLES=5000 make fuzz`` for more.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import http.client
import json
import os
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webhook.support import NAMESPACES, POLICY, notebook_pod, review

from gpuwarden.certs.loopback import loopback_directory
from gpuwarden.kube.cluster import StaticCluster
from gpuwarden.webhook.app import Settings
from gpuwarden.webhook.server import ServeConfig, WebhookServer

EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
MAX_BODY = 256 * 1024


class ThreadedServer:
    """The webhook on its own event loop in a thread, for synchronous hypothesis tests."""

    def __init__(self, root: Path) -> None:
        (root / "policies").mkdir()
        (root / "policies" / "policy.yaml").write_text(POLICY)
        (root / "namespaces.yaml").write_text(NAMESPACES)
        certs = loopback_directory(root / "certs")
        self.config = ServeConfig(
            policies=(root / "policies",),
            host="127.0.0.1",
            port=0,
            metrics_port=None,
            cert_dir=certs.root,
            namespaces_file=root / "namespaces.yaml",
            reload_interval=3600,
            settings=Settings(max_body=MAX_BODY),
        )
        self.ssl = ssl.create_default_context(cafile=str(certs.ca_cert))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = WebhookServer(self.config, cluster=StaticCluster(root / "namespaces.yaml"))
        self._call(self.server.start())
        self.conn = self._connect()

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=60)

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.server.port, context=self.ssl, timeout=30
        )

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                self.conn.request(
                    method, path, body=body, headers={"Content-Type": "application/json"}
                )
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError):
                # The server may close a connection after a 4xx; the next request reconnects.
                self.conn.close()
                self.conn = self._connect()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        self.conn.close()
        self._call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    running = ThreadedServer(tmp_path_factory.mktemp("fuzz"))
    yield running
    running.stop()


def check_answer(server: ThreadedServer, endpoint: str, body: bytes, sent: Any) -> None:
    status, data = server.request("POST", endpoint, body)
    assert status < 500, data[:500]
    text = data.decode("utf-8", "replace")
    assert "Traceback" not in text
    if status != 200:
        assert 400 <= status < 500
        assert text.strip(), "a 4xx must say why"
        return
    out = json.loads(data)
    assert out["kind"] == "AdmissionReview"
    assert out["apiVersion"] == sent["apiVersion"]
    response = out["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["message"]
        assert "internal error" not in response["status"]["message"], response
    for warning in response.get("warnings", []):
        assert "internal error" not in warning
    if "patch" in response:
        assert endpoint == "/mutate" and response["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(response["patch"]))
        jsonpatch.apply_patch(copy.deepcopy(sent["request"]["object"]), ops)


# --- strategies ----------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
any_json = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
quantities = st.one_of(
    st.sampled_from(
        [
            "1",
            "0",
            "1Gi",
            "1G",
            "1e3",
            "0.5",
            "500m",
            "16Gi",
            "1.5Ti",
            "-1",
            "",
            " ",
            "1Gi ",
            "1e999",
            "99999999999999999999999Gi",
            "1E",
            "0.0000000001",
            "1Gi1",
            "Gi",
            "1.2.3",
            "NaN",
            "Infinity",
            "\u0661",
            "1\u00a0Gi",
            "+1",
            ".5",
            "5.",
            "1e-3",
            "0x10",
            "1ki",
        ]
    ),
    st.text(max_size=12),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
resource_names = st.sampled_from(
    [
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory",
        "nvidia.com/mig-1g.5gb",
        "cpu",
        "memory",
        "nvidia.com/gpu.shared",
    ]
) | st.text(max_size=12)
env_names = st.sampled_from(
    ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "PATH", "X"]
) | st.text(max_size=10)
env_entry = st.one_of(
    st.fixed_dictionaries({"name": env_names, "value": st.text(max_size=20) | json_scalars}),
    st.fixed_dictionaries({"name": env_names, "valueFrom": any_json}),
    any_json,
)
container_names = (
    st.sampled_from(["main", "main", "alice-jupyter", ""]) | st.text(max_size=8) | json_scalars
)
container = st.fixed_dictionaries(
    {"name": container_names, "image": st.text(max_size=20)},
    optional={
        "resources": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "limits": st.dictionaries(resource_names, quantities, max_size=4) | any_json,
                    "requests": st.dictionaries(resource_names, quantities, max_size=4) | any_json,
                },
            ),
            any_json,
        ),
        "env": st.lists(env_entry, max_size=4) | any_json,
        "envFrom": any_json,
        "securityContext": st.fixed_dictionaries({"privileged": json_scalars}) | any_json,
    },
)
label_maps = (
    st.dictionaries(st.text(max_size=40), st.text(max_size=40) | json_scalars, max_size=5)
    | any_json
)


@st.composite
def pods(draw: st.DrawFn) -> Any:
    pod: dict[str, Any] = notebook_pod()
    if draw(st.booleans()):
        pod["spec"]["containers"] = draw(st.lists(container, max_size=4) | any_json)
    if draw(st.booleans()):
        pod["spec"]["initContainers"] = draw(st.lists(container, max_size=2) | any_json)
    if draw(st.booleans()):
        pod["spec"]["ephemeralContainers"] = draw(st.lists(container, max_size=2))
    if draw(st.booleans()):
        pod["metadata"]["labels"] = draw(label_maps)
    if draw(st.booleans()):
        pod["metadata"]["annotations"] = draw(label_maps)
    for key in (
        "schedulerName",
        "hostIPC",
        "hostPID",
        "volumes",
        "nodeSelector",
        "priorityClassName",
    ):
        if draw(st.integers(0, 5)) == 0:
            pod["spec"][key] = draw(any_json)
    if draw(st.integers(0, 6)) == 0:
        pod["spec"] = draw(any_json)
    if draw(st.integers(0, 6)) == 0:
        pod["metadata"] = draw(any_json)
    if draw(st.integers(0, 8)) == 0:
        pod.pop(draw(st.sampled_from(["spec", "metadata", "kind", "apiVersion"])), None)
    return pod


@st.composite
def reviews(draw: st.DrawFn) -> Any:
    pod = draw(pods())
    data = review(
        pod,
        operation=draw(st.sampled_from(["CREATE", "CREATE", "UPDATE"])),
        namespace=draw(st.sampled_from(["team-a", "plain", "", "ünïcödé"])),
        sub_resource=draw(st.sampled_from([None, None, "ephemeralcontainers", "status"])),
        dry_run=draw(st.booleans()),
        old=notebook_pod() if draw(st.booleans()) else None,
    )
    request = data["request"]
    if draw(st.integers(0, 4)) == 0:
        request[draw(st.sampled_from(list(request)))] = draw(any_json)
    if draw(st.integers(0, 6)) == 0:
        request.pop(draw(st.sampled_from(list(request))))
    if draw(st.integers(0, 10)) == 0:
        data["apiVersion"] = draw(st.sampled_from(["admission.k8s.io/v1beta1", "v1", ""]))
    return data


# --- properties ----------------------------------------------------------------------------


@FUZZ
@given(data=reviews(), endpoint=st.sampled_from(["/mutate", "/validate"]))
def test_structured_reviews(server: ThreadedServer, data: Any, endpoint: str) -> None:
    body = json.dumps(data, allow_nan=True).encode()
    if len(body) > MAX_BODY:
        return
    if not isinstance(data.get("request"), dict) or not isinstance(data["request"].get("uid"), str):
        status, text = server.request("POST", endpoint, body)
        assert 400 <= status < 500 and text.strip()
        return
    check_answer(server, endpoint, body, data)


@FUZZ
@given(body=st.binary(max_size=2048) | any_json.map(lambda v: json.dumps(v).encode()))
def test_random_bodies(server: ThreadedServer, body: bytes) -> None:
    status, text = server.request("POST", "/mutate", body)
    assert 400 <= status < 500, (status, text[:300])
    assert text.strip() and b"Traceback" not in text


@FUZZ
@given(
    depth=st.integers(1, 200_000),
    size=st.integers(0, 300_000),
    key=st.text(min_size=1, max_size=5),
)
def test_deep_nesting_and_huge_strings(
    server: ThreadedServer, depth: int, size: int, key: str
) -> None:
    data = review(notebook_pod(), uid="deep")
    nested = json.dumps({key: "x" * size})
    deep = "[" * depth + "1" + "]" * depth
    data["request"]["object"]["metadata"]["annotations"][key] = "placeholder"
    body = json.dumps(data).replace('"placeholder"', f'{{"s": {nested}, "d": {deep}}}')
    status, text = server.request("POST", "/mutate", body.encode())
    assert status in (200, 400, 413), (status, text[:300])
    if status == 200:
        response = json.loads(text)["response"]
        assert response["uid"] == "deep" and isinstance(response["allowed"], bool)
        assert "internal error" not in json.dumps(response)
    else:
        assert text.strip()


def test_healthy_after_the_fuzzing(server: ThreadedServer) -> None:
    assert server.request("GET", "/healthz") == (200, b"ok\n")
    data = review(notebook_pod())
    status, body = server.request("POST", "/mutate", json.dumps(data).encode())
    assert status == 200 and json.loads(body)["response"]["allowed"] is True
    context = server.server.context
    assert context is not None
    metrics = context.metrics.exposition().decode()
    assert "gpuwarden_admission_internal_errors_total{" not in metrics, "an evaluation crashed"
