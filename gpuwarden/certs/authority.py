"""A small certificate authority: CA, serving and client certificates as PEM key pairs."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

# Clock skew between the issuer and the API server must never make a fresh certificate "not yet valid".
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def private_key(self) -> PrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ValueError(f"unsupported private key type {type(key).__name__}")
        return key

    @property
    def not_after(self) -> datetime.datetime:
        return self.certificate.not_valid_after_utc

    def write(self, directory: Path, cert_name: str, key_name: str) -> tuple[Path, Path]:
        """Write both files atomically (rename), the key readable by the owner only."""
        directory.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = directory / cert_name, directory / key_name
        _atomic_write(key_path, self.key_pem, mode=0o600)
        _atomic_write(cert_path, self.cert_pem, mode=0o644)
        return cert_path, key_path

    @classmethod
    def read(cls, cert_path: Path, key_path: Path) -> KeyPair:
        return cls(cert_pem=cert_path.read_bytes(), key_pem=key_path.read_bytes())


def _atomic_write(path: Path, data: bytes, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def new_private_key(algorithm: str = "ecdsa-p256") -> PrivateKey:
    if algorithm == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if algorithm == "rsa-2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"unknown key algorithm {algorithm!r} (use ecdsa-p256 or rsa-2048)")


def _pem_key(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_usage(*, key_cert_sign: bool = False, key_encipherment: bool = False) -> x509.KeyUsage:
    """Digital signatures always; a CA also signs certificates and CRLs; RSA leaves encipher keys."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=key_cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(
    *,
    common_name: str,
    valid_for: datetime.timedelta = datetime.timedelta(days=3650),
    algorithm: str = "ecdsa-p256",
    now: datetime.datetime | None = None,
) -> KeyPair:
    """A self-signed CA certificate that may sign leaf certificates only."""
    key = new_private_key(algorithm)
    start = (now or _now()) - _BACKDATE
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + _BACKDATE + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_pem_key(key))


def _issue_leaf(
    ca: KeyPair,
    *,
    subject: x509.Name,
    usages: Sequence[x509.ObjectIdentifier],
    sans: Sequence[x509.GeneralName],
    valid_for: datetime.timedelta,
    algorithm: str,
    now: datetime.datetime | None,
) -> KeyPair:
    key = new_private_key(algorithm)
    ca_cert, ca_key = ca.certificate, ca.private_key
    start = (now or _now()) - _BACKDATE
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        # Never past the CA: a client stops trusting the chain when the CA expires anyway.
        .not_valid_after(min(start + _BACKDATE + valid_for, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(key_encipherment=isinstance(key, rsa.RSAPrivateKey)), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_pem_key(key))


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a Kubernetes Service answers to inside the cluster."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def issue_serving(
    ca: KeyPair,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    valid_for: datetime.timedelta = datetime.timedelta(days=90),
    algorithm: str = "ecdsa-p256",
    now: datetime.datetime | None = None,
) -> KeyPair:
    """A TLS server certificate for the given DNS names and IP addresses."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    common_name = dns_names[0] if dns_names else ip_addresses[0]
    return _issue_leaf(
        ca,
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
        valid_for=valid_for,
        algorithm=algorithm,
        now=now,
    )


def issue_client(
    ca: KeyPair,
    *,
    common_name: str,
    organizations: Sequence[str] = (),
    valid_for: datetime.timedelta = datetime.timedelta(days=90),
    algorithm: str = "ecdsa-p256",
    now: datetime.datetime | None = None,
) -> KeyPair:
    """A TLS client certificate; Kubernetes reads CN as the user and O as the groups."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return _issue_leaf(
        ca,
        subject=x509.Name(attributes),
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        sans=[],
        valid_for=valid_for,
        algorithm=algorithm,
        now=now,
    )
