"""A developer applies a `Postgres` and gets a running PostgreSQL: proven on the test bed
with the operator running from this checkout and real PostgreSQL servers."""

from __future__ import annotations

import base64
import re
import time
from typing import Any

import psycopg
import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import ConfigMap, Event, PersistentVolumeClaim, Pod, Secret, Service
from lightkube.types import PatchType

from e2e.kube import get_or_none, wait_until
from e2e.operator_process import OperatorProcess
from framework.rollout.controller import Rollout
from services.postgres import PLUGIN

pytestmark = pytest.mark.e2e

Postgres = PLUGIN.resource()


def create(kube: Client, namespace: str, name: str, spec: dict[str, Any]) -> None:
    kube.create(
        Postgres.from_dict(
            {
                "apiVersion": "statefleet.dev/v1alpha1",
                "kind": "Postgres",
                "metadata": {"name": name},
                "spec": spec,
            }
        ),
        namespace=namespace,
    )


def patch_spec(kube: Client, namespace: str, name: str, change: dict[str, Any]) -> None:
    """What `kubectl patch --type merge -p '{"spec": ...}'` does."""
    kube.patch(Postgres, name, {"spec": change}, namespace=namespace, patch_type=PatchType.MERGE)


def condition(kube: Client, namespace: str, name: str, type_: str = "Ready") -> dict[str, Any] | None:
    status = kube.get(Postgres, name, namespace=namespace).to_dict().get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)


def wait_ready(
    kube: Client, namespace: str, name: str, instances: int, timeout: float = 240
) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        body = kube.get(Postgres, name, namespace=namespace).to_dict()
        status = body.get("status") or {}
        ready_condition = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        done = (
            ready_condition.get("status") == "True"
            and status.get("readyInstances") == instances
            and status.get("observedGeneration") == body["metadata"]["generation"]
        )
        return status if done else None

    return wait_until(
        f"Postgres {namespace}/{name} Ready with {instances} instances", ready, timeout, interval=1
    )


def connect(kube: Client, namespace: str, service: str, secret: str) -> psycopg.Connection:
    data = kube.get(Secret, secret, namespace=namespace).data
    password = base64.b64decode(data["password"]).decode()
    user = base64.b64decode(data["username"]).decode()
    host = kube.get(Service, service, namespace=namespace).spec.clusterIP
    return psycopg.connect(
        host=host, user=user, password=password, dbname="postgres", connect_timeout=5, autocommit=True
    )


def query(kube: Client, namespace: str, service: str, sql: str, retry_for: float = 30) -> Any:
    """The first value `sql` returns through `service`; retried while the Service's endpoints
    settle (kube-proxy follows a change within a second or two), as a client would."""
    deadline = time.monotonic() + retry_for
    while True:
        try:
            with connect(kube, namespace, service, "demo-superuser") as conn:
                return conn.execute(sql).fetchone()[0]
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def query_or_none(kube: Client, namespace: str, service: str, sql: str) -> Any:
    """For polling through a rolling restart: None while the server is away."""
    try:
        return query(kube, namespace, service, sql, retry_for=0)
    except psycopg.OperationalError:
        return None


def execute(kube: Client, namespace: str, service: str, sql: str) -> None:
    with connect(kube, namespace, service, "demo-superuser") as conn:
        conn.execute(sql)


