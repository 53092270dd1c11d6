"""Backups and restores on the test bed, against a real PostgreSQL and the test bed's real S3
server: the issue's examples as written, identical data after a restore (checksummed table
contents), physical backups with their WAL positions, and the faults a user meets (wrong
credentials, a missing bucket or storage, a tampered object, deletion with its objects).
Client-side encryption (`spec.s3.encryption`) runs in two of them: the plan's (physical
backups, the WAL archive, restore tests replaying it, the import after a disaster) and the
tampered backup's (no plaintext stored, forged and swapped manifests refused)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from lightkube import Client
from lightkube.models.core_v1 import ResourceQuotaSpec, ResourceQuotaStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Pod, ResourceQuota, Secret, Service
from lightkube.types import CascadeType, PatchType

from backup.plan import BackupPlanKind
from backup.resources import BackupStorageKind
from backup.restore import RestoreKind
from backup.sealing import MAGIC, key_id
from backup.take import BackupKind
from e2e.kube import (
    REPO,
    apply,
    get_or_none,
    pod_is_ready,
    ready_condition,
    statefleet,
    wait_gone,
    wait_reason,
    wait_until,
)
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace
from e2e.node import kill_command
from e2e.operator_process import OperatorProcess
from e2e.s3 import s3_api, s3_settings
from e2e.test_postgres import Postgres, create, wait_ready
from services.postgres import backup_replace
from services.postgres.wal_archive import SEGMENT, SEGMENT_SIZE, archive_prefix, lsn_value, segment_number

pytestmark = pytest.mark.e2e

BackupStorage = BackupStorageKind.resource()
Backup = BackupKind.resource()
Restore = RestoreKind.resource()
BackupPlan = BackupPlanKind.resource()
# Sealing keys (`spec.s3.encryption`): made for this run, the same in every namespace it uses.
KEYS = {"k1": base64.b64encode(os.urandom(32)).decode()}


def storage(
    kube: Client,
    namespace: str,
    name: str,
    bucket: str,
    secret_key: str | None = None,
    endpoint: str | None = None,
    access_key: str | None = None,
    sealed_with: str | None = None,
) -> None:
    """The issue's BackupStorage, with the test bed's endpoint and keys in a Secret; with
    `sealed_with`, encrypting with that entry of KEYS (in the Secret `<name>-keys`)."""
    settings = s3_settings()
    secret_name = f"{name}-creds"
    kube.create(
        Secret(
            metadata=ObjectMeta(name=secret_name),
            stringData={
                "AWS_ACCESS_KEY_ID": access_key or settings["AWS_ACCESS_KEY_ID"],
                "AWS_SECRET_ACCESS_KEY": secret_key or settings["AWS_SECRET_ACCESS_KEY"],
            },
        ),
        namespace=namespace,
    )
    s3 = {
        "endpoint": endpoint or settings["S3_ENDPOINT"],
        "bucket": bucket,
        "prefix": "apps",
        "credentialsSecret": secret_name,
    }
    if sealed_with:
        kube.create(Secret(metadata=ObjectMeta(name=f"{name}-keys"), stringData=KEYS), namespace=namespace)
        s3["encryption"] = {"keysSecret": f"{name}-keys", "key": sealed_with}
    apply(kube, BackupStorage, namespace, name, {"s3": s3})


def status(kube: Client, resource: Any, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(resource, name, namespace=namespace).to_dict().get("status") or {}


def wait_phase(
    kube: Client, resource: Any, namespace: str, name: str, phase: str, timeout: float = 240
) -> dict:
    def reached() -> dict[str, Any] | None:
        found = status(kube, resource, namespace, name)
        if found.get("phase") in ("Completed", "Failed") and found.get("phase") != phase:
            raise AssertionError(f"{name} ended {found.get('phase')}: {found.get('message')}")
        return found if found.get("phase") == phase else None

    return wait_until(f"{name} {phase}", reached, timeout, interval=1)


def connect_db(kube: Client, namespace: str, instance: str, database: str) -> psycopg.Connection:
    data = kube.get(Secret, f"{instance}-superuser", namespace=namespace).data
    host = kube.get(Service, f"{instance}-rw", namespace=namespace).spec.clusterIP
    return psycopg.connect(
        host=host,
        user=base64.b64decode(data["username"]).decode(),
        password=base64.b64decode(data["password"]).decode(),
        dbname=database,
        connect_timeout=5,
        autocommit=True,
    )


def sql(kube: Client, namespace: str, instance: str, statement: str, database: str = "postgres") -> Any:
    """The first value of `statement`, run as the instance's superuser through `<instance>-rw`;
    retried while the Service's endpoints settle (kube-proxy follows a new pod within seconds;
    before it programs a new Service, the host's default route answers in its place)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = connect_db(kube, namespace, instance, database)
            break
        except psycopg.OperationalError as error:
            settling = ("Connection refused", "invalid response to SSL negotiation", "timeout expired")
            if not any(text in str(error) for text in settling) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    with conn:
        cursor = conn.execute(statement)
        row = cursor.fetchone() if cursor.description else None
        return row[0] if row else None


def demo_with_storage(
    kube: Client, namespace: str, bucket: str, version: str, sealed_with: str | None = None, **spec: Any
) -> None:
    """The BackupStorage `s3` on `bucket`, and a ready one-instance Postgres `demo`."""
    storage(kube, namespace, "s3", bucket, sealed_with=sealed_with)
    create(kube, namespace, "demo", {"version": version, "storage": {"size": "2Gi"}, **spec})
    wait_ready(kube, namespace, "demo", 1)


SEED = [
    "CREATE ROLE shop_owner LOGIN PASSWORD 'x'",
    "CREATE DATABASE shop OWNER shop_owner",
]
SHOP = [
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, total numeric(12,2),"
    " placed timestamptz)",
    "INSERT INTO orders SELECT g, 'customer-' || (g % 977), (g * 7 % 10000) / 100.0,"
    " timestamptz '2026-01-01' + g * interval '1 minute' FROM generate_series(1, 50000) g",
    "CREATE INDEX orders_customer ON orders (customer)",
    "ALTER TABLE orders OWNER TO shop_owner",
]
CHECKSUM = "SELECT md5(string_agg(o::text, ',' ORDER BY id)) FROM orders o"


def seed(kube: Client, namespace: str, instance: str) -> tuple[str, str]:
    for statement in SEED:
        sql(kube, namespace, instance, statement)
    for statement in SHOP:
        sql(kube, namespace, instance, statement, database="shop")
    sql(
        kube,
        namespace,
        instance,
        "CREATE TABLE notes AS SELECT g AS id, md5(g::text) AS body FROM generate_series(1, 999) g",
    )
    return (
        sql(kube, namespace, instance, CHECKSUM, database="shop"),
        sql(kube, namespace, instance, "SELECT md5(string_agg(body, ',' ORDER BY id)) FROM notes"),
    )


def sealed_objects(api: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under `prefix/` but manifests and an archive's SYSTEM, checked sealed (by
    the key KEYS["k1"], not readable as anything else). Returns them."""
    found = {}
    for page in api.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for item in page.get("Contents") or []:
            if not item["Key"].endswith(("/manifest.json", "/SYSTEM")):
                found[item["Key"]] = api.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    assert found, f"nothing under {prefix}"
    sealer = (MAGIC + key_id(base64.b64decode(KEYS["k1"])).encode()).decode()
    assert {k: v[:20].decode(errors="replace") for k, v in found.items()} == dict.fromkeys(found, sealer)
    return found


def stored_key(manifest: dict[str, Any], name: str) -> str:
    """The key of the first piece the manifest's object `name` was stored as."""
    return next(o for o in manifest["objects"] if o["name"] == name)["pieces"][0]["key"]


