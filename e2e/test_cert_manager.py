"""With cert-manager installed, it makes and renews the instances' certificates: the real
cert-manager controllers on the test bed, a real PostgreSQL verified with `sslmode=verify-full`."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509
from lightkube import Client
from lightkube.resources.core_v1 import Secret, Service
from lightkube.types import PatchType

from e2e import cert_manager
from e2e.kube import apply, events, secret_data, wait_gone, wait_reason, wait_until
from e2e.operator_process import OperatorProcess
from e2e.test_postgres import Postgres, create, wait_ready
from e2e.test_postgres_users import (
    ServiceBinding,
    served_certificate,
    verify_full,
)
from framework.instance_controller import Certificate

# It installs cert-manager's CRDs, which every operator of the cluster sees: it runs alone.
pytestmark = [pytest.mark.e2e, pytest.mark.serial]


def certificate_ready(kube: Client, namespace: str, name: str) -> bool:
    status = kube.get(Certificate, name, namespace=namespace).to_dict().get("status") or {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])


def test_cert_manager_issues_and_renews_the_instance_certificates(
    kube: Client, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    with cert_manager.installed():
        create(kube, namespace, "demo", {"version": "15", "storage": {"size": "1Gi"}})
        wait_ready(kube, namespace, "demo", 1, timeout=300)
        postgres = kube.get(Postgres, "demo", namespace=namespace).to_dict()
        assert postgres["status"]["tls"]["provider"] == "cert-manager"
        assert certificate_ready(kube, namespace, "demo-tls")
        assert certificate_ready(kube, namespace, "demo-ca")
        # The server Secret is cert-manager's, signed by the CA cert-manager made, and goes with
        # the instance.
        server = kube.get(Secret, "demo-tls", namespace=namespace)
        assert server.metadata.annotations["cert-manager.io/certificate-name"] == "demo-tls"
        ca_pem = base64.b64decode(kube.get(Secret, "demo-ca", namespace=namespace).data["tls.crt"])
        address = kube.get(Service, "demo-rw", namespace=namespace).spec.clusterIP

        def presented() -> x509.Certificate | None:
            try:
                return served_certificate(address)
            except ConnectionRefusedError:  # kube-proxy follows a pod just Ready within seconds
                return None

        served = wait_until("demo-rw answering", presented, timeout=30, interval=0.5)
        served.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))

        # Each Secret owned by its Certificate, each Certificate by the instance.
        def owned_by_certificates() -> bool:
            for name in ("demo-tls", "demo-ca"):
                certificate = kube.get(Certificate, name, namespace=namespace)
                owners = certificate.metadata.ownerReferences or []
                if [o.uid for o in owners] != [postgres["metadata"]["uid"]]:
                    return False
                secret = kube.get(Secret, name, namespace=namespace)
                if [o.uid for o in secret.metadata.ownerReferences or []] != [certificate.metadata.uid]:
                    return False
            return True

        wait_until("the Secrets owned by their Certificates", owned_by_certificates, timeout=90, interval=2)

        def noted() -> dict | None:
            tls = kube.get(Postgres, "demo", namespace=namespace).to_dict()["status"]["tls"]
            return tls if tls.get("notAfter") else None

        tls = wait_until("the certificate noted in status", noted, timeout=90, interval=2)
        assert datetime.fromisoformat(tls["notAfter"].replace("Z", "+00:00")) == served.not_valid_after_utc
        assert "waiting" not in tls

        # An application verifies the server with the CA its binding hands out.
        apply(kube, ServiceBinding, namespace, "app", {"service": {"kind": "Postgres", "name": "demo"}})
        wait_reason(kube, ServiceBinding, namespace, "app", "Bound", timeout=120)
        data = secret_data(kube, namespace, "app")
        assert data["sslmode"] == "verify-full"
        assert data["ca.crt"].encode().strip() == ca_pem.strip()
        root = tmp_path / "ca.crt"
        root.write_text(data["ca.crt"])

        with verify_full(data, address, root) as conn:
            assert conn.execute("select ssl from pg_stat_ssl where pid = pg_backend_pid()").fetchone() == (
                True,
            )

        # A renewal, asked of cert-manager as `cmctl renew` does: the server takes it up.
        certificate = kube.get(Certificate, "demo-tls", namespace=namespace).to_dict()
        conditions = [c for c in certificate["status"]["conditions"] if c["type"] != "Issuing"]
        conditions.append(
            {
                "type": "Issuing",
                "status": "True",
                "reason": "ManuallyTriggered",
                "message": "renewal asked by the test",
                "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        kube.patch(
            Certificate.Status,
            "demo-tls",
            {"status": {"conditions": conditions}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
        renewed = wait_until(
            "cert-manager's new certificate",
            lambda: (
                (pem := base64.b64decode(kube.get(Secret, "demo-tls", namespace=namespace).data["tls.crt"]))
                and x509.load_pem_x509_certificate(pem).serial_number != served.serial_number
                and x509.load_pem_x509_certificate(pem)
            ),
            timeout=120,
            interval=2,
        )
        wait_until(
            "the server presents the renewed certificate",
            lambda: served_certificate(address).serial_number == renewed.serial_number,
            timeout=240,
            interval=5,
        )
        with verify_full(data, address, root) as conn:  # the same CA: the application's copy still verifies
            assert conn.execute("select 1").fetchone() == (1,)
        # The Event of the renewal, naming the renewed certificate's end.
        until = renewed.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
        issued = wait_until(
            "the renewal's Event",
            lambda: [
                e
                for e in events(kube, namespace, "demo", "CertificateIssued", timeout=0)
                if "cert-manager" in e.message and until in e.message
            ],
            timeout=60,
        )
        assert issued

        # Deleting the instance takes cert-manager's objects and Secrets with it.
        kube.delete(Postgres, "demo", namespace=namespace)
        for kind, name in ((Certificate, "demo-tls"), (Certificate, "demo-ca"), (Secret, "demo-tls")):
            wait_gone(kube, kind, name, namespace, timeout=120)
