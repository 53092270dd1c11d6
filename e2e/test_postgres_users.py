"""PostgresUser and ServiceBinding on the test bed, against a real PostgreSQL: the examples of
the issue as written, idempotence, passwords changed by hand, wrong or missing Secrets, a
binding that waits for its instance, deletion with and without dropping the role."""

from __future__ import annotations

import base64
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography import x509
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod, Secret, Service
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.types import PatchType

from e2e import node
from e2e.kube import (
    apply,
    events,
    get_or_none,
    pod_logs,
    ready_condition,
    secret_data,
    wait_pod_finished,
    wait_reason,
    wait_until,
)
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace
from e2e.operator_process import OperatorProcess
from e2e.test_postgres import Postgres, create, execute, patch_spec, query, wait_ready
from framework.binding import ServiceBindingKind
from framework.certificates import plan_tls
from framework.kube.pod_security import restricted
from services.postgres.users import PostgresUserKind

# One worker runs the steps, in this order: they share one instance.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("postgres-users")]

PostgresUser = PostgresUserKind.resource()
ServiceBinding = ServiceBindingKind.resource()


def login(kube: Client, namespace: str, user: str, password: str, database: str) -> psycopg.Connection:
    """As the application would; retried while `demo-rw` has no endpoint yet (kube-proxy follows
    a pod that just turned Ready within a second or two), never on a refused password."""
    host = kube.get(Service, "demo-rw", namespace=namespace).spec.clusterIP
    deadline = time.monotonic() + 30
    while True:
        try:
            return psycopg.connect(
                host=host, user=user, password=password, dbname=database, connect_timeout=5, autocommit=True
            )
        except psycopg.OperationalError as error:
            if "Connection refused" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def roles(kube: Client, namespace: str) -> set[str]:
    sql = "select string_agg(rolname, ',') from pg_roles where rolname !~ '^pg_'"
    return set(query(kube, namespace, "demo-rw", sql).split(","))


@pytest.fixture(scope="module")
def namespace(kube: Client, deleted_namespaces: DeletedNamespaces) -> Iterator[str]:
    """The steps' one namespace (overrides the per-test one)."""
    name = new_namespace(kube, namespace_prefix(), "postgres-users")
    yield name
    deleted_namespaces.delete(name)


@pytest.fixture(scope="module")
def demo(kube: Client, namespace: str, operator: OperatorProcess) -> str:
    """The one-instance Postgres the steps share, made by the first that needs it."""
    create(kube, namespace, "demo", {"version": "15", "storage": {"size": "1Gi"}})
    wait_ready(kube, namespace, "demo", 1)
    return "demo"