def test_logical_backup_restores_into_a_new_instance_with_identical_data(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    storage(kube, namespace, "s3", bucket)
    assert "answers" in wait_reason(kube, BackupStorage, namespace, "s3", "Available")
    create(kube, namespace, "demo", {"version": "17", "storage": {"size": "1Gi"}})
    wait_ready(kube, namespace, "demo", 1)
    orders, notes = seed(kube, namespace, "demo")

    apply(
        kube,
        Backup,
        namespace,
        "demo-now",
        {"service": {"kind": "Postgres", "name": "demo"}, "storage": "s3", "method": "logical"},
    )
    done = wait_phase(kube, Backup, namespace, "demo-now", "Completed")
    assert done["bytes"] > 100_000
    assert done["location"].startswith(f"s3://{bucket}/apps/{namespace}/postgres/demo/demo-now-")
    assert done["version"].startswith("17")
    assert ready_condition(kube, Backup, namespace, "demo-now")["reason"] == "Completed"

    # The manifest, written last, names every object with its size and sha256, and the pieces
    # it is stored as with theirs.
    api = s3_api(s3_settings())
    manifest = json.loads(api.get_object(Bucket=bucket, Key=done["manifest"])["Body"].read())
    assert manifest["method"] == "logical"
    assert {d["name"] for d in manifest["details"]["databases"]} >= {"postgres", "shop"}
    for entry in manifest["objects"]:
        pieces = [api.get_object(Bucket=bucket, Key=p["key"])["Body"].read() for p in entry["pieces"]]
        assert [(len(b), hashlib.sha256(b).hexdigest()) for b in pieces] == [
            (p["size"], p["sha256"]) for p in entry["pieces"]
        ]
        body = b"".join(pieces)
        assert (len(body), hashlib.sha256(body).hexdigest()) == (entry["size"], entry["sha256"])
    assert sum(o["size"] for o in manifest["objects"]) == done["bytes"]

    apply(
        kube,
        Restore,
        namespace,
        "demo-copy",
        {"backup": "demo-now", "target": {"kind": "Postgres", "name": "demo-copy"}},
    )
    wait_phase(kube, Restore, namespace, "demo-copy", "Completed", timeout=360)
    assert sql(kube, namespace, "demo-copy", CHECKSUM, database="shop") == orders
    assert (
        sql(kube, namespace, "demo-copy", "SELECT md5(string_agg(body, ',' ORDER BY id)) FROM notes") == notes
    )
    owner = "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'shop'"
    assert sql(kube, namespace, "demo-copy", owner) == "shop_owner"
    # The copy keeps its own superuser: its Secret still opens it.
    assert sql(kube, namespace, "demo-copy", "SELECT current_user") == "postgres"
    index = "SELECT count(*) FROM pg_indexes WHERE indexname = 'orders_customer'"
    assert sql(kube, namespace, "demo-copy", index, database="shop") == 1

    # A second Restore onto the instance that now exists is refused: nothing is overwritten.
    apply(
        kube,
        Restore,
        namespace,
        "again",
        {"backup": "demo-now", "target": {"kind": "Postgres", "name": "demo"}},
    )
    refused = wait_phase(kube, Restore, namespace, "again", "Failed")
    assert refused["reason"] == "TargetExists"
    assert "spec.target.name" in refused["message"]


def test_physical_backup_records_its_wal_positions(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    demo_with_storage(kube, namespace, bucket, "15")
    sql(kube, namespace, "demo", "CREATE TABLE t AS SELECT generate_series(1, 10000) AS id")

    # Before its storage exists, a backup waits and says why; then it goes on by itself.
    kube.delete(BackupStorage, "s3", namespace=namespace)
    apply(
        kube,
        Backup,
        namespace,
        "nightly-1",
        {"service": {"kind": "Postgres", "name": "demo"}, "storage": "s3", "deletionPolicy": "Delete"},
    )
    assert "BackupStorage s3 does not exist" in wait_reason(
        kube, Backup, namespace, "nightly-1", "StorageNotFound"
    )
    s3 = {"endpoint": s3_settings()["S3_ENDPOINT"], "bucket": bucket, "credentialsSecret": "s3-creds"}
    storage_spec = {"s3": {**s3, "pieceSizeMiB": 1}}  # the objects stored as several pieces
    apply(kube, BackupStorage, namespace, "s3", storage_spec)
    done = wait_phase(kube, Backup, namespace, "nightly-1", "Completed")
    assert done["method"] == "physical"  # the default
    assert done["physical"]["timeline"] >= 1
    assert "/" in done["physical"]["startLsn"]
    assert "/" in done["physical"]["endLsn"]

    api = s3_api(s3_settings())
    manifest = json.loads(api.get_object(Bucket=bucket, Key=done["manifest"])["Body"].read())
    assert manifest["physical"]["startLsn"] == done["physical"]["startLsn"]
    (base,) = manifest["objects"]
    assert base["name"] == "base.tar.zst"
    pieces = [api.get_object(Bucket=bucket, Key=p["key"])["Body"].read() for p in base["pieces"]]
    assert len(pieces) > 1
    assert [hashlib.sha256(p).hexdigest() for p in pieces] == [p["sha256"] for p in base["pieces"]]
    # The S3 server checked each piece against the manifest's sha256, sent along with it.
    stored = [api.head_object(Bucket=bucket, Key=p["key"], ChecksumMode="ENABLED") for p in base["pieces"]]
    assert [base64.b64decode(h["ChecksumSHA256"]).hex() for h in stored] == [
        p["sha256"] for p in base["pieces"]
    ]
    data = b"".join(pieces)
    assert hashlib.sha256(data).hexdigest() == base["sha256"]
    tar_bytes = subprocess.run(["zstd", "-dc"], input=data, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        names = set(tar.getnames())
    assert {"PG_VERSION", "backup_label", "global/pg_control"} <= names
    assert any(n.startswith("pg_wal/0000000") for n in names)  # the WAL it needs to start

    # deletionPolicy Delete: deleting the Backup deletes its objects, the manifest first.
    kube.delete(Backup, "nightly-1", namespace=namespace)
    prefix = done["manifest"].rsplit("/", 1)[0] + "/"
    wait_until(
        "the backup's objects deleted",
        lambda: api.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0) == 0,
        timeout=60,
    )

    # A physical backup starts a new instance: its first pod's data is the backup's, the
    # same cluster (system identifier), with the new instance's own passwords.
    sql(kube, namespace, "demo", "INSERT INTO t SELECT generate_series(10001, 12345)")
    before = sql(kube, namespace, "demo", "SELECT md5(string_agg(id::text, ',' ORDER BY id)) FROM t")
    identifier = sql(kube, namespace, "demo", "SELECT system_identifier::text FROM pg_control_system()")
    service = {"kind": "Postgres", "name": "demo"}
    apply(kube, Backup, namespace, "nightly-2", {"service": service, "storage": "s3"})
    wait_phase(kube, Backup, namespace, "nightly-2", "Completed")
    sql(kube, namespace, "demo", "INSERT INTO t VALUES (99999999)")  # after the backup: not in the copy
    target = {"kind": "Postgres", "name": "copy", "spec": {"instances": 2}}
    apply(kube, Restore, namespace, "copy", {"backup": "nightly-2", "target": target})
    restored = wait_phase(kube, Restore, namespace, "copy", "Completed", timeout=360)
    assert restored["details"]["check"]["systemIdentifier"] == identifier
    assert sql(kube, namespace, "copy", "SELECT md5(string_agg(id::text, ',' ORDER BY id)) FROM t") == before
    copy = wait_ready(kube, namespace, "copy", 2)  # its standby cloned the restored primary
    assert copy["version"] == "15"
    spec = kube.get(Postgres, "copy", namespace=namespace).to_dict()["spec"]
    assert spec["bootstrap"] == {"fromBackup": {"name": "nightly-2"}}
    # A physical backup of 15 cannot start a 17.
    target17 = {"kind": "Postgres", "name": "copy17", "spec": {"version": "17"}}
    apply(kube, Restore, namespace, "copy17", {"backup": "nightly-2", "target": target17})
    refused = wait_phase(kube, Restore, namespace, "copy17", "Failed")
    assert refused["reason"] == "TargetRefused"
    assert "spec.target.spec: version 17" in refused["message"]
    # Nor replace a running 17's data: refused before anything is read or stopped.
    create(kube, namespace, "running17", {"version": "17", "storage": {"size": "1Gi"}})
    wait_ready(kube, namespace, "running17", 1)
    pod = kube.get(Pod, "running17-0", namespace=namespace).metadata.uid
    over17 = {"kind": "Postgres", "name": "running17", "replace": True}
    apply(kube, Restore, namespace, "over17", {"backup": "nightly-2", "target": over17})
    refused = wait_phase(kube, Restore, namespace, "over17", "Failed")
    assert refused["reason"] == "TargetRefused"
    assert "spec.target.name: Postgres running17 is at version 17" in refused["message"]
    assert kube.get(Pod, "running17-0", namespace=namespace).metadata.uid == pod
    assert get_or_none(kube, Job, "over17-verify", namespace) is None

    # A new instance reads the backup once, extracting aside: a damaged piece, which breaks
    # the stream before its checksum is known, is still named, and nothing starts.
    manifest = json.loads(
        api.get_object(Bucket=bucket, Key=status(kube, Backup, namespace, "nightly-2")["manifest"])[
            "Body"
        ].read()
    )
    key = stored_key(manifest, "base.tar.zst")
    api.put_object(Bucket=bucket, Key=key, Body=b"not what was stored" * 1000)
    apply(
        kube,
        Restore,
        namespace,
        "damaged",
        {"backup": "nightly-2", "target": {"kind": "Postgres", "name": "damaged"}},
    )
    failed = wait_phase(kube, Restore, namespace, "damaged", "Failed", timeout=240)
    assert failed["reason"] == "ChecksumMismatch"
    assert key in failed["message"]
    # Its server never started: the pod waits behind the init container that refused.
    containers = kube.get(Pod, "damaged-0", namespace=namespace).to_dict()["status"]["containerStatuses"]
    assert all("waiting" in c["state"] and not c.get("lastState", {}).get("terminated") for c in containers)


def test_storage_faults_fail_with_a_clear_reason_and_leave_nothing(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    create(kube, namespace, "demo", {"version": "15", "storage": {"size": "1Gi"}})
    storage(kube, namespace, "wrongkeys", bucket, secret_key="not-the-key")
    storage(kube, namespace, "nobucket", f"{bucket}-missing")
    # The S3 server's address with nothing listening there (the test bed's own bridge).
    host = s3_settings()["S3_ENDPOINT"].rsplit(":", 1)[0]
    storage(kube, namespace, "down", bucket, endpoint=f"{host}:9")
    assert "does not answer" in wait_reason(
        kube, BackupStorage, namespace, "down", "Unreachable", timeout=120
    )
    assert "refused the credentials" in wait_reason(
        kube, BackupStorage, namespace, "wrongkeys", "AccessDenied"
    )
    assert "does not exist" in wait_reason(kube, BackupStorage, namespace, "nobucket", "BucketNotFound")
    wait_ready(kube, namespace, "demo", 1)

    service = {"kind": "Postgres", "name": "demo"}
    apply(kube, Backup, namespace, "keys", {"service": service, "storage": "wrongkeys", "method": "logical"})
    apply(kube, Backup, namespace, "bucket", {"service": service, "storage": "nobucket", "method": "logical"})
    apply(
        kube, Backup, namespace, "method", {"service": service, "storage": "nobucket", "method": "snapshot"}
    )
    assert wait_phase(kube, Backup, namespace, "keys", "Failed")["reason"] == "AccessDenied"
    assert wait_phase(kube, Backup, namespace, "bucket", "Failed")["reason"] == "BucketNotFound"
    apply(
        kube, Backup, namespace, "unreachable", {"service": service, "storage": "down", "method": "logical"}
    )
    unreachable = wait_phase(kube, Backup, namespace, "unreachable", "Failed", timeout=240)
    assert unreachable["reason"] == "Unreachable", unreachable
    unsupported = wait_phase(kube, Backup, namespace, "method", "Failed")
    assert unsupported["reason"] == "UnsupportedMethod"
    assert "spec.method" in unsupported["message"]
    assert s3_api(s3_settings()).list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0

    # A Job whose pod the API refuses (a quota here, PodSecurity or another admission plugin
    # alike) fails its Backup within a minute in the API's own words, and is suspended: a pod
    # admitted later (the quota raised) never runs a backup that has failed.
    storage(kube, namespace, "s3", bucket)
    one_pod = ResourceQuota(metadata=ObjectMeta(name="one-pod"), spec=ResourceQuotaSpec(hard={"pods": "1"}))
    kube.create(one_pod, namespace=namespace)
    wait_until(  # admission refuses everything while a quota's use is not counted yet
        "the quota counted",
        lambda: (
            (kube.get(ResourceQuota, "one-pod", namespace=namespace).status or ResourceQuotaStatus()).used
        ),
        timeout=30,
    )
    apply(kube, Backup, namespace, "refused", {"service": service, "storage": "s3", "method": "logical"})
    refused = wait_phase(kube, Backup, namespace, "refused", "Failed", timeout=60)
    assert refused["reason"] == "PodRefused", refused
    assert refused["message"].startswith("its pod could not be created: "), refused["message"]
    assert "exceeded quota: one-pod" in refused["message"], refused["message"]
    assert kube.get(Job, "refused-backup", namespace=namespace).spec.suspend is True
    kube.delete(ResourceQuota, "one-pod", namespace=namespace)

    # A plan whose backups fail retries them with backoff, between its scheduled runs.
    plan = {"service": service, "storage": "wrongkeys", "schedule": "*/2 * * * *", "method": "logical"}
    apply(kube, BackupPlan, namespace, "failing", plan)
    backing_off = wait_reason(kube, BackupPlan, namespace, "failing", "BackingOff", timeout=200)
    assert "1 failed in a row" in backing_off
    plan_status = status(kube, BackupPlan, namespace, "failing")
    assert plan_status["consecutiveFailures"] == 1
    assert plan_status["nextRetryTime"] < plan_status["nextScheduleTime"]
    wait_until(
        "a second, retried backup",
        lambda: status(kube, BackupPlan, namespace, "failing").get("consecutiveFailures") == 2,
        timeout=150,
        interval=2,
    )
    reasons = [
        (b.get("status") or {}).get("reason") for b in plan_backups(kube, namespace, "failing").values()
    ]
    assert reasons.count("AccessDenied") >= 2, reasons


def fill(kube: Client, namespace: str, instance: str, rows: int) -> None:
    """A table `filler` of incompressible rows (about 100 bytes each), so its dump and upload
    take their time."""
    noise = "gen_random_uuid()::text || gen_random_uuid()::text || gen_random_uuid()::text"
    statement = f"CREATE TABLE filler AS SELECT g, {noise} AS noise FROM generate_series(1, {rows}) g"
    sql(kube, namespace, instance, statement)


def test_a_backup_whose_pod_is_killed_or_whose_instance_goes_down_fails_and_leaves_nothing(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    demo_with_storage(kube, namespace, bucket, "17")
    fill(kube, namespace, "demo", 2500000)  # enough for the dump to take a while
    service = {"kind": "Postgres", "name": "demo"}
    api = s3_api(s3_settings())

    def uploading(backup: str) -> Callable[[], str | None]:
        def pod() -> str | None:
            """The Job's pod once it printed progress (every 2 s while it uploads)."""
            for found in kube.list(Pod, namespace=namespace, labels={"job-name": f"{backup}-backup"}):
                if found.status.phase == "Running":
                    lines = list(kube.log(found.metadata.name, namespace=namespace, tail_lines=2))
                    if any('"progress"' in line for line in lines):
                        return found.metadata.name
            return None

        return pod

    def nothing_left() -> None:
        """A partial upload never counts: no piece, no manifest."""
        assert api.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0

    apply(kube, Backup, namespace, "killed", {"service": service, "storage": "s3", "method": "logical"})
    pod = wait_until("the backup uploading", uploading("killed"), timeout=120, interval=0.3)
    kill_command(kube.get(Pod, pod, namespace=namespace).metadata.uid, ["python3", "-m", "backup"])
    failed = wait_phase(kube, Backup, namespace, "killed", "Failed")
    assert failed["reason"] == "JobFailed"
    assert "killed or deleted" in failed["message"] or "ended" in failed["message"]
    nothing_left()
    events = [
        e.reason for e in kube.list(Event, namespace=namespace, fields={"involvedObject.name": "killed"})
    ]
    assert "JobFailed" in events

    # Deleted while it uploads: its Job is stopped first, then everything it wrote goes.
    apply(kube, Backup, namespace, "withdrawn", {"service": service, "storage": "s3", "method": "logical"})
    wait_until("the backup uploading", uploading("withdrawn"), timeout=120, interval=0.3)
    kube.delete(Backup, "withdrawn", namespace=namespace)
    wait_gone(kube, Backup, "withdrawn", namespace, timeout=180)
    nothing_left()

    # The instance goes down while it is read: the dump fails and says so; the instance comes
    # back with its data. (pg_dump waits for a lock the test holds on the table, so it is still
    # reading when the instance goes, however fast the machine reads.)
    holder = connect_db(kube, namespace, "demo", "postgres")
    holder.execute("BEGIN")
    holder.execute("LOCK TABLE filler IN ACCESS EXCLUSIVE MODE")
    apply(kube, Backup, namespace, "down", {"service": service, "storage": "s3", "method": "logical"})
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_dump' "
        "AND wait_event_type = 'Lock'"
    )
    wait_until("pg_dump waiting for the table", lambda: sql(kube, namespace, "demo", waiting), 120, 0.5)
    kube.delete(Pod, "demo-0", namespace=namespace, grace_period=0)
    with contextlib.suppress(psycopg.Error):
        holder.close()
    failed = wait_phase(kube, Backup, namespace, "down", "Failed", timeout=240)
    assert failed["reason"] == "CommandFailed", failed
    assert "pg_dump" in failed["message"]
    nothing_left()
    wait_ready(kube, namespace, "demo", 1)
    assert sql(kube, namespace, "demo", "SELECT count(*) FROM filler") == 2500000


def test_a_tampered_backup_is_refused_before_anything_is_restored(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    demo_with_storage(kube, namespace, bucket, "15")
    orders, _ = seed(kube, namespace, "demo")
    apply(
        kube,
        Backup,
        namespace,
        "b",
        {"service": {"kind": "Postgres", "name": "demo"}, "storage": "s3", "method": "logical"},
    )
    done = wait_phase(kube, Backup, namespace, "b", "Completed")
    api = s3_api(s3_settings())
    manifest = json.loads(api.get_object(Bucket=bucket, Key=done["manifest"])["Body"].read())
    shop = next(d["object"] for d in manifest["details"]["databases"] if d["name"] == "shop")
    key = stored_key(manifest, shop)
    data = bytearray(api.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    api.put_object(Bucket=bucket, Key=key, Body=bytes(data))

    apply(kube, Restore, namespace, "copy", {"backup": "b", "target": {"kind": "Postgres", "name": "copy"}})
    failed = wait_phase(kube, Restore, namespace, "copy", "Failed", timeout=360)
    assert failed["reason"] == "ChecksumMismatch"
    assert key in failed["message"]
    # Nothing was applied: the new instance has neither the roles nor the databases.
    assert sql(kube, namespace, "copy", "SELECT count(*) FROM pg_database WHERE datname = 'shop'") == 0
    assert sql(kube, namespace, "copy", "SELECT count(*) FROM pg_roles WHERE rolname = 'shop_owner'") == 0

    # The same instance backed up to a storage that encrypts: nothing of it in clear in S3.
    # (The backup in clear above shows what would be seen: a dump's PGDMP header, the roles.)
    clear = b"".join(
        api.get_object(Bucket=bucket, Key=p["key"])["Body"].read()
        for o in manifest["objects"]
        for p in o["pieces"]
    )
    assert b"PGDMP" in clear
    assert b"shop_owner" in clear
    storage(kube, namespace, "sealed", bucket, sealed_with="k1")
    wait_reason(kube, BackupStorage, namespace, "sealed", "Available")
    service = {"kind": "Postgres", "name": "demo"}
    apply(kube, Backup, namespace, "s", {"service": service, "storage": "sealed", "method": "logical"})
    sealed = wait_phase(kube, Backup, namespace, "s", "Completed")
    location = sealed["manifest"].rsplit("/", 1)[0]
    stored = b"".join(sealed_objects(api, bucket, location).values())
    assert b"PGDMP" not in stored
    assert b"shop_owner" not in stored
    signed = api.get_object(Bucket=bucket, Key=sealed["manifest"])["Body"].read()

    def restore_over_copy(name: str) -> dict[str, Any]:
        target = {"kind": "Postgres", "name": "copy", "replace": True}
        apply(kube, Restore, namespace, name, {"backup": "s", "target": target})
        return wait_phase(kube, Restore, namespace, name, "Failed", timeout=240)

    # A piece replaced and its manifest entry rewritten to match (what someone without the
    # keys can do): the manifest fails its authentication, and nothing is restored.
    forged = json.loads(signed)
    piece = forged["objects"][0]["pieces"][0]
    body, original = b"-- nothing here\n", api.get_object(Bucket=bucket, Key=piece["key"])["Body"].read()
    api.put_object(Bucket=bucket, Key=piece["key"], Body=body)
    piece.update(size=len(body), sha256=hashlib.sha256(body).hexdigest())
    api.put_object(Bucket=bucket, Key=sealed["manifest"], Body=json.dumps(forged).encode())
    failed = restore_over_copy("forged")
    assert failed["reason"] == "ManifestForged", failed["message"]
    assert f"{sealed['manifest']} fails authentication" in failed["message"]
    assert sql(kube, namespace, "copy", "SELECT count(*) FROM pg_database WHERE datname = 'shop'") == 0
    # Another backup's manifest swapped in (the one in clear): refused, nothing restored.
    api.put_object(Bucket=bucket, Key=sealed["manifest"], Body=json.dumps(manifest).encode())
    failed = restore_over_copy("swapped")
    assert failed["reason"] == "ManifestUnsigned", failed["message"]
    assert sealed["manifest"] in failed["message"]
    assert sql(kube, namespace, "copy", "SELECT count(*) FROM pg_database WHERE datname = 'shop'") == 0

    # Put back as they were, the sealed backup restores: opened in the restore's Job.
    api.put_object(Bucket=bucket, Key=piece["key"], Body=original)
    api.put_object(Bucket=bucket, Key=sealed["manifest"], Body=signed)
    target = {"kind": "Postgres", "name": "copy", "replace": True}
    apply(kube, Restore, namespace, "opened", {"backup": "s", "target": target})
    wait_phase(kube, Restore, namespace, "opened", "Completed", timeout=240)
    assert sql(kube, namespace, "copy", CHECKSUM, database="shop") == orders


def plan_backups(kube: Client, namespace: str, plan: str) -> dict[str, dict[str, Any]]:
    found = kube.list(Backup, namespace=namespace, labels={"statefleet.dev/backup-plan": plan})
    return {b.metadata.name: b.to_dict() for b in found}


def wal_files(bucket: str, prefix: str) -> list[str]:
    """The WAL files archived under `prefix` (names without their .zst)."""
    pages = s3_api(s3_settings()).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    keys = [item["Key"] for page in pages for item in page.get("Contents") or []]
    return [key.rsplit("/", 1)[-1].removesuffix(".zst") for key in keys if key.endswith(".zst")]


def verified(backup: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (c for c in (backup.get("status") or {}).get("conditions") or [] if c["type"] == "Verified"), None
    )


def test_a_plan_backs_up_on_schedule_verifies_and_prunes(
    kube: Client,
    namespace: str,
    operator: OperatorProcess,
    bucket: str,
    deleted_namespaces: DeletedNamespaces,
) -> None:
    # The instance archives its WAL to the plan's storage: retention covers the archive, and
    # each restore test replays it from the backup to its newest point. The storage encrypts:
    # every piece and WAL file is sealed in its pod, and opened by the pods that restore.
    demo_with_storage(kube, namespace, bucket, "15", sealed_with="k1", walArchive={"storage": "s3"})
    sealing = wait_reason(kube, BackupStorage, namespace, "s3", "Available")
    assert f"sealing with key k1 ({key_id(base64.b64decode(KEYS['k1']))})" in sealing
    seed(kube, namespace, "demo")
    plan = {
        "service": {"kind": "Postgres", "name": "demo"},
        "storage": "s3",
        "schedule": "* * * * *",
        "method": "physical",
        "retention": {"keepLast": 1},
        "verify": {"enabled": True, "query": "SELECT count(*) = 50000 FROM orders", "database": "shop"},
    }
    apply(kube, BackupPlan, namespace, "demo-nightly", plan)

    # The first backup comes at the next minute, and its restore test passes.
    def first_verified() -> tuple[str, dict[str, Any]] | None:
        for name, backup in plan_backups(kube, namespace, "demo-nightly").items():
            condition = verified(backup)
            if condition:
                assert condition["status"] == "True", condition["message"]
                return name, backup
        return None

    first, backup = wait_until("a verified backup", first_verified, timeout=300, interval=2)
    assert "rows read" in verified(backup)["message"]
    tests = kube.list(Restore, namespace=namespace, labels={"statefleet.dev/verification": "true"})
    assert all(r.to_dict()["spec"].get("pointInTime") for r in tests)  # the archive replayed too
    wal = archive_prefix("apps", namespace, "demo") + "/"
    before = [name for name in wal_files(bucket, wal) if SEGMENT.match(name)]

    # The plan notes it on its next pass, after the backup's own condition.
    def noted() -> dict | None:
        last = status(kube, BackupPlan, namespace, "demo-nightly").get("lastVerification") or {}
        return last if last.get("backup") == first else None

    last = wait_until("the plan's lastVerification", noted, timeout=60)
    assert (last["backup"], last["result"]) == (first, "Passed")
    # Nothing left its pod in clear: the base backup's pieces and every WAL file are sealed
    # (zstd's own frames would start with 28 b5 2f fd), and the manifest is signed.
    api = s3_api(s3_settings())
    sealed_objects(api, bucket, backup["status"]["manifest"].rsplit("/", 1)[0])
    sealed_objects(api, bucket, wal.rstrip("/"))
    signed = json.loads(api.get_object(Bucket=bucket, Key=backup["status"]["manifest"])["Body"].read())
    assert signed["sealing"] == {"keyId": key_id(base64.b64decode(KEYS["k1"])), "cipher": "AES-256-GCM"}
    assert signed["authentication"].startswith("hmac-sha256:")
    # The throwaway instance is gone.
    wait_until(
        "the throwaway instance deleted",
        lambda: not [p for p in kube.list(Postgres, namespace=namespace) if "-verify-" in p.metadata.name],
        timeout=120,
    )

    # Retention (keepLast 1, and the newest verified backup): once a newer one is verified,
    # the first goes, objects and all.
    prefix = backup["status"]["manifest"].rsplit("/", 1)[0] + "/"
    wait_until(
        "the first backup pruned", lambda: first not in plan_backups(kube, namespace, "demo-nightly"), 300, 2
    )
    wait_until(
        "its objects deleted",
        lambda: api.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0) == 0,
        60,
    )
    plan_status = status(kube, BackupPlan, namespace, "demo-nightly")
    assert plan_status["lastSuccessfulBackup"] in plan_backups(kube, namespace, "demo-nightly")
    assert plan_status["consecutiveFailures"] == 0
    # ...and with it the WAL only it needed: none older than the survivor's start is left.
    survivor_start = status(kube, Backup, namespace, plan_status["lastSuccessfulBackup"])["physical"]
    first_needed = lsn_value(survivor_start["startLsn"]) // SEGMENT_SIZE
    wait_until(
        "the WAL before the kept backup deleted",
        lambda: min(segment_number(n) for n in wal_files(bucket, wal) if SEGMENT.match(n)) == first_needed,
        60,
    )
    assert [n for n in before if segment_number(n) < first_needed], "no WAL was older than the kept backup"
    pruned_events = [e for e in kube.list(Event, namespace=namespace) if e.reason == "WalPruned"]
    assert pruned_events, "no Event says WAL was pruned"

    # Retention is the only automatic deletion: the namespace deleted (its Backup objects with
    # it), the plan's backups stay in the storage...
    kube.delete(BackupPlan, "demo-nightly", namespace=namespace)  # deletes none of its backups
    survivor = plan_status["lastSuccessfulBackup"]
    kept = kube.get(Backup, survivor, namespace=namespace).to_dict()
    assert kept["spec"]["deletionPolicy"] == "Retain"
    location = kept["status"]["manifest"].rsplit("/", 1)[0]
    orders = sql(kube, namespace, "demo", CHECKSUM, database="shop")
    deleted_namespaces.delete(namespace)
    wait_until(
        "the namespace's Backups deleted", lambda: not list(kube.list(Backup, namespace=namespace)), 120
    )
    left = [
        item["Key"]
        for item in api.list_objects_v2(Bucket=bucket, Prefix=f"{location}/").get("Contents") or []
    ]
    assert f"{location}/manifest.json" in left

    # ...where a new namespace (a new cluster, after a disaster) finds them and restores one,
    # from the bucket alone and the keys.
    elsewhere = new_namespace(kube, namespace_prefix(), "after-disaster")
    try:
        storage(kube, elsewhere, "s3", bucket, sealed_with="k1")
        found = statefleet("backups", "found", "--storage", "s3", "--import", "-n", elsewhere)
        assert found.returncode == 0, found.stderr
        assert location in found.stdout
        imported = location.rsplit("/", 1)[-1]
        done = wait_phase(kube, Backup, elsewhere, imported, "Completed")
        assert (done["method"], done["instanceSpec"]["storage"]) == (
            "physical",
            kept["status"]["instanceSpec"]["storage"],
        )
        check = {"query": "SELECT count(*) = 50000 FROM orders", "database": "shop"}
        target = {"kind": "Postgres", "name": "demo"}
        apply(kube, Restore, elsewhere, "back", {"backup": imported, "target": target, "check": check})
        wait_phase(kube, Restore, elsewhere, "back", "Completed", timeout=360)
        assert sql(kube, elsewhere, "demo", CHECKSUM, database="shop") == orders
    finally:
        deleted_namespaces.delete(elsewhere)


def test_a_restore_test_fails_loudly_on_a_tampered_backup(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    demo_with_storage(kube, namespace, bucket, "15")
    seed(kube, namespace, "demo")
    plan = {
        "service": {"kind": "Postgres", "name": "demo"},
        "storage": "s3",
        "schedule": "* * * * *",
        "method": "logical",
    }
    apply(kube, BackupPlan, namespace, "p", plan)

    def completed() -> tuple[str, dict[str, Any]] | None:
        done = [
            (n, b)
            for n, b in plan_backups(kube, namespace, "p").items()
            if b.get("status", {}).get("phase") == "Completed"
        ]
        return done[0] if done else None

    name, backup = wait_until("a completed backup", completed, timeout=180, interval=2)
    kube.patch(BackupPlan, "p", {"spec": {"suspend": True}}, namespace=namespace, patch_type=PatchType.MERGE)
    api = s3_api(s3_settings())
    manifest = json.loads(api.get_object(Bucket=bucket, Key=backup["status"]["manifest"])["Body"].read())
    key = stored_key(manifest, "globals.sql")
    api.put_object(Bucket=bucket, Key=key, Body=b"-- nothing here\n")
    # Suspended: nothing newer comes; the restore test now runs on the tampered backup.
    kube.patch(
        BackupPlan,
        "p",
        {"spec": {"verify": {"enabled": True}}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    message = wait_reason(kube, BackupPlan, namespace, "p", "VerificationFailed", timeout=240)
    assert name in message
    assert "ChecksumMismatch" in message
    condition = verified(kube.get(Backup, name, namespace=namespace).to_dict())
    assert condition["status"] == "False"
    assert condition["reason"] == "RestoreTestFailed"
    warnings = [
        e
        for e in kube.list(Event, namespace=namespace, fields={"involvedObject.name": name})
        if e.reason == "VerificationFailed" and e.type == "Warning"
    ]
    assert warnings


ASIDE = "SELECT count(*) FROM pg_database WHERE position('__before_' in datname) > 0"


def test_a_restore_replaces_an_instances_databases_and_puts_them_back_when_it_fails(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    demo_with_storage(kube, namespace, bucket, "17")
    orders, _ = seed(kube, namespace, "demo")
    service = {"kind": "Postgres", "name": "demo"}
    apply(kube, Backup, namespace, "before", {"service": service, "storage": "s3", "method": "logical"})
    wait_phase(kube, Backup, namespace, "before", "Completed")
    # After the backup, a bad deploy deletes rows; a database the backup does not hold appears.
    sql(kube, namespace, "demo", "DELETE FROM orders WHERE id % 2 = 0", database="shop")
    sql(kube, namespace, "demo", "CREATE DATABASE scratch")
    # The application's password moved on since (its Secret holds the new one): it stays.
    sql(kube, namespace, "demo", "ALTER ROLE shop_owner PASSWORD 'rotated'")
    password = sql(kube, namespace, "demo", "SELECT rolpassword FROM pg_authid WHERE rolname = 'shop_owner'")
    damaged = sql(kube, namespace, "demo", CHECKSUM, database="shop")
    target = {"kind": "Postgres", "name": "demo", "replace": True}

    def nothing_left_over(committed: bool = False) -> None:
        """No database kept aside or closed to sessions; the record says the last restore ended."""
        assert sql(kube, namespace, "demo", ASIDE) == 0
        closed = "SELECT count(*) FROM pg_database WHERE NOT datallowconn AND NOT datistemplate"
        assert sql(kube, namespace, "demo", closed) == 0
        record = (
            "SELECT coalesce(string_agg(c, ','), '') FROM pg_db_role_setting, unnest(setconfig) c"
            " WHERE c LIKE 'statefleet.restore=%'"
        )
        recorded = sql(kube, namespace, "demo", record)
        assert ('"phase":"committed"' in recorded) if committed else recorded == "", recorded

    # Its check fails: the restore is undone and the instance holds what it held.
    failing = {"backup": "before", "target": target, "check": {"query": "SELECT false", "database": "shop"}}
    apply(kube, Restore, namespace, "failing", failing)
    failed = wait_phase(kube, Restore, namespace, "failing", "Failed", timeout=300)
    assert failed["reason"] == "CheckFailed", failed
    assert "Postgres demo holds its own data again" in failed["message"]
    assert sql(kube, namespace, "demo", CHECKSUM, database="shop") == damaged
    nothing_left_over()

    # Its Job killed (SIGKILL: no chance to clean up) while the restored data is in place and
    # the instance's own kept aside: a Job of its own puts that back.
    slow_check = {"query": "SELECT count(*) FROM pg_sleep(300)", "database": "shop"}
    apply(kube, Restore, namespace, "killed", {"backup": "before", "target": target, "check": slow_check})

    def checking(restore: str) -> Callable[[], str | None]:
        def probe() -> str | None:
            pods = kube.list(Pod, namespace=namespace, labels={"job-name": f"{restore}-restore"})
            running = [p.metadata.name for p in pods if p.status.phase == "Running"]
            if running and any('"checking"' in line for line in kube.log(running[0], namespace=namespace)):
                return running[0]
            return None

        return probe

    pod = wait_until("the restore checking", checking("killed"), timeout=240, interval=0.5)
    assert sql(kube, namespace, "demo", ASIDE) == 1
    assert sql(kube, namespace, "demo", CHECKSUM, database="shop") == orders  # the backup's, for now
    kill_command(kube.get(Pod, pod, namespace=namespace).metadata.uid, ["python3", "-m", "backup"])
    failed = wait_phase(kube, Restore, namespace, "killed", "Failed", timeout=240)
    assert failed["reason"] == "JobFailed", failed
    assert "(shop put back)" in failed["message"]
    assert sql(kube, namespace, "demo", CHECKSUM, database="shop") == damaged
    nothing_left_over()

    # Deleted while it runs, in the foreground (the garbage collector deletes its Jobs as they
    # come): its Job is stopped and the instance's own data put back before the Restore goes.
    apply(kube, Restore, namespace, "withdrawn", {"backup": "before", "target": target, "check": slow_check})
    wait_until("the restore checking", checking("withdrawn"), timeout=240, interval=0.5)
    assert sql(kube, namespace, "demo", ASIDE) == 1
    kube.delete(Restore, "withdrawn", namespace=namespace, cascade=CascadeType.FOREGROUND)
    wait_gone(kube, Restore, "withdrawn", namespace, timeout=240)
    assert sql(kube, namespace, "demo", CHECKSUM, database="shop") == damaged
    nothing_left_over()
    withdrawn = kube.list(Event, namespace=namespace, fields={"involvedObject.name": "withdrawn"})
    assert any(e.reason == "Withdrawn" and "holds its own data again" in (e.message or "") for e in withdrawn)
    wait_gone(kube, Job, "withdrawn-rollback", namespace, timeout=60)  # nothing of it stays

    # The restore that succeeds: the backup's data; the database it does not hold, untouched.
    apply(kube, Restore, namespace, "undo-the-deploy", {"backup": "before", "target": target})
    done = wait_phase(kube, Restore, namespace, "undo-the-deploy", "Completed", timeout=300)
    assert sql(kube, namespace, "demo", CHECKSUM, database="shop") == orders
    assert "shop" in done["details"]["replaced"]
    assert "scratch" in done["details"]["untouched"]
    assert sql(kube, namespace, "demo", "SELECT count(*) FROM pg_database WHERE datname = 'scratch'") == 1
    nothing_left_over(committed=True)
    assert (
        sql(kube, namespace, "demo", "SELECT rolpassword FROM pg_authid WHERE rolname = 'shop_owner'")
        == password
    )
    owner = "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'shop'"
    assert sql(kube, namespace, "demo", owner) == "shop_owner"


VOLUME = "SELECT coalesce(string_agg(f, ',' ORDER BY f), '') FROM pg_ls_dir('/var/lib/postgresql/data') f"
IDENTIFIER = "SELECT system_identifier::text FROM pg_control_system()"
STANDBYS = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"


def test_a_physical_backup_replaces_a_running_instance_and_is_undone_when_it_fails(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    storage(kube, namespace, "s3", bucket)
    create(kube, namespace, "demo", {"version": "17", "instances": 2, "storage": {"size": "2Gi"}})
    wait_ready(kube, namespace, "demo", 2)
    orders, _ = seed(kube, namespace, "demo")
    service = {"kind": "Postgres", "name": "demo"}
    apply(kube, Backup, namespace, "base", {"service": service, "storage": "s3", "method": "physical"})
    wait_phase(kube, Backup, namespace, "base", "Completed")
    identifier = sql(kube, namespace, "demo", IDENTIFIER)
    # After the backup, a bad deploy deletes rows and adds a table.
    sql(kube, namespace, "demo", "DELETE FROM orders WHERE id % 2 = 0", database="shop")
    sql(kube, namespace, "demo", "CREATE TABLE after_backup (id int)")
    damaged = sql(kube, namespace, "demo", CHECKSUM, database="shop")
    target = {"kind": "Postgres", "name": "demo", "replace": True}
    primary = kube.get(Postgres, "demo", namespace=namespace).to_dict()["status"]["currentPrimary"]

    def holds_its_own_data() -> None:
        """What it held before, served by both pods again, with nothing left aside."""
        wait_ready(kube, namespace, "demo", 2, timeout=300)
        assert sql(kube, namespace, "demo", CHECKSUM, database="shop") == damaged
        assert sql(kube, namespace, "demo", "SELECT count(*) FROM pg_tables WHERE tablename = 'after_backup'")
        assert "before-" not in sql(kube, namespace, "demo", VOLUME)
        wait_until("the standby streams", lambda: sql(kube, namespace, "demo", STANDBYS) == 1, timeout=120)

    # Its check fails: the instance stops again and gets its own data back.
    failing = {"backup": "base", "target": target, "check": {"query": "SELECT false", "database": "shop"}}
    apply(kube, Restore, namespace, "failing", failing)
    failed = wait_phase(kube, Restore, namespace, "failing", "Failed", timeout=600)
    assert failed["reason"] == "CheckFailed", failed
    assert "Postgres demo holds its own data again" in failed["message"]
    record = kube.get(Postgres, "demo", namespace=namespace).to_dict()["status"]["inPlaceRestore"]
    assert (record["mode"], record["phase"], record["pod"]) == ("rollback", "RolledBack", primary)
    holds_its_own_data()

    # A corrupted backup: every object is checked before the instance stops, so it never does.
    apply(kube, Backup, namespace, "spoilt", {"service": service, "storage": "s3", "method": "physical"})
    spoilt = wait_phase(kube, Backup, namespace, "spoilt", "Completed")
    api = s3_api(s3_settings())
    manifest = json.loads(api.get_object(Bucket=bucket, Key=spoilt["manifest"])["Body"].read())
    key = stored_key(manifest, "base.tar.zst")
    data = bytearray(api.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    api.put_object(Bucket=bucket, Key=key, Body=bytes(data))

    def pods_as_they_run() -> dict[str, tuple[str, int]]:
        pods = kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/instance": "demo"})
        return {
            p.metadata.name: (p.metadata.uid, sum(c.restartCount for c in p.status.containerStatuses or []))
            for p in pods
        }

    serving = pods_as_they_run()
    apply(kube, Restore, namespace, "corrupted", {"backup": "spoilt", "target": target})
    failed = wait_phase(kube, Restore, namespace, "corrupted", "Failed", timeout=600)
    assert failed["reason"] == "ChecksumMismatch", failed
    assert key in failed["message"]
    assert "Postgres demo was not stopped" in failed["message"]
    assert pods_as_they_run() == serving
    assert "inPlace" not in failed
    holds_its_own_data()

    # Deleted while its check runs: the check's Job stops, the instance gets its own data back,
    # and only then does the Restore go.
    slow = {"query": "SELECT count(*) FROM pg_sleep(300)", "database": "shop"}
    apply(kube, Restore, namespace, "withdrawn", {"backup": "base", "target": target, "check": slow})
    wait_until(
        "the check running",
        lambda: status(kube, Restore, namespace, "withdrawn").get("inPlace") == "check",
        timeout=300,
    )
    kube.delete(Restore, "withdrawn", namespace=namespace)
    wait_gone(kube, Restore, "withdrawn", namespace, timeout=300)
    withdrawn = kube.list(Event, namespace=namespace, fields={"involvedObject.name": "withdrawn"})
    assert any(e.reason == "Withdrawn" and "holds its own data again" in (e.message or "") for e in withdrawn)
    holds_its_own_data()

    # The restore that succeeds: the backup's cluster and data, served by both pods (the
    # standby cloned the restored primary), nothing left aside once checked.
    apply(kube, Restore, namespace, "undo-the-deploy", {"backup": "base", "target": target})
    done = wait_phase(kube, Restore, namespace, "undo-the-deploy", "Completed", timeout=600)
    assert done["details"]["check"]["systemIdentifier"] == identifier
    assert done["details"]["committed"] is True
    wait_ready(kube, namespace, "demo", 2, timeout=300)
    assert sql(kube, namespace, "demo", CHECKSUM, database="shop") == orders
    assert not sql(kube, namespace, "demo", "SELECT count(*) FROM pg_tables WHERE tablename = 'after_backup'")
    volume = sql(kube, namespace, "demo", VOLUME)
    assert "before-" not in volume
    assert "statefleet-restore-" in volume
    wait_until("the standby streams", lambda: sql(kube, namespace, "demo", STANDBYS) == 1, timeout=120)
    events = kube.list(Event, namespace=namespace, fields={"involvedObject.name": "demo"})
    reasons = {e.reason for e in events}
    assert {"RestoreStopping", "RestoreStarted", "RestoreRollingBack", "RestoreRolledBack"} <= reasons
    # The annotation is gone; a restart of every pod keeps the restored data (done once per token).
    annotations = kube.get(Postgres, "demo", namespace=namespace).metadata.annotations or {}
    assert "statefleet.dev/restore-in-place" not in annotations
    restarted = {}
    for pod in kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/instance": "demo"}):
        kube.delete(Pod, pod.metadata.name, namespace=namespace)
        restarted[pod.metadata.name] = pod.metadata.uid

    def replaced() -> bool:
        """Every pod a new one, Ready (what status says after that is about the new pods)."""
        pods = kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/instance": "demo"})
        now = {p.metadata.name: p.metadata.uid for p in pods if pod_is_ready(p)}
        return now.keys() == restarted.keys() and not set(now.values()) & set(restarted.values())

    wait_until("every pod replaced and Ready", replaced, timeout=300)
    wait_ready(kube, namespace, "demo", 2, timeout=300)
    assert sql(kube, namespace, "demo", CHECKSUM, database="shop") == orders


def test_restore_tests_on_a_schedule_of_their_own_test_the_newest_backup_again(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    demo_with_storage(kube, namespace, bucket, "17")
    sql(kube, namespace, "demo", "CREATE TABLE t AS SELECT generate_series(1, 1000) AS id")
    # The plan's own backups come once a year; the one it tests is taken now, under its label.
    plan = {
        "service": {"kind": "Postgres", "name": "demo"},
        "storage": "s3",
        "schedule": "0 0 1 1 *",
        "method": "logical",
        "verify": {"enabled": True, "schedule": "* * * * *", "query": "SELECT count(*) = 1000 FROM t"},
    }
    apply(kube, BackupPlan, namespace, "weekly-test", plan)
    kube.create(
        Backup(
            metadata=ObjectMeta(
                name="taken-by-hand",
                namespace=namespace,
                labels={"statefleet.dev/backup-plan": "weekly-test"},
            ),
            spec={"service": {"kind": "Postgres", "name": "demo"}, "storage": "s3", "method": "logical"},
        )
    )
    wait_phase(kube, Backup, namespace, "taken-by-hand", "Completed")

    seen: list[str] = []

    def tested_twice() -> bool:
        last = status(kube, BackupPlan, namespace, "weekly-test").get("lastVerification") or {}
        if last.get("backup") == "taken-by-hand" and last.get("at") not in seen:
            assert last["result"] == "Passed", last
            seen.append(last["at"])
        return len(seen) >= 2

    wait_until("the backup tested at two times of the verify schedule", tested_twice, timeout=360, interval=2)
    plan_status = status(kube, BackupPlan, namespace, "weekly-test")
    assert plan_status["nextVerifyTime"] > plan_status["lastVerifyScheduleTime"]
    condition = verified(kube.get(Backup, "taken-by-hand", namespace=namespace).to_dict())
    assert condition is not None
    assert condition["status"] == "True"


@contextlib.contextmanager
def small_disk(directory: Path, size: str) -> Iterator[None]:
    """A tmpfs of `size` over `directory` (its extended attributes, where the S3 server keeps
    a bucket's settings, carried over): a disk that fills up."""
    attributes = {name: os.getxattr(directory, name) for name in os.listxattr(directory)}
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(directory)], check=True
    )
    try:
        for name, value in attributes.items():
            os.setxattr(directory, name, value)
        yield
    finally:
        if subprocess.run(["umount", str(directory)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(directory)], check=True)


def test_a_backup_into_a_full_storage_fails_and_leaves_nothing(
    kube: Client, namespace: str, operator: OperatorProcess, bucket: str
) -> None:
    demo_with_storage(kube, namespace, bucket, "17")
    fill(kube, namespace, "demo", 600000)  # about 40 MB dumped: more than the disk holds
    with small_disk(REPO / ".testbed" / "s3" / "data" / bucket, "16m"):
        service = {"kind": "Postgres", "name": "demo"}
        apply(kube, Backup, namespace, "full", {"service": service, "storage": "s3", "method": "logical"})
        failed = wait_phase(kube, Backup, namespace, "full", "Failed", timeout=240)
        assert failed["reason"] == "StorageFull", failed
        assert "out of space" in failed["message"]
        api = s3_api(s3_settings())
        assert api.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    # Nothing in the instance was touched.
    assert sql(kube, namespace, "demo", "SELECT count(*) FROM filler") == 600000


@pytest.fixture
def instance_env(kube: Client, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The driver's connection settings, as a Job has them, for an instance `demo`; the
    advisory lock this process takes is let go afterwards."""
    create(kube, namespace, "demo", {"version": "17", "storage": {"size": "1Gi"}})
    wait_ready(kube, namespace, "demo", 1)
    data = kube.get(Secret, "demo-superuser", namespace=namespace).data
    monkeypatch.setenv("PGHOST", kube.get(Service, "demo-rw", namespace=namespace).spec.clusterIP)
    monkeypatch.setenv("PGUSER", base64.b64decode(data["username"]).decode())
    monkeypatch.setenv("PGPASSWORD", base64.b64decode(data["password"]).decode())
    yield
    if backup_replace._lock is not None:
        backup_replace._lock.close()
        backup_replace._lock = None


def test_a_replacing_restore_is_undone_from_wherever_it_stopped(
    kube: Client, namespace: str, operator: OperatorProcess, instance_env: None
) -> None:
    """The driver's rollback, run (twice) after a Job killed at each step, against a real
    server: the instance's own databases come back whole, open, under their names."""
    replace = backup_replace

    def run(statement: str, database: str = "postgres") -> Any:
        return sql(kube, namespace, "demo", statement, database)

    def fresh() -> None:
        for name in ("keep", "other"):
            run(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            run(f"CREATE DATABASE {name}")
            run(f"CREATE TABLE mine AS SELECT '{name}' AS owner, generate_series(1, 100) AS id", name)

    def whole() -> None:
        for name in ("keep", "other"):
            assert run(f"SELECT count(*) FROM mine WHERE owner = '{name}'", name) == 100, name
        assert run(ASIDE) == 0
        assert run("SELECT count(*) FROM pg_database WHERE NOT datallowconn AND NOT datistemplate") == 0
        assert run("SELECT count(*) FROM pg_database WHERE datname = 'fresh'") == 0

    def restored_copy(name: str) -> None:
        """What pg_restore --create makes: a database of the backup's name, with other rows."""
        run(f"CREATE DATABASE {name}")
        run("CREATE TABLE mine AS SELECT 'backup' AS owner, 1 AS id", name)

    wanted = ["postgres", "keep", "other", "fresh"]
    fresh()
    # Killed after it restored some databases (and created one the instance did not have).
    replace.begin("t1", wanted)
    restored_copy("keep")
    restored_copy("fresh")
    assert replace.roll_back("t1")["putBack"] == ["keep", "other"]
    assert replace.roll_back("t1") == {"putBack": []}
    whole()

    # Killed in the middle of setting aside: one renamed, the next closed but not renamed.
    state = replace.ReplaceState("t2", replace.RESTORING, originals=["keep", "other"])
    with replace.connect() as conn:
        replace.write_state(conn, state)
        conn.execute(
            replace.statement("ALTER DATABASE {} RENAME TO {}", "keep", replace.aside_name("keep", "t2"))
        )
        conn.execute(replace.statement("ALTER DATABASE {} ALLOW_CONNECTIONS false", "other"))
    replace.roll_back("t2")
    whole()

    # Killed in the middle of a rollback: one original back already, the record still there.
    replace.begin("t3", wanted)
    restored_copy("keep")
    with replace.connect() as conn:
        conn.execute(replace.statement("DROP DATABASE {} WITH (FORCE)", "keep"))
        conn.execute(
            replace.statement("ALTER DATABASE {} RENAME TO {}", replace.aside_name("keep", "t3"), "keep")
        )
    replace.roll_back("t3")
    whole()

    # Another restore's record stands: a second one is refused and touches nothing.
    replace.begin("t4", wanted)
    with pytest.raises(replace.ReplaceRefused, match="t4"):
        replace.begin("t5", wanted)
    assert replace.roll_back("t5") == {"putBack": []}
    replace.roll_back("t4")
    whole()

    # Killed after it committed: the rollback finds the restore done and leaves it.
    replace.begin("t6", wanted)
    restored_copy("keep")
    restored_copy("other")
    replace.commit("t6")
    assert replace.roll_back("t6")["committed"] is True
    assert run("SELECT owner FROM mine", "keep") == "backup"
    assert run(ASIDE) == 0
