"""A 3-instance `Postgres` survives the loss of its primary, switches over on request and rolls
out a parameter change without losing an acknowledged commit: proven on the test bed with real
PostgreSQL servers, whose processes the tests kill and freeze on the real node.

The steps share one instance (created once, about a minute): each starts from it whole, with
its 100 rows, and leaves it whole; the switchover step scales it down. The instance archives
its WAL all along (`spec.walArchive`): a step checks the archive has every segment across the
failovers, the switchover and a time with revoked keys; the last recovers a new instance to
a point in time from it and a physical backup taken before the failovers."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import zstandard
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import PatchType

from e2e import node
from e2e.kube import apply, get_or_none, pod_is_ready, statefleet, wait_until
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace
from e2e.operator_process import OperatorProcess
from e2e.s3 import create_keys, keys_under, new_bucket, revoke_keys, s3_api, s3_settings
from e2e.test_backup import Backup, Restore, sql, storage, wait_phase
from e2e.test_backup import status as status_in
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
from framework.kube import conditions
from services.postgres.primary import UNREADY_LIMIT
from services.postgres.wal_archive import (
    ARCHIVER_PORT,
    CONDITION,
    HISTORY,
    archive_prefix,
    missing_segments,
    segment_number,
)

# One worker runs the steps, in this order, on the one instance.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("postgres-failover")]


@pytest.fixture(scope="module")
def namespace(kube: Client, deleted_namespaces: DeletedNamespaces) -> Iterator[str]:
    """The steps' one namespace (overrides the per-test one)."""
    name = new_namespace(kube, namespace_prefix(), "postgres-failover")
    yield name
    deleted_namespaces.delete(name)


@pytest.fixture(scope="module")
def archive_bucket() -> Iterator[str]:
    with new_bucket() as name:
        yield name


@pytest.fixture(scope="module")
def archive_keys() -> Iterator[list[tuple[str, str]]]:
    """The storage's keys, a user of the S3 server's own (the last test revokes them and
    makes new ones: each added here is revoked at the end)."""
    made = [create_keys()]
    yield made
    for access, _ in made:
        revoke_keys(access)


@pytest.fixture(scope="module")
def instance(
    kube: Client,
    namespace: str,
    operator: OperatorProcess,
    archive_bucket: str,
    archive_keys: list[tuple[str, str]],
) -> str:
    """The 3-instance Postgres `demo` with a table of 100 rows, archiving its WAL to the
    BackupStorage `s3`."""
    access, secret = archive_keys[0]
    storage(kube, namespace, "s3", archive_bucket, access_key=access, secret_key=secret)
    create(kube, namespace, "demo", {**SPEC, "walArchive": {"storage": "s3"}})
    wait_ready(kube, namespace, "demo", 3, timeout=240)
    execute(kube, namespace, "demo-rw", "create table orders(id int primary key)")
    insert(kube, namespace, range(1, 101))
    # The base backup of the point-in-time step, before the failovers change the timeline.
    service = {"kind": "Postgres", "name": "demo"}
    apply(kube, Backup, namespace, "base", {"service": service, "storage": "s3", "method": "physical"})
    wait_phase(kube, Backup, namespace, "base", "Completed", timeout=240)
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


