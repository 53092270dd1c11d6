"""Benchmark: a full physical backup of a database of about 1 GiB to S3, and its restore into a
new server until that server serves, ours against barman-cloud (CloudNativePG's tools) and
pgBackRest (Crunchy PGO's).

One PostgreSQL server (this machine's, the Debian package) is loaded to `--size-mb`
(pgbench's tables at scale 10, then rows of hex text, which compress about 2:1), then
archives its WAL into the test bed's S3 server through every tool (`archive_command`: our
`archive-wal.sh` with the `wal-archiver` running beside it, `barman-cloud-wal-archive`, then
`pgbackrest archive-push`), so that each finds the WAL it relies on where it looks. Then,
taking turns, `--repeats` times each:

  backup   ours: the backup Job's own work (`python -m backup`, with the request the operator
           sends for an instance that archives into the backup's storage): pg_basebackup
           -X none, compressed by the server (zstd), streamed to S3 as 16 MiB pieces with their
           sha256, then every WAL segment the backup needs read back from the archive and
           checked, then the manifest
           barman: `barman-cloud-backup --immediate-checkpoint` (2 upload jobs, no compression:
           its defaults, and CloudNativePG's)
           pgbackrest: `pgbackrest backup --type=full --start-fast` (one process, zstd level 3)
  restore  ours: a new instance's first pod's work (the tar streamed, every piece checked,
           extracted aside and moved into place, the recovery set), then the server replays the
           archive to the backup's end with the `wal-restore` sidecar and promotes itself
           barman: `barman-cloud-restore`, then the server replays the archive to the backup's
           end (`recovery_target = immediate`) with `barman-cloud-wal-restore` and promotes
           pgbackrest: `pgbackrest restore --type=immediate`, then the same with `pgbackrest
           archive-get` (through the S3 server's TLS listener: its S3 client speaks only HTTPS)
The restore's clock runs from the first byte read until the server says it is ready to accept
connections (the chown of the files between, which a pod does not need, is not counted).

With `--pitr-wal-mb N`, point-in-time recovery instead: one backup by each tool, then N MiB of
WAL from pgbench's transactions (4 clients), a restore point and a few seconds of writes after
it, all archived by every tool; each run then restores each tool's backup and recovers to the
restore point (`recovery_target_name`; `pgbackrest restore --type=name`), and the server's
pgbench_history must hold exactly the rows it held at the point.

    .venv/bin/python -m e2e.bench.base_backup [--size-mb 1024] [--repeats 3] [--pitr-wal-mb 2048]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backup.manifest import read_manifest
from backup.run import streamed_source
from backup.storage import S3Spec, s3_client
from e2e.bench.wal_archive import (
    RUN_AS,
    MiB,
    PgBackRest,
    Server,
    as_postgres,
    barman_bin,
    drained,
    keys,
    owned,
    postgres_bin,
    rendered_archive_script,
    stop_server,
)
from e2e.bench.wal_restore import rendered_restore_script
from e2e.kube import REPO
from e2e.s3 import new_bucket, s3_api, s3_settings
from services.postgres.backup_driver import DRIVER

OURS_WAL = "ours-wal"
BARMAN = "barman"


def storage(bucket: str) -> dict[str, str]:
    return {"endpoint": s3_settings()["S3_ENDPOINT"], "bucket": bucket, "credentialsSecret": "k"}


@dataclass(frozen=True)
class Target:
    """Where a restore's recovery stops, as each tool is told."""

    ours: dict[str, Any]  # services.postgres.point_in_time.RecoveryTarget
    settings: tuple[str, ...]  # postgresql.auto.conf, for barman's restore
    pgbackrest: tuple[str, ...]  # pgbackrest restore's options
    history: int | None = None  # pgbench_history's rows at the target, checked once it serves


IMMEDIATE = Target({"immediate": True}, ("recovery_target = 'immediate'",), ("--type=immediate",))


