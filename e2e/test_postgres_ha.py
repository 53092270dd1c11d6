"""A `Postgres` with several instances survives the loss of its primary: proven on the test bed
with real PostgreSQL servers, whose processes the tests kill and freeze on the real node."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Event, Pod

from e2e import node
from e2e.kube import statefleet, wait_until
from e2e.operator_process import OperatorProcess
from e2e.test_postgres import Postgres, connect, create, execute, patch_spec, query, wait_ready
from e2e.writer import Writer

pytestmark = pytest.mark.e2e

SPEC = {"version": "15", "instances": 3, "storage": {"size": "1Gi"}}


def status_of(kube: Client, namespace: str, name: str = "demo") -> dict[str, Any]:
    return kube.get(Postgres, name, namespace=namespace).to_dict().get("status") or {}


def role(kube: Client, namespace: str, pod: str) -> str | None:
    return (kube.get(Pod, pod, namespace=namespace).metadata.labels or {}).get("statefleet.dev/role")


def wait_new_primary(kube: Client, namespace: str, old: str, timeout: float = 60) -> str:
    def moved() -> str | None:
        status = status_of(kube, namespace)
        current = status.get("currentPrimary")
        return current if current and current != old and not status.get("targetPrimary") else None

    return wait_until(f"a primary other than {old}", moved, timeout, interval=0.5)


def insert(kube: Client, namespace: str, values: range, retry_for: float = 30) -> None:
    """Rows through `<name>-rw`, retried as a client would while the Service follows a new
    primary (kube-proxy takes a second or two)."""
    sql = f"insert into orders select generate_series({values.start}, {values.stop - 1})"
    deadline = time.monotonic() + retry_for
    while True:
        try:
            execute(kube, namespace, "demo-rw", sql)
            return
        # Read-only: a standby's pod is not Ready in its first 3 s, which narrows the window in
        # which `demo-rw` may send a write to a restarted primary that came back a standby; a
        # run after a kill -9 still met it once (session 4): not closed yet.
        except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def rows(kube: Client, namespace: str) -> int:
    return query(kube, namespace, "demo-rw", "select count(*) from orders", retry_for=30)


def wait_whole(kube: Client, namespace: str, timeout: float = 240) -> None:
    """All three instances ready, two standbys streaming from the primary behind `demo-rw`."""
    wait_ready(kube, namespace, "demo", 3, timeout=timeout)
    streaming = "select count(*) from pg_stat_replication where state = 'streaming'"
    wait_until(
        "two standbys streaming from the primary",
        lambda: query(kube, namespace, "demo-rw", streaming) == 2,
        timeout=timeout,
        interval=1,
    )


def assert_one_primary_and_healthy(kube: Client, namespace: str, primary: str) -> None:
    """Every instance back, streaming from the one primary; only it carries the label."""
    wait_whole(kube, namespace)
    roles = {f"demo-{i}": role(kube, namespace, f"demo-{i}") for i in range(3)}
    assert [pod for pod, r in roles.items() if r == "primary"] == [primary], roles
    assert query(kube, namespace, "demo-rw", "select not pg_is_in_recovery()") is True


def events(kube: Client, namespace: str, reason: str) -> list[Event]:
    return [
        e
        for e in kube.list(Event, namespace=namespace, fields={"involvedObject.name": "demo"})
        if e.reason == reason
    ]


@pytest.fixture
def cluster(kube: Client, namespace: str, operator: OperatorProcess) -> str:
    """A 3-instance Postgres with a table of 100 rows; returns its primary."""
    create(kube, namespace, "demo", SPEC)
    status = wait_ready(kube, namespace, "demo", 3, timeout=240)
    execute(kube, namespace, "demo-rw", "create table orders(id int primary key)")
    insert(kube, namespace, range(1, 101))
    return status["currentPrimary"]


def recovers(kube: Client, namespace: str, cluster: str, disrupt: Callable[[], None]) -> float:
    """Writes resume through `<name>-rw` and nothing committed before the failure is lost. A
    primary that comes back at once (a killed server's container restarts in a second; a
    deleted pod's namesake starts in two) returns as a standby holding all the WAL there is
    and is promoted again in place, the quickest way back; one that is slower, or behind a
    standby, is replaced by the most advanced standby. Returns the seconds until the first
    write succeeded."""
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
        assert events(kube, namespace, f"{failover['kind']}Completed"), "no Event says what happened"
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


def test_switchover_on_request_and_scaling_down_never_removes_the_primary(
    kube: Client, namespace: str, cluster: str
) -> None:
    target = "demo-2" if cluster != "demo-2" else "demo-1"
    patch_spec(kube, namespace, "demo", {"switchover": {"to": target, "requestedAt": "1"}})
    assert wait_new_primary(kube, namespace, cluster) == target
    assert status_of(kube, namespace)["failover"]["kind"] == "Switchover"
    assert rows(kube, namespace) == 100
    assert_one_primary_and_healthy(kube, namespace, target)
    # A request to a pod that is no standby is refused, naming the field.
    patch_spec(kube, namespace, "demo", {"switchover": {"to": "demo-7", "requestedAt": "2"}})
    refused = wait_until(
        "SwitchoverRefused", lambda: events(kube, namespace, "SwitchoverRefused"), timeout=30
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


def test_a_parameter_rollout_updates_the_standbys_first_and_the_primary_last(
    kube: Client, namespace: str, cluster: str
) -> None:
    """Even after the primary moved off ordinal 0 (here with `statefleet pg promote`, as a
    failover moves it): the rollout first switches it over to ordinal 0, the pod it updates
    last, and the primary's own update is a clean switchover. No acknowledged commit is lost."""
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
    started_events = [e.message for e in events(kube, namespace, "SwitchoverStarted")]
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


def test_a_standby_that_lost_the_wal_it_needs_is_cloned_again(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    """Frozen while the primary writes and recycles its WAL, a standby cannot follow once it
    thaws: restarted once (30 s without streaming), then cloned afresh (30 s more)."""
    small_wal = {"wal_keep_size": "16MB", "max_wal_size": "64MB", "min_wal_size": "32MB"}
    create(kube, namespace, "demo", {**SPEC, "parameters": small_wal})
    primary = wait_ready(kube, namespace, "demo", 3, timeout=240)["currentPrimary"]
    wait_whole(kube, namespace)
    standby = next(f"demo-{i}" for i in range(3) if f"demo-{i}" != primary)
    execute(kube, namespace, "demo-rw", "create table filler(x text)")
    frozen = node.freezer(kube.get(Pod, standby, namespace=namespace).metadata.uid)
    node.freeze(frozen)
    try:
        for _ in range(4):  # about 120 MB of WAL; each checkpoint recycles what is past 16 MB
            execute(
                kube,
                namespace,
                "demo-rw",
                "insert into filler select repeat('x', 1000) from generate_series(1, 30000)",
            )
            execute(kube, namespace, "demo-rw", "checkpoint")
    finally:
        node.thaw(frozen)
    wait_until("Recloning", lambda: events(kube, namespace, "Recloning"), timeout=180, interval=2)
    assert events(kube, namespace, "Rejoining"), "a restart comes first"
    wait_whole(kube, namespace, timeout=300)
    with connect(kube, namespace, "demo-rw", "demo-superuser") as conn:
        password = conn.info.password

    def rows_on_the_standby() -> int | None:
        # Seen refusing connections just after the cluster was whole (cause not found yet).
        ip = kube.get(Pod, standby, namespace=namespace).status.podIP
        try:
            with psycopg.connect(
                host=ip, user="postgres", password=password, dbname="postgres", connect_timeout=5
            ) as conn:
                return conn.execute("select count(*) from filler").fetchone()[0]
        except psycopg.OperationalError:
            return None

    assert wait_until("the recloned standby answers", rows_on_the_standby, timeout=120, interval=2) == 120000
    wait_until(
        "the standby forgotten as rejoining", lambda: not status_of(kube, namespace).get("rejoins"), 30
    )


def test_synchronous_commits_survive_a_failover(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    create(kube, namespace, "demo", {**SPEC, "synchronous": {"number": 1}})
    primary = wait_ready(kube, namespace, "demo", 3, timeout=240)["currentPrimary"]
    assert query(kube, namespace, "demo-rw", "show synchronous_standby_names") == "ANY 1 (*)"
    execute(kube, namespace, "demo-rw", "create table orders(id int primary key)")
    acknowledged = 0
    with connect(kube, namespace, "demo-rw", "demo-superuser") as conn:
        for value in range(1, 201):
            conn.execute("insert into orders values (%s)", (value,))
            acknowledged = value
    # Frozen, the primary can send nothing more: what the new one has is what was replicated.
    frozen = node.freezer(kube.get(Pod, primary, namespace=namespace).metadata.uid)
    node.freeze(frozen)
    try:
        wait_new_primary(kube, namespace, primary)
        assert rows(kube, namespace) == acknowledged
    finally:
        node.thaw(frozen)


def test_bad_synchronous_settings_are_refused_at_admission(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    with pytest.raises(ApiError) as refused:
        create(
            kube,
            namespace,
            "lonely",
            {"storage": {"size": "1Gi"}, "instances": 2, "synchronous": {"number": 2}},
        )
    assert "synchronous.number must be below instances" in refused.value.status.message