def test_a_primary_pod_stuck_terminating_is_replaced_once_its_server_stopped(
    kube: Client, namespace: str, cluster: str
) -> None:
    """A finalizer keeps the primary's pod (someone else's controller; a kubelet that is gone
    acts alike) and `kubectl delete pod` stops its server at once: writes resume within
    seconds, not when the finalizer goes (it was 394 s before)."""
    since = this_second()
    hold = {"metadata": {"finalizers": ["example.com/hold"]}}
    kube.patch(Pod, cluster, hold, namespace=namespace, patch_type=PatchType.MERGE)
    try:
        kube.delete(Pod, cluster, namespace=namespace)  # its grace period: 30 s
        at = time.monotonic()
        # (An insert right after the delete may still reach the old primary: its kubelet stops
        # it a moment later. The Event comes first, then writes go to the new primary.)
        stuck = wait_until(
            "an Event that says why the switchover went on",
            lambda: events(kube, namespace, "PrimaryStuckTerminating", since),
            timeout=60,
            interval=0.5,
        )
        assert "server stopped but its pod is still being deleted" in (stuck[0].message or "")
        insert(kube, namespace, range(101, 102), retry_for=60)
        took = time.monotonic() - at
    finally:
        released = {"metadata": {"finalizers": None}}
        kube.patch(Pod, cluster, released, namespace=namespace, patch_type=PatchType.MERGE)
    # As any deletion (30 s, test_the_primary_pod_deleted_...): a clean stop, then the failover.
    assert took < 30, f"writes resumed {took:.1f} s after the deletion"
    new = wait_new_primary(kube, namespace, cluster)  # (writes resume a moment before status says so)
    assert role(kube, namespace, new) == "primary"


def test_a_primary_whose_pod_is_not_ready_while_its_server_answers_is_replaced(
    kube: Client, namespace: str, cluster: str
) -> None:
    """Its readiness probe (pg_isready on 127.0.0.1) times out while its server answers on the
    pod's IP: `<name>-rw` sends it no client, yet the operator hears it. The probes' leftovers
    do not restart the server meanwhile (they once did, every 3 s: the postmaster was PID 1
    and took an orphaned pg_isready's exit for a crash). Past 15 s it is stopped first, then a
    standby promoted; nothing committed before is lost."""
    since = this_second()
    started = server_started(kube, namespace, cluster)
    node.block_loopback_port(kube.get(Pod, cluster, namespace=namespace).metadata.uid, 5432)
    wait_until("its pod not ready", lambda: not pod_is_ready(kube.get(Pod, cluster, namespace=namespace)), 30)
    at = time.monotonic()  # from here `<name>-rw` has no endpoint

    def failover_started() -> list[Any]:
        found = events(kube, namespace, "FailoverStarted", since)
        if not found:  # still the primary, not ready: the same server, never restarted
            assert server_started(kube, namespace, cluster) in (started, None)
        return found

    why = wait_until("a failover", failover_started, timeout=UNREADY_LIMIT + 30, interval=1)[0].message or ""
    insert(kube, namespace, range(101, 102), retry_for=60)
    took = time.monotonic() - at
    print(f"failover: {why}; writes back {took:.1f} s after the pod turned not ready")
    # Past 15 s; or before, if a probe went unanswered meanwhile (not ready and silent: down).
    assert "not been ready" in why or "does not answer and its pod is not ready" in why, why
    assert took < UNREADY_LIMIT + 15, f"writes resumed {took:.1f} s after its pod turned not ready"
    assert wait_new_primary(kube, namespace, cluster) != cluster
    wait_ready(kube, namespace, "demo", 3, timeout=240)
    assert rows(kube, namespace) == 101


def server_started(kube: Client, namespace: str, pod: str) -> str | None:
    """When the pod's server started, asked on its pod's IP (None: it did not answer in 1 s)."""
    secret = {
        k: base64.b64decode(v).decode()
        for k, v in kube.get(Secret, "demo-superuser", namespace=namespace).data.items()
    }
    address = kube.get(Pod, pod, namespace=namespace).status.podIP
    try:
        with psycopg.connect(
            host=address,
            user=secret["username"],
            password=secret["password"],
            dbname="postgres",
            connect_timeout=1,
        ) as connection:
            return str(connection.execute("select pg_postmaster_start_time()").fetchone()[0])
    except psycopg.OperationalError:
        return None


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
    status = status_of(kube, namespace)
    final = status["currentPrimary"]
    # Its own update: a switchover to an updated standby; or, when its pod went and came back
    # before the operator saw it stopping (a short clean stop: every WAL record reached the
    # standbys), promoted again in place, as a recorded Restart.
    assert final in ("demo-1", "demo-2") or status["failover"]["kind"] == "Restart", status["failover"]
    assert_one_primary_and_healthy(kube, namespace, final)
    acknowledged = {value for value, _ in writer.acknowledged}
    with connect(kube, namespace, "demo-rw", "demo-superuser") as conn:
        present = {row[0] for row in conn.execute("select value from ticks")}
    assert acknowledged <= present, f"{len(acknowledged - present)} acknowledged commits lost"
    print(f"rollout of 3 instances: {len(acknowledged)} commits, longest write pause {pause:.1f} s")
    assert pause < 30


