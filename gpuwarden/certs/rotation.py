"""A certificate directory the webhook serves from: issue, renew before expiry, rotate the CA.

Layout (the names a Kubernetes TLS Secret and cert-manager use):

* ``ca.crt``: the CA bundle clients trust. During a CA rotation it holds the new CA first and
  the previous one after it, so a client holding either keeps verifying the server.
* ``ca.key``: the current CA's key, kept so the serving certificate can be renewed in place.
* ``tls.crt`` / ``tls.key``: the serving certificate (signed by the current CA) and its key.

A safe CA rotation is three steps, in this order: :func:`rotate_ca` (new CA added to the
bundle), publish the bundle to the clients (``gpuwarden certs inject``), then
:func:`renew_serving` moves the serving certificate to the new CA.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from gpuwarden.certs.authority import KeyPair, _atomic_write, issue_serving, new_ca

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"

DEFAULT_SERVING_LIFETIME = datetime.timedelta(days=90)
DEFAULT_CA_LIFETIME = datetime.timedelta(days=3650)
# Renew once less than this fraction of the serving certificate's lifetime is left.
RENEW_FRACTION = 1 / 3


class CertificateError(Exception):
    """A certificate directory that cannot be used as it is; the message says why."""


@dataclass(frozen=True)
class ServingNames:
    """The names a serving certificate must cover."""

    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...] = ()

    @classmethod
    def of(cls, names: Sequence[str]) -> ServingNames:
        """Split a list of names into DNS names and IP addresses."""
        dns: list[str] = []
        ips: list[str] = []
        for name in names:
            try:
                ips.append(str(ipaddress.ip_address(name)))
            except ValueError:
                dns.append(name)
        return cls(tuple(dict.fromkeys(dns)), tuple(dict.fromkeys(ips)))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _ca_name(base: str, now: datetime.datetime | None) -> str:
    # The issue time tells the CAs of a bundle apart during a rotation.
    return f"{base} {(now or _now()):%Y-%m-%dT%H:%M:%SZ}"


def load_bundle(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise CertificateError(f"not a PEM certificate bundle: {exc}") from exc


def bundle_pem(certs: Sequence[x509.Certificate]) -> bytes:
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in certs)


def names_of(cert: x509.Certificate) -> ServingNames:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ServingNames(())
    dns = tuple(san.get_values_for_type(x509.DNSName))
    ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    return ServingNames(dns, ips)


def needs_renewal(
    cert: x509.Certificate,
    *,
    now: datetime.datetime | None = None,
    fraction: float = RENEW_FRACTION,
) -> bool:
    """True once less than ``fraction`` of the certificate's lifetime remains (or it expired)."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return (now or _now()) >= end - (end - start) * fraction


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


