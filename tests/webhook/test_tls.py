"""TLS: verified by the generated CA, TLS 1.2 at least, client certificates, rotation in flight."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import json
import ssl
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from gpuwarden import cli
from gpuwarden.certs.authority import issue_client, new_ca
from gpuwarden.certs.rotation import (
    CertDirectory,
    load_bundle,
    names_of,
    renew_serving,
    rotate_ca,
)

from .support import RawConnection, Webhook, Workdir, client_context, notebook_pod, review


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


async def test_a_client_that_does_not_trust_the_ca_is_refused(webhook: Webhook) -> None:
    other = new_ca(common_name="someone else")
    ctx = ssl.create_default_context(cadata=other.cert_pem.decode())
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with webhook.session.get(webhook.url + "/healthz", ssl=ctx):
            pass
    await webhook.serves()


async def test_tls_1_2_is_the_minimum(webhook: Webhook, workdir: Workdir) -> None:
    assert webhook.server.tls is not None
    assert webhook.server.tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    old = client_context(workdir.certs.ca_cert)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(aiohttp.ClientError):
        async with webhook.session.get(webhook.url + "/healthz", ssl=old):
            pass
    tls12 = client_context(workdir.certs.ca_cert)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    conn = await RawConnection.open(webhook.server.port, tls12)
    assert await conn.request("GET", "/healthz") == (200, b"ok\n")
    assert conn.ssl_object.version() == "TLSv1.2"
    await conn.close()


async def test_client_ca_requires_a_client_certificate(
    make_webhook: Callable[..., Any], workdir: Workdir
) -> None:
    apiserver_ca = new_ca(common_name="apiserver client CA")
    ca_file = workdir.root / "client-ca.crt"
    ca_file.write_bytes(apiserver_ca.cert_pem)
    pair = issue_client(apiserver_ca, common_name="kube-apiserver")
    cert_file, key_file = pair.write(workdir.root, "client.crt", "client.key")
    hook: Webhook = await make_webhook(client_ca=ca_file)
    # Without a certificate: admission is refused, the kubelet's probes still get through.
    status, text = await hook.post("/mutate", json.dumps(review(notebook_pod())).encode())
    assert (status, text.strip()) == (
        403,
        "mutate: a client certificate signed by the webhook's --client-ca is required",
    )
    assert (await hook.get("/readyz"))[0] == 200 and (await hook.get("/healthz"))[0] == 200
    hook.ssl = client_context(workdir.certs.ca_cert, client=(cert_file, key_file))
    await hook.serves()
    stranger = issue_client(new_ca(common_name="stranger"), common_name="mallory")
    s_cert, s_key = stranger.write(workdir.root, "s.crt", "s.key")
    hook.ssl = client_context(workdir.certs.ca_cert, client=(s_cert, s_key))
    with pytest.raises(aiohttp.ClientError):
        await hook.admit("mutate", review(notebook_pod()))


async def test_certificate_rotation_with_requests_in_flight(
    webhook: Webhook, workdir: Workdir
) -> None:
    """Serving renewal and a full CA rotation under load: no request fails."""
    directory = workdir.certs
    trust = {"ctx": client_context(directory.ca_cert)}
    failures: list[str] = []
    serials: set[int] = set()
    answered = 0
    stop = asyncio.Event()
    body = json.dumps(review(notebook_pod())).encode()

    async def client(fresh_connections: bool) -> None:
        """Requests in a loop: a new TLS connection for each, or one kept alive throughout."""
        nonlocal answered
        conn: RawConnection | None = None
        while not stop.is_set():
            try:
                if conn is None:
                    conn = await RawConnection.open(webhook.server.port, trust["ctx"])
                    serials.add(conn.peer_serial())
                status, data = await conn.request("POST", "/mutate", body)
                if status != 200 or json.loads(data)["response"]["allowed"] is not True:
                    failures.append(f"{status} {data[:200]!r}")
                answered += 1
                if fresh_connections:
                    await conn.close()
                    conn = None
            except (OSError, ssl.SSLError, ValueError) as exc:
                failures.append(repr(exc))
                conn = None
        if conn is not None:
            await conn.close()

    async def answered_more(than: int) -> None:
        deadline = asyncio.get_running_loop().time() + 20
        while answered < than + 20:
            assert asyncio.get_running_loop().time() < deadline, "clients stalled"
            await asyncio.sleep(0.01)

    clients = [asyncio.create_task(client(fresh)) for fresh in (True, True, False, False)]
    try:
        await answered_more(0)
        # 1. Renew the serving certificate (same CA), as before expiry.
        renew_serving(directory)
        webhook.server.tick()
        await answered_more(answered)
        # 2. Roll the CA: the bundle gets the new CA first, the old one stays.
        bundle = rotate_ca(directory)
        assert len(bundle) == 2
        trust["ctx"] = client_context(directory.ca_cert)  # clients get the new bundle
        await answered_more(answered)
        # 3. Move the serving certificate to the new CA.
        renew_serving(directory)
        webhook.server.tick()
        await answered_more(answered)
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert failures == []
    assert len(serials) >= 3, "new connections did not see the renewed certificates"
    serving = directory.serving().certificate
    serving.verify_directly_issued_by(load_bundle(directory.ca_cert.read_bytes())[0])
    webhook.ssl = trust["ctx"]
    _, metrics = await webhook.get("/metrics")
    assert 'gpuwarden_certificate_reloads_total{result="ok"} 2.0' in metrics


async def test_a_half_written_certificate_keeps_the_old_one(
    webhook: Webhook, workdir: Workdir
) -> None:
    directory = workdir.certs
    good = directory.tls_cert.read_bytes()
    directory.tls_cert.write_bytes(good[: len(good) // 2])
    webhook.server.tick()
    await webhook.serves()
    assert webhook.server.context is not None
    assert webhook.server.context.certificate_error is not None
    renew_serving(directory, names_of(x509.load_pem_x509_certificate(good)))
    webhook.server.tick()
    assert webhook.server.context.certificate_error is None
    await webhook.serves()


def test_certs_issue_writes_a_ca_and_a_serving_certificate(tmp_path: Path) -> None:
    out = tmp_path / "issued"
    code, text = run_cli(
        "certs", "issue", "--service", "gpuwarden", "--namespace", "kubeflow", "--out", str(out)
    )
    assert code == 0, text
    directory = CertDirectory(out)
    cert = directory.serving().certificate
    names = names_of(cert)
    assert names.dns_names == (
        "gpuwarden",
        "gpuwarden.kubeflow",
        "gpuwarden.kubeflow.svc",
        "gpuwarden.kubeflow.svc.cluster.local",
    )
    cert.verify_directly_issued_by(load_bundle(directory.ca_cert.read_bytes())[0])
    assert (directory.tls_key.stat().st_mode & 0o777) == 0o600
    code, text = run_cli("certs", "issue", "--service", "x", "--namespace", "y", "--out", str(out))
    assert code == 1 and "--force" in text


def test_certs_rotate(tmp_path: Path) -> None:
    out = tmp_path / "issued"
    assert (
        run_cli("certs", "issue", "--service", "s", "--namespace", "n", "--out", str(out))[0] == 0
    )
    directory = CertDirectory(out)
    before = directory.serving().certificate
    code, text = run_cli("certs", "rotate", "--dir", str(out))
    assert code == 0 and "not due" in text
    assert directory.serving().certificate.serial_number == before.serial_number
    code, text = run_cli("certs", "rotate", "--dir", str(out), "--ca")
    assert code == 0 and "certs inject" in text
    bundle = load_bundle(directory.ca_cert.read_bytes())
    assert len(bundle) == 2
    # Until the bundle is published, the serving certificate stays on the old CA.
    directory.serving().certificate.verify_directly_issued_by(bundle[1])
    code, text = run_cli("certs", "rotate", "--dir", str(out), "--force")
    assert code == 0, text
    after = directory.serving().certificate
    after.verify_directly_issued_by(bundle[0])
    assert names_of(after) == names_of(before)


async def test_the_server_renews_its_own_certificate_before_expiry(
    make_webhook: Callable[..., Any], workdir: Workdir
) -> None:
    directory = workdir.certs
    # A 30-day certificate issued 25 days ago: in its renewal window (the last third).
    issued = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=25)
    renew_serving(directory, lifetime=datetime.timedelta(days=30), now=issued)
    old = directory.serving().certificate
    hook: Webhook = await make_webhook(renew_interval=0.0)
    renewed = directory.serving().certificate  # renewed at start-up already
    assert renewed.serial_number != old.serial_number
    assert renewed.not_valid_after_utc > old.not_valid_after_utc
    conn = await RawConnection.open(hook.server.port, hook.ssl)
    assert conn.peer_serial() == renewed.serial_number
    await conn.close()
    hook.server.tick()  # nothing is due any more
    assert directory.serving().certificate.serial_number == renewed.serial_number


async def test_readyz_reports_an_expired_certificate(
    make_webhook: Callable[..., Any], workdir: Workdir
) -> None:
    directory = workdir.certs
    hook: Webhook = await make_webhook(
        cert_dir=None, tls_cert=directory.tls_cert, tls_key=directory.tls_key
    )
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=400)
    renew_serving(directory, lifetime=datetime.timedelta(days=30), now=long_ago)
    hook.server.tick()
    status, text = await hook.get("/readyz", metrics_port=True)
    assert status == 503 and "expired" in text