def password_in(kube: Client, namespace: str, secret: str) -> tuple[str, dict[str, str]]:
    """A generated Secret's password, and its other entries (decoded)."""
    data = {
        k: base64.b64decode(v).decode()
        for k, v in (kube.get(Secret, secret, namespace=namespace).data or {}).items()
    }
    return data["password"], data


def logs_in(host: str, user: str, password: str, replication: bool = False) -> bool:
    """Whether the server at `host` takes that login (a replication connection: as a standby's
    WAL receiver makes it); False when it refuses the password."""
    conninfo = psycopg.conninfo.make_conninfo(
        host=host,
        user=user,
        password=password,
        dbname="replication" if replication else "postgres",
        connect_timeout=5,
        **({"replication": "true"} if replication else {}),
    )
    connection = psycopg.pq.PGconn.connect(conninfo.encode())  # no query: a replication connection
    try:
        if connection.status == psycopg.pq.ConnStatus.OK:
            return True
        message = connection.error_message.decode()
        assert "password authentication failed" in message, message
        return False
    finally:
        connection.finish()


def test_credentials_rotated_without_downtime_while_a_client_writes(
    kube: Client, namespace: str, cluster: str
) -> None:
    """`statefleet pg rotate-credentials`: the superuser's and the replication role's passwords
    replaced while a client commits through `demo-rw` all along and a session opened before goes
    on; the standbys keep streaming on the connections they had (a WAL sender is not asked to
    log in again), every pod's passfile holds the new password, the old ones are refused
    everywhere, and a standby whose pod is deleted afterwards streams again."""
    old_superuser, _ = password_in(kube, namespace, "demo-superuser")
    old_replication, _ = password_in(kube, namespace, "demo-replication")
    senders = (
        "select string_agg(application_name || '/' || pid || '/' || backend_start, ',' order by pid) "
        "from pg_stat_replication where state = 'streaming'"
    )
    streaming_before = query(kube, namespace, "demo-rw", senders)
    execute(kube, namespace, "demo-rw", "create table ticks(value bigint primary key)")
    since = this_second()
    with connect(kube, namespace, "demo-rw", "demo-superuser") as session:  # opened before
        writer = Writer(kube, namespace)
        writer.start()
        started = time.monotonic()
        try:
            done = statefleet("pg", "rotate-credentials", "demo", "-n", namespace, "--timeout", "180")
            assert done.returncode == 0, done.stdout + done.stderr
            assert "postgres/demo: rotated" in done.stdout, done.stdout
            took = time.monotonic() - started
            time.sleep(1)  # and a moment after
            pause = writer.longest_pause(started)
            committed = len(writer.acknowledged)
        finally:
            writer.stop()
        assert session.execute("select count(*) from orders").fetchone() == (100,)
    print(f"credentials rotated in {took:.1f} s: {committed} commits, longest write pause {pause:.1f} s")
    assert pause < 2, f"no commit for {pause:.1f} s during the rotation"

    rotation = status_of(kube, namespace)["credentialsRotation"]
    assert rotation["phase"] == "Rotated"
    assert events(kube, namespace, "CredentialsRotated", since)
    new_superuser, superuser = password_in(kube, namespace, "demo-superuser")
    new_replication, replication = password_in(kube, namespace, "demo-replication")
    assert "next-password" not in superuser
    assert "next-password" not in replication
    assert new_superuser != old_superuser
    assert new_replication != old_replication
    for pod in ("demo-0", "demo-1", "demo-2"):
        ip = kube.get(Pod, pod, namespace=namespace).status.podIP
        assert logs_in(ip, "postgres", new_superuser), pod
        assert not logs_in(ip, "postgres", old_superuser), pod
        assert not logs_in(ip, "streaming_replica", old_replication, replication=True), pod
        with psycopg.connect(host=ip, user="postgres", password=new_superuser, dbname="postgres") as conn:
            passfile = conn.execute("select pg_read_file('/var/run/postgresql/statefleet.pgpass')").fetchone()
        assert f"*:*:*:streaming_replica:{new_replication}\n" in passfile[0], pod
    primary = status_of(kube, namespace)["currentPrimary"]
    primary_ip = kube.get(Pod, primary, namespace=namespace).status.podIP
    assert logs_in(primary_ip, "streaming_replica", new_replication, replication=True)
    # The same WAL senders as before: nothing was restarted.
    assert query(kube, namespace, "demo-rw", senders) == streaming_before

    # A standby made again after the rotation: its new container starts with the Secrets' new
    # passwords, clones or rewinds, and streams.
    standby = next(pod for pod in ("demo-0", "demo-1", "demo-2") if pod != primary)
    uid = kube.get(Pod, standby, namespace=namespace).metadata.uid
    kube.delete(Pod, standby, namespace=namespace)
    wait_until(
        f"{standby} made again",
        lambda: (p := get_or_none(kube, Pod, standby, namespace)) is not None and p.metadata.uid != uid,
        timeout=60,
    )
    wait_whole(kube, namespace)
    assert rows(kube, namespace) == 100


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