def test_create_scale_update_and_delete(kube: Client, namespace: str, operator: OperatorProcess) -> None:
    create(kube, namespace, "demo", {"version": "15", "instances": 1, "storage": {"size": "1Gi"}})
    status = wait_ready(kube, namespace, "demo", 1)
    assert status["currentPrimary"] == "demo-0"
    assert status["version"] == "15"
    assert status["instances"] == "1/1"
    assert status["endpoints"]["rw"] == f"demo-rw.{namespace}.svc:5432"
    assert query(kube, namespace, "demo-rw", "show server_version").startswith("15.")

    # Scale 1 -> 3: two streaming replicas cloned from the primary, read-only through -ro.
    execute(kube, namespace, "demo-rw", "create table orders(id int); insert into orders values (1), (2)")
    patch_spec(kube, namespace, "demo", {"instances": 3})
    status = wait_ready(kube, namespace, "demo", 3)
    assert status["instances"] == "3/3"
    assert query(kube, namespace, "demo-ro", "select pg_is_in_recovery()") is True
    assert query(kube, namespace, "demo-rw", "select count(*) from pg_stat_replication") == 2
    wait_until(
        "rows replicated to -ro",
        lambda: query(kube, namespace, "demo-ro", "select count(*) from orders") == 2,
        timeout=30,
    )

    # An update of the parameters and the resources reaches every instance.
    resources = {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "512Mi"}}
    patch_spec(kube, namespace, "demo", {"parameters": {"max_connections": "150"}, "resources": resources})
    wait_until(
        "max_connections 150 on the primary",
        lambda: query_or_none(kube, namespace, "demo-rw", "show max_connections") == "150",
        timeout=300,
        interval=2,
    )
    wait_ready(kube, namespace, "demo", 3, timeout=300)
    assert query(kube, namespace, "demo-ro", "show max_connections") == "150"
    for index in range(3):
        pod = kube.get(Pod, f"demo-{index}", namespace=namespace)
        postgres = next(c for c in pod.spec.containers if c.name == "postgres")
        assert postgres.resources.requests == resources["requests"], pod.metadata.name
        assert postgres.resources.limits == resources["limits"], pod.metadata.name

    # Scale 3 -> 2: the highest ordinal goes (never the primary), the data stays.
    patch_spec(kube, namespace, "demo", {"instances": 2})
    wait_until(
        "2 instances",
        lambda: (
            len(list(kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/instance": "demo"}))) == 2
        ),
        timeout=120,
    )
    status = wait_ready(kube, namespace, "demo", 2)
    assert status["instances"] == "2/2"
    assert status["currentPrimary"] in ("demo-0", "demo-1")
    assert query(kube, namespace, "demo-rw", "select count(*) from orders") == 2
    assert query(kube, namespace, "demo-rw", "select count(*) from pg_stat_replication") == 1

    # Deleting the Postgres removes every child but keeps the volumes (deletionPolicy Retain).
    claims = {c.metadata.name for c in kube.list(PersistentVolumeClaim, namespace=namespace)}
    assert claims == {"data-demo-0", "data-demo-1", "data-demo-2"}
    kube.delete(Postgres, "demo", namespace=namespace)
    wait_until(
        "children garbage-collected",
        lambda: (
            not list(kube.list(StatefulSet, namespace=namespace))
            and not list(kube.list(Service, namespace=namespace))
        ),
        timeout=120,
    )
    assert {c.metadata.name for c in kube.list(PersistentVolumeClaim, namespace=namespace)} == claims


def test_operator_restart_changes_nothing(kube: Client, namespace: str, operator: OperatorProcess) -> None:
    create(kube, namespace, "calm", {"version": "15", "storage": {"size": "1Gi"}})
    wait_ready(kube, namespace, "calm", 1)

    def versions() -> dict[str, str]:
        found = {}
        for resource in (StatefulSet, Rollout, Service, ConfigMap, Secret):
            for obj in kube.list(
                resource, namespace=namespace, labels={"app.kubernetes.io/instance": "calm"}
            ):
                found[f"{resource.__name__}/{obj.metadata.name}"] = obj.metadata.resourceVersion
        found["Postgres/calm"] = kube.get(Postgres, "calm", namespace=namespace).metadata.resourceVersion
        return found

    def event_count() -> int:
        return len(list(kube.list(Event, namespace=namespace, fields={"involvedObject.name": "calm"})))

    # The operator keeps its state in status and its children: nothing of kopf's on the resource.
    resource = kube.get(Postgres, "calm", namespace=namespace)
    assert not resource.metadata.finalizers
    assert not [a for a in resource.metadata.annotations or {} if a.startswith("kopf.")]

    # Settled first: the StatefulSet controller writes status for a moment after the pod is Ready.
    def settled() -> dict[str, str] | None:
        first = versions()
        time.sleep(3)
        return first if versions() == first else None

    before = wait_until("the resource and its children to settle", settled, timeout=60)
    events_before = event_count()
    assert len(before) >= 7, before
    operator.restart()
    assert operator.stopped_in < 15, f"the operator took {operator.stopped_in:.0f}s to stop on SIGTERM"

    def passed_twice() -> bool:
        """The restarted operator listed the resource, asked its server and passed again (its
        counters also count what this worker's earlier tests left being deleted: at least)."""
        exposed = operator.metrics()
        passes = re.search(
            r'^statefleet_reconcile_total\{kind="Postgres",result="ok"\} (\S+)$', exposed, re.M
        )
        ready = re.search(r'^statefleet_resources_ready\{kind="Postgres"\} (\S+)$', exposed, re.M)
        return bool(passes and float(passes[1]) >= 2 and ready and float(ready[1]) >= 1)

    wait_until("two passes of the restarted operator, Ready", passed_twice, timeout=60)
    assert settled() == before  # and nothing written for 3 s more
    assert event_count() == events_before


def test_a_deleted_pod_comes_back_with_its_role(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    create(kube, namespace, "demo", {"version": "15", "storage": {"size": "1Gi"}})
    wait_ready(kube, namespace, "demo", 1)
    old = kube.get(Pod, "demo-0", namespace=namespace).metadata.uid
    kube.delete(Pod, "demo-0", namespace=namespace)

    def new_primary_labelled() -> bool:
        pod = get_or_none(kube, Pod, "demo-0", namespace)
        return (
            bool(pod)
            and pod.metadata.uid != old
            and pod.metadata.labels.get("statefleet.dev/role") == "primary"
        )

    wait_until("the new demo-0 labelled primary", new_primary_labelled, timeout=120)
    wait_ready(kube, namespace, "demo", 1)
    assert query(kube, namespace, "demo-rw", "select not pg_is_in_recovery()", retry_for=60) is True
