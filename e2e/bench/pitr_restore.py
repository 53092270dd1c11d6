"""Benchmark: point-in-time recovery through a whole `Restore` on the test bed, from the
Restore's creation to the new instance serving at the target, with N MiB of WAL to replay.

One `Postgres` (1 instance, archiving its WAL to the test bed's S3 server) is loaded to
`--size-mb` (pgbench's tables at scale 10, then rows of hex text, as the host-level
benchmark `e2e.bench.base_backup` does), backed up (`method: physical`), then writes
`--wal-mb` of WAL with pgbench's transactions (4 clients, from the host), names a restore
point and writes two seconds more. Each run then creates a `Restore` of the named point
into a new instance and measures, from the Restore's creation:

  serving    the new instance's `-rw` Service answers with pgbench_history as it was at the
             point (the rows counted then)
  completed  the Restore Completed (its check Job done)

The host-level figures of the same tools (`e2e.bench.base_backup --pitr-wal-mb`) are the
peers' side: no peer operator runs on this test bed (no container registry here), so what
this adds is the Restore's own cost above the files and the replay.

    .venv/bin/python -m e2e.bench.pitr_restore [--size-mb 1024] [--wal-mb 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import time
import uuid

from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod, Secret, Service

from e2e.bench.wal_archive import MiB, postgres_bin
from e2e.kube import apply, client, delete_namespace, wait_until
from e2e.operator_process import OperatorProcess
from e2e.s3 import create_keys, new_bucket, revoke_keys
from e2e.test_backup import Backup, Restore, connect_db, sql, storage, wait_phase
from e2e.test_postgres import Postgres, create, wait_ready

POINT = "bench-target"


def pgbench(kube: Client, namespace: str, *args: str) -> None:
    """The host's pgbench against the instance's `-rw` Service."""
    data = kube.get(Secret, "demo-superuser", namespace=namespace).data
    env = {
        **os.environ,
        "PGHOST": kube.get(Service, "demo-rw", namespace=namespace).spec.clusterIP,
        "PGUSER": base64.b64decode(data["username"]).decode(),
        "PGPASSWORD": base64.b64decode(data["password"]).decode(),
        "PGDATABASE": "postgres",
    }
    done = subprocess.run([str(postgres_bin() / "pgbench"), *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pgbench {' '.join(args)} failed: {done.stderr.strip()}")


def load(kube: Client, namespace: str, size_mb: int) -> int:
    """pgbench's tables, then rows as hard to compress as text usually is (about 2:1)."""
    sql(kube, namespace, "demo", "select 1")  # retried while the Service's endpoints settle
    pgbench(kube, namespace, "-i", "-q", "-s", "10")
    sql(kube, namespace, "demo", "create table payload (id bigint, body text)")
    size = "select sum(pg_database_size(datname)) from pg_database"
    while int(sql(kube, namespace, "demo", size)) < size_mb * MiB:
        sql(
            kube,
            namespace,
            "demo",
            "insert into payload select g, md5(g::text) || md5((g * 7)::text)"
            " || repeat(md5((g * 13)::text), 2) from generate_series("
            "coalesce((select max(id) from payload), 0) + 1,"
            " coalesce((select max(id) from payload), 0) + 1000000) g",
        )
    return int(sql(kube, namespace, "demo", size))


def archived_through(kube: Client, namespace: str, wal_file: str) -> bool:
    status = kube.get(Postgres, "demo", namespace=namespace).to_dict().get("status", {})
    last = (status.get("walArchive") or {}).get("lastArchivedWal") or ""
    return last[8:] >= wal_file[8:]


def write_wal(kube: Client, namespace: str, wal_mb: int) -> int:
    """pgbench's transactions until `wal_mb` of WAL follows the backup, the restore point, two
    seconds more that the recoveries must leave out, all archived. Returns pgbench_history's
    rows at the point."""
    since = sql(kube, namespace, "demo", "select pg_current_wal_lsn()::text")
    written = f"select (pg_current_wal_lsn() - '{since}')::bigint"
    while int(sql(kube, namespace, "demo", written)) < wal_mb * MiB:
        pgbench(kube, namespace, "-c", "4", "-j", "2", "-T", "10")
    history = int(sql(kube, namespace, "demo", "select count(*) from pgbench_history"))
    sql(kube, namespace, "demo", f"select pg_create_restore_point('{POINT}')::text")
    pgbench(kube, namespace, "-c", "4", "-j", "2", "-T", "2")
    switched = sql(kube, namespace, "demo", "select pg_walfile_name(pg_switch_wal())")
    wait_until(f"{switched} archived", lambda: archived_through(kube, namespace, switched), 600, interval=1)
    return history