def archived(bucket: str, namespace: str) -> dict[str, str]:
    """The WAL files in the archive: name -> key."""
    prefix = archive_prefix("apps", namespace, "demo")
    keys = keys_under(bucket, prefix + "/")
    return {key.rsplit("/", 1)[1].removesuffix(".zst"): key for key in keys if key.endswith(".zst")}


def gaps_through(kube: Client, namespace: str, bucket: str) -> Callable[[], list[str]]:
    """Closes the primary's current WAL segment; returns a check of what a recovery through it
    would miss in the archive (history files read from the archive itself)."""
    # A write of its own (the tables the steps use may be dropped, or restored away).
    execute(kube, namespace, "demo-rw", "create table if not exists archive_marks(at timestamptz)")
    execute(kube, namespace, "demo-rw", "insert into archive_marks values (now())")
    last = query(kube, namespace, "demo-rw", "select pg_walfile_name(pg_current_wal_lsn())")
    execute(kube, namespace, "demo-rw", "select pg_switch_wal()")
    timeline = int(last[:8], 16)

    def missing() -> list[str]:
        files = archived(bucket, namespace)
        history = ""
        if timeline > 1:
            key = files.get(f"{timeline:08X}.history")
            if key is None:
                return [f"{timeline:08X}.history"]
            body = s3_api(s3_settings()).get_object(Bucket=bucket, Key=key)["Body"].read()
            history = zstandard.ZstdDecompressor().decompress(body).decode()
        return missing_segments(set(files), timeline, history, segment_number(last))

    return missing


def archiver_reports(kube: Client, namespace: str) -> dict[str, dict[str, Any]]:
    """Each server's archiver's own report (`GET /status`)."""
    reports = {}
    for pod in kube.list(Pod, namespace=namespace):
        if pod.metadata.name.startswith("demo-") and pod.status.podIP:
            url = f"http://{pod.status.podIP}:{ARCHIVER_PORT}/status"
            with urllib.request.urlopen(url, timeout=5) as answer:
                reports[pod.metadata.name] = json.load(answer)
    return reports