def restore_point(name: str, history: int) -> Target:
    return Target(
        {"name": name},
        (f"recovery_target_name = '{name}'", "recovery_target_timeline = 'latest'"),
        ("--type=name", f"--target={name}"),
        history,
    )


class Source:
    """The server every tool backs up, archiving its WAL through each."""

    def __init__(self, root: Path, bucket: str, size_mb: int) -> None:
        self.root, self.bucket = root, bucket
        self.server = Server(root, keys())
        self.archiver: subprocess.Popen[bytes] | None = None
        try:
            self.set_up(size_mb)
        except BaseException:
            self.close()  # no server or archiver left behind
            raise

    def set_up(self, size_mb: int) -> None:
        root, bucket = self.root, self.bucket
        self.server.start("init")  # archive_mode on, archiving nothing yet
        self.server.pgbench("-i", "-q", "-s", "10")
        # Rows as hard to compress as text usually is (about 2:1), not pgbench's blank fillers.
        self.server.sql("create table payload (id bigint, body text)")
        while self.database_size() < size_mb * MiB:
            self.server.sql(
                "insert into payload select g, md5(g::text) || md5((g * 7)::text)"
                " || repeat(md5((g * 13)::text), 2) from generate_series("
                "coalesce((select max(id) from payload), 0) + 1,"
                " coalesce((select max(id) from payload), 0) + 1000000) g"
            )
        self.server.sql("checkpoint")
        self.size = self.database_size()
        spool, credentials = owned(root / "spool"), owned(root / "keys")
        owned(spool / "archived")
        for name, value in keys().items():
            (credentials / name).write_text(value)
        script = root / "archive-wal.sh"
        script.write_text(rendered_archive_script(spool))
        archive = {"s3": storage(bucket), "prefix": OURS_WAL, "parallel": 4}
        env = {
            **os.environ,
            "PGDATA": str(self.server.data),
            "POD_NAME": "bench",
            "STATEFLEET_WAL_ARCHIVE": json.dumps(archive),
            "STATEFLEET_WAL_SPOOL": str(spool),
            "STATEFLEET_WAL_CREDENTIALS": str(credentials),
        }
        self.archiver = subprocess.Popen(
            [sys.executable, "-m", "services.postgres.wal_archiver"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        barman = (
            f"{barman_bin()}/barman-cloud-wal-archive --endpoint-url {storage(bucket)['endpoint']} --zstd "
            f"s3://{bucket}/{BARMAN} demo %p"
        )
        self.pgbackrest = PgBackRest(owned(root / "pgbackrest"), bucket, self.server.data, root, keys())
        self.pgbackrest.run("stanza-create")
        pgbackrest = " ".join(self.pgbackrest.argv("archive-push", "%p"))
        self.server.sql(f"alter system set archive_command = 'bash {script} %f && {barman} && {pgbackrest}'")
        self.server.sql("select pg_reload_conf()")
        drained(self.server)  # the load's WAL, archived by both before the first backup

    def database_size(self) -> int:
        return int(self.server.sql("select sum(pg_database_size(datname)) from pg_database"))

    def close(self) -> None:
        self.server.stop()
        if self.archiver:
            self.archiver.terminate()
            self.archiver.wait(30)


def backup_ours(source: Source, run: int) -> dict[str, Any]:
    location = f"ours/b{run}"
    request = {
        "action": "backup",
        "driver": "services.postgres.backup_driver",
        "storage": storage(source.bucket),
        "location": location,
        "method": "physical",
        "backup": {"namespace": "bench", "name": f"b{run}", "uid": str(uuid.uuid4())},
        "service": {"kind": "Postgres", "name": "demo"},
        "instanceSpec": {},
        "archive": OURS_WAL,
    }
    env = {
        **os.environ,
        **keys(),
        "PATH": f"{postgres_bin()}:{os.environ['PATH']}",
        "PGHOST": str(source.root),
        "PGUSER": "postgres",
        "PGPASSWORD": "",
        "REPLICATION_USER": "postgres",
        "REPLICATION_PASSWORD": "",
        "STATEFLEET_BACKUP_REQUEST": json.dumps(request),
    }
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "backup"], cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    if "result" not in outcome:
        raise RuntimeError(f"our backup failed: {outcome}")
    return {"seconds": seconds, "stored": outcome["result"]["bytes"], "location": location}


def backup_barman(source: Source, run: int) -> dict[str, Any]:
    name = f"b{run}"
    argv = [
        f"{barman_bin()}/barman-cloud-backup", "--endpoint-url", storage(source.bucket)["endpoint"],
        "--immediate-checkpoint", "-h", str(source.root), "-U", "postgres", "-n", name,
        f"s3://{source.bucket}/{BARMAN}", "demo",
    ]  # fmt: skip
    before = stored_bytes(source.bucket, f"{BARMAN}/demo/base/")
    started = time.monotonic()
    subprocess.run(argv, env={**os.environ, **keys()}, check=True, capture_output=True, text=True)
    seconds = time.monotonic() - started
    stored = stored_bytes(source.bucket, f"{BARMAN}/demo/base/") - before
    return {"seconds": seconds, "stored": stored, "location": name}


def stored_bytes(bucket: str, prefix: str) -> int:
    pages = s3_api(s3_settings()).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sum(item["Size"] for page in pages for item in page.get("Contents") or [])


def backup_pgbackrest(source: Source, run: int) -> dict[str, Any]:
    started = time.monotonic()
    source.pgbackrest.run("backup", "--type=full", "--start-fast")
    seconds = time.monotonic() - started
    newest = source.pgbackrest.newest()
    return {"seconds": seconds, "stored": newest["info"]["repository"]["delta"], "location": newest["label"]}


def restore_pgbackrest(source: Source, label: str, target: Target = IMMEDIATE) -> dict[str, float]:
    root = owned(Path(tempfile.mkdtemp(prefix="bench-base-pgbackrest-")))
    try:
        data = owned(root / "data")
        data.chmod(0o700)
        started = time.monotonic()
        source.pgbackrest.run(
            "restore", f"--pg1-path={data}", f"--set={label}", *target.pgbackrest, "--target-action=promote"
        )
        files = time.monotonic() - started
        command = " ".join(source.pgbackrest.argv("archive-get", f"--pg1-path={data}", "%f", '"%p"'))
        # The same target as pgBackRest's own settings: a second, other one would be refused.
        recovery = serve(data, root, command, None, target)
        return {"files": files, "recovery": recovery}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def serve(
    data: Path, root: Path, restore_command: str, ours: dict[str, Any] | None, target: Target = IMMEDIATE
) -> float:
    """The restored data directory started until it serves; the seconds it took."""
    for path in [data, *data.rglob("*")]:
        shutil.chown(path, RUN_AS, RUN_AS)
    data.chmod(0o700)
    auto = data / "postgresql.auto.conf"
    # The source's archive settings (ALTER SYSTEM) come with its data: the copy archives nothing.
    dropped = ("restore_command", "archive_mode", "archive_command")
    settings = [line for line in auto.read_text().splitlines() if not line.startswith(dropped)]
    settings += [f"restore_command = '{restore_command}'", "archive_mode = off"]
    if ours is None:
        settings += [*target.settings, "recovery_target_action = 'promote'"]
        (data / "recovery.signal").touch()
        shutil.chown(data / "recovery.signal", RUN_AS, RUN_AS)
    auto.write_text("\n".join(settings) + "\n")
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"\nlisten_addresses = ''\nunix_socket_directories = '{root}'\n")
    log = root / "log"
    started = time.monotonic()
    sidecar = None
    if ours is not None:
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "services.postgres.wal_restore"],
            cwd=REPO,
            env={**os.environ, **ours},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        start = [str(postgres_bin() / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "3600", "start"]
        try:
            as_postgres(*start)
        except subprocess.CalledProcessError as error:
            raise RuntimeError(
                f"the server did not start: {error.stderr}\n{log.read_text()[-3000:]}"
            ) from error
        while "database system is ready to accept connections" not in log.read_text():
            if "database system is shut down" in log.read_text():
                raise RuntimeError(f"the server stopped:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        seconds = time.monotonic() - started
        promoted = as_postgres(
            str(postgres_bin() / "psql"), "-h", str(root), "-U", "postgres", "-Atqc",
            "select not pg_is_in_recovery() and (select count(*) from pgbench_branches) > 0",
        ).stdout.strip()  # fmt: skip
        if promoted != "t":
            raise RuntimeError(f"the restored server does not serve its data:\n{log.read_text()[-2000:]}")
        if target.history is not None:
            history = as_postgres(
                str(postgres_bin() / "psql"), "-h", str(root), "-U", "postgres", "-Atqc",
                "select count(*) from pgbench_history",
            ).stdout.strip()  # fmt: skip
            if history != str(target.history):
                raise RuntimeError(
                    f"recovered {history} pgbench_history rows, not the target's {target.history}"
                )
        return seconds
    finally:
        if sidecar:
            sidecar.terminate()
            sidecar.wait(30)
        stop_server(data)


def restore_ours(source: Source, location: str, target: Target = IMMEDIATE) -> dict[str, float]:
    root = owned(Path(tempfile.mkdtemp(prefix="bench-base-ours-")))
    try:
        data = root / "data"
        spec = S3Spec.model_validate(storage(source.bucket))
        archive = f"s3://{source.bucket}/{OURS_WAL}"
        started = time.monotonic()
        client = s3_client(spec, *keys().values())
        manifest = read_manifest(client, spec, location)
        os.environ["PGDATA"] = str(data)
        point = {"archive": archive, "target": target.ours}
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines, for the operator
            DRIVER.bootstrap(manifest, streamed_source(client, spec, manifest), point)
        files = time.monotonic() - started
        spool = owned(root / "spool")
        owned(spool / "want")
        owned(spool / "missing")
        script = root / "restore-wal.sh"
        script.write_text(rendered_restore_script(spool))
        sidecar = {
            "PGDATA": str(data),
            "STATEFLEET_BACKUP_REQUEST": json.dumps(
                {"storage": storage(source.bucket), "pointInTime": point}
            ),
            "STATEFLEET_WAL_RESTORE_SPOOL": str(spool),
            **keys(),
        }
        recovery = serve(data, root, f'bash {script} "%f" "%p"', sidecar, target)
        return {"files": files, "recovery": recovery}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def restore_barman(source: Source, name: str, target: Target = IMMEDIATE) -> dict[str, float]:
    root = owned(Path(tempfile.mkdtemp(prefix="bench-base-barman-")))
    try:
        data = root / "data"
        endpoint = storage(source.bucket)["endpoint"]
        argv = [
            f"{barman_bin()}/barman-cloud-restore", "--endpoint-url", endpoint,
            f"s3://{source.bucket}/{BARMAN}", "demo", name, str(data),
        ]  # fmt: skip
        started = time.monotonic()
        subprocess.run(argv, env={**os.environ, **keys()}, check=True, capture_output=True, text=True)
        files = time.monotonic() - started
        credentials = " ".join(f"{k}={v}" for k, v in keys().items())
        wal = f"s3://{source.bucket}/{BARMAN}"
        tool = f"{barman_bin()}/barman-cloud-wal-restore"
        command = f"env {credentials} {tool} --endpoint-url {endpoint} {wal} demo %f %p"
        recovery = serve(data, root, command, None, target)
        return {"files": files, "recovery": recovery}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def write_wal(source: Source, wal_mb: int) -> Target:
    """pgbench's transactions (4 clients) until `wal_mb` of WAL follows the backups, then a
    restore point, a few seconds more that the recoveries must leave out, all of it archived
    by every tool."""
    server = source.server
    since = server.sql("select pg_current_wal_lsn()")
    while int(float(server.sql(f"select pg_current_wal_lsn() - '{since}'"))) < wal_mb * MiB:
        server.pgbench("-c", "4", "-j", "2", "-T", "10")
    history = int(server.sql("select count(*) from pgbench_history"))
    server.sql("select pg_create_restore_point('bench-target')")
    server.pgbench("-c", "4", "-j", "2", "-T", "2")
    server.sql("select pg_switch_wal()")
    drained(server)
    return restore_point("bench-target", history)


def ratios(results: dict[str, list[dict[str, Any]]], what: str, label: str) -> None:
    medians = {tool: statistics.median(r[what] for r in runs) for tool, runs in results.items()}
    print(
        f"median {label}: "
        + ", ".join(f"{tool} {seconds:.1f} s" for tool, seconds in medians.items())
        + "; ours is "
        + ", ".join(f"{medians[t] / medians['ours']:.2f}x as fast as {t}" for t in medians if t != "ours")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pitr-wal-mb",
        type=int,
        default=0,
        help="instead: one backup each, then this much WAL, then each restore recovers to a point after it",
    )
    args = parser.parse_args()
    barman_bin()
    tools = {
        "ours": (backup_ours, restore_ours),
        "barman": (backup_barman, restore_barman),
        "pgbackrest": (backup_pgbackrest, restore_pgbackrest),
    }
    results: dict[str, list[dict[str, Any]]] = {tool: [] for tool in tools}
    root = owned(Path(tempfile.mkdtemp(prefix="bench-base-source-")))
    try:
        with new_bucket() as bucket:
            source = Source(root, bucket, args.size_mb)
            try:
                print(f"the databases hold {source.size / MiB:.0f} MiB", flush=True)
                if args.pitr_wal_mb:
                    point_in_time(source, tools, args.pitr_wal_mb, args.repeats, results)
                else:
                    backups_and_restores(source, tools, args.repeats, results)
            finally:
                source.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.pitr_wal_mb:
        ratios(results, "restore", f"recovery to a point {args.pitr_wal_mb} MiB of WAL after the backup")
    else:
        ratios(results, "seconds", "backup")
        ratios(results, "restore", "restore")
    return 0


Tools = dict[str, tuple[Any, Any]]


def backups_and_restores(source: Source, tools: Tools, repeats: int, results: dict[str, list[Any]]) -> None:
    for run in range(repeats):
        for tool in list(tools)[run % 3 :] + list(tools)[: run % 3]:  # each first once
            take, bring_back = tools[tool]
            taken = take(source, run)
            restored = bring_back(source, taken["location"])
            result = {**taken, **restored, "restore": restored["files"] + restored["recovery"]}
            results[tool].append(result)
            print(
                f"run {run + 1} {tool:>6}: backup {taken['seconds']:.1f} s "
                f"({source.size / MiB / taken['seconds']:.1f} MiB/s, "
                f"stored {taken['stored'] / MiB:.0f} MiB); "
                f"restore {result['restore']:.1f} s (files {restored['files']:.1f} s, recovery "
                f"{restored['recovery']:.1f} s)",
                flush=True,
            )


def point_in_time(
    source: Source, tools: Tools, wal_mb: int, repeats: int, results: dict[str, list[Any]]
) -> None:
    taken = {tool: take(source, 0) for tool, (take, _) in tools.items()}
    for tool, backup in taken.items():
        print(f"{tool:>10}: backup {backup['seconds']:.1f} s", flush=True)
    target = write_wal(source, wal_mb)
    print(
        f"{wal_mb} MiB of WAL written and archived; the point: {target.history} pgbench_history rows",
        flush=True,
    )
    for run in range(repeats):
        for tool in list(tools)[run % 3 :] + list(tools)[: run % 3]:
            restored = tools[tool][1](source, taken[tool]["location"], target)
            results[tool].append({**restored, "restore": restored["files"] + restored["recovery"]})
            print(
                f"run {run + 1} {tool:>10}: to the point in {restored['files'] + restored['recovery']:.1f} s "
                f"(files {restored['files']:.1f} s, recovery {restored['recovery']:.1f} s)",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
