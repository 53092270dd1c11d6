"""TLS in transit for every instance: a CA and a server certificate, made by the operator and
renewed before they expire. Pure: what to issue, from the Secrets as they are and the time.

The CA (ECDSA P-256, 10 years) signs the server certificate (90 days, renewed when 30 are
left, or when the names it must carry or its uses changed). A renewed CA is published beside the
old one (`ca.crt` holds both while the old is valid), so clients that verify keep working.

The server certificate serves as a client certificate too (extended key usage serverAuth and
clientAuth): servers that talk to each other over mutual TLS present it on both ends, and a TLS
stack that checks the peer's extended key usage for its role (Erlang's) refuses a client
certificate made for serverAuth only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = timedelta(days=3650)
CA_RENEW_BEFORE = timedelta(days=365)
SERVER_VALIDITY = timedelta(days=90)
SERVER_RENEW_BEFORE = timedelta(days=30)
BACKDATE = timedelta(minutes=5)  # clocks differ a little between machines
# What a server certificate is for: serving, and connecting to its peers with it (mutual TLS).
SERVER_USAGES = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)


@dataclass(frozen=True)
class TlsPlan:
    ca: dict[str, str] | None  # the CA Secret's new data; None: keep it
    server: dict[str, str] | None  # the server Secret's new data (tls.crt, tls.key, ca.crt)
    reason: str = ""
    not_after: datetime | None = None  # of the server certificate in use after the plan


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def issue_ca(common_name: str, now: datetime) -> dict[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return {"ca.crt": _cert_pem(cert), "ca.key": _key_pem(key)}


def issue_server(ca: dict[str, str], hosts: list[str], now: datetime) -> dict[str, str]:
    ca_cert = x509.load_pem_x509_certificate(ca["ca.crt"].encode())
    ca_key = serialization.load_pem_private_key(ca["ca.key"].encode(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + SERVER_VALIDITY, ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(SERVER_USAGES)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return {"tls.crt": _cert_pem(cert), "tls.key": _key_pem(key), "ca.crt": ca["ca.crt"]}


def _first_cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificates(pem.encode())[0]


def _names(cert: x509.Certificate) -> list[str]:
    try:
        extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return extension.value.get_values_for_type(x509.DNSName)


def _usages(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    try:
        return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return set()


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
        return True
    except (ValueError, TypeError, Exception):
        return False


def plan_tls(
    ca: dict[str, str] | None, server: dict[str, str] | None, hosts: list[str], now: datetime
) -> TlsPlan:
    """What to issue. `ca`/`server`: the Secrets' data as they are (None: missing)."""
    new_ca = None
    try:
        ca_cert = _first_cert(ca["ca.crt"]) if ca and ca.get("ca.key") and ca.get("ca.crt") else None
        if ca_cert is not None:  # its key must be one this module can sign with
            assert ca is not None
            key = serialization.load_pem_private_key(ca["ca.key"].encode(), password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                ca_cert = None
    except ValueError:
        ca_cert = None
    if ca_cert is None or ca_cert.not_valid_after_utc - now < CA_RENEW_BEFORE:
        new_ca = issue_ca("statefleet instance CA", now)  # a CN is at most 64 characters
        if ca_cert is not None and ca_cert.not_valid_after_utc > now:
            # Clients that verify with the old CA keep working until they read the new one.
            new_ca["ca.crt"] += ca["ca.crt"]  # type: ignore[index]
        reason = "a CA was made" if ca_cert is None else "the CA expires soon"
        issued = issue_server(new_ca, hosts, now)
        return TlsPlan(new_ca, issued, reason, _first_cert(issued["tls.crt"]).not_valid_after_utc)
    assert ca is not None
    try:
        cert = (
            _first_cert(server["tls.crt"])
            if server and server.get("tls.key") and server.get("tls.crt")
            else None
        )
    except ValueError:
        cert = None
    if cert is None:
        reason = "the server certificate was missing"
    elif cert.not_valid_after_utc - now < SERVER_RENEW_BEFORE:
        reason = f"the server certificate expires on {cert.not_valid_after_utc:%Y-%m-%d}"
    elif sorted(_names(cert)) != sorted(hosts):
        reason = "the names the server certificate must carry changed"
    elif not set(SERVER_USAGES) <= _usages(cert):
        reason = "the server certificate is not for client authentication too (mutual TLS between servers)"
    elif not _signed_by(cert, ca_cert) or (server or {}).get("ca.crt") != ca["ca.crt"]:
        reason = "the server certificate is not the CA's"
    else:
        return TlsPlan(None, None, "", cert.not_valid_after_utc)
    issued = issue_server(ca, hosts, now)
    return TlsPlan(None, issued, reason, _first_cert(issued["tls.crt"]).not_valid_after_utc)


def service_hosts(names: list[str], namespace: str, pods_of: str | None = None) -> list[str]:
    """DNS names of Services in `namespace` as clients write them, and of the pods behind the
    headless Service `pods_of`."""
    hosts = []
    for name in names:
        hosts += [
            name,
            f"{name}.{namespace}",
            f"{name}.{namespace}.svc",
            f"{name}.{namespace}.svc.cluster.local",
        ]
    if pods_of:
        hosts += [f"*.{pods_of}.{namespace}.svc", f"*.{pods_of}.{namespace}.svc.cluster.local"]
    return hosts


# --- cert-manager: when its API is served, it issues and renews the same two Secrets --------
CERT_MANAGER_API = "cert-manager.io/v1"
CERT_MANAGER_ANNOTATION = "cert-manager.io/certificate-name"  # on every Secret it wrote
OPERATOR, CERT_MANAGER = "operator", "cert-manager"


def choose_tls_provider(tls_status: dict[str, Any], server: dict[str, Any] | None, served: bool) -> str:
    """Who makes an instance's certificates. Chosen once and kept in status: moving an instance
    from one CA to another would break the clients that verify with the first."""
    if tls_status:
        return str(tls_status.get("provider") or OPERATOR)  # instances from before this choice
    annotations = ((server or {}).get("metadata") or {}).get("annotations") or {}
    if server and CERT_MANAGER_ANNOTATION not in annotations:
        return OPERATOR  # certificates the operator already made
    return CERT_MANAGER if served else OPERATOR


def _certificate(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": CERT_MANAGER_API, "kind": "Certificate", "metadata": {"name": name}, "spec": spec}


def _issuer(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": CERT_MANAGER_API, "kind": "Issuer", "metadata": {"name": name}, "spec": spec}


def _hours(delta: timedelta) -> str:
    return f"{int(delta.total_seconds() // 3600)}h"


def build_cert_manager_resources(name: str, hosts: list[str]) -> list[dict[str, Any]]:
    """The instance's CA and server certificate as cert-manager objects, with the lifetimes and
    the Secret names (`<name>-ca`, `<name>-tls`) the operator's own path uses: a self-signed
    issuer makes the CA, a CA issuer signs the server certificate, whose Secret carries
    tls.crt, tls.key and ca.crt."""
    ecdsa = {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}
    return [
        _issuer(f"{name}-selfsigned", {"selfSigned": {}}),
        _certificate(
            f"{name}-ca",
            {
                "isCA": True,
                "commonName": "statefleet instance CA",
                "secretName": f"{name}-ca",
                "duration": _hours(CA_VALIDITY),
                "renewBefore": _hours(CA_RENEW_BEFORE),
                "privateKey": ecdsa,
                "issuerRef": {"name": f"{name}-selfsigned", "kind": "Issuer", "group": "cert-manager.io"},
            },
        ),
        _issuer(f"{name}-ca", {"ca": {"secretName": f"{name}-ca"}}),
        _certificate(
            f"{name}-tls",
            {
                "secretName": f"{name}-tls",
                "commonName": hosts[0][:64],
                "dnsNames": hosts,
                "duration": _hours(SERVER_VALIDITY),
                "renewBefore": _hours(SERVER_RENEW_BEFORE),
                "privateKey": ecdsa,
                # As the operator's own: serving, and connecting to peers with it (mutual TLS).
                "usages": ["server auth", "client auth", "digital signature"],
                "issuerRef": {"name": f"{name}-ca", "kind": "Issuer", "group": "cert-manager.io"},
            },
        ),
    ]


def read_issued(server: dict[str, str] | None) -> datetime | None:
    """When the server certificate in a Secret's data expires; None: none there (yet)."""
    try:
        return (
            _first_cert(server["tls.crt"]).not_valid_after_utc if server and server.get("tls.crt") else None
        )
    except ValueError:
        return None


def certificate_not_ready(certificate: dict[str, Any] | None) -> str:
    """cert-manager's own words when it has not issued a Certificate; empty when it has."""
    if certificate is None:
        return "its Certificate is not there yet"
    for condition in (certificate.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return ""
            return f"{condition.get('reason', '')}: {condition.get('message', '')}".strip(": ")
    return "cert-manager has not looked at its Certificate yet"