def history_rows(kube: Client, namespace: str, instance: str) -> int | None:
    """pgbench_history's rows through `<instance>-rw`, None while nothing serves there."""
    try:
        with connect_db(kube, namespace, instance, "postgres") as conn:
            return conn.execute("select count(*) from pgbench_history").fetchone()[0]
    except Exception:  # not there yet: no Secret, no Service, no server, still recovering
        return None


def restore(kube: Client, namespace: str, run: int, history: int) -> dict[str, float]:
    name = f"demo-r{run}"
    started = time.monotonic()
    apply(
        kube,
        Restore,
        namespace,
        f"r{run}",
        {
            "pointInTime": {"instance": "demo", "name": POINT},
            "target": {"kind": "Postgres", "name": name, "spec": {"instances": 1}},
        },
    )
    rows = wait_until(f"{name} serving", lambda: history_rows(kube, namespace, name), 1800, interval=0.5)
    serving = time.monotonic() - started
    done = wait_phase(kube, Restore, namespace, f"r{run}", "Completed", timeout=600)
    completed = time.monotonic() - started
    if rows != history:
        raise SystemExit(f"{name}: pgbench_history holds {rows} rows, {history} at the point")
    if done["pointInTime"]["backup"] != "base":
        raise SystemExit(f"{name} recovered from {done['pointInTime']['backup']}, not the base backup")
    kube.delete(Postgres, name, namespace=namespace)  # its CPU goes to the next run
    wait_until(
        f"{name}'s pods gone",
        lambda: not list(kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/instance": name})),
        300,
        interval=1,
    )
    return {"serving": serving, "completed": completed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--wal-mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    kube = client()
    operator = OperatorProcess.start(namespaces="bench-pitr-*", log_name="operator-bench-pitr.log")
    namespace = f"bench-pitr-{uuid.uuid4().hex[:5]}"
    access, secret = create_keys()
    try:
        with new_bucket() as bucket:
            kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
            try:
                storage(kube, namespace, "s3", bucket, access_key=access, secret_key=secret)
                spec = {"instances": 1, "storage": {"size": "16Gi"}, "walArchive": {"storage": "s3"}}
                create(kube, namespace, "demo", {"version": "15", **spec})
                wait_ready(kube, namespace, "demo", 1, timeout=240)
                size = load(kube, namespace, args.size_mb)
                service = {"kind": "Postgres", "name": "demo"}
                physical = {"service": service, "storage": "s3", "method": "physical"}
                apply(kube, Backup, namespace, "base", physical)
                taken = time.monotonic()
                wait_phase(kube, Backup, namespace, "base", "Completed", timeout=900)
                print(f"{size / MiB:.0f} MiB instance backed up in {time.monotonic() - taken:.0f} s")
                writing = time.monotonic()
                history = write_wal(kube, namespace, args.wal_mb)
                print(
                    f"{args.wal_mb} MiB of WAL written and archived in {time.monotonic() - writing:.0f} s; "
                    f"at the point, {history} pgbench_history rows"
                )
                runs = []
                for run in range(args.repeats):
                    runs.append(restore(kube, namespace, run, history))
                    print(
                        f"run {run + 1}: serving at the point {runs[-1]['serving']:.1f} s after the "
                        f"Restore's creation, Completed {runs[-1]['completed']:.1f} s"
                    )
                serving = statistics.median(r["serving"] for r in runs)
                completed = statistics.median(r["completed"] for r in runs)
                print(f"median over {len(runs)} runs: serving {serving:.1f} s, Completed {completed:.1f} s")
            finally:
                delete_namespace(kube, namespace, wait=300)
    finally:
        revoke_keys(access)
        operator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
