"""A TLS server context whose certificate can change under a running server.

The listening socket keeps one :class:`ssl.SSLContext` for its whole life. That context's SNI
callback (which OpenSSL calls on every handshake, with or without SNI) hands each new
connection the most recently loaded context, so renewed files take effect for new
connections at once while established ones finish on the certificate they started with.
"""

from __future__ import annotations

import datetime
import hashlib
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509


class TLSConfigError(Exception):
    """Certificate, key or client CA files that cannot be served; the message names the file."""


@dataclass(frozen=True)
class TLSFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None

    def paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key) + ((self.client_ca,) if self.client_ca else ())


def server_context(files: TLSFiles) -> ssl.SSLContext:
    """A server context: TLS 1.2 at least; with a client CA, client certificates verified."""
    for path in files.paths():
        if not path.is_file():
            raise TLSConfigError(f"{path}: no such file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    try:
        ctx.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as exc:
        raise TLSConfigError(
            f"{files.cert} / {files.key}: cannot load the certificate and key: {exc}"
        ) from exc
    if files.client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=files.client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError(f"{files.client_ca}: cannot load the client CA: {exc}") from exc
        # A certificate that is presented must verify; one that is not is refused by the
        # admission endpoints, not the handshake, so the kubelet's probes need none.
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def fingerprint(files: TLSFiles) -> str:
    """A hash of the files' contents ("" for any unreadable), to notice any change."""
    digest = hashlib.sha256()
    for path in files.paths():
        try:
            digest.update(path.read_bytes())
        except OSError:
            return ""
        digest.update(b"\0")
    return digest.hexdigest()


def certificate_expiry(path: Path) -> datetime.datetime | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class ReloadOutcome:
    changed: bool
    error: str | None = None


class TLSReloader:
    """Serve ``files``; :meth:`check` loads them again when their contents change."""

    def __init__(self, files: TLSFiles) -> None:
        self.files = files
        self._fingerprint = fingerprint(files)
        self._current = server_context(files)
        self.not_after = certificate_expiry(files.cert)
        self.last_error: str | None = None
        self.handshakes = 0
        base = server_context(files)
        base.sni_callback = self._select
        self._base = base

    @property
    def context(self) -> ssl.SSLContext:
        """The context to listen with; it always presents the latest good certificate."""
        return self._base

    @property
    def current(self) -> ssl.SSLContext:
        return self._current

    def _select(self, conn: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        self.handshakes += 1
        current = self._current
        if conn.context is not current:
            conn.context = current

    def check(self) -> ReloadOutcome:
        """Reload if the files changed; a bad set keeps the last good context serving."""
        seen = fingerprint(self.files)
        if seen == self._fingerprint or not seen:
            return ReloadOutcome(changed=False)
        try:
            context = server_context(self.files)
        except TLSConfigError as exc:
            # A writer may be between renaming the key and the certificate: try again next time.
            self.last_error = str(exc)
            return ReloadOutcome(changed=False, error=str(exc))
        self._current = context
        self._fingerprint = seen
        self.not_after = certificate_expiry(self.files.cert)
        self.last_error = None
        return ReloadOutcome(changed=True)
