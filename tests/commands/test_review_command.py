"""`gpuwarden review` against a running webhook, and `gpuwarden serve` on a busy port
(issue 21, item 5): what `make run` gives a user to try it with."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuwarden.certs.loopback import loopback_directory
from gpuwarden.certs.rotation import CertDirectory
from gpuwarden.cli import main
from gpuwarden.kube.cluster import StaticCluster
from gpuwarden.webhook.app import Settings
from gpuwarden.webhook.server import ServeConfig, WebhookServer

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
NAMESPACES = ROOT / "examples" / "namespaces.yaml"
SAMPLE = ROOT / "examples" / "admissionreview-notebook.json"
ESCAPE = POLICIES / "tests" / "pods" / "escape-mps-pipe.yaml"


@pytest.fixture
def certs(tmp_path: Path) -> CertDirectory:
    return loopback_directory(tmp_path / "certs")


@pytest.fixture
async def server(certs: CertDirectory) -> AsyncIterator[WebhookServer]:
    config = ServeConfig(
        policies=(POLICIES,),
        host="127.0.0.1",
        port=0,
        metrics_port=None,
        cert_dir=certs.root,
        namespaces_file=NAMESPACES,
        reload_interval=3600.0,
        shutdown_timeout=5.0,
        settings=Settings(),
    )
    webhook = WebhookServer(config, cluster=StaticCluster(NAMESPACES))
    await webhook.start()
    try:
        yield webhook
    finally:
        await webhook.stop()


async def review(
    capsys: pytest.CaptureFixture[str], server: WebhookServer, certs: CertDirectory, *argv: str
) -> tuple[int, str, str]:
    url = f"https://127.0.0.1:{server.port}"
    code = await asyncio.to_thread(
        main, ["review", "--url", url, "--cert-dir", str(certs.root), *argv]
    )
    out, err = capsys.readouterr()
    return code, out, err


def dry_run_patch(capsys: pytest.CaptureFixture[str], *files: Path) -> list[object]:
    argv = ["apply", "-p", str(POLICIES), "--namespaces", str(NAMESPACES), "-o", "patch"]
    assert main([*argv, *map(str, files)]) == 0
    patch: list[object] = json.loads(capsys.readouterr().out)
    return patch


async def test_the_sample_review_is_allowed_with_the_dry_runs_patch(
    capsys: pytest.CaptureFixture[str], server: WebhookServer, certs: CertDirectory
) -> None:
    expected = dry_run_patch(capsys, SAMPLE)
    code, out, err = await review(capsys, server, certs, str(SAMPLE))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (
        f"tenant-a/alice-jupyter-0 ({SAMPLE}): allowed by /mutate, "
        f"{len(expected)} patch operation(s)"
    )
    assert "  warning: gpuwarden: profile notebook via rule/notebooks (tenant tenant-a)" in lines

    code, out, _ = await review(capsys, server, certs, "-o", "patch", str(SAMPLE))
    assert code == 0
    assert json.loads(out) == expected


async def test_review_prints_the_patch_bytes_the_webhook_returned(
    capsys: pytest.CaptureFixture[str], server: WebhookServer, certs: CertDirectory
) -> None:
    """Not re-serialised: the same bytes as `apply -o patch`, which the webhook's encoder sent."""
    argv = ["apply", "-p", str(POLICIES), "--namespaces", str(NAMESPACES), "-o", "patch"]
    assert main([*argv, str(SAMPLE)]) == 0
    dry_run = capsys.readouterr().out
    code, out, _ = await review(capsys, server, certs, "-o", "patch", str(SAMPLE))
    assert (code, out) == (0, dry_run)


async def test_a_denied_pod_exits_1_with_the_servers_message(
    capsys: pytest.CaptureFixture[str], server: WebhookServer, certs: CertDirectory
) -> None:
    code, out, _ = await review(capsys, server, certs, "--endpoint", "validate", str(ESCAPE))
    assert code == 1
    assert out.startswith(
        f"tenant-b/bob-jupyter-0 ({ESCAPE}): denied by /validate (403): gpuwarden denied the pod: "
    )
    assert "CUDA_MPS_PIPE_DIRECTORY" in out


async def test_json_output_is_the_servers_admission_review(
    capsys: pytest.CaptureFixture[str], server: WebhookServer, certs: CertDirectory
) -> None:
    code, out, _ = await review(capsys, server, certs, "-o", "json", str(SAMPLE))
    answer = json.loads(out)
    assert code == 0
    assert (answer["kind"], answer["response"]["uid"]) == (
        "AdmissionReview",
        json.loads(SAMPLE.read_text())["request"]["uid"],
    )


async def test_a_server_the_ca_does_not_sign_is_refused(
    capsys: pytest.CaptureFixture[str],
    server: WebhookServer,
    certs: CertDirectory,
    tmp_path: Path,
) -> None:
    other = loopback_directory(tmp_path / "other")
    code, out, err = await review(capsys, server, certs, "--ca", str(other.ca_cert), str(SAMPLE))
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {SAMPLE}: cannot reach https://127.0.0.1:{server.port}/mutate: ")
    assert "certificate verify failed" in err


def test_no_ca_says_where_it_looked(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["review", "--cert-dir", str(tmp_path), str(SAMPLE)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == (
        f"error: {tmp_path / 'ca.crt'}: no such CA file (run `make run` first, which issues "
        "it, or give --ca FILE)\n"
    )


def test_serve_on_a_busy_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "-p", str(POLICIES), "--namespaces", str(NAMESPACES)]
        argv += ["--cert-dir", str(tmp_path / "certs"), "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--metrics-port", "-1"]
        done = subprocess.run(
            [sys.executable, "-m", "gpuwarden", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"error: cannot listen on 127.0.0.1:{port}: address already in use"
    )
