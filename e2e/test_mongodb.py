"""A developer applies a `MongoDB` and gets a server: proven on the test bed with the operator
running from this checkout against FerretDB 1.24 (MongoDB 7's wire protocol over SQLite, built
from the Go module proxy), the only MongoDB-protocol server these machines can run. What FerretDB
cannot do (replica sets, roles) is proven here only by its refusals; the replica set planner is
tested against MongoDB's documented replies in tests/unit/test_mongodb_replicaset.py."""

from __future__ import annotations

import base64
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pymongo
import pymongo.errors
import pytest
from cryptography import x509
from lightkube import Client
from lightkube.resources.core_v1 import Pod, Secret, Service
from lightkube.types import PatchType

from e2e.kube import (
    apply,
    get_or_none,
    secret_data,
    statefleet,
    wait_pod_replaced,
    wait_reason,
    wait_until,
)
from e2e.operator_process import OperatorProcess
from e2e.test_backup import Backup, Restore, storage, wait_phase
from framework.binding import ServiceBindingKind
from services.mongodb import PLUGIN
from services.mongodb.users import MongoDBUserKind

pytestmark = pytest.mark.e2e

MongoDB = PLUGIN.resource()
MongoDBUser = MongoDBUserKind.resource()
ServiceBinding = ServiceBindingKind.resource()


def create(kube: Client, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": "statefleet.dev/v1alpha1",
        "kind": "MongoDB",
        "metadata": {"name": name},
        "spec": spec,
    }
    kube.create(MongoDB.from_dict(body), namespace=namespace)


def wait_ready(kube: Client, namespace: str, name: str, timeout: float = 180) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        body = kube.get(MongoDB, name, namespace=namespace).to_dict()
        status = body.get("status") or {}
        condition = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        done = (
            condition.get("status") == "True"
            and status.get("observedGeneration") == body["metadata"]["generation"]
        )
        return status if done else None

    return wait_until(f"MongoDB {namespace}/{name} Ready", ready, timeout, 1)


def connect(
    kube: Client, namespace: str, name: str, username: str, password: str, auth_source: str = "admin"
) -> pymongo.MongoClient:
    """Through the client Service, as an application would; the first command proves the login."""
    host = kube.get(Service, name, namespace=namespace).spec.clusterIP
    client: pymongo.MongoClient = pymongo.MongoClient(
        host=host,
        port=27017,
        username=username,
        password=password,
        authSource=auth_source,
        directConnection=True,
        serverSelectionTimeoutMS=10000,
    )
    client.admin.command("ping")
    return client


