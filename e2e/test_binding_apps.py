"""Bindings as real applications read them: one program per ecosystem (e2e/apps: Spring Boot
with Spring Cloud Bindings, Node with kube-service-bindings, Python with pyservicebinding, Go with
nebhale/client-go), each taking its connections only from its library's reading of the Secrets
projected at $SERVICE_BINDING_ROOT, against PostgreSQL, RabbitMQ and MongoDB (FerretDB), with
the server's certificate and name verified. The steps share the instances and run in order."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod, Secret, Service
from lightkube.types import PatchType

from e2e import test_mongodb, test_postgres, test_rabbitmq
from e2e.kube import (
    apply,
    built_image,
    secret_data,
    wait_gone,
    wait_pod_ready,
    wait_reason,
    wait_until,
)
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace
from e2e.operator_process import OperatorProcess
from e2e.test_postgres_users import ServiceBinding, verify_full
from framework.certificates import issue_ca
from framework.kube.pod_security import restricted

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("binding-apps")]

ECOSYSTEMS = ("java", "node", "python", "go")
# Binding suffix -> the instance's kind and name; each ecosystem binds all three.
SERVICES = {"pg": ("Postgres", "pg"), "mq": ("RabbitMQ", "mq"), "docs": ("MongoDB", "docs")}
TYPES = {"pg": "postgresql", "mq": "rabbitmq", "docs": "mongodb"}
BINDING_ROOT = "/bindings"


def bindings_of(eco: str) -> list[str]:
    return [f"{eco}-{suffix}" for suffix in SERVICES]


@pytest.fixture(scope="module")
def namespace(kube: Client, deleted_namespaces: DeletedNamespaces) -> Iterator[str]:
    name = new_namespace(kube, namespace_prefix(), "binding-apps")
    yield name
    deleted_namespaces.delete(name)


@pytest.fixture(scope="module")
def bound(kube: Client, namespace: str, operator: OperatorProcess) -> dict[str, dict[str, str]]:
    """The three instances and twelve bindings (`<eco>-<pg|mq|docs>`): each binding's Secret."""
    storage = {"size": "1Gi"}
    test_postgres.create(kube, namespace, "pg", {"version": "17", "storage": storage})
    test_rabbitmq.create(kube, namespace, "mq", {"version": "4", "replicas": 1, "storage": storage})
    test_mongodb.create(kube, namespace, "docs", {"version": "7", "members": 1, "storage": storage})
    for eco in ECOSYSTEMS:
        for suffix, (kind, instance) in SERVICES.items():
            apply(
                kube,
                ServiceBinding,
                namespace,
                f"{eco}-{suffix}",
                {"service": {"kind": kind, "name": instance}},
            )
    test_postgres.wait_ready(kube, namespace, "pg", 1)
    test_rabbitmq.wait_formed(kube, namespace, "mq", 1)
    test_mongodb.wait_ready(kube, namespace, "docs")
    secrets = {}
    for eco in ECOSYSTEMS:
        for binding in bindings_of(eco):
            wait_reason(kube, ServiceBinding, namespace, binding, "Bound", timeout=180)
            secrets[binding] = secret_data(kube, namespace, binding)
    return secrets


def app_pod(eco: str, name: str, bindings: list[str]) -> dict[str, Any]:
    """The ecosystem's application, each binding's Secret projected at
    $SERVICE_BINDING_ROOT/<binding> as the servicebinding.io spec lays it out."""
    memory = "768Mi" if eco == "java" else "256Mi"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": eco}},
        "spec": restricted(
            {
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "app",
                        "image": built_image(f"app-{eco}"),
                        "imagePullPolicy": "IfNotPresent",
                        "env": [{"name": "SERVICE_BINDING_ROOT", "value": BINDING_ROOT}],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {
                            "httpGet": {"path": "/healthz", "port": 8080},
                            "periodSeconds": 1,
                        },
                        "resources": {
                            "requests": {"cpu": "50m", "memory": "128Mi"},
                            "limits": {"cpu": "500m", "memory": memory},
                        },
                        "volumeMounts": [
                            {"name": binding, "mountPath": f"{BINDING_ROOT}/{binding}", "readOnly": True}
                            for binding in bindings
                        ],
                    }
                ],
                "volumes": [{"name": binding, "secret": {"secretName": binding}} for binding in bindings],
            }
        ),
    }


