"""`gpuwarden usage` against a stand-in Prometheus HTTP API on loopback (answers as Prometheus
writes them), and the errors a user meets: a bad URL or duration, nothing listening, a refusal.

The same command against a real Prometheus scraping a node agent is tests/e2e/test_usage.py.
"""

from __future__ import annotations

import csv
import io
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpuwarden.cli import main
from gpuwarden.commands.usage import duration_seconds, queries

GIB = 2**30


def vector(*samples: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": labels, "value": [1764892800.0, str(value)]} for labels, value in samples
            ],
        },
    }


A = {"tenant": "team-a", "profile": "gpu-1"}
B = {"tenant": "team-b", "profile": "shared-small"}
ANSWERS = {
    "gpuwarden:tenant_gpus_allocated": vector((A, 336), (B, 84)),
    "gpuwarden:tenant_gpus_busy": vector((A, 134.4), (B, 63)),
    "gpuwarden:tenant_gpus_idle": vector((A, 168), (B, 0)),
    "gpuwarden:tenant_gpu_memory_used_bytes": vector((A, 1000 * GIB), (B, 200 * GIB)),
    "gpuwarden:container_gpus_idle": vector(
        ({"namespace": "team-a", "pod": "nb-idle", **A}, 160),
        ({"namespace": "team-a", "pod": "nb-2", **A}, 8),
    ),
}


class FakePrometheus(BaseHTTPRequestHandler):
    """Answers /api/v1/query with the recorded vector of the series the query names."""

    seen: list[str]

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        expr = urllib.parse.parse_qs(url.query).get("query", [""])[0]
        self.seen.append(expr)
        if url.path != "/api/v1/query":
            self._send(404, {"status": "error", "error": "not found"})
            return
        for series, answer in ANSWERS.items():
            if f"({series}[" in expr:
                self._send(200, answer)
                return
        self._send(400, {"status": "error", "errorType": "bad_data", "error": "unknown query"})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (FakePrometheus,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["usage", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_per_tenant_and_profile_and_the_idlest_pods(
    prometheus: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, seen = prometheus
    code, out, err = run(capsys, "--prometheus", url, "--since", "7d")
    assert (code, err) == (0, "")
    assert out == (
        f"GPU usage over the last 7d (Prometheus {url}, step 1m)\n"
        "\n"
        "TENANT  PROFILE       GPU-H ALLOCATED  GPU-H BUSY  GPU-H IDLE  EFFICIENCY  GPU-MEM GIB-H\n"
        "team-a  gpu-1         336.00           134.40      168.00      40%         1000.00\n"
        "team-b  shared-small  84.00            63.00       0.00        75%         200.00\n"
        "\n"
        "Pods holding the most idle GPU-hours\n"
        "\n"
        "NAMESPACE  POD      TENANT  PROFILE  GPU-H IDLE\n"
        "team-a     nb-idle  team-a  gpu-1    160.00\n"
        "team-a     nb-2     team-a  gpu-1    8.00\n"
    )
    # GPU-hours: the recorded series integrated over 7d in one-minute steps
    assert "sum_over_time(gpuwarden:tenant_gpus_allocated[7d:1m]) * 60 / 3600" in seen
    assert any(q.startswith("topk(10, ") for q in seen)


def test_json_and_csv_carry_the_same_figures(
    prometheus: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = prometheus
    code, out, _ = run(capsys, "--prometheus", url, "-o", "json", "--top", "1")
    assert code == 0
    report = json.loads(out)
    assert report["tenants"][0] == {
        "tenant": "team-a",
        "profile": "gpu-1",
        "gpu_hours_allocated": 336.0,
        "gpu_hours_busy": 134.4,
        "gpu_hours_idle": 168.0,
        "efficiency": 0.4,
        "gpu_memory_gib_hours": 1000.0,
    }
    assert [p["pod"] for p in report["idle_pods"]] == ["nb-idle", "nb-2"]  # as answered
    code, out, _ = run(capsys, "--prometheus", url, "-o", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["scope"], r["tenant"], r["pod"]) for r in rows] == [
        ("tenant", "team-a", ""),
        ("tenant", "team-b", ""),
        ("pod", "team-a", "nb-idle"),
        ("pod", "team-a", "nb-2"),
    ]
    assert rows[1]["efficiency"] == "0.75" and rows[2]["gpu_hours_idle"] == "160.0"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--prometheus", "prometheus:9090"],
            "--prometheus 'prometheus:9090' is not an http(s) URL",
        ),
        (["--since", "7days"], "--since '7days' is not a duration"),
        (["--since", "0d"], "--since '0d' is not a duration"),
        (["--step", "1q"], "--step '1q' is not a duration"),
        (["--top", "-1"], "--top must be 0 or more"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if "--prometheus" not in argv:
        argv = ["--prometheus", "http://127.0.0.1:9", *argv]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"gpuwarden usage: {message}")


def test_an_unreachable_prometheus_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        code, out, err = run(capsys, "--prometheus", f"http://127.0.0.1:{port}", "--timeout", "5")
    assert (code, out) == (1, "")
    assert err.startswith(f"gpuwarden usage: cannot reach Prometheus at http://127.0.0.1:{port}: ")


def test_a_refused_query_says_what_prometheus_said(
    prometheus: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = prometheus
    code, _, err = run(capsys, "--prometheus", url + "/not-prometheus")
    assert code == 1
    assert "answered HTTP 404" in err and "not found" in err


def test_no_recorded_usage_says_what_to_turn_on(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwarden.commands.usage import Report, render_table

    text = render_table(Report("http://p:9090", "7d", "1m", (), ()))
    assert "no GPU usage recorded" in text and "monitoring.prometheusRule.enabled" in text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604800), ("1h30m", 5400), ("90m", 5400), ("1w2d", 777600), ("500ms", 0.5)],
)
def test_durations_read_as_prometheus_reads_them(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


def test_no_pods_asked_no_pod_query() -> None:
    assert "idle_pods" not in queries("7d", "1m", 60, 0)
