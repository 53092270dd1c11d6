"""The CA and server certificates of instances: issued, kept while good, renewed in time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from framework.certificates import (
    SERVER_RENEW_BEFORE,
    build_cert_manager_resources,
    plan_tls,
    service_hosts,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 30, tzinfo=UTC)
HOSTS = service_hosts(["demo-rw", "demo-ro"], "apps", pods_of="demo")


def names(pem: str) -> list[str]:
    cert = x509.load_pem_x509_certificate(pem.encode())
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )


def test_a_new_instance_gets_a_ca_and_a_server_certificate_for_its_names() -> None:
    planned = plan_tls(None, None, HOSTS, NOW)
    assert planned.ca is not None
    assert planned.server is not None
    assert "demo-rw.apps.svc" in names(planned.server["tls.crt"])
    assert "*.demo.apps.svc" in names(planned.server["tls.crt"])
    assert planned.server["ca.crt"] == planned.ca["ca.crt"]
    server = x509.load_pem_x509_certificate(planned.server["tls.crt"].encode())
    server.verify_directly_issued_by(x509.load_pem_x509_certificate(planned.ca["ca.crt"].encode()))
    assert planned.not_after == server.not_valid_after_utc
    # Mutual TLS between the servers: the same certificate serves and connects.
    usages = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def server_only(ca: dict[str, str], server: dict[str, str]) -> dict[str, str]:
    """`server`'s certificate as the operator issued it before, for serverAuth only: same names,
    validity and CA."""
    old = x509.load_pem_x509_certificate(server["tls.crt"].encode())
    ca_key = serialization.load_pem_private_key(ca["ca.key"].encode(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(old.subject)
        .issuer_name(old.issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(old.not_valid_before_utc)
        .not_valid_after(old.not_valid_after_utc)
        .add_extension(old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value, False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    cert = builder.sign(ca_key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return {
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM).decode(),
        "tls.key": key_pem.decode(),
        "ca.crt": server["ca.crt"],
    }


def test_a_server_certificate_without_client_auth_is_reissued_by_the_same_ca() -> None:
    """Certificates issued before mutual TLS between servers (serverAuth only) are replaced at
    the next pass, signed by the same CA: clients that verify keep working."""
    first = plan_tls(None, None, HOSTS, NOW)
    assert first.ca is not None
    assert first.server is not None
    old = server_only(first.ca, first.server)
    renewed = plan_tls(first.ca, old, HOSTS, NOW + timedelta(days=1))
    assert renewed.ca is None
    assert renewed.server is not None
    assert renewed.reason.startswith("the server certificate is not for client authentication too")
    cert = x509.load_pem_x509_certificate(renewed.server["tls.crt"].encode())
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
    assert plan_tls(first.ca, renewed.server, HOSTS, NOW + timedelta(days=1)).server is None


def test_cert_manager_issues_the_server_certificate_for_both_ends_of_mutual_tls() -> None:
    resources = build_cert_manager_resources("demo", HOSTS)
    server = next(r for r in resources if r["kind"] == "Certificate" and r["metadata"]["name"] == "demo-tls")
    assert {"server auth", "client auth"} <= set(server["spec"]["usages"])


def test_good_certificates_are_kept_and_renewed_before_they_expire() -> None:
    first = plan_tls(None, None, HOSTS, NOW)
    kept = plan_tls(first.ca, first.server, HOSTS, NOW + timedelta(days=10))
    assert (kept.ca, kept.server) == (None, None)
    assert first.not_after is not None
    late = first.not_after - SERVER_RENEW_BEFORE + timedelta(hours=1)
    renewed = plan_tls(first.ca, first.server, HOSTS, late)
    assert renewed.ca is None  # the same CA: clients keep verifying
    assert renewed.server is not None
    assert renewed.reason.startswith("the server certificate expires on")
    assert renewed.not_after is not None
    assert renewed.not_after > first.not_after


def test_a_missing_or_foreign_server_certificate_or_new_names_are_reissued() -> None:
    first = plan_tls(None, None, HOSTS, NOW)
    assert plan_tls(first.ca, None, HOSTS, NOW).reason == "the server certificate was missing"
    other = plan_tls(None, None, HOSTS, NOW)
    assert plan_tls(first.ca, other.server, HOSTS, NOW).reason == "the server certificate is not the CA's"
    more = [*HOSTS, "demo-extra"]
    assert (
        plan_tls(first.ca, first.server, more, NOW).reason
        == "the names the server certificate must carry changed"
    )


def test_a_renewed_ca_is_published_beside_the_old_one() -> None:
    first = plan_tls(None, None, HOSTS, NOW)
    assert first.ca is not None
    later = NOW + timedelta(days=3650 - 300)
    renewed = plan_tls(first.ca, first.server, HOSTS, later)
    assert renewed.reason == "the CA expires soon"
    assert renewed.ca is not None
    assert renewed.ca["ca.crt"].count("BEGIN CERTIFICATE") == 2
    assert renewed.ca["ca.crt"].endswith(first.ca["ca.crt"])


def test_broken_secrets_are_replaced_and_long_names_fit() -> None:
    long_hosts = service_hosts(["a" * 52 + "-rw"], "apps", pods_of="a" * 52)
    first = plan_tls(None, None, long_hosts, NOW)  # a CN is at most 64 characters
    assert first.server is not None
    assert first.ca is not None
    assert plan_tls({"ca.key": first.ca["ca.key"]}, None, long_hosts, NOW).reason == "a CA was made"
    garbled = plan_tls(first.ca, {"tls.crt": "not a certificate", "tls.key": "x"}, long_hosts, NOW)
    assert garbled.reason == "the server certificate was missing"
