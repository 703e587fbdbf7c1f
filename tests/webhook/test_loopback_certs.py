"""The throwaway loopback certificate the lab, the benchmarks and the tests serve with: a client
on the same machine verifies it by name or address against its CA, which it never outlives."""

from __future__ import annotations

import ipaddress

from cryptography import x509

from gpuwarden.certs.loopback import loopback_serving


def test_loopback_certificate_names_localhost_and_its_address_and_ends_before_its_ca() -> None:
    ca, serving = loopback_serving("test-ca")
    cert, authority = serving.certificate, ca.certificate
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert cert.issuer == authority.subject
    cert.verify_directly_issued_by(authority)
    assert cert.not_valid_after_utc < authority.not_valid_after_utc
