"""`gpuwarden serve` as a process: SIGTERM with requests in flight, and --workers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.cli import main

from .support import RawConnection, Workdir, client_context, notebook_pod, review


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Served:
    def __init__(self, workdir: Workdir, *extra: str) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.log = workdir.root / f"serve-{self.port}.log"
        argv = [
            sys.executable,
            "-m",
            "gpuwarden",
            "serve",
            "--policies",
            str(workdir.policies),
            "--namespaces",
            str(workdir.namespaces),
            "--cert-dir",
            str(workdir.certs.root),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
            *extra,
        ]
        self.handle = self.log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self.handle, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=1
                ) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"not ready in {timeout}s:\n{self.log.read_text()}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as resp:
            text: str = resp.read().decode()
            return text

    def wait_for_metric(self, line: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.metrics().splitlines():
            assert time.monotonic() < deadline, f"no {line!r} in /metrics"
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.handle.close()


async def wait_refused(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        writer.close()
        assert time.monotonic() < deadline, "the server kept accepting connections"
        await asyncio.sleep(0.02)


def admission_lines(log: str) -> list[dict[str, Any]]:
    """The one-per-admission JSON lines of a server's log."""
    entries = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [entry for entry in entries if entry.get("msg") == "admission"]


@pytest.fixture
def served(workdir: Workdir) -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for item in started:
        item.stop()


async def test_sigterm_answers_every_request_in_flight(
    workdir: Workdir, served: list[Served]
) -> None:
    server = Served(workdir)
    served.append(server)
    await asyncio.to_thread(server.wait_ready)
    ctx = client_context(workdir.certs.ca_cert)
    body = json.dumps(review(notebook_pod())).encode()
    half = len(body) // 2
    # Each connection has sent the headers and half of the body: its request is in flight.
    conns = [await RawConnection.open(server.port, ctx) for _ in range(8)]
    for conn in conns:
        conn.writer.write(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:half]
        )
        await conn.writer.drain()
    # A kept-alive idle connection, too.
    idle = await RawConnection.open(server.port, ctx)
    assert (await idle.request("POST", "/mutate", body))[0] == 200
    await asyncio.to_thread(server.wait_for_metric, "gpuwarden_admission_in_flight 8.0")
    server.proc.send_signal(signal.SIGTERM)
    await wait_refused(server.port)  # draining: no new connections, in-flight ones go on
    for conn in conns:
        conn.writer.write(body[half:])
        await conn.writer.drain()
    results = [await asyncio.wait_for(conn.response(), timeout=10) for conn in conns]
    for status, data in results:
        assert status == 200
        assert json.loads(data)["response"]["allowed"] is True
    code = await asyncio.to_thread(server.proc.wait, 15)
    assert code == 0, server.log.read_text()
    log = server.log.read_text()
    assert "stopping: finishing in-flight requests" in log
    assert len(admission_lines(log)) == 9


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_drain_delay_keeps_accepting_while_unready(
    workdir: Workdir, served: list[Served]
) -> None:
    """During a rollout the API server still opens connections to a terminating replica for a
    moment: with --drain-delay they are answered, and /readyz says the replica is going."""
    server = Served(workdir, "--drain-delay", "60")
    served.append(server)
    await asyncio.to_thread(server.wait_ready)
    ctx = client_context(workdir.certs.ca_cert)
    body = json.dumps(review(notebook_pod())).encode()
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    while (status := readyz(server.metrics_port))[0] != 503:
        assert time.monotonic() < deadline, f"still ready after SIGTERM: {status}"
        await asyncio.sleep(0.02)
    assert "shutting down" in status[1]
    late = await RawConnection.open(server.port, ctx)  # a new connection is still accepted
    status_code, data = await late.request("POST", "/mutate", body)
    assert status_code == 200 and json.loads(data)["response"]["allowed"] is True
    server.proc.send_signal(signal.SIGTERM)  # a second signal ends the delay
    assert await asyncio.to_thread(server.proc.wait, 15) == 0


async def test_workers_share_the_port(workdir: Workdir, served: list[Served]) -> None:
    server = Served(workdir, "--workers", "2")
    served.append(server)
    await asyncio.to_thread(server.wait_ready)
    ctx = client_context(workdir.certs.ca_cert)
    body = json.dumps(review(notebook_pod())).encode()
    pids: set[str] = set()
    deadline = time.monotonic() + 30
    total = 0
    # Connections are spread by the kernel; keep connecting until both workers have answered.
    while len(pids) < 2:
        assert time.monotonic() < deadline, "only one worker ever answered"
        conn = await RawConnection.open(server.port, ctx)
        status, _ = await conn.request("POST", "/mutate", body)
        assert status == 200
        total += 1
        await conn.close()
        pids |= {entry["worker"] for entry in admission_lines(server.log.read_text())}
    text = server.metrics()
    counted = [
        line
        for line in text.splitlines()
        if line.startswith(
            'gpuwarden_admission_requests_total{decision="allowed",endpoint="mutate"'
        )
    ]
    assert len(counted) == 1 and float(counted[0].split()[-1]) == total
    os.kill(server.proc.pid, signal.SIGTERM)
    code = await asyncio.to_thread(server.proc.wait, 20)
    assert code == 0, server.log.read_text()


def test_bad_flags_are_refused_with_a_message(workdir: Workdir, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "serve", "--policies", str(workdir.policies)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--cert-dir" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "serve",
            "--policies",
            str(workdir.policies),
            "--tls-cert",
            str(tmp_path / "nope.crt"),
            "--tls-key",
            str(tmp_path / "nope.key"),
            "--namespaces",
            str(workdir.namespaces),
            "--port",
            str(free_port()),
            "--metrics-port",
            "-1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "nope.crt" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--deadline", "0"], "--deadline must be positive"),
        (["--reload-interval", "0"], "--reload-interval must be positive"),
        (["--drain-delay", "-1"], "--drain-delay must not be negative"),
        (["--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_serve_refuses_bad_numbers_with_a_message(
    workdir: Workdir, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    base = ["serve", "--policies", str(workdir.policies), "--cert-dir", str(workdir.certs.root)]
    assert main([*base, *argv]) == 2
    assert message in capsys.readouterr().err
