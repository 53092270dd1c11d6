"""A 3-instance `Postgres` survives the loss of its primary, switches over on request and rolls
out a parameter change without losing an acknowledged commit: proven on the test bed with real
PostgreSQL servers, whose processes the tests kill and freeze on the real node.

The steps share one instance (created once, about a minute): each starts from it whole, with
its 100 rows, and leaves it whole; the last one scales it down."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Pod

from e2e import node
from e2e.kube import statefleet, wait_until
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace
from e2e.operator_process import OperatorProcess
from e2e.test_postgres import Postgres, connect, create, execute, patch_spec, query, wait_ready
from e2e.test_postgres_ha import (
    SPEC,
    assert_one_primary_and_healthy,
    events,
    insert,
    role,
    rows,
    status_of,
    this_second,
    wait_new_primary,
    wait_whole,
)
from e2e.writer import Writer

# One worker runs the steps, in this order, on the one instance.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("postgres-failover")]


@pytest.fixture(scope="module")
def namespace(kube: Client, deleted_namespaces: DeletedNamespaces) -> Iterator[str]:
    """The steps' one namespace (overrides the per-test one)."""
    name = new_namespace(kube, namespace_prefix(), "postgres-failover")
    yield name
    deleted_namespaces.delete(name)


@pytest.fixture(scope="module")
def instance(kube: Client, namespace: str, operator: OperatorProcess) -> str:
    """The 3-instance Postgres `demo` with a table of 100 rows."""
    create(kube, namespace, "demo", SPEC)
    wait_ready(kube, namespace, "demo", 3, timeout=240)
    execute(kube, namespace, "demo-rw", "create table orders(id int primary key)")
    insert(kube, namespace, range(1, 101))
    return "demo"


@pytest.fixture
def cluster(kube: Client, namespace: str, instance: str) -> str:
    """The instance whole again (every standby streaming) with its 100 rows and nothing a
    step before left; returns its primary."""
    wait_whole(kube, namespace)
    execute(kube, namespace, "demo-rw", "delete from orders where id > 100; drop table if exists ticks")
    assert rows(kube, namespace) == 100
    return status_of(kube, namespace)["currentPrimary"]


def recovers(kube: Client, namespace: str, cluster: str, disrupt: Callable[[], None]) -> float:
    """Writes resume through `<name>-rw` and nothing committed before the failure is lost. A
    primary that comes back at once (a killed server's container restarts in a second; a
    deleted pod's namesake starts in two) returns as a standby holding all the WAL there is
    and is promoted again in place, the quickest way back; one that is slower, or behind a
    standby, is replaced by the most advanced standby. Returns the seconds until the first
    write succeeded."""
    since = this_second()
    started_before = query(kube, namespace, "demo-rw", "select pg_postmaster_start_time()::text")
    disrupt()
    at = time.monotonic()
    # The first write may still reach the old server in its last moment (a pod deleted without
    # grace dies a little after its API object): with asynchronous replication such a write can
    # be lost, so the test counts only what follows once the cluster settled.
    insert(kube, namespace, range(101, 102))
    took = time.monotonic() - at
    wait_ready(kube, namespace, "demo", 3, timeout=240)

    def settled() -> dict[str, Any] | None:
        status = status_of(kube, namespace)
        primary = status.get("currentPrimary")
        return None if status.get("targetPrimary") or role(kube, namespace, primary) != "primary" else status

    status = wait_until("the primary settled and labelled", settled, timeout=120, interval=1)
    primary = status["currentPrimary"]
    assert_one_primary_and_healthy(kube, namespace, primary)
    execute(kube, namespace, "demo-rw", "delete from orders where id = 101")
    insert(kube, namespace, range(101, 151))
    assert rows(kube, namespace) == 150  # the 100 from before, the 50 after
    assert query(kube, namespace, "demo-ro", "select count(*) from orders", retry_for=30) == 150
    assert query(kube, namespace, "demo-rw", "select pg_postmaster_start_time()::text") != started_before
    if primary != cluster:
        failover = status["failover"]
        assert failover["from"] == cluster
        assert failover["to"] == primary
        assert events(kube, namespace, f"{failover['kind']}Completed", since), "no Event says what happened"
        assert role(kube, namespace, cluster) == "replica"  # back, as a standby of the new one
    return took


def test_the_primary_pod_deleted_writes_resume_without_loss(
    kube: Client, namespace: str, cluster: str
) -> None:
    took = recovers(
        kube, namespace, cluster, lambda: kube.delete(Pod, cluster, namespace=namespace, grace_period=0)
    )
    assert took < 30, f"writes resumed {took:.1f} s after the deletion"


def test_the_primary_server_killed_writes_resume_without_loss(
    kube: Client, namespace: str, cluster: str
) -> None:
    uid = kube.get(Pod, cluster, namespace=namespace).metadata.uid
    took = recovers(kube, namespace, cluster, lambda: node.kill_server(uid))
    assert took < 15, f"writes resumed {took:.1f} s after the kill"


