"""Benchmark: how fast a recovery replays WAL from the archive, ours against
barman-cloud-wal-restore and pgBackRest.

One PostgreSQL server (this machine's, the Debian package) is backed up first
(`pg_basebackup`), then writes `--wal-mb` of WAL with pgbench, which is archived once by each
tool into the test bed's S3 server: by our `wal-archiver` (as the pods run it) and by
`barman-cloud-wal-archive --zstd`. Each run copies the base backup and recovers it to the
newest point archived (`recovery.signal`): the clock runs from the start until the server
says it is ready, once promoted; the WAL is fetched by

  ours    the `wal-restore` sidecar of our point-in-time instances
          (`python -m services.postgres.wal_restore`: 8 segments ahead, 4 at once) with the
          `restore-wal.sh` our ConfigMap renders as `restore_command`
  barman  `barman-cloud-wal-restore` as the `restore_command` (its documented use; one
          process per file)
  pgbackrest  `pgbackrest archive-get` (Debian's package) in its asynchronous mode with 4
          processes (it fetches ahead), through the S3 server's TLS listener

The tools take turns, `--repeats` times each. What is left of the time beyond the fetching is
the server's own replay, the same for both (`--local` adds runs from a local directory with
`cp`, the floor no archive beats). Also the sidecar's peak memory.

    .venv/bin/python -m e2e.bench.wal_restore [--wal-mb 1024] [--repeats 3] [--workload tpcb|init]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from e2e.bench.wal_archive import (
    RUN_AS,
    SEGMENT,
    MiB,
    PgBackRest,
    Server,
    as_postgres,
    barman_bin,
    drained,
    keys,
    owned,
    peak_memory,
    postgres_bin,
    rendered_archive_script,
    stop_server,
)
from e2e.kube import REPO
from e2e.s3 import new_bucket, s3_settings
from framework.catalog import Catalog
from framework.instance_plan import plan
from framework.plugin import Observed
from services.postgres import PLUGIN
from services.postgres.backup_driver import RECOVERY_MARK


def rendered_restore_script(spool: Path) -> str:
    """restore-wal.sh as our ConfigMap renders it for a point-in-time instance, its spool moved."""
    catalog = Catalog.from_yaml('postgres: {default: "17", versions: {"17": {image: pg:17}}}')
    bootstrap = {"fromBackup": {"name": "b"}, "pointInTime": {}}
    spec = {"instances": 1, "storage": {"size": "1Gi"}, "bootstrap": bootstrap}
    observed = Observed(name="demo", namespace="bench", generation=1, spec=spec, status={})
    config = next(c for c in plan(PLUGIN, observed, catalog, "uid").children if c["kind"] == "ConfigMap")
    return config["data"]["restore-wal.sh"].replace("/var/lib/postgresql/data/wal-restore", str(spool))


class Source:
    """The server whose WAL both archives hold, and its base backup from before that WAL."""

    def __init__(self, root: Path, bucket: str, wal_mb: int, workload: str) -> None:
        self.root, self.bucket = root, bucket
        self.server = Server(root, {})
        self.server.start(workload)
        # Archived twice: a checkpoint must not remove a file the second archiver has not read.
        self.server.sql(f"alter system set wal_keep_size = '{2 * wal_mb + 1024}MB'")
        self.server.sql("select pg_reload_conf()")
        self.base = root / "base"
        as_postgres(
            str(postgres_bin() / "pg_basebackup"), "-h", str(root), "-U", "postgres",
            "-D", str(self.base), "-X", "fetch", "-c", "fast",
        )  # fmt: skip
        self.pgbackrest = PgBackRest(
            owned(root / "pgbackrest"), bucket, self.server.data, root, keys(), parallel=4
        )
        self.pgbackrest.run("stanza-create")
        self.wal_bytes = self.server.write_backlog(wal_mb, workload)
        self.archive_ours()
        self.archive_barman()
        self.archive_again(" ".join(self.pgbackrest.argv("archive-push", "%p")))
        self.server.stop()

    def archive_ours(self) -> None:
        settings = s3_settings()
        spool, keys = owned(self.root / "spool"), owned(self.root / "keys")
        owned(spool / "archived")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            (keys / name).write_text(settings[name])
        script = self.root / "archive-wal.sh"
        script.write_text(rendered_archive_script(spool))
        archive = {
            "s3": {"endpoint": settings["S3_ENDPOINT"], "bucket": self.bucket, "credentialsSecret": "k"},
            "prefix": "ours",
            "parallel": 4,
        }
        env = {
            **os.environ,
            "PGDATA": str(self.server.data),
            "POD_NAME": "bench",
            "STATEFLEET_WAL_ARCHIVE": json.dumps(archive),
            "STATEFLEET_WAL_SPOOL": str(spool),
            "STATEFLEET_WAL_CREDENTIALS": str(keys),
        }
        archiver = subprocess.Popen(
            [sys.executable, "-m", "services.postgres.wal_archiver"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        try:
            self.server.sql(f"alter system set archive_command = 'bash {script} %f'")
            self.server.sql("select pg_reload_conf()")
            drained(self.server)
        finally:
            archiver.terminate()
            archiver.wait(30)

    def archive_barman(self) -> None:
        settings = s3_settings()
        command = (
            f"{barman_bin()}/barman-cloud-wal-archive --endpoint-url {settings['S3_ENDPOINT']} --zstd "
            f"--compression-level 3 s3://{self.bucket}/barman demo %p"
        )
        self.server.env = keys()
        self.archive_again(command)

    def archive_again(self, command: str) -> None:
        """The same WAL again, by `command`: each file goes back to .ready first."""
        self.server.sql("alter system set archive_command = ''")
        self.server.sql("select pg_reload_conf()")
        status = self.server.data / "pg_wal" / "archive_status"
        for done in status.glob("*.done"):
            done.rename(done.with_suffix(".ready"))
        self.server.stop()
        self.server.pg_ctl("start")
        self.server.sql(f"alter system set archive_command = '{command}'")
        self.server.sql("select pg_reload_conf()")
        drained(self.server)


def recover(source: Source, tool: str, run: int) -> dict[str, Any]:
    """A copy of the base backup recovered to the newest point; the seconds its start took."""
    settings = s3_settings()
    root = owned(Path(tempfile.mkdtemp(prefix=f"bench-restore-{tool}-")))
    data = root / "data"
    shutil.copytree(source.base, data, symlinks=True)
    for path in [data, *data.rglob("*")]:
        shutil.chown(path, RUN_AS, RUN_AS)
    data.chmod(0o700)
    env: dict[str, str] = {}
    sidecar = None
    if tool == "ours":
        spool = owned(root / "spool")
        owned(spool / "want")  # the server's user writes its wishes there
        owned(spool / "missing")
        script = root / "restore-wal.sh"
        script.write_text(rendered_restore_script(spool))
        command = f'bash {script} "%f" "%p"'
        (data / RECOVERY_MARK).write_text("bench\n")
        request = {
            "storage": {
                "endpoint": settings["S3_ENDPOINT"],
                "bucket": source.bucket,
                "credentialsSecret": "k",
            },
            "pointInTime": {"archive": f"s3://{source.bucket}/ours"},
        }
        sidecar_env = {
            **os.environ,
            "PGDATA": str(data),
            "STATEFLEET_BACKUP_REQUEST": json.dumps(request),
            "STATEFLEET_WAL_RESTORE_SPOOL": str(spool),
            "AWS_ACCESS_KEY_ID": settings["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": settings["AWS_SECRET_ACCESS_KEY"],
        }
    elif tool == "pgbackrest":
        command = " ".join(source.pgbackrest.argv("archive-get", f"--pg1-path={data}", "%f", '"%p"'))
    elif tool == "barman":
        command = (
            f"{barman_bin()}/barman-cloud-wal-restore --endpoint-url {settings['S3_ENDPOINT']} "
            f"s3://{source.bucket}/barman demo %f %p"
        )
        env = {k: settings[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    else:  # the floor: the same files, decompressed on the local disk
        command = f"cp {source.root}/wal-copy/%f %p"
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(
            f"unix_socket_directories = '{root}'\nhot_standby = off\narchive_mode = off\n"
            f"restore_command = '{command}'\nrecovery_target_timeline = 'latest'\n"
        )
    (data / "recovery.signal").touch()
    shutil.chown(data / "recovery.signal", RUN_AS, RUN_AS)
    started = time.monotonic()
    if tool == "ours":
        # As root, as the archiver bench runs ours: the interpreter lives where the server's
        # user cannot reach; the files it hands over are readable by the server.
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "services.postgres.wal_restore"],
            cwd=REPO,
            env=sidecar_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    failed = None
    try:
        try:
            as_postgres(
                str(postgres_bin() / "pg_ctl"), "-D", str(data), "-l", str(root / "log"),
                "-w", "-t", "3600", "start", env=env,
            )  # fmt: skip
        except subprocess.CalledProcessError as error:
            failed = error
            raise
        # pg_ctl -w counts a server that recovers without hot standby as started: the clock runs
        # until it says it is ready, once promoted.
        while "database system is ready to accept connections" not in (root / "log").read_text():
            if "database system is shut down" in (root / "log").read_text():
                raise RuntimeError(f"{tool}: the server stopped")
            time.sleep(0.05)
        seconds = time.monotonic() - started
        peak = peak_memory(sidecar.pid) if sidecar else None
        try:
            replayed = as_postgres(
                str(postgres_bin() / "psql"), "-h", str(root), "-U", "postgres", "-Atqc",
                "select pg_current_wal_lsn()",
            ).stdout.strip()  # fmt: skip
        except subprocess.CalledProcessError as error:
            failed = error
            raise
    finally:
        if sidecar:
            (data / RECOVERY_MARK).unlink(missing_ok=True)  # the sidecar's cue: recovery ended
            time.sleep(0.5)
            sidecar.terminate()  # idle by now
            sidecar.wait(30)
        stop_server(data)
        log = (root / "log").read_text() if (root / "log").exists() else ""
        if failed is not None:
            print(f"{tool}: the server did not start ({failed.stderr.strip()}):\n{log[-3000:]}", flush=True)
        shutil.rmtree(root, ignore_errors=True)
    restored = log.count("restored log file")
    if "archive recovery complete" not in log:
        raise RuntimeError(f"{tool}: the recovery did not complete:\n{log[-2000:]}")
    return {"tool": tool, "seconds": seconds, "restored": restored, "lsn": replayed, "peak_mib": peak}


def local_copy(source: Source) -> None:
    """The archive's files, decompressed, on the local disk (for the `local` floor)."""
    folder = owned(source.root / "wal-copy")
    for name in os.listdir(source.server.data / "pg_wal"):
        path = source.server.data / "pg_wal" / name
        if path.is_file():
            shutil.copy(path, folder / name)
            shutil.chown(folder / name, RUN_AS, RUN_AS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wal-mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", choices=("init", "tpcb"), default="tpcb")
    parser.add_argument("--local", action="store_true", help="also recover from a local copy (the floor)")
    args = parser.parse_args()
    barman_bin()
    root = owned(Path(tempfile.mkdtemp(prefix="bench-wal-source-")))
    tools = ["ours", "barman", "pgbackrest"] + (["local"] if args.local else [])
    results: dict[str, list[dict[str, Any]]] = {tool: [] for tool in tools}
    try:
        with new_bucket() as bucket:
            source = Source(root, bucket, args.wal_mb, args.workload)
            if args.local:
                local_copy(source)
            wal_mib = source.wal_bytes / MiB
            print(f"{source.wal_bytes // SEGMENT} WAL files ({wal_mib:.0f} MiB) to replay, in each archive")
            for run in range(args.repeats):
                for tool in tools[run % len(tools) :] + tools[: run % len(tools)]:  # each first once
                    result = recover(source, tool, run)
                    results[tool].append(result)
                    peak = f", sidecar peak {result['peak_mib']:.0f} MiB" if result["peak_mib"] else ""
                    print(
                        f"run {run + 1} {tool:>6}: recovered to {result['lsn']} ({result['restored']} files "
                        f"from the archive) in {result['seconds']:.1f} s = "
                        f"{wal_mib / result['seconds']:.1f} MiB/s{peak}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {tool: statistics.median(r["seconds"] for r in results[tool]) for tool in tools}
    print(
        "median recovery time: " + ", ".join(f"{tool} {seconds:.1f} s" for tool, seconds in medians.items())
    )
    for peer in ("barman", "pgbackrest"):
        print(f"ratio {peer}/ours (how many times faster ours is): {medians[peer] / medians['ours']:.2f}x")
    print(f"the sidecar's peak memory: {max(r['peak_mib'] for r in results['ours']):.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