def archiving(kube: Client, namespace: str) -> dict[str, Any]:
    return conditions.find(status_of(kube, namespace).get("conditions"), CONDITION) or {}


def test_the_archive_has_every_wal_file_across_failovers_and_catches_up_after_revoked_keys(
    kube: Client, namespace: str, instance: str, archive_bucket: str, archive_keys: list[tuple[str, str]]
) -> None:
    """After the steps above (a deleted pod, a killed server, a frozen container, a rollout, two
    switchovers): every segment from the first to the newest, on each timeline's part of the
    history, plus every timeline's history file and the `.partial` segments of the old ones."""
    missing = gaps_through(kube, namespace, archive_bucket)
    wait_until("the archive holds every segment through the newest", lambda: missing() == [], timeout=90)
    files = archived(archive_bucket, namespace)
    timeline = max(int(name[:8], 16) for name in files if HISTORY.match(name))
    assert timeline >= 4, f"the steps above changed the timeline only to {timeline}"
    assert {f"{t:08X}.history" for t in range(2, timeline + 1)} <= set(files)
    assert any(name.endswith(".partial") for name in files)
    assert archiving(kube, namespace)["status"] == "True"
    status = status_of(kube, namespace)["walArchive"]
    assert status["lastArchivedWal"]
    assert not status["failing"]

    # The storage's keys revoked (by the S3 server, as a storage admin would): archiving fails,
    # says why, and the WAL waits on the volume.
    since = this_second()
    execute(kube, namespace, "demo-rw", "create table filler(value text)")
    revoke_keys(archive_keys[0][0])
    revoked = time.monotonic()

    switched = [0.0]

    def failing() -> dict[str, Any] | None:
        if time.monotonic() - switched[0] > 10:  # a new segment now and then, not a full volume
            execute(kube, namespace, "demo-rw", "insert into filler values (repeat('x', 1000))")
            execute(kube, namespace, "demo-rw", "select pg_switch_wal()")
            switched[0] = time.monotonic()
        condition = archiving(kube, namespace)
        return condition if condition.get("status") == "False" else None

    condition = wait_until("ContinuousArchiving False", failing, timeout=60, interval=1)
    noticed = time.monotonic() - revoked
    assert condition["reason"] == "ArchiveFailing"
    assert "refused the credentials" in condition["message"], condition["message"]
    assert events(kube, namespace, "ArchiveFailing", since), "no Event says archiving fails"
    piled = wait_until(
        "WAL waiting on the volume",
        lambda: failing() and (s := status_of(kube, namespace)["walArchive"])["pending"] >= 2 and s,
        timeout=60,
        interval=2,
    )
    assert piled["failing"]
    assert piled["pendingBytes"] >= 2 * 16 * 2**20

    # New keys in the Secret: the archiver takes them when the kubelet updates its volume, and
    # catches up by itself, with no gap.
    archive_keys.append(create_keys())
    access, secret = archive_keys[-1]
    kube.patch(
        Secret,
        "s3-creds",
        {"stringData": {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}},
        namespace=namespace,
    )
    fixed = time.monotonic()
    missing = gaps_through(kube, namespace, archive_bucket)
    wait_until("the archive caught up with no gap", lambda: missing() == [], timeout=180, interval=2)
    caught_up = time.monotonic() - fixed
    wait_until(
        "ContinuousArchiving True again", lambda: archiving(kube, namespace)["status"] == "True", timeout=60
    )
    assert events(kube, namespace, "Archiving", since), "no Event says archiving works again"
    # Every server's archiver, the standbys' too, is past the failure: none conflicts with the
    # archive or is stuck on a file.
    reports: dict[str, dict[str, Any]] = {}

    def every_archiver_clear() -> bool:
        reports.clear()
        reports.update(archiver_reports(kube, namespace))
        servers = status_of(kube, namespace)["readyInstances"]  # 2 since the scale-down above
        return len(reports) == servers and not any(r.get("failing") for r in reports.values())

    try:
        wait_until("every archiver clear", every_archiver_clear, timeout=60)
    except TimeoutError as error:
        pytest.fail(f"{error}: {json.dumps(reports, indent=1)}")
    print(
        f"archive: timelines 1-{timeline}, {len(files)} files; revoked keys noticed in {noticed:.0f} s, "
        f"caught up {caught_up:.0f} s after new keys went into the Secret (the kubelet's update of the "
        "volume included); "
        + ", ".join(f"{pod} archived {r['archived']}" for pod, r in sorted(reports.items()))
    )