def test_failover_when_the_primary_container_freezes(kube: Client, namespace: str, cluster: str) -> None:
    uid = kube.get(Pod, cluster, namespace=namespace).metadata.uid
    frozen = node.freezer(uid)
    node.freeze(frozen)
    try:
        started = time.monotonic()
        new = wait_new_primary(kube, namespace, cluster)
        took = time.monotonic() - started
        # The frozen server still holds its IP, but <name>-rw reaches only the new primary.
        assert role(kube, namespace, cluster) != "primary"
        insert(kube, namespace, range(101, 111))
        assert query(kube, namespace, "demo-rw", "select inet_server_addr()::text").split("/")[0] == (
            kube.get(Pod, new, namespace=namespace).status.podIP
        )
    finally:
        node.thaw(frozen)
    # Thawed, it finds itself a primary beside the new one: fenced, restarted, rejoined.
    assert_one_primary_and_healthy(kube, namespace, new)
    assert rows(kube, namespace) == 110
    assert took < 20, f"failover after a freeze took {took:.1f} s"


def test_a_parameter_rollout_updates_the_standbys_first_and_the_primary_last(
    kube: Client, namespace: str, cluster: str
) -> None:
    """Even after the primary moved off ordinal 0 (here with `statefleet pg promote`, as a
    failover moves it): the rollout first switches it over to ordinal 0, the pod it updates
    last, and the primary's own update is a clean switchover. No acknowledged commit is lost."""
    since = this_second()
    moved = "demo-1" if cluster != "demo-1" else "demo-2"
    done = statefleet("pg", "promote", "demo", moved, "-n", namespace, "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{moved} is the primary" in done.stdout
    wait_whole(kube, namespace)
    execute(kube, namespace, "demo-rw", "create table ticks(value bigint primary key)")
    before = kube.get(StatefulSet, "demo", namespace=namespace).status.updateRevision
    writer = Writer(kube, namespace)
    writer.start()
    started = time.monotonic()
    patch_spec(kube, namespace, "demo", {"parameters": {"work_mem": "8MB"}})
    updated: list[str] = []  # in the order their new pods appeared
    primary_then: dict[str, str] = {}

    def progress() -> bool:
        revision = kube.get(StatefulSet, "demo", namespace=namespace).status.updateRevision
        if revision == before:
            return False
        primary = status_of(kube, namespace).get("currentPrimary", "")
        for pod in kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/instance": "demo"}):
            name = pod.metadata.name
            if pod.metadata.labels.get("controller-revision-hash") == revision and name not in updated:
                updated.append(name)
                primary_then[name] = primary
        return len(updated) == 3

    try:
        wait_until("every pod updated", progress, timeout=300, interval=0.25)
        wait_whole(kube, namespace)
        assert query(kube, namespace, "demo-rw", "show work_mem") == "8MB"
        assert query(kube, namespace, "demo-ro", "show work_mem") == "8MB"
        pause = writer.longest_pause(started)
    finally:
        writer.stop()
    assert updated == ["demo-2", "demo-1", "demo-0"]
    # The primary was on ordinal 0 before any pod was updated, and the last to go.
    assert primary_then["demo-2"] == "demo-0", primary_then
    assert primary_then["demo-1"] == "demo-0", primary_then
    started_events = [e.message for e in events(kube, namespace, "SwitchoverStarted", since)]
    assert any(f"{moved} -> demo-0" in m and "a rollout updates this pod last" in m for m in started_events)
    final = status_of(kube, namespace)["currentPrimary"]
    assert final in ("demo-1", "demo-2")
    assert_one_primary_and_healthy(kube, namespace, final)
    acknowledged = {value for value, _ in writer.acknowledged}
    with connect(kube, namespace, "demo-rw", "demo-superuser") as conn:
        present = {row[0] for row in conn.execute("select value from ticks")}
    assert acknowledged <= present, f"{len(acknowledged - present)} acknowledged commits lost"
    print(f"rollout of 3 instances: {len(acknowledged)} commits, longest write pause {pause:.1f} s")
    assert pause < 30


def test_switchover_on_request_and_scaling_down_never_removes_the_primary(
    kube: Client, namespace: str, cluster: str
) -> None:
    since = this_second()
    target = "demo-2" if cluster != "demo-2" else "demo-1"
    patch_spec(kube, namespace, "demo", {"switchover": {"to": target, "requestedAt": "1"}})
    assert wait_new_primary(kube, namespace, cluster) == target
    assert status_of(kube, namespace)["failover"]["kind"] == "Switchover"
    assert rows(kube, namespace) == 100
    assert_one_primary_and_healthy(kube, namespace, target)
    # A request to a pod that is no standby is refused, naming the field.
    patch_spec(kube, namespace, "demo", {"switchover": {"to": "demo-7", "requestedAt": "2"}})
    refused = wait_until(
        "SwitchoverRefused", lambda: events(kube, namespace, "SwitchoverRefused", since), timeout=30
    )
    assert "spec.switchover.to: demo-7" in refused[0].message

    # The primary on the highest ordinal: scaling to 2 switches over first, then removes it.
    if target != "demo-2":
        patch_spec(kube, namespace, "demo", {"switchover": {"to": "demo-2", "requestedAt": "3"}})
        assert wait_new_primary(kube, namespace, target) == "demo-2"
    patch_spec(kube, namespace, "demo", {"instances": 2})
    wait_until(
        "2 instances, the primary among them",
        lambda: (
            (s := status_of(kube, namespace)).get("readyInstances") == 2
            and s.get("currentPrimary") in ("demo-0", "demo-1")
            and not kube.get(Postgres, "demo", namespace=namespace).to_dict()["status"].get("targetPrimary")
            and len(list(kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/instance": "demo"})))
            == 2
        ),
        timeout=180,
        interval=1,
    )
    assert rows(kube, namespace) == 100
    insert(kube, namespace, range(101, 102))