def test_a_binding_waits_for_its_instance_then_hands_out_its_own_credentials(
    kube: Client, namespace: str, operator: OperatorProcess, request: pytest.FixtureRequest
) -> None:
    # The issue's example, applied before the instance exists.
    apply(
        kube,
        ServiceBinding,
        namespace,
        "orders-db",
        {"service": {"kind": "Postgres", "name": "demo"}, "secretName": "orders-db"},
    )
    message = wait_reason(kube, ServiceBinding, namespace, "orders-db", "ServiceNotFound")
    assert message.startswith(f"spec.service.name: Postgres demo does not exist in namespace {namespace}")
    request.getfixturevalue("demo")  # the instance made now, after its binding
    wait_reason(kube, ServiceBinding, namespace, "orders-db", "Bound", timeout=120)

    secret = kube.get(Secret, "orders-db", namespace=namespace)
    assert secret.type == "servicebinding.io/postgresql"
    data = secret_data(kube, namespace, "orders-db")
    assert {k: data[k] for k in ("type", "provider", "host", "port", "username", "database")} == {
        "type": "postgresql",
        "provider": "statefleet",
        "host": f"demo-rw.{namespace}.svc",
        "port": "5432",
        "username": "orders-db",
        "database": "orders-db",
    }
    assert data["uri"].startswith("postgresql://orders-db:")
    assert data["uri"].endswith(f"@demo-rw.{namespace}.svc:5432/orders-db?sslmode=verify-full")
    body = kube.get(ServiceBinding, "orders-db", namespace=namespace).to_dict()
    assert body["status"]["binding"] == {"name": "orders-db"}  # servicebinding.io Provisioned Service
    # The application works in its own database with what the Secret says.
    with login(kube, namespace, data["username"], data["password"], data["database"]) as conn:
        conn.execute("create table orders(id int)")
        conn.execute("insert into orders values (1)")
        assert conn.execute("select current_user, current_database()").fetchone() == (
            "orders-db",
            "orders-db",
        )
    user = kube.get(PostgresUser, "orders-db", namespace=namespace)
    assert user.metadata.ownerReferences[0].kind == "ServiceBinding"

    # Unbinding removes the Secret, the PostgresUser and the role; the data stays.
    kube.delete(ServiceBinding, "orders-db", namespace=namespace)
    wait_until(
        "the binding's Secret, user and role gone",
        lambda: (
            get_or_none(kube, Secret, "orders-db", namespace) is None
            and get_or_none(kube, PostgresUser, "orders-db", namespace) is None
            and "orders-db" not in roles(kube, namespace)
        ),
        timeout=120,
        interval=1,
    )
    owner = "select pg_get_userbyid(datdba) from pg_database where datname = 'orders-db'"
    assert query(kube, namespace, "demo-rw", owner) == "postgres"


