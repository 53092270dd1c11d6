"""A `Postgres` with several instances keeps its standbys and its commits: a standby that lost
the WAL it needs is cloned again, synchronous commits survive a failover; proven on the test
bed with real PostgreSQL servers, whose processes the tests freeze on the real node. The
helpers here serve e2e/test_postgres_failover.py too."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event, Pod

from e2e import node
from e2e.kube import events as kube_events
from e2e.kube import wait_until
from e2e.operator_process import OperatorProcess
from e2e.test_postgres import Postgres, connect, create, execute, query, wait_ready

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
        # Read-only: kube-proxy still routes to a pod that turned unready a moment ago.
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


def this_second() -> datetime:
    """Now, to the second, as Events are stamped."""
    return datetime.now(UTC).replace(microsecond=0)


def events(kube: Client, namespace: str, reason: str, since: datetime | None = None) -> list[Event]:
    """The instance's Events of `reason`, waited for (those of `since` or later only if given:
    steps that share an instance see each other's)."""
    return kube_events(kube, namespace, "demo", reason, since)


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
        ip = kube.get(Pod, standby, namespace=namespace).status.podIP
        try:
            with psycopg.connect(
                host=ip, user="postgres", password=password, dbname="postgres", connect_timeout=5
            ) as conn:
                return conn.execute("select count(*) from filler").fetchone()[0]
        except psycopg.OperationalError:
            return None

    assert wait_until("the recloned standby answers", rows_on_the_standby, timeout=120, interval=2) == 120000
    # It follows what the primary writes next: a clone that wrote WAL of its own (pg_rewind's
    # recovery of a fresh clone did) answers, but diverged, and fails at its next start.
    execute(kube, namespace, "demo-rw", "insert into filler select 'after' from generate_series(1, 10)")
    wait_until("the standby follows", lambda: rows_on_the_standby() == 120010, timeout=30, interval=1)
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
