"""The four files of a self-managed webhook certificate, as a Secret holds them: check and fix.

``gpuwarden certs sync`` keeps ``ca.crt``, ``ca.key``, ``tls.crt`` and ``tls.key`` in one
Secret shared by every webhook replica. :func:`plan_material` looks at what the Secret holds
and returns what it should hold, with the reasons for every change (none: keep it as it is):

* The CA is kept while its key matches a certificate of ``ca.crt`` and it is outside its
  renewal window (the last third of its lifetime, the rule the serving certificate follows)
  with room for a whole serving lifetime. Otherwise a new CA goes first in the bundle and the
  still-valid old CAs stay after it, as ``certs rotate --ca`` does, so replicas still serving
  a certificate of the old CA keep being trusted through the rollout.
* The serving certificate is kept while its key matches, the current CA signed it, it covers
  every name asked for, and it is outside its renewal window; otherwise the current CA issues
  a new one, for the names asked for.

Nothing here does I/O except :meth:`Material.write`.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

from gpuwarden.certs.authority import (
    KeyPair,
    _atomic_write,
    issue_serving,
    new_ca,
    service_dns_names,
)
from gpuwarden.certs.rotation import (
    CA_CERT,
    CA_KEY,
    DEFAULT_CA_LIFETIME,
    DEFAULT_SERVING_LIFETIME,
    TLS_CERT,
    TLS_KEY,
    CertificateError,
    ServingNames,
    _ca_name,
    _signed_by,
    bundle_pem,
    load_bundle,
    names_of,
    needs_renewal,
)

KEYS = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)

# What `gpuwarden serve` puts in every certificate it issues besides the Service's names
# (gpuwarden.commands.serve.config_from): a Secret certificate that has them too is one serve's
# start-up check finds complete, so a pod serves the Secret's certificate as it is.
LOCAL_NAMES = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Material:
    """PEM contents of the four files."""

    ca_cert: bytes
    ca_key: bytes
    tls_cert: bytes
    tls_key: bytes

    def as_data(self) -> dict[str, bytes]:
        return {
            CA_CERT: self.ca_cert,
            CA_KEY: self.ca_key,
            TLS_CERT: self.tls_cert,
            TLS_KEY: self.tls_key,
        }

    @property
    def serving(self) -> KeyPair:
        return KeyPair(self.tls_cert, self.tls_key)

    def write(self, out: Path) -> list[Path]:
        """Write the files into ``out`` (each atomically; the keys readable by the owner only).

        The CA goes first and the serving key before its certificate, so a server reloading
        meanwhile sees either the old pair or the new one, never a certificate without its key.
        """
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / name for name in (CA_CERT, CA_KEY, TLS_KEY, TLS_CERT)]
        _atomic_write(paths[0], self.ca_cert, mode=0o644)
        _atomic_write(paths[1], self.ca_key, mode=0o600)
        _atomic_write(paths[2], self.tls_key, mode=0o600)
        _atomic_write(paths[3], self.tls_cert, mode=0o644)
        return paths


@dataclass(frozen=True)
class Plan:
    """What the Secret should hold, and why it differs from what it holds (empty: it doesn't)."""

    material: Material
    changes: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def serving_names(service: str, namespace: str, extra: Sequence[str] = ()) -> ServingNames:
    """The names a synced serving certificate covers: the Service's, ``extra`` and LOCAL_NAMES."""
    return ServingNames.of([*LOCAL_NAMES, *extra, *service_dns_names(service, namespace)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _spki(public_key: CertificatePublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _key(pem: bytes | None) -> KeyPair | None:
    """A key-only pair for a PEM private key; None for a missing or unreadable one."""
    if not pem:
        return None
    pair = KeyPair(cert_pem=b"", key_pem=pem)
    try:
        pair.private_key  # noqa: B018 - parse it now
    except (ValueError, TypeError):
        return None
    return pair


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _current_ca(
    data: Mapping[str, bytes], moment: datetime.datetime, serving_lifetime: datetime.timedelta
) -> tuple[list[x509.Certificate], KeyPair | None, str | None]:
    """The bundle's CA certificates, the usable signing CA, and why there is none if so."""
    raw = data.get(CA_CERT)
    if not raw:
        return [], None, "no CA yet"
    try:
        bundle = [cert for cert in load_bundle(raw) if _is_ca(cert)]
    except CertificateError:
        return [], None, f"{CA_CERT} is not a PEM certificate bundle"
    if not bundle:
        return [], None, f"{CA_CERT} holds no CA certificate"
    key = _key(data.get(CA_KEY))
    if key is None:
        return bundle, None, f"{CA_KEY} is missing or not a private key"
    public = _spki(key.private_key.public_key())
    ca_cert = next((cert for cert in bundle if _spki(cert.public_key()) == public), None)
    if ca_cert is None:
        return bundle, None, f"{CA_KEY} matches no certificate in {CA_CERT}"
    end = ca_cert.not_valid_after_utc
    if needs_renewal(ca_cert, now=moment) or end < moment + serving_lifetime:
        return bundle, None, f"the CA expires {end:%Y-%m-%d}"
    ca = KeyPair(ca_cert.public_bytes(serialization.Encoding.PEM), key.key_pem)
    return bundle, ca, None


def _serving_problem(
    data: Mapping[str, bytes],
    ca: x509.Certificate,
    names: ServingNames,
    moment: datetime.datetime,
) -> str | None:
    raw, key = data.get(TLS_CERT), _key(data.get(TLS_KEY))
    if not raw:
        return "no serving certificate yet"
    try:
        cert = x509.load_pem_x509_certificate(raw)
    except ValueError:
        return f"{TLS_CERT} is not a PEM certificate"
    if key is None:
        return f"{TLS_KEY} is missing or not a private key"
    if _spki(key.private_key.public_key()) != _spki(cert.public_key()):
        return f"{TLS_KEY} does not match {TLS_CERT}"
    if not _signed_by(cert, ca):
        return "the serving certificate is not signed by the current CA"
    have = names_of(cert)
    missing = (set(names.dns_names) - set(have.dns_names)) | (
        set(names.ip_addresses) - set(have.ip_addresses)
    )
    if missing:
        return f"the serving certificate lacks {', '.join(sorted(missing))}"
    if needs_renewal(cert, now=moment):
        return f"the serving certificate expires {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    return None


def plan_material(
    data: Mapping[str, bytes],
    names: ServingNames,
    *,
    now: datetime.datetime | None = None,
    serving_lifetime: datetime.timedelta = DEFAULT_SERVING_LIFETIME,
    ca_lifetime: datetime.timedelta = DEFAULT_CA_LIFETIME,
    common_name: str = "gpuwarden-webhook-ca",
) -> Plan:
    """What a Secret holding ``data`` should hold for a server answering to ``names``."""
    moment = now or _now()
    changes: list[str] = []
    bundle, ca, problem = _current_ca(data, moment, serving_lifetime)
    kept = [cert for cert in bundle if cert.not_valid_after_utc > moment]
    if ca is None:
        ca = new_ca(common_name=_ca_name(common_name, now), valid_for=ca_lifetime, now=now)
        kept = [ca.certificate, *kept]
        old = f" (the {len(kept) - 1} still-valid old CA(s) stay in {CA_CERT})" if kept[1:] else ""
        changes.append(f"issued a new CA: {problem}{old}")
    elif len(kept) != len(bundle):
        changes.append(f"dropped {len(bundle) - len(kept)} expired CA(s) from {CA_CERT}")
    ca_bundle = bundle_pem(kept)
    if ca_bundle != data.get(CA_CERT) and not changes:
        # Same certificates, other bytes (e.g. non-CA certificates or text around them).
        changes.append(f"rewrote {CA_CERT} as the CA certificates it holds")
    serving_problem = _serving_problem(data, ca.certificate, names, moment)
    if serving_problem is None:
        serving = KeyPair(data[TLS_CERT], data[TLS_KEY])
    else:
        serving = issue_serving(
            ca,
            dns_names=list(names.dns_names),
            ip_addresses=list(names.ip_addresses),
            valid_for=serving_lifetime,
            now=now,
        )
        changes.append(f"issued a new serving certificate: {serving_problem}")
    material = Material(ca_bundle, ca.key_pem, serving.cert_pem, serving.key_pem)
    return Plan(material, tuple(changes))