def test_postgres_user_lifecycle(kube: Client, namespace: str, demo: str) -> None:
    # The issue's example as written.
    apply(
        kube,
        PostgresUser,
        namespace,
        "reporting",
        {"instance": "demo", "database": "reporting", "ownDatabase": True},
    )
    wait_reason(kube, PostgresUser, namespace, "reporting", "Reconciled", timeout=60)
    status = kube.get(PostgresUser, "reporting", namespace=namespace).to_dict()["status"]
    assert (status["role"], status["database"], status["secret"]) == (
        "reporting",
        "reporting",
        "reporting-credentials",
    )
    password = secret_data(kube, namespace, "reporting-credentials")["password"]
    with login(kube, namespace, "reporting", password, "reporting") as conn:
        conn.execute("create table sales(amount int); insert into sales values (10), (20)")

    # Reconciling again creates nothing twice.
    kube.patch(
        PostgresUser,
        "reporting",
        {"metadata": {"annotations": {"touch": "1"}}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    kube.patch(
        PostgresUser,
        "reporting",
        {"spec": {"connectionLimit": 5}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    wait_until(
        "connection limit 5",
        lambda: (
            query(kube, namespace, "demo-rw", "select rolconnlimit from pg_roles where rolname = 'reporting'")
            == 5
        ),
        timeout=30,
    )
    assert len(events(kube, namespace, "reporting", "RoleCreated")) == 1
    assert len(events(kube, namespace, "reporting", "DatabaseCreated")) == 1
    assert ready_condition(kube, PostgresUser, namespace, "reporting")["status"] == "True"

    # The password Secret edited by hand is applied.
    kube.patch(
        Secret,
        "reporting-credentials",
        {"stringData": {"password": "a-new-one"}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )

    def new_password_works() -> bool:
        try:
            login(kube, namespace, "reporting", "a-new-one", "reporting").close()
            return True
        except psycopg.OperationalError:
            return False

    # Secrets are not watched: the next look at every user (each minute) applies it.
    wait_until("the edited password logs in", new_password_works, timeout=90, interval=2)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        login(kube, namespace, "reporting", password, "reporting")

    # Wrong or missing Secrets: a clear reason naming the field, and it recovers once fixed.
    apply(
        kube,
        PostgresUser,
        namespace,
        "analyst",
        {"instance": "demo", "passwordSecret": "analyst-pw", "memberOf": ["pg_read_all_data"]},
    )
    message = wait_reason(kube, PostgresUser, namespace, "analyst", "SecretNotFound")
    assert message == f"spec.passwordSecret: Secret analyst-pw does not exist in namespace {namespace}"
    kube.create(Secret(metadata=ObjectMeta(name="analyst-pw"), stringData={"pass": "x"}), namespace=namespace)
    message = wait_reason(kube, PostgresUser, namespace, "analyst", "SecretInvalid", timeout=40)
    assert message.startswith("spec.passwordSecret: Secret analyst-pw has no `password` entry")
    kube.patch(
        Secret,
        "analyst-pw",
        {"stringData": {"password": "reads-all"}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    wait_reason(kube, PostgresUser, namespace, "analyst", "Reconciled", timeout=40)
    with login(kube, namespace, "analyst", "reads-all", "reporting") as conn:
        assert conn.execute("select sum(amount) from sales").fetchone() == (30,)  # pg_read_all_data

    # A role the operator did not create is refused.
    execute(kube, namespace, "demo-rw", "create role intruder")
    apply(kube, PostgresUser, namespace, "intruder", {"instance": "demo"})
    message = wait_reason(kube, PostgresUser, namespace, "intruder", "Refused")
    assert "the role intruder exists and was not created for this resource" in message
    # A role with a superuser's powers, made by hand, is refused by the operator itself.
    execute(kube, namespace, "demo-rw", "create role admins superuser")
    apply(kube, PostgresUser, namespace, "climber", {"instance": "demo", "memberOf": ["admins"]})
    message = wait_reason(kube, PostgresUser, namespace, "climber", "Refused")
    assert message.startswith("spec.memberOf: admins would give this role powers")

    # Deleting drops the role; what it owned (its database, the table) goes to postgres.
    kube.delete(PostgresUser, "reporting", namespace=namespace)
    wait_until(
        "role reporting dropped",
        lambda: (
            get_or_none(kube, PostgresUser, "reporting", namespace) is None
            and "reporting" not in roles(kube, namespace)
        ),
        timeout=60,
    )
    owner = "select pg_get_userbyid(datdba) from pg_database where datname = 'reporting'"
    assert query(kube, namespace, "demo-rw", owner) == "postgres"
    # deletionPolicy: Retain keeps the role.
    kube.patch(
        PostgresUser,
        "analyst",
        {"spec": {"deletionPolicy": "Retain"}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    wait_until(
        "Retain seen",
        lambda: (
            kube.get(PostgresUser, "analyst", namespace=namespace).to_dict()["status"]["observedGeneration"]
            == kube.get(PostgresUser, "analyst", namespace=namespace).metadata.generation
        ),
        timeout=30,
    )
    kube.delete(PostgresUser, "analyst", namespace=namespace)
    wait_until(
        "analyst gone", lambda: get_or_none(kube, PostgresUser, "analyst", namespace) is None, timeout=60
    )
    assert "analyst" in roles(kube, namespace)


def served_certificate(host: str) -> x509.Certificate:
    """The certificate the server presents (PostgreSQL's SSLRequest, then the TLS handshake)."""
    with socket.create_connection((host, 5432), timeout=5) as raw:
        raw.sendall(struct.pack("!ii", 8, 80877103))
        assert raw.recv(1) == b"S"
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with context.wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def verify_full(binding: dict[str, str], address: str, rootcert: Path) -> psycopg.Connection:
    """As the application with the binding's Secret: the name the certificate must carry is the
    Service's; the address is its ClusterIP (the host resolves no cluster names)."""
    return psycopg.connect(
        host=binding["host"],
        hostaddr=address,
        user=binding["username"],
        password=binding["password"],
        dbname=binding["database"],
        sslmode="verify-full",
        sslrootcert=str(rootcert),
        connect_timeout=5,
    )


def test_tls_verify_full_with_the_binding_ca_and_a_renewed_certificate(
    kube: Client, namespace: str, demo: str, tmp_path: Path
) -> None:
    apply(kube, ServiceBinding, namespace, "app", {"service": {"kind": "Postgres", "name": "demo"}})
    wait_reason(kube, ServiceBinding, namespace, "app", "Bound", timeout=120)
    data = secret_data(kube, namespace, "app")
    assert data["sslmode"] == "verify-full"
    assert data["sslrootcert"] == "ca.crt"
    assert data["ca.crt"] == data["root.crt"]
    root = tmp_path / "ca.crt"
    root.write_text(data["ca.crt"])
    address = kube.get(Service, "demo-rw", namespace=namespace).spec.clusterIP

    def verified(rootcert: Path) -> psycopg.Connection:
        return verify_full(data, address, rootcert)

    with verified(root) as conn:
        assert conn.execute("select ssl from pg_stat_ssl where pid = pg_backend_pid()").fetchone() == (True,)
    # Verification is real: another CA is refused.
    stranger = tmp_path / "other-ca.crt"
    stranger.write_text(plan_tls(None, None, ["elsewhere"], datetime.now(UTC)).ca["ca.crt"])  # type: ignore[index]
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        verified(stranger)

    # A server certificate lost (or due) is issued again and the server takes it up.
    first = served_certificate(address)
    status = kube.get(Postgres, "demo", namespace=namespace).to_dict()["status"]
    assert status["tls"]["secret"] == "demo-tls"
    assert datetime.fromisoformat(status["tls"]["notAfter"].replace("Z", "+00:00")) > datetime.now(
        UTC
    ) + timedelta(days=80)
    kube.delete(Secret, "demo-tls", namespace=namespace)
    renewed = wait_until(
        "a new server certificate",
        lambda: get_or_none(kube, Secret, "demo-tls", namespace),
        timeout=120,
        interval=2,
    )
    new_serial = x509.load_pem_x509_certificate(base64.b64decode(renewed.data["tls.crt"])).serial_number
    assert new_serial != first.serial_number

    def presents_the_new_one() -> bool:
        try:
            return served_certificate(address).serial_number == new_serial
        except ConnectionRefusedError:  # demo-rw between endpoints: asked again, as a client would
            return False

    wait_until("the server presents the new certificate", presents_the_new_one, timeout=240, interval=5)
    with verified(root) as conn:  # the same CA: the application's copy still verifies
        assert conn.execute("select 1").fetchone() == (1,)
    assert events(kube, namespace, "demo", "CertificateIssued")


def client_pod(name: str, image: str, labels: dict[str, str], binding: str, tries: int) -> dict[str, Any]:
    """A one-shot application pod that logs in with the binding's Secret and asks who it is,
    `tries` times a second apart until it can (the enforcer lets a new pod in once it has seen
    its address, as an application retries)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": restricted(
            {
                "restartPolicy": "Never",
                "securityContext": {"runAsUser": 999, "runAsGroup": 999},
                "containers": [
                    {
                        "name": "psql",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": [
                            "bash",
                            "-c",
                            'for _ in $(seq "$0"); do psql -v ON_ERROR_STOP=1 -tAc "select current_user" '
                            "&& exit 0; sleep 1; done; exit 1",
                            str(tries),
                        ],
                        "env": [
                            {"name": "PGCONNECT_TIMEOUT", "value": "10"},
                            *(
                                {
                                    "name": variable,
                                    "valueFrom": {"secretKeyRef": {"name": binding, "key": key}},
                                }
                                for variable, key in (
                                    ("PGHOST", "host"),
                                    ("PGUSER", "username"),
                                    ("PGPASSWORD", "password"),
                                    ("PGDATABASE", "database"),
                                )
                            ),
                        ],
                    }
                ],
            }
        ),
    }


def run_client(kube: Client, namespace: str, pod: dict[str, Any]) -> tuple[str, str, float]:
    """The pod's phase and log once it ended, and how long it ran; the pod is deleted."""
    name = pod["metadata"]["name"]
    kube.create(Pod.from_dict(pod), namespace=namespace)
    ended = wait_pod_finished(kube, name, namespace, timeout=90)
    terminated = ended.status.containerStatuses[0].state.terminated
    took = (terminated.finishedAt - terminated.startedAt).total_seconds()
    log = pod_logs(kube, name, namespace)
    kube.delete(Pod, name, namespace=namespace, grace_period=0)
    wait_until(f"pod {name} gone", lambda: get_or_none(kube, Pod, name, namespace) is None, timeout=60)
    return ended.status.phase, log, took


def test_network_policies_let_in_the_bound_application_and_the_standbys_only(
    kube: Client, namespace: str, demo: str, operator: OperatorProcess
) -> None:
    """With the operator's NetworkPolicies on (and kube-router enforcing them on the node): a pod
    labelled as a binding's workload logs in, an unlabelled pod of the same namespace is refused,
    a new standby clones and streams through the policy; turned off, the policy goes and the
    unlabelled pod logs in. The operator runs on the host here, not in a pod: the node's own
    traffic always reaches the pods (kube-router accepts a local source address)."""
    assert node.network_policies_enforced(), (
        "no NetworkPolicy enforcer on the node: make testbed-up starts one"
    )
    apply(
        kube,
        ServiceBinding,
        namespace,
        "shop",
        {
            "service": {"kind": "Postgres", "name": "demo"},
            "workload": {"selector": {"matchLabels": {"app": "shop"}}},
        },
    )
    wait_reason(kube, ServiceBinding, namespace, "shop", "Bound", timeout=120)
    image = kube.get(Postgres, "demo", namespace=namespace).to_dict()["status"]["image"]  # has psql
    operator.network_policies = True
    operator.restart()
    try:
        shop = {"podSelector": {"matchLabels": {"app": "shop"}}}

        def policy_with_the_binding() -> bool:
            policy = get_or_none(kube, NetworkPolicy, "demo-ingress", namespace)
            return policy is not None and shop in policy.to_dict()["spec"]["ingress"][0]["from"]

        wait_until("demo-ingress letting in the binding's pods", policy_with_the_binding, timeout=60)
        # A new pod is let in once the enforcer has its address (kube-router's next sync, a few
        # seconds): until then its packets are dropped, so the client tries again, as at any start.
        phase, log, _ = run_client(kube, namespace, client_pod("shop", image, {"app": "shop"}, "shop", 20))
        assert (phase, log.strip().splitlines()[-1]) == ("Succeeded", "shop"), log
        phase, log, took = run_client(
            kube, namespace, client_pod("stranger", image, {"app": "other"}, "shop", 5)
        )
        assert phase == "Failed", log
        # kube-router rejects (ICMP port unreachable): refused at once rather than a timeout.
        refusals = [line for line in log.splitlines() if "Connection refused" in line or "timeout" in line]
        assert len(refusals) >= 5, log
        assert "shop" not in log.split(), log
        print(f"the unlabelled pod, 5 tries in {took:.1f} s: {refusals[-1]}")
        # The instance's own pods reach each other: a new standby clones the primary and streams.
        patch_spec(kube, namespace, "demo", {"instances": 2})
        wait_ready(kube, namespace, "demo", 2)
        streaming = "select count(*) from pg_stat_replication where state = 'streaming'"
        assert query(kube, namespace, "demo-rw", streaming) == 1
    finally:
        operator.network_policies = False
        operator.restart()
    wait_until(
        "demo-ingress deleted once the operator makes none",
        lambda: get_or_none(kube, NetworkPolicy, "demo-ingress", namespace) is None,
        timeout=90,
    )
    phase, log, _ = run_client(kube, namespace, client_pod("stranger", image, {"app": "other"}, "shop", 20))
    assert (phase, log.strip().splitlines()[-1]) == ("Succeeded", "shop"), log