@contextmanager
def resolving(host: str, address: str) -> Iterator[None]:
    """`host` resolves to `address` in this process (as `curl --resolve` does): the test reaches
    the Service's address, and the client checks the certificate against the name it was given."""
    original = socket.getaddrinfo

    def getaddrinfo(name: Any, *args: Any, **kwargs: Any) -> Any:
        return original(address if name == host else name, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    try:
        yield
    finally:
        socket.getaddrinfo = original  # type: ignore[assignment]


@contextmanager
def tls_client(
    kube: Client, namespace: str, uri: str, ca: str | None, tmp: Path, timeout_ms: int = 10000
) -> Iterator[pymongo.MongoClient]:
    """A client of `uri` as a binding gives it (TLS, a Service's name), verifying the server's
    name with `ca` (None: the system's CAs only); the first command proves the login."""
    host = urlsplit(uri).hostname or ""
    address = kube.get(Service, host.split(".")[0], namespace=namespace).spec.clusterIP
    options: dict[str, Any] = {"serverSelectionTimeoutMS": timeout_ms}
    if ca is not None:
        (tmp / "ca.crt").write_text(ca)
        options["tlsCAFile"] = str(tmp / "ca.crt")
    with resolving(host, address), pymongo.MongoClient(uri, **options) as client:
        client.admin.command("ping")
        yield client


def served_serial(address: str) -> int | None:
    """The serial number of the certificate the TLS listener presents (None: nothing answers)."""
    try:
        pem = ssl.get_server_certificate((address, 27018), timeout=5)
    except OSError:  # between pods
        return None
    return x509.load_pem_x509_certificate(pem.encode()).serial_number


def root(kube: Client, namespace: str, name: str) -> pymongo.MongoClient:
    data = kube.get(Secret, f"{name}-root", namespace=namespace).data
    username, password = (base64.b64decode(data[k]).decode() for k in ("username", "password"))
    return connect(kube, namespace, name, username, password)


def refused(kube: Client, namespace: str, name: str, username: str, password: str, source: str) -> bool:
    try:
        connect(kube, namespace, name, username, password, source).close()
    except pymongo.errors.OperationFailure as error:
        return error.code == 18  # AuthenticationFailed
    return False


def test_ferretdb_serves_one_member(
    kube: Client, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """(Members it cannot serve are refused: tests/controller/test_admission.py.)"""
    started = time.monotonic()
    create(kube, namespace, "catalog", {"version": "7", "members": 1, "storage": {"size": "1Gi"}})
    status = wait_ready(kube, namespace, "catalog")
    print(f"\nFerretDB MongoDB Ready in {time.monotonic() - started:.1f} s")
    assert status["flavor"] == "ferretdb"
    assert status["endpoints"]["uri"] == f"mongodb://catalog.{namespace}.svc:27017/"
    secret = kube.get(Secret, "catalog-root", namespace=namespace)
    assert secret.metadata.ownerReferences[0].kind == "MongoDB"
    with root(kube, namespace, "catalog") as client:
        client.shop.items.insert_many([{"sku": f"s{i}", "n": i} for i in range(10)])
        assert client.shop.items.count_documents({"n": {"$gte": 5}}) == 5
        assert client.admin.command("buildInfo")["ferretdbVersion"] == "v1.24.2"
    # Without credentials, nothing but a ping.
    host = kube.get(Service, "catalog", namespace=namespace).spec.clusterIP
    anonymous = pymongo.MongoClient(host=host, directConnection=True, serverSelectionTimeoutMS=5000)
    with anonymous, pytest.raises(pymongo.errors.OperationFailure, match="requires authentication"):
        anonymous.shop.items.find_one()

    # The root user's password rotated: a client logged in before goes on (a login is per
    # connection), the new password logs in, the old one is refused, the operator still serves.
    old_password = base64.b64decode(secret.data["password"]).decode()
    with root(kube, namespace, "catalog") as before:
        done = statefleet("mongodb", "rotate-credentials", "catalog", "-n", namespace, "--timeout", "120")
        assert done.returncode == 0, done.stdout + done.stderr
        assert before.shop.items.count_documents({}) == 10
    data = kube.get(Secret, "catalog-root", namespace=namespace).data
    assert "next-password" not in data
    new_password = base64.b64decode(data["password"]).decode()
    assert new_password != old_password
    connect(kube, namespace, "catalog", "root", new_password).close()
    assert refused(kube, namespace, "catalog", "root", old_password, "admin")
    apply(kube, MongoDBUser, namespace, "after-rotation", {"instance": "catalog", "database": "shop"})
    wait_reason(kube, MongoDBUser, namespace, "after-rotation", "Reconciled", timeout=60)

    # TLS (the operator's own connections are TLS already): the server's name verified with the
    # instance's CA; a client without that CA refuses the server.
    assert status["endpoints"]["tlsUri"] == f"mongodb://catalog.{namespace}.svc:27018/?tls=true"
    ca = secret_data(kube, namespace, "catalog-tls")["ca.crt"]
    as_root = f"mongodb://root:{quote(new_password, safe='')}@catalog.{namespace}.svc:27018/?tls=true"
    with tls_client(kube, namespace, as_root, ca, tmp_path) as client:
        assert client.shop.items.count_documents({}) == 10
    with (
        pytest.raises(pymongo.errors.ServerSelectionTimeoutError, match="CERTIFICATE_VERIFY_FAILED"),
        tls_client(kube, namespace, as_root, None, tmp_path, timeout_ms=3000),
    ):
        pass

    # TLS only: the plaintext listener goes (off the Service too), the data and the operator stay.
    before = kube.get(Pod, "catalog-0", namespace=namespace).metadata.uid
    only_tls = {"spec": {"tls": {"required": True}}}
    kube.patch(MongoDB, "catalog", only_tls, namespace=namespace, patch_type=PatchType.MERGE)
    wait_pod_replaced(kube, "catalog-0", namespace, before, 180)
    status = wait_ready(kube, namespace, "catalog")
    assert status["endpoints"].get("uri") is None
    assert [port.port for port in kube.get(Service, "catalog", namespace=namespace).spec.ports] == [27018]
    pod_ip = kube.get(Pod, "catalog-0", namespace=namespace).status.podIP
    plaintext = pymongo.MongoClient(
        host=pod_ip, port=27017, directConnection=True, serverSelectionTimeoutMS=3000
    )
    with plaintext, pytest.raises(pymongo.errors.ServerSelectionTimeoutError, match="Connection refused"):
        plaintext.admin.command("ping")
    with tls_client(kube, namespace, as_root, ca, tmp_path) as client:
        assert client.shop.items.count_documents({}) == 10
    apply(kube, MongoDBUser, namespace, "after-tls", {"instance": "catalog", "database": "shop"})
    wait_reason(kube, MongoDBUser, namespace, "after-tls", "Reconciled", timeout=60)


def test_users_and_a_binding(kube: Client, namespace: str, operator: OperatorProcess, tmp_path: Path) -> None:
    create(kube, namespace, "catalog", {"version": "7", "members": 1, "storage": {"size": "1Gi"}})
    wait_ready(kube, namespace, "catalog")

    # A binding: the application's own user, defined in its own database.
    apply(kube, ServiceBinding, namespace, "shop", {"service": {"kind": "MongoDB", "name": "catalog"}})
    wait_reason(kube, ServiceBinding, namespace, "shop", "Bound", timeout=120)
    secret = kube.get(Secret, "shop", namespace=namespace)
    assert secret.type == "servicebinding.io/mongodb"
    bound = secret_data(kube, namespace, "shop")
    password = quote(bound["password"], safe="")
    assert bound["uri"] == (
        f"mongodb://shop:{password}@catalog.{namespace}.svc:27018/shop?authSource=shop&tls=true"
    )
    assert (bound["username"], bound["database"]) == ("shop", "shop")
    assert (bound["port"], bound["tls"]) == ("27018", "true")
    # The uri as the application uses it, over TLS verified with the binding's CA.
    with tls_client(kube, namespace, bound["uri"], bound["ca.crt"], tmp_path) as client:
        client.shop.orders.insert_one({"order": 1})
        assert client.shop.orders.find_one({}, {"_id": 0}) == {"order": 1}

    # A server certificate lost (or due) is issued again, and FerretDB, which reads it only at
    # start, is restarted with it; the application's copy of the CA still verifies.
    address = kube.get(Service, "catalog", namespace=namespace).spec.clusterIP
    first = served_serial(address)
    kube.delete(Secret, "catalog-tls", namespace=namespace)
    renewed = wait_until(
        "a new server certificate", lambda: get_or_none(kube, Secret, "catalog-tls", namespace), 120, 1
    )
    new_serial = x509.load_pem_x509_certificate(base64.b64decode(renewed.data["tls.crt"])).serial_number
    assert new_serial != first
    wait_until("FerretDB presents the new certificate", lambda: served_serial(address) == new_serial, 180, 2)
    with tls_client(kube, namespace, bound["uri"], bound["ca.crt"], tmp_path) as client:
        assert client.shop.orders.count_documents({}) == 1

    # A user of its own, whose password is rotated through its Secret.
    apply(kube, MongoDBUser, namespace, "reporter", {"instance": "catalog", "database": "reports"})
    status = wait_reason(kube, MongoDBUser, namespace, "reporter", "Reconciled", timeout=60)
    assert "FerretDB enforces no roles" in status
    password = secret_data(kube, namespace, "reporter-credentials")["password"]
    connect(kube, namespace, "catalog", "reporter", password, "reports").close()
    assert refused(kube, namespace, "catalog", "reporter", "wrong", "reports")
    kube.patch(
        Secret,
        "reporter-credentials",
        {"stringData": {"password": "rotated-password-1"}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    wait_until(
        "the new password works",
        lambda: not refused(kube, namespace, "catalog", "reporter", "rotated-password-1", "reports"),
        90,
        2,
    )
    assert refused(kube, namespace, "catalog", "reporter", password, "reports")

    # A user that exists and is not this resource's is never taken over, nor dropped.
    with root(kube, namespace, "catalog") as client:
        client.reports.command({"createUser": "auditor", "pwd": "by-hand", "roles": []})
    apply(
        kube,
        MongoDBUser,
        namespace,
        "clash",
        {"instance": "catalog", "database": "reports", "username": "auditor"},
    )
    message = wait_reason(kube, MongoDBUser, namespace, "clash", "Refused")
    assert message.startswith(
        "user auditor already exists in database reports and this resource did not make it"
    )
    kube.delete(MongoDBUser, "clash", namespace=namespace)
    wait_until(
        "the clash resource gone", lambda: get_or_none(kube, MongoDBUser, "clash", namespace) is None, 60, 1
    )
    connect(kube, namespace, "catalog", "auditor", "by-hand", "reports").close()

    # Deleting the binding drops its user; the data stays.
    kube.delete(ServiceBinding, "shop", namespace=namespace)
    wait_until(
        "the binding's user dropped",
        lambda: refused(kube, namespace, "catalog", "shop", bound["password"], "shop"),
        90,
        1,
    )
    with root(kube, namespace, "catalog") as client:
        assert client.shop.orders.count_documents({}) == 1


def test_a_dump_restores_into_a_new_instance(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    create(kube, namespace, "catalog", {"version": "7", "members": 1, "storage": {"size": "1Gi"}})
    wait_ready(kube, namespace, "catalog")
    with root(kube, namespace, "catalog") as client:
        client.shop.items.create_index("sku", unique=True)
        client.shop.items.insert_many(
            [{"sku": f"s{i:05d}", "n": i, "blob": bytes(range(256)) * 4} for i in range(5000)]
        )
        client.shop["orders.2026"].insert_many([{"order": i} for i in range(10)])
        client.audit.log.insert_one({"event": "created"})

    storage(kube, namespace, "s3", bucket)
    apply(
        kube,
        Backup,
        namespace,
        "catalog-now",
        {"service": {"kind": "MongoDB", "name": "catalog"}, "storage": "s3"},
    )
    started = time.monotonic()
    backed_up = wait_phase(kube, Backup, namespace, "catalog-now", "Completed", timeout=240)
    assert backed_up["method"] == "dump"
    assert backed_up["objects"] == 6  # per collection: its documents and its options and indexes
    assert "FerretDB v1.24.2" in backed_up["version"]
    print(f"\ndump of 5011 documents: {backed_up['bytes']} bytes in {time.monotonic() - started:.1f} s")
    apply(
        kube,
        Restore,
        namespace,
        "catalog-copy",
        {"backup": "catalog-now", "target": {"kind": "MongoDB", "name": "catalog-copy"}},
    )
    started = time.monotonic()
    wait_phase(kube, Restore, namespace, "catalog-copy", "Completed", timeout=300)
    print(f"restored into a new instance in {time.monotonic() - started:.1f} s")
    with root(kube, namespace, "catalog-copy") as client:
        assert client.shop.items.count_documents({}) == 5000
        item = client.shop.items.find_one({"sku": "s04242"})
        assert (item["n"], item["blob"]) == (4242, bytes(range(256)) * 4)
        assert client.shop["orders.2026"].count_documents({}) == 10
        assert client.audit.log.find_one({}, {"_id": 0}) == {"event": "created"}
        unique = [i for i in client.shop.items.list_indexes() if i["name"] == "sku_1"]
        assert unique
        assert unique[0].get("unique") is True
        with pytest.raises(pymongo.errors.DuplicateKeyError):
            client.shop.items.insert_one({"sku": "s00001"})
    # Restoring over an instance is refused, naming why.
    apply(
        kube,
        Restore,
        namespace,
        "over",
        {"backup": "catalog-now", "target": {"kind": "MongoDB", "name": "catalog", "replace": True}},
    )
    message = wait_reason(kube, Restore, namespace, "over", "ReplaceRefused")
    assert "a dump backup of a MongoDB is restored into a new instance only" in message