def start_pods(kube: Client, namespace: str, pods: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Pods by name, made at once, waited for together: name -> pod IP."""
    for pod in pods.values():
        kube.create(Pod.from_dict(pod), namespace=namespace)
    return {name: wait_pod_ready(kube, name, namespace, timeout=180).status.podIP for name in pods}


def stop_pods(kube: Client, namespace: str, names: list[str]) -> None:
    for name in names:
        kube.delete(Pod, name, namespace=namespace, grace_period=0)
    for name in names:
        wait_gone(kube, Pod, name, namespace, timeout=60)


def check(address: str, binding: str) -> tuple[int, dict[str, Any], str]:
    """The application moves a token through a new connection of `binding`: the HTTP status,
    its answer, and the token sent."""
    token = uuid.uuid4().hex
    url = f"http://{address}:8080/check/{binding}?token={token}"
    try:
        with urllib.request.urlopen(url, timeout=120) as answer:
            return answer.status, json.loads(answer.read()), token
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}"), token


def check_all(targets: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, dict[str, Any], str]]:
    """(address, binding) -> check(...), every application at once."""
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        return dict(zip(targets, pool.map(lambda target: check(*target), targets), strict=True))


@pytest.fixture(scope="module")
def apps(kube: Client, namespace: str, bound: dict[str, dict[str, str]]) -> dict[str, str]:
    """One pod per ecosystem with its three bindings: eco -> pod IP."""
    return start_pods(kube, namespace, {eco: app_pod(eco, eco, bindings_of(eco)) for eco in ECOSYSTEMS})


def assert_served(results: dict[tuple[str, str], tuple[int, dict[str, Any], str]], secrets: dict) -> None:
    for (_address, binding), (status, answer, token) in results.items():
        assert status == 200, f"{binding}: {answer}"
        suffix = binding.rsplit("-", 1)[1]
        assert answer["type"] == TYPES[suffix], f"{binding}: {answer}"
        assert answer["token"] == token, f"{binding}: {answer}"
        assert answer["tls"] is True, f"{binding}: {answer}"
        assert answer["user"] == secrets[binding]["username"], f"{binding}: {answer}"


def test_each_application_moves_data_through_each_binding_over_verified_tls(
    bound: dict[str, dict[str, str]], apps: dict[str, str]
) -> None:
    # The Secrets carry what the libraries look for (README: "Bindings, as applications read them").
    for binding, data in bound.items():
        if data["type"] == "postgresql":
            assert (data["sslmode"], data["sslrootcert"]) == ("verify-full", "ca.crt")
            assert data["root.crt"] == data["ca.crt"]
            assert data["uri"].endswith("?sslmode=verify-full"), binding
        if data["type"] == "rabbitmq":
            assert data["addresses"] == f"amqps://{data['host']}:5671"
    results = check_all([(apps[eco], binding) for eco in ECOSYSTEMS for binding in bindings_of(eco)])
    assert_served(results, bound)


def copies(kube: Client, namespace: str, suffix: str, change: dict[str, dict[str, str]]) -> None:
    """A copy `<binding>-<suffix>` of each binding's Secret with `change[binding]` applied."""
    for binding, entries in change.items():
        data = {**secret_data(kube, namespace, binding), **entries}
        secret = Secret(metadata=ObjectMeta(name=f"{binding}-{suffix}"), stringData=data)
        kube.create(secret, namespace=namespace)


def refused(kube: Client, namespace: str, suffix: str, kind: str) -> None:
    """Pods `<eco>-<suffix>` reading the copies: every connection refused with `kind`."""
    pods = {
        f"{eco}-{suffix}": app_pod(eco, f"{eco}-{suffix}", [f"{b}-{suffix}" for b in bindings_of(eco)])
        for eco in ECOSYSTEMS
    }
    addresses = start_pods(kube, namespace, pods)
    try:
        results = check_all(
            [(addresses[f"{eco}-{suffix}"], f"{b}-{suffix}") for eco in ECOSYSTEMS for b in bindings_of(eco)]
        )
    finally:
        stop_pods(kube, namespace, list(pods))
    for (_address, binding), (status, answer, _token) in results.items():
        assert (status, answer.get("kind")) == (500, kind), f"{binding}: {answer}"


@pytest.fixture(scope="module")
def rotation(kube: Client, namespace: str, bound: dict[str, dict[str, str]]) -> dict[str, str]:
    """Every binding user's password changed through its Secret (`<binding>-credentials`, which
    the user resource reads), as a platform team rotates one: binding -> the new password. Asked
    for by the refusal step, so that the operator's work overlaps it."""
    rotated = {}
    for binding in bound:
        rotated[binding] = f"rotated-{uuid.uuid4().hex}"
        kube.patch(
            Secret,
            f"{binding}-credentials",
            {"stringData": {"password": rotated[binding]}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
    return rotated


def test_a_binding_with_another_ca_or_an_address_the_certificate_does_not_name_is_refused(
    kube: Client, namespace: str, bound: dict[str, dict[str, str]], rotation: dict[str, str]
) -> None:
    other_ca = issue_ca("another-ca", datetime.now(UTC))["ca.crt"]
    copies(
        kube,
        namespace,
        "other-ca",
        {
            b: {"ca.crt": other_ca, **({"root.crt": other_ca} if "root.crt" in d else {})}
            for b, d in bound.items()
        },
    )
    refused(kube, namespace, "other-ca", "certificate")

    # The Service's address for the host: the certificate names the Service's DNS names only.
    by_address = {}
    for binding, data in bound.items():
        service = data["host"].split(".", 1)[0]
        address = kube.get(Service, service, namespace=namespace).spec.clusterIP
        by_address[binding] = {
            key: data[key].replace(data["host"], address)
            for key in ("host", "uri", "addresses")
            if key in data
        }
    copies(kube, namespace, "by-address", by_address)
    refused(kube, namespace, "by-address", "name")


def old_password_refused(kube: Client, namespace: str, data: dict[str, str], tmp: Path) -> bool:
    """Whether the server now refuses the binding's password as it was before the rotation."""
    try:
        if data["type"] == "postgresql":
            address = kube.get(Service, data["host"].split(".", 1)[0], namespace=namespace).spec.clusterIP
            (tmp / "ca.crt").write_text(data["ca.crt"])
            verify_full(data, address, tmp / "ca.crt").close()
        elif data["type"] == "rabbitmq":
            test_rabbitmq.login_tls(kube, namespace, data, retry_for=0).close()
        else:
            with test_mongodb.tls_client(kube, namespace, data["uri"], data["ca.crt"], tmp, timeout_ms=5000):
                pass
    except psycopg.OperationalError as error:
        return "password authentication failed" in str(error)
    except Exception as error:  # pika's and pymongo's authentication errors
        return "auth" in f"{type(error).__name__} {error}".lower()
    return False


def test_a_rotated_password_reaches_each_application(
    kube: Client,
    namespace: str,
    bound: dict[str, dict[str, str]],
    apps: dict[str, str],
    rotation: dict[str, str],
    tmp_path: Path,
) -> None:
    before = {eco: kube.get(Pod, eco, namespace=namespace) for eco in ECOSYSTEMS}
    # The operator applies each new password to its server and writes it into the binding's
    # Secret; only then is the old one refused, so a passing check below used the new one.
    for binding, data in bound.items():
        wait_until(
            f"{binding}: the binding holds the new password",
            lambda binding=binding: secret_data(kube, namespace, binding)["password"] == rotation[binding],
            timeout=180,
            interval=2,
        )
        wait_until(
            f"{binding}: the old password refused",
            lambda data=data: old_password_refused(kube, namespace, data, tmp_path),
            timeout=120,
            interval=2,
        )
    rotated = {binding: secret_data(kube, namespace, binding) for binding in bound}

    # The kubelet updates the projected files within its sync period; the applications that
    # read the binding on each connection serve without a restart.
    targets = [(apps[eco], binding) for eco in ECOSYSTEMS for binding in bindings_of(eco)]
    waiting = set(targets)

    def all_served() -> bool:
        results = check_all(sorted(waiting))
        waiting.difference_update(target for target, (status, _a, _t) in results.items() if status == 200)
        return not waiting

    wait_until("every application served with the new passwords", all_served, timeout=240, interval=5)
    assert_served(check_all(targets), rotated)
    for eco, pod in before.items():
        now = kube.get(Pod, eco, namespace=namespace)
        assert now.metadata.uid == pod.metadata.uid, f"{eco} was made again"
        assert now.status.containerStatuses[0].restartCount == 0, f"{eco} restarted"
