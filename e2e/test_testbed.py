"""Proof that the test bed is a real cluster: real containers with their own IPs, cluster
DNS, Services, persistent volumes, and kwok's simulated nodes for scale."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import psycopg
import pytest
from lightkube import Client, codecs
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Node, PersistentVolumeClaim, Pod

from e2e import manifests
from e2e.kube import get_or_none, pod_is_ready, pod_logs, wait_pod_finished, wait_pod_ready, wait_until
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace

pytestmark = pytest.mark.e2e


@pytest.fixture
def namespace(
    kube: Client, deleted_namespaces: DeletedNamespaces, request: pytest.FixtureRequest
) -> Iterator[str]:
    """Not `restricted`: these proofs of the test bed run plain images as root."""
    name = new_namespace(kube, namespace_prefix(), request.node.name, restricted=False)
    yield name
    deleted_namespaces.delete(name)


def apply(kube: Client, manifest: dict, namespace: str) -> None:
    kube.create(codecs.from_dict(manifest), namespace=namespace)


def test_nodes_real_and_simulated_are_ready(kube: Client) -> None:
    nodes = {node.metadata.name: node for node in kube.list(Node)}
    ready = {
        name
        for name, node in nodes.items()
        if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    }
    real = [name for name, node in nodes.items() if (node.metadata.labels or {}).get("type") != "kwok"]
    simulated = [name for name, node in nodes.items() if (node.metadata.labels or {}).get("type") == "kwok"]
    assert real, "no real node"
    assert simulated, "no kwok node"
    assert set(nodes) == ready, f"not Ready: {sorted(set(nodes) - ready)}"
    runtime = nodes[real[0]].status.nodeInfo.containerRuntimeVersion
    assert runtime.startswith("containerd://"), runtime


def test_postgres_pod_reachable_through_service_dns_and_from_host(kube: Client, namespace: str) -> None:
    password = secrets.token_hex(8)
    labels = {"app": "db"}
    apply(kube, manifests.postgres_pod("db", password, labels), namespace)
    apply(kube, manifests.service("db", labels, 5432), namespace)
    pod = wait_pod_ready(kube, "db", namespace, timeout=120)

    # A second pod reaches it through the Service's DNS name, with psql.
    uri = f"postgresql://postgres:{password}@db.{namespace}.svc.cluster.local:5432/postgres"
    apply(kube, manifests.psql_client_pod("client", uri, "select 'reached ' || version()"), namespace)
    client_pod = wait_pod_finished(kube, "client", namespace, timeout=120)
    output = pod_logs(kube, "client", namespace)
    assert client_pod.status.phase == "Succeeded", output
    assert "reached PostgreSQL 15." in output

    # The host reaches the pod's own IP (the operator runs on the host in tests).
    with psycopg.connect(
        host=pod.status.podIP, user="postgres", password=password, dbname="postgres", connect_timeout=5
    ) as conn:
        assert conn.execute("select current_setting('server_version_num')::int / 10000").fetchone() == (15,)


def test_statefulset_pod_keeps_its_data_when_deleted(kube: Client, namespace: str) -> None:
    password = secrets.token_hex(8)
    apply(kube, manifests.service("pg", {"app": "pg"}, 5432, headless=True), namespace)
    apply(kube, manifests.postgres_statefulset("pg", password), namespace)
    first = wait_pod_ready(kube, "pg-0", namespace, timeout=180)
    claim = kube.get(PersistentVolumeClaim, "data-pg-0", namespace=namespace)
    assert claim.status.phase == "Bound"

    marker = secrets.token_hex(8)
    # Through the pod's own DNS name on the headless Service, from another pod.
    uri = f"postgresql://postgres:{password}@pg-0.pg.{namespace}.svc.cluster.local:5432/postgres"
    apply(
        kube,
        manifests.psql_client_pod(
            "writer", uri, f"create table kept(v text); insert into kept values ('{marker}')"
        ),
        namespace,
    )
    writer = wait_pod_finished(kube, "writer", namespace)
    assert writer.status.phase == "Succeeded", pod_logs(kube, "writer", namespace)

    kube.delete(Pod, "pg-0", namespace=namespace)

    def replaced() -> Pod | None:
        pod = get_or_none(kube, Pod, "pg-0", namespace)
        return pod if pod and pod.metadata.uid != first.metadata.uid and pod_is_ready(pod) else None

    second = wait_until("pg-0 recreated and Ready", replaced, timeout=180)
    assert (
        kube.get(PersistentVolumeClaim, "data-pg-0", namespace=namespace).metadata.uid == claim.metadata.uid
    )
    with psycopg.connect(
        host=second.status.podIP, user="postgres", password=password, dbname="postgres", connect_timeout=5
    ) as conn:
        assert conn.execute("select v from kept").fetchall() == [(marker,)]


@pytest.mark.slow
def test_thousand_pods_on_kwok_nodes_become_running(kube: Client, namespace: str) -> None:
    replicas = 1000
    started = time.monotonic()
    apply(kube, manifests.kwok_statefulset("fleet", replicas), namespace)

    def all_ready() -> int | None:
        status = kube.get(StatefulSet, "fleet", namespace=namespace).status
        return status.readyReplicas if status and status.readyReplicas == replicas else None

    wait_until(f"{replicas} kwok pods ready", all_ready, timeout=600, interval=2)
    elapsed = time.monotonic() - started
    pods = list(kube.list(Pod, namespace=namespace, labels={"app": "fleet"}))
    running = [p for p in pods if p.status.phase == "Running"]
    assert len(running) == replicas
    assert all((p.spec.nodeName or "").startswith("kwok-node-") for p in running)
    print(f"\n{replicas} pods Running on kwok nodes in {elapsed:.1f}s")