def test_a_restore_to_a_point_in_time_undoes_a_drop_across_the_failovers(
    kube: Client, namespace: str, instance: str, archive_bucket: str
) -> None:
    """The archive and the base backup taken before the failovers bring a new instance back to
    the moment before a `DROP TABLE`: what was committed before it is there, the table too,
    and nothing after it. A point the archive cannot reach is refused before anything is made."""
    base = status_in(kube, Backup, namespace, "base")
    now_on = query(kube, namespace, "demo-rw", "select pg_walfile_name(pg_current_wal_lsn())")
    assert int(now_on[:8], 16) > base["physical"]["timeline"], "no failover since the base backup"
    execute(kube, namespace, "demo-rw", "create table kept as select generate_series(1, 50) as id")
    orders = query(kube, namespace, "demo-rw", "select count(*) from orders")  # 100 and what steps left
    point = query(
        kube,
        namespace,
        "demo-rw",
        """select to_char(clock_timestamp() at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')""",
    )
    time.sleep(1)  # the DROP's commit time is clearly after the point
    execute(kube, namespace, "demo-rw", "drop table orders")
    execute(kube, namespace, "demo-rw", "create table later as select 1 as id")
    switched = query(kube, namespace, "demo-rw", "select pg_walfile_name(pg_switch_wal())")
    wait_until(
        f"{switched} archived",
        lambda: (status_of(kube, namespace)["walArchive"].get("lastArchivedWal") or "")[8:] >= switched[8:],
        timeout=60,
    )
    restored_at = time.monotonic()
    target = {"kind": "Postgres", "name": "demo-pitr", "spec": {"instances": 1}}
    apply(
        kube,
        Restore,
        namespace,
        "before-drop",
        {"pointInTime": {"instance": "demo", "time": point}, "target": target},
    )
    # Meanwhile, the base backup alone: it holds no WAL (the archive does), so its new instance
    # replays the archive to the backup's end, as it was then.
    assert base["physical"]["archive"] == f"s3://{archive_bucket}/{archive_prefix('apps', namespace, 'demo')}"
    as_taken = {"kind": "Postgres", "name": "demo-base", "spec": {"instances": 1}}
    apply(kube, Restore, namespace, "as-taken", {"backup": "base", "target": as_taken})
    done = wait_phase(kube, Restore, namespace, "before-drop", "Completed", timeout=360)
    took = time.monotonic() - restored_at
    assert done["pointInTime"]["backup"] == "base"
    assert sql(kube, namespace, "demo-pitr", "select count(*) from orders") == orders
    assert sql(kube, namespace, "demo-pitr", "select count(*) from kept") == 50
    assert sql(kube, namespace, "demo-pitr", "select to_regclass('later') is null") is True
    timeline = sql(kube, namespace, "demo-pitr", "select pg_walfile_name(pg_current_wal_lsn())")
    assert int(timeline[:8], 16) > int(now_on[:8], 16), "the recovered instance is on a timeline of its own"
    wait_phase(kube, Restore, namespace, "as-taken", "Completed", timeout=240)
    assert sql(kube, namespace, "demo-base", "select count(*) from orders") == 100
    for made in ("demo-pitr", "demo-base"):  # their pods' CPU goes to the steps that follow
        kube.delete(Postgres, made, namespace=namespace)

    # Before the base backup: refused at once, naming the field and what can be reached.
    early = base["startedAt"].replace("Z", "+00:00")
    apply(
        kube,
        Restore,
        namespace,
        "too-early",
        {"pointInTime": {"instance": "demo", "time": early}, "target": {"kind": "Postgres", "name": "never"}},
    )
    refused = wait_phase(kube, Restore, namespace, "too-early", "Failed", timeout=60)
    assert refused["reason"] == "TargetUnreachable"
    assert refused["message"].startswith("spec.pointInTime.time: "), refused["message"]
    assert "is before the oldest base backup; reachable from" in refused["message"]
    with pytest.raises(ApiError):  # nothing was made
        kube.get(Postgres, "never", namespace=namespace)

    # A recovery over the instance whose check fails: it is rolled back, and the timeline the
    # recovered server had promoted itself to never reaches the archive (a later recovery to the
    # latest point could follow it); the instance's own WAL is archived again, with no gap, and
    # every timeline in the archive is one of its own history (its old primary, promoted again
    # once its data is back, may take the same number: then that one is its own).
    over = {"kind": "Postgres", "name": "demo", "replace": True}
    checked = {"query": "SELECT false", "database": "postgres"}
    point_in_time = {"instance": "demo", "time": point}
    apply(
        kube, Restore, namespace, "undone", {"pointInTime": point_in_time, "target": over, "check": checked}
    )
    undone = wait_phase(kube, Restore, namespace, "undone", "Failed", timeout=420)
    assert undone["reason"] == "CheckFailed", undone
    assert query(kube, namespace, "demo-rw", "select to_regclass('later') is not null") is True
    missing = gaps_through(kube, namespace, archive_bucket)
    wait_until("the instance's own WAL archived again", lambda: missing() == [], timeout=90, interval=2)
    files = archived(archive_bucket, namespace)
    current = int(query(kube, namespace, "demo-rw", "select pg_walfile_name(pg_current_wal_lsn())")[:8], 16)
    own = query(kube, namespace, "demo-rw", f"select pg_read_file('pg_wal/{current:08X}.history')")
    body = s3_api(s3_settings()).get_object(Bucket=archive_bucket, Key=files[f"{current:08X}.history"])[
        "Body"
    ]
    assert zstandard.ZstdDecompressor().decompress(body.read()).decode() == own
    lineage = {int(line.split()[0]) for line in own.splitlines() if line.strip()} | {current}
    assert {int(name[:8], 16) for name in files if HISTORY.match(name)} <= lineage, own
    wait_until(
        "ContinuousArchiving True again",
        lambda: archiving(kube, namespace).get("status") == "True",
        timeout=30,
    )

    # The same point over the instance itself, through the in-place machinery: its primary
    # keeps its data aside, takes the base backup and replays the archive to the point; the
    # standbys clone it. (Without spec.target.replace, the existing instance is refused.)
    in_place_at = time.monotonic()
    apply(
        kube,
        Restore,
        namespace,
        "in-place",
        {"pointInTime": point_in_time, "target": over},
    )
    recovered = wait_phase(kube, Restore, namespace, "in-place", "Completed", timeout=420)
    in_place_took = time.monotonic() - in_place_at
    assert "recovered in place to time" in recovered["message"], recovered["message"]
    assert query(kube, namespace, "demo-rw", "select count(*) from orders") == orders
    assert query(kube, namespace, "demo-rw", "select count(*) from kept") == 50
    assert query(kube, namespace, "demo-rw", "select to_regclass('later') is null") is True
    # Every instance back (three, or two after the scale-down step), its standbys streaming
    # from the recovered primary.
    count = kube.get(Postgres, "demo", namespace=namespace).to_dict()["spec"]["instances"]
    wait_ready(kube, namespace, "demo", count)
    streaming = "select count(*) from pg_stat_replication where state = 'streaming'"
    wait_until(
        "every standby streaming from the recovered primary",
        lambda: query(kube, namespace, "demo-rw", streaming) == count - 1,
        timeout=120,
        interval=1,
    )
    # Kept: the recovered timeline is archived from its first segment on.
    missing = gaps_through(kube, namespace, archive_bucket)
    wait_until("the recovered timeline archived", lambda: missing() == [], timeout=90, interval=2)
    print(
        f"point in time {point}, timeline {int(timeline[:8], 16)}; Restore Completed in {took:.0f} s, "
        f"in place in {in_place_took:.0f} s"
    )


