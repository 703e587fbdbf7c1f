"""Throwaway certificates for servers on loopback (the lab's API server and Kueue webhook, the
benchmarks' and tests' webhooks): a CA of their own and a serving certificate it signed for
``localhost`` and ``127.0.0.1``, minted here only."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from gpuwarden.certs.authority import KeyPair, issue_serving, new_ca
from gpuwarden.certs.rotation import CertDirectory, ServingNames, issue_directory

#: What a client on the same machine dials.
LOOPBACK_NAMES = ServingNames(("localhost",), ("127.0.0.1",))
#: Long enough for any run: nothing renews these.
THROWAWAY_LIFETIME = timedelta(days=1)


def loopback_serving(
    ca_name: str, *, valid_for: timedelta = THROWAWAY_LIFETIME
) -> tuple[KeyPair, KeyPair]:
    """A fresh CA named ``ca_name`` and the loopback serving certificate it signed; the CA
    outlives the certificate by as long again, so the trust never ends first."""
    ca = new_ca(common_name=ca_name, valid_for=2 * valid_for)
    serving = issue_serving(
        ca,
        dns_names=list(LOOPBACK_NAMES.dns_names),
        ip_addresses=list(LOOPBACK_NAMES.ip_addresses),
        valid_for=valid_for,
    )
    return ca, serving


def loopback_directory(out: Path) -> CertDirectory:
    """A certificate directory (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``) for a webhook
    on loopback, as ``gpuwarden serve --cert-dir`` reads it."""
    return issue_directory(out, LOOPBACK_NAMES)
