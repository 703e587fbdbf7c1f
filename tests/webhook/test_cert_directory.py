"""The self-managed certificate directory: renewal, CA rotation, lifetimes."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509

from gpuwarden.certs.authority import issue_serving, new_ca
from gpuwarden.certs.rotation import (
    CertDirectory,
    ServingNames,
    ensure_directory,
    issue_directory,
    renew_serving,
    rotate_ca,
)

NAMES = ServingNames(("gpuwarden.gpuwarden.svc",), ("127.0.0.1",))


def serving_issuer(directory: CertDirectory) -> x509.Name:
    return directory.serving().certificate.issuer


def test_a_ca_rotation_keeps_serving_from_the_old_ca_until_renew(tmp_path: Path) -> None:
    """The server's periodic ensure_directory must not move to the new CA on its own: the
    API server may not have the new bundle yet."""
    directory = issue_directory(tmp_path, NAMES)
    before = directory.serving().cert_pem
    old_ca = directory.current_ca().certificate
    rotate_ca(directory, now=datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1))
    assert directory.current_ca().certificate != old_ca
    assert ensure_directory(tmp_path, NAMES) == []
    assert directory.serving().cert_pem == before
    renew_serving(directory)  # the rotation's last step, after the bundle is published
    assert serving_issuer(directory) == directory.current_ca().certificate.subject
    assert ensure_directory(tmp_path, NAMES) == []


def test_a_certificate_from_a_ca_outside_the_bundle_is_replaced(tmp_path: Path) -> None:
    directory = issue_directory(tmp_path, NAMES)
    stranger = issue_serving(new_ca(common_name="stranger"), dns_names=list(NAMES.dns_names))
    stranger.write(tmp_path, "tls.crt", "tls.key")
    (line,) = ensure_directory(tmp_path, NAMES)
    assert "signed by no valid CA of the bundle" in line
    assert serving_issuer(directory) == directory.current_ca().certificate.subject


def test_a_serving_certificate_never_outlives_its_ca(tmp_path: Path) -> None:
    ca = new_ca(common_name="short", valid_for=datetime.timedelta(days=30))
    pair = issue_serving(ca, dns_names=["x"], valid_for=datetime.timedelta(days=90))
    assert pair.certificate.not_valid_after_utc <= ca.certificate.not_valid_after_utc