@dataclass(frozen=True)
class CertDirectory:
    """Paths of the files in one certificate directory."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / CA_CERT

    @property
    def ca_key(self) -> Path:
        return self.root / CA_KEY

    @property
    def tls_cert(self) -> Path:
        return self.root / TLS_CERT

    @property
    def tls_key(self) -> Path:
        return self.root / TLS_KEY

    def has_ca(self) -> bool:
        return self.ca_cert.is_file() and self.ca_key.is_file()

    def current_ca(self) -> KeyPair:
        """The CA that signs: the key in ca.key and the bundle certificate matching it."""
        try:
            key_pem = self.ca_key.read_bytes()
            bundle = load_bundle(self.ca_cert.read_bytes())
        except OSError as exc:
            raise CertificateError(f"{self.root}: cannot read the CA: {exc}") from exc
        key = KeyPair(cert_pem=b"", key_pem=key_pem).private_key
        public = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for cert in bundle:
            spki = cert.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            if spki == public:
                return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)
        raise CertificateError(f"{self.ca_key}: no certificate in {self.ca_cert} matches this key")

    def bundle(self) -> list[x509.Certificate]:
        """The CA certificates clients are given (ca.crt), newest first."""
        try:
            return load_bundle(self.ca_cert.read_bytes())
        except OSError as exc:
            raise CertificateError(f"{self.ca_cert}: cannot read: {exc}") from exc

    def serving(self) -> KeyPair:
        try:
            return KeyPair.read(self.tls_cert, self.tls_key)
        except OSError as exc:
            raise CertificateError(
                f"{self.root}: cannot read the serving certificate: {exc}"
            ) from exc


def issue_directory(
    out: Path,
    names: ServingNames,
    *,
    now: datetime.datetime | None = None,
    serving_lifetime: datetime.timedelta = DEFAULT_SERVING_LIFETIME,
    ca_lifetime: datetime.timedelta = DEFAULT_CA_LIFETIME,
    common_name: str = "gpuwarden-webhook-ca",
) -> CertDirectory:
    """A fresh CA and serving certificate in ``out`` (existing files are replaced)."""
    ca = new_ca(common_name=_ca_name(common_name, now), valid_for=ca_lifetime, now=now)
    directory = CertDirectory(out)
    ca.write(out, CA_CERT, CA_KEY)
    _serve(directory, ca, names, now=now, lifetime=serving_lifetime)
    return directory


def _serve(
    directory: CertDirectory,
    ca: KeyPair,
    names: ServingNames,
    *,
    now: datetime.datetime | None,
    lifetime: datetime.timedelta,
) -> KeyPair:
    pair = issue_serving(
        ca,
        dns_names=list(names.dns_names),
        ip_addresses=list(names.ip_addresses),
        valid_for=lifetime,
        now=now,
    )
    # The key first: a reader that sees the new certificate with the old key fails its
    # consistency check and retries, while the reverse order could never be told apart.
    pair.write(directory.root, TLS_CERT, TLS_KEY)
    return pair


def renew_serving(
    directory: CertDirectory,
    names: ServingNames | None = None,
    *,
    now: datetime.datetime | None = None,
    lifetime: datetime.timedelta = DEFAULT_SERVING_LIFETIME,
) -> KeyPair:
    """A new serving certificate from the current CA, for ``names`` or the names it had."""
    ca = directory.current_ca()
    if names is None:
        names = names_of(directory.serving().certificate)
    return _serve(directory, ca, names, now=now, lifetime=lifetime)


def ensure_directory(
    out: Path,
    names: ServingNames,
    *,
    now: datetime.datetime | None = None,
    serving_lifetime: datetime.timedelta = DEFAULT_SERVING_LIFETIME,
) -> list[str]:
    """Make ``out`` hold a usable CA and serving certificate; returns what was done.

    Issues everything when there is no CA; renews the serving certificate when it is missing,
    signed by no CA of the bundle that is still valid, missing one of ``names``, or in its
    renewal window. A certificate from the previous CA while a rotation is under way is kept:
    moving it to the new CA before clients have the new bundle would break them
    (:func:`renew_serving` does that, as the rotation's last step).
    """
    directory = CertDirectory(out)
    if not directory.has_ca():
        if directory.tls_cert.exists() and not directory.ca_key.exists():
            # Someone else (cert-manager, a Secret) manages these files: serve them as they are.
            return []
        issue_directory(out, names, now=now, serving_lifetime=serving_lifetime)
        return [f"issued a new CA and serving certificate in {out}"]
    ca = directory.current_ca()
    moment = now or _now()
    trusted = [c for c in directory.bundle() if c.not_valid_after_utc > moment]
    reason = None
    try:
        current = directory.serving().certificate
    except (CertificateError, ValueError):
        reason = "no readable serving certificate"
    else:
        have = names_of(current)
        missing = (set(names.dns_names) - set(have.dns_names)) | (
            set(names.ip_addresses) - set(have.ip_addresses)
        )
        if not any(_signed_by(current, cert) for cert in trusted):
            reason = "the serving certificate is signed by no valid CA of the bundle"
        elif missing:
            reason = f"the serving certificate lacks {', '.join(sorted(missing))}"
        elif needs_renewal(current, now=now):
            reason = f"the serving certificate expires {current.not_valid_after_utc:%Y-%m-%d}"
    if reason is None:
        return []
    merged = names
    if reason.startswith("the serving certificate expires"):
        merged = names_of(current)
    _serve(directory, ca, merged, now=now, lifetime=serving_lifetime)
    return [f"renewed the serving certificate in {out}: {reason}"]


def rotate_ca(
    directory: CertDirectory,
    *,
    now: datetime.datetime | None = None,
    ca_lifetime: datetime.timedelta = DEFAULT_CA_LIFETIME,
    common_name: str = "gpuwarden-webhook-ca",
) -> list[x509.Certificate]:
    """Put a new CA first in the bundle, keeping every still-valid old CA after it.

    The serving certificate is left as it is: renew it (:func:`renew_serving`) only after the
    clients have the new bundle. Returns the new bundle.
    """
    try:
        old = load_bundle(directory.ca_cert.read_bytes())
    except OSError as exc:
        raise CertificateError(f"{directory.ca_cert}: cannot read: {exc}") from exc
    ca = new_ca(common_name=_ca_name(common_name, now), valid_for=ca_lifetime, now=now)
    moment = now or _now()
    kept = [cert for cert in old if cert.not_valid_after_utc > moment]
    bundle = [ca.certificate, *kept]
    _atomic_write(directory.ca_key, ca.key_pem, mode=0o600)
    _atomic_write(directory.ca_cert, bundle_pem(bundle), mode=0o644)
    return bundle


def prune_bundle(directory: CertDirectory, *, now: datetime.datetime | None = None) -> int:
    """Drop CAs from the bundle that signed nothing current: expired ones. Returns how many."""
    bundle = load_bundle(directory.ca_cert.read_bytes())
    moment = now or _now()
    kept = [cert for cert in bundle if cert.not_valid_after_utc > moment]
    if len(kept) != len(bundle):
        _atomic_write(directory.ca_cert, bundle_pem(kept), mode=0o644)
    return len(bundle) - len(kept)