def test_after_the_whole_namespace_is_lost_its_archive_brings_back_every_commit_older_than_10_s(
    kube: Client,
    namespace: str,
    instance: str,
    archive_bucket: str,
    archive_keys: list[tuple[str, str]],
    deleted_namespaces: DeletedNamespaces,
) -> None:
    """A writer commits all along; every pod of the instance stops dead at once (frozen, its
    sidecars too, then killed: no last WAL switch, no last upload), and the namespace goes with
    every volume and object. In a new namespace, with the storage and the base backup imported
    from the bucket, a Restore of the newest point brings back every row committed more than
    10 s before the loss, with the default settings (archiveTimeoutSeconds 5)."""
    base = status_in(kube, Backup, namespace, "base")
    execute(kube, namespace, "demo-rw", "create table ticks(value bigint primary key)")
    writer = Writer(kube, namespace)
    writer.start()
    wait_until("the writer commits", lambda: len(writer.acknowledged) > 100, timeout=30)
    time.sleep(15)  # three archive timeouts of commits
    pods = list(kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/instance": "demo"}))
    frozen = [node.pod_freezer(pod.metadata.uid) for pod in pods]
    for state in frozen:
        node.freeze(state)
    lost_at = time.monotonic()
    try:
        deleted_namespaces.delete(namespace)
        for pod in pods:  # killed while frozen: they die as they thaw, doing nothing more
            kube.delete(Pod, pod.metadata.name, namespace=namespace, grace_period=0)
        time.sleep(5)
    finally:
        for state in frozen:
            node.thaw(state)
    writer.stop()
    older = [value for value, at in writer.acknowledged if at < lost_at - 10]
    newest = [value for value, at in writer.acknowledged if at < lost_at]
    assert len(older) > 100

    reborn = new_namespace(kube, namespace_prefix(), "postgres-reborn")
    try:
        access, secret = archive_keys[-1]
        storage(kube, reborn, "s3", archive_bucket, access_key=access, secret_key=secret)
        location = base["manifest"].rsplit("/", 1)[0]
        service = {"kind": "Postgres", "name": "demo"}
        apply(kube, Backup, reborn, "base", {"service": service, "storage": "s3", "importFrom": location})
        wait_phase(kube, Backup, reborn, "base", "Completed", timeout=60)
        started = time.monotonic()
        source = {"instance": "demo", "namespace": namespace, "storage": "s3"}
        target = {"kind": "Postgres", "name": "demo", "spec": {"instances": 1}}
        apply(kube, Restore, reborn, "latest", {"pointInTime": source, "target": target})
        done = wait_phase(kube, Restore, reborn, "latest", "Completed", timeout=360)
        took = time.monotonic() - started
        assert done["pointInTime"]["target"] == "the newest point archived"
        back = sql(kube, reborn, "demo", "select coalesce(max(value), 0) from ticks")
        present = sql(kube, reborn, "demo", f"select count(*) from ticks where value <= {max(older)}")
        assert present == len(older), (
            f"{len(older) - present} rows committed over 10 s before the loss are gone"
        )
        lost_seconds = lost_at - dict(writer.acknowledged).get(back, lost_at)
        print(
            f"total loss: {len(newest)} rows acknowledged, {len(older)} over 10 s before the loss; restored "
            f"through row {back} (the last {lost_seconds:.1f} s lost); Restore done in {took:.0f} s"
        )
    finally:
        deleted_namespaces.delete(reborn)
