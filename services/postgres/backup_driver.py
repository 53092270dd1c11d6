"""The Postgres backup driver: pg_basebackup (physical) and pg_dump (logical), streamed.

Runs inside the backup Job with the PostgreSQL 17 client, which reads every server version
the catalog offers. The connection comes from the environment (PGHOST, PGPORT, PGUSER,
PGPASSWORD, PGSSLMODE; REPLICATION_USER and REPLICATION_PASSWORD for the physical kind).

Logical: the roles (pg_dumpall --globals-only, without the instance's own system roles) and
one pg_dump custom-format archive per database. Physical: one tar of the data directory,
restored by a new instance's first pod; its WAL is in the instance's continuous archive when
that is in the backup's storage (pg_basebackup -X none, each segment read back), in the tar
otherwise (-X fetch).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from botocore.exceptions import ClientError

from backup.driver import (
    BootstrapsPhysical,
    CheckFailed,
    ReplacesInPlace,
    ReplacesOnline,
    Sink,
    Source,
    Taken,
    WalArchive,
)
from backup.manifest import Manifest, PhysicalPosition
from backup.storage import CHUNK
from framework.spec import RecoveryTarget
from services.postgres import backup_in_place, backup_replace
from services.postgres.backup_connection import SETTLE_SECONDS, connect, unreachable
from services.postgres.point_in_time import RESTORE_SPOOL, WalDamaged, read_wal, recovery_settings
from services.postgres.wal_archive import SEGMENT_SIZE, lsn_value, segment_name, wal_key

# Roles every instance creates for itself: a restore keeps the target's own.
SYSTEM_ROLES = frozenset({"postgres", "streaming_replica"})
ROLE_STATEMENT = re.compile(r'^(?:CREATE|ALTER|COMMENT ON) ROLE ("(?:[^"]|"")*"|[^\s;]+)')


class CommandFailed(Exception):
    pass


def filter_globals(sql: str, skip: frozenset[str] = SYSTEM_ROLES) -> str:
    """pg_dumpall's globals without the statements that create or change the `skip` roles."""
    kept = []
    for line in sql.splitlines():
        match = ROLE_STATEMENT.match(line)
        if match:
            name = match.group(1)
            name = name[1:-1].replace('""', '"') if name.startswith('"') else name
            if name in skip:
                continue
        kept.append(line)
    return "\n".join(kept) + "\n"


START = re.compile(r"start point: ([0-9A-F]+/[0-9A-F]+) on timeline (\d+)")
END = re.compile(r"end point: ([0-9A-F]+/[0-9A-F]+)")


HISTORY_FIELD = re.compile(
    r"^(START WAL LOCATION|STOP WAL LOCATION|START TIMELINE|LABEL): (\S+)", re.MULTILINE
)


def parse_backup_history(text: str) -> PhysicalPosition:
    """The positions in a backup history file (`<segment>.<offset>.backup`), which the server
    writes at the end of every backup: pg_basebackup reports them only when it takes WAL."""
    fields = dict(HISTORY_FIELD.findall(text))
    missing = [f for f in ("START WAL LOCATION", "STOP WAL LOCATION", "START TIMELINE") if f not in fields]
    if missing:
        raise CommandFailed(f"the backup history file lacks {', '.join(missing)}: {text[:500]}")
    return PhysicalPosition(
        timeline=int(fields["START TIMELINE"]),
        startLsn=fields["START WAL LOCATION"],
        endLsn=fields["STOP WAL LOCATION"],
    )


def backup_history(label: str) -> tuple[str, str]:
    """The name and text of the history file the server wrote for the backup labelled `label`
    (it stays in pg_wal until the next backup ends)."""
    with connect() as conn:
        rows = conn.execute(
            "SELECT name, pg_read_file('pg_wal/' || name, 0, 65536, true) FROM pg_ls_waldir()"
            " WHERE name LIKE '%.backup'"
        ).fetchall()
    for name, text in rows:
        if text and f"\nLABEL: {label}\n" in text:
            return name, text
    raise CommandFailed(f"the server holds no backup history file labelled {label} (did it fail over?)")


def parse_basebackup_log(text: str) -> PhysicalPosition:
    """The timeline and WAL positions pg_basebackup --verbose reports."""
    start, end = START.search(text), END.search(text)
    if not start or not end:
        raise CommandFailed(f"pg_basebackup did not report its WAL positions: {text[-500:]}")
    return PhysicalPosition(timeline=int(start.group(2)), startLsn=start.group(1), endLsn=end.group(1))


class ChunkReader(io.RawIOBase):
    """A file over an iterator of chunks, for tarfile's stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.pending = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            try:
                self.pending = next(self.chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self.pending))
        buffer[:size] = self.pending[:size]
        self.pending = self.pending[size:]
        return size


class Feeder:
    """Writes chunks to a process's stdin from a thread of its own, while the caller reads its
    output. What stopped it early (a checksum mismatch) kills the process and comes back from
    `join`; a process that stops reading is not a failure here (its exit code tells)."""

    def __init__(self, process: subprocess.Popen[bytes], chunks: Iterator[bytes]) -> None:
        self.process, self.chunks = process, chunks
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()

    def _feed(self) -> None:
        assert self.process.stdin is not None
        try:
            for data in self.chunks:
                self.process.stdin.write(data)
        except BrokenPipeError:
            pass
        except BaseException as error:
            self.failure = error
            self.process.kill()
        finally:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()

    def join(self) -> BaseException | None:
        self.thread.join()
        return self.failure


@contextlib.contextmanager
def decompressed(chunks: Iterator[bytes]) -> Iterator[Any]:
    """`zstd -dc` over the chunks, as a file; raises what failed (a checksum, zstd)."""
    process = subprocess.Popen(["zstd", "-dc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout is not None
    feeder = Feeder(process, chunks)
    finished = False
    try:
        yield process.stdout
        while process.stdout.read(CHUNK):  # what follows the tar's end: zstd then ends on its own
            pass
        finished = True
    finally:
        if not finished:
            process.kill()
        process.stdout.close()
        failure = feeder.join()
        code = process.wait()
        if failure:  # the cause (a checksum, the storage), not what it did to zstd or tar
            raise failure
    if code != 0:
        raise CommandFailed(f"zstd -dc exited with {code}: the archive is damaged")


class CommandOutput:
    """A command's stdout as chunks; raises `CommandFailed` with its stderr if it fails. Its
    stderr goes to a file (never a pipe nobody reads) and is kept in `log` once it ended. A
    command that could not reach the server, before it wrote anything, is started again for
    up to `SETTLE_SECONDS` (the instance's Service may lead nowhere for a few seconds)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv, self.env, self.log = argv, env, ""

    def __iter__(self) -> Iterator[bytes]:
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            wrote = False
            with tempfile.TemporaryFile() as errors:
                process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=errors, env=self.env)
                assert process.stdout is not None
                try:
                    while data := process.stdout.read(CHUNK):
                        wrote = True
                        yield data
                finally:
                    process.stdout.close()
                    code = process.wait()
                    errors.seek(0)
                    self.log = errors.read().decode(errors="replace")
            if code == 0:
                return
            if wrote or not unreachable(self.log) or time.monotonic() > deadline:
                raise CommandFailed(f"{self.argv[0]} exited with {code}: {self.log.strip()[-1500:]}")
            time.sleep(1)


def run_streaming_in(argv: list[str], chunks: Iterator[bytes], env: dict[str, str] | None = None) -> str:
    """Feeds `chunks` to the command's stdin; returns its output, raises `CommandFailed`."""
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, env=env
        )
        assert process.stdin is not None
        broken = False
        try:
            for data in chunks:
                process.stdin.write(data)
        except BrokenPipeError:
            broken = True  # it stopped reading: its exit code and output say why
        finally:
            try:
                process.stdin.close()
            except BrokenPipeError:
                broken = True
        code = process.wait()
        output.seek(0)
        text = output.read().decode(errors="replace")
    if code != 0 or broken:
        raise CommandFailed(f"{argv[0]} exited with {code}: {text.strip()[-1500:]}")
    return text


CLIENT_MAJOR = 17  # the image's pg_dump and pg_restore
NEWER_SETTINGS = (b"SET transaction_timeout = 0;\n",)  # what pg_restore 17 sets, unknown before 17


class ScriptFilter:
    """Drops from a pg_restore script the settings an older server refuses, outside the data of
    COPY blocks (a row is never touched)."""

    def __init__(self) -> None:
        self.in_copy = False

    def __call__(self, line: bytes) -> bytes | None:
        if self.in_copy:
            if line in (b"\\.\n", b"\\."):
                self.in_copy = False
            return line
        if line.startswith(b"COPY ") and line.rstrip().endswith(b"FROM stdin;"):
            self.in_copy = True
            return line
        return None if line in NEWER_SETTINGS else line


def run_piped(
    first: list[str], keep: Callable[[bytes], bytes | None], second: list[str], chunks: Iterator[bytes]
) -> None:
    """`chunks | first | keep | second`, streamed; raises what failed first (a checksum, a command)."""
    with tempfile.TemporaryFile() as first_errors, tempfile.TemporaryFile() as output:
        producer = subprocess.Popen(first, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=first_errors)
        consumer = subprocess.Popen(second, stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT)
        assert producer.stdout
        assert consumer.stdin
        feeder = Feeder(producer, chunks)
        try:
            for line in producer.stdout:
                kept = keep(line)
                if kept is not None:
                    consumer.stdin.write(kept)
        except BrokenPipeError:
            producer.kill()
        finally:
            with contextlib.suppress(BrokenPipeError):
                consumer.stdin.close()
            failure = feeder.join()
            first_code, second_code = producer.wait(), consumer.wait()
        if failure:
            raise failure
        first_errors.seek(0)
        output.seek(0)
        if first_code != 0:
            raise CommandFailed(
                f"{first[0]} exited with {first_code}: {first_errors.read().decode(errors='replace')[-1500:]}"
            )
        if second_code != 0:
            raise CommandFailed(
                f"{second[0]} exited with {second_code}: {output.read().decode(errors='replace')[-1500:]}"
            )


def databases(connectable_only: bool = True) -> list[str]:
    """The instance's databases, without templates (and without those closed to sessions, such
    as a replacing restore's set-aside copies, unless asked)."""
    where = "NOT datistemplate" + (" AND datallowconn" if connectable_only else "")
    with connect() as conn:
        rows = conn.execute(f"SELECT datname FROM pg_database WHERE {where} ORDER BY datname").fetchall()
    return [r[0] for r in rows]


def roles() -> list[str]:
    with connect() as conn:
        return [r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname !~ '^pg_'")]


def server_version() -> str:
    with connect() as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0]).split()[0]


def system_identifier() -> str:
    """What makes a cluster itself: a physical copy keeps it, a logical one does not."""
    with connect() as conn:
        return str(conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0])


def restore_database(name: str, chunks: Iterator[bytes], older: bool, clean: bool) -> None:
    """One pg_dump archive: a database of its own is created by pg_restore; the postgres
    database is restored into, in one transaction (over what it holds, with `clean`)."""
    into_postgres = name == "postgres"
    cleaning = ["--clean", "--if-exists"] if clean and into_postgres else []
    if older:
        # pg_restore 17 sets parameters an older server does not know: its script goes to psql
        # without them.
        restore = ["pg_restore", "--file", "-", *cleaning] + ([] if into_postgres else ["--create"])
        psql = ["psql", "--no-psqlrc", "--quiet", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres"]
        psql += ["--single-transaction"] if into_postgres else []
        run_piped(restore, ScriptFilter(), psql, chunks)
    elif into_postgres:
        argv = ["pg_restore", "--exit-on-error", "--single-transaction", *cleaning, "--dbname", "postgres"]
        run_streaming_in(argv, chunks)
    else:
        run_streaming_in(["pg_restore", "--exit-on-error", "--create", "--dbname", "postgres"], chunks)


BASE_TAR = "base.tar.zst"
PHYSICAL_COMPRESSION = "server-zstd:level=1,workers=2"
RESTORED_MARK = "statefleet-restored"  # start.sh starts a server that has it as the new primary
RECOVERY_MARK = "statefleet-recovery"  # ... after a recovery to a point (the wal-restore sidecar's cue)


class WalNotArchived(Exception):
    pass


def backup_segments(position: PhysicalPosition) -> list[str]:
    """The WAL segments a physical backup needs to become consistent: from its start to its end."""
    first = lsn_value(position.start_lsn) // SEGMENT_SIZE
    last = (lsn_value(position.end_lsn) - 1) // SEGMENT_SIZE
    return [segment_name(position.timeline, n) for n in range(first, max(first, last) + 1)]


def check_archived(archive: WalArchive, position: PhysicalPosition, history: str, wait: float = 60.0) -> int:
    """Every segment the backup needs, and its history file, are in the archive and read back
    as they were stored (the server said so before it answered; a storage slow to show them
    gets `wait` seconds). Returns how many segments."""
    names = backup_segments(position)
    deadline = time.monotonic() + wait
    for name in [*names, history]:
        key = wal_key(archive.prefix, name)
        while True:
            try:
                data = read_wal(archive.client, archive.storage.bucket, key, archive.keyring)
                break
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                    raise
                if time.monotonic() > deadline:
                    raise WalNotArchived(
                        f"{name}, which the backup needs, is not in the archive {archive.location}: "
                        "the instance's ContinuousArchiving condition says why"
                    ) from error
                time.sleep(1)
        if name != history and len(data) != SEGMENT_SIZE:
            raise WalDamaged(f"{key}: {len(data)} bytes of WAL, not {SEGMENT_SIZE}")
    return len(names)


def replication_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PGUSER"] = os.environ["REPLICATION_USER"]
    env["PGPASSWORD"] = os.environ["REPLICATION_PASSWORD"]
    return env


class PostgresDriver(ReplacesOnline, BootstrapsPhysical, ReplacesInPlace):
    """Logical backups restored over a running instance by a Job; physical ones as a new
    instance's data, or over a running instance stopped for it."""

    methods = ("logical", "physical")

    def backup(self, method: str, sink: Sink, archive: WalArchive | None = None) -> Taken:
        version = server_version()
        if method == "physical":
            # With the instance's archive in this storage, the WAL stays there: the server
            # answers only once it archived the last segment the backup needs, and no WAL is
            # fetched from pg_wal (which a long backup could outlast). Then each segment is read
            # back and checked. Without: the tar carries its WAL.
            wal = ["-X", "none"] if archive else ["-X", "fetch"]
            label = f"statefleet-{uuid.uuid4().hex}"  # finds its history file
            argv = ["pg_basebackup", "-D", "-", "-Ft", *wal, "-c", "fast", "--no-manifest", "-v", "-l", label]
            # Compressed by the server (zstd, fast level, two threads): a third of the bytes
            # through the network, the storage and its disks, as fast as sending them raw.
            argv += ["--compress", PHYSICAL_COMPRESSION]
            identifier = system_identifier()
            tar = CommandOutput(argv, replication_env())
            sink.write_object(BASE_TAR, iter(tar))
            details: dict[str, Any] = {"systemIdentifier": identifier, "compression": "zstd"}
            if archive:
                history, text = backup_history(label)
                position = parse_backup_history(text)
                details["walSegments"] = check_archived(archive, position, history)
                position = position.model_copy(update={"archive": archive.location})
            else:
                position = parse_basebackup_log(tar.log)
            return Taken(version, physical=position, details=details)
        roles = b"".join(CommandOutput(["pg_dumpall", "--globals-only", "--no-tablespaces"]))
        sink.write_object("globals.sql", iter([filter_globals(roles.decode()).encode()]))
        listed = []
        for index, name in enumerate(databases()):
            object_name = f"db/{index:04d}.dump"
            stored = sink.write_object(object_name, iter(CommandOutput(["pg_dump", "-Fc", "--dbname", name])))
            listed.append({"name": name, "object": object_name, "size": stored.size})
        return Taken(version, details={"databases": listed})

    def restore(self, manifest: Manifest, source: Source, replace: str | None = None) -> dict[str, Any]:
        if manifest.method != "logical":
            raise CommandFailed(
                f"a {manifest.method} backup is restored by a new instance's first pod, not by a Job"
            )
        if replace and self.roll_back(replace).get("committed"):  # an earlier attempt's
            raise backup_replace.ReplaceRefused(f"the restore {replace} already replaced the databases")
        wanted = [d["name"] for d in manifest.details.get("databases", [])]
        present = set(databases(connectable_only=False))
        clashes = sorted(name for name in wanted if name != "postgres" and name in present)
        globals_sql = b"".join(source("globals.sql")).decode()
        if replace:
            backup_replace.begin(replace, wanted)
            # The roles the instance has keep their passwords: the applications' Secrets hold them.
            globals_sql = filter_globals(globals_sql, SYSTEM_ROLES | frozenset(roles()))
        elif clashes:
            raise CommandFailed(
                f"the target already has the databases {', '.join(clashes)}: restore into a new instance, "
                "or set spec.target.replace"
            )
        output = run_streaming_in(
            ["psql", "--no-psqlrc", "--quiet", "--dbname", "postgres", "-f", "-"],
            iter([globals_sql.encode()]),
        )
        role_errors = [line for line in output.splitlines() if "ERROR:" in line]
        older = int(server_version().split(".")[0]) < CLIENT_MAJOR
        # The postgres database last, in one transaction, over what it holds: the one restored
        # in place (a rollback does not undo it).
        for database in sorted(manifest.details.get("databases", []), key=lambda d: d["name"] == "postgres"):
            restore_database(database["name"], source(database["object"]), older, clean=bool(replace))
        result: dict[str, Any] = {"databases": wanted, "roleErrors": role_errors[:5]}
        if replace:
            result["replaced"] = clashes
            result["untouched"] = sorted(present - set(wanted))
        return result

    def roll_back(self, replace: str) -> dict[str, Any]:
        return backup_replace.roll_back(replace)

    def commit(self, replace: str) -> dict[str, Any]:
        return backup_replace.commit(replace)

    def bootstrap_wanted(self) -> str | None:
        """Why this pod must not take a physical backup's data (None: it must): only the first
        pod of a cluster that never had a primary, with an empty data directory."""
        pgdata = Path(os.environ["PGDATA"])
        if os.environ.get("POD_NAME") != os.environ.get("BOOTSTRAP_PRIMARY"):
            return "not the first pod: it clones the primary"
        if Path("/etc/statefleet/cluster-state").read_text().strip() != "new":
            return "the cluster has had a primary"
        if (pgdata / "PG_VERSION").exists():
            return f"{pgdata} holds a cluster already"
        return None

    def bootstrap(
        self, manifest: Manifest, source: Source, point_in_time: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A physical backup into this pod's empty data directory: extracted aside, then moved
        into place only once the whole tar was read and its checksum matched. With a point in
        time, set to recover to it (start.sh runs the recovery, the wal-restore sidecar serves
        the WAL)."""
        pgdata = Path(os.environ["PGDATA"])
        partial = pgdata.with_name(pgdata.name + ".restoring")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=0o700)
        try:
            with decompressed(source(BASE_TAR)) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
                tar.extractall(partial, filter="data")
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)  # a retry must not find the volume full
            raise
        (partial / RESTORED_MARK).write_text(f"{manifest.namespace}/{manifest.backup}\n")
        (partial / "standby.signal").unlink(missing_ok=True)
        if point_in_time is not None:
            # What an earlier recovery left in the spool (a `missing` word) would mislead this one.
            shutil.rmtree(pgdata.parent / Path(RESTORE_SPOOL).name, ignore_errors=True)
            target = RecoveryTarget.model_validate(point_in_time["target"])
            settings = "\n".join(["# statefleet recovery", *recovery_settings(target)]) + "\n"
            with (partial / "postgresql.auto.conf").open("a") as auto:
                auto.write(settings)
            (partial / RECOVERY_MARK).write_text(json.dumps(point_in_time) + "\n")
            (partial / "recovery.signal").touch()
        partial.chmod(0o700)
        if pgdata.exists():
            shutil.rmtree(pgdata)
        partial.rename(pgdata)
        restored = {"restored": str(pgdata), "systemIdentifier": manifest.details.get("systemIdentifier")}
        if point_in_time is not None:
            restored["pointInTime"] = point_in_time
        return restored

    def replace_in_place(
        self,
        mode: str,
        token: str,
        fetch: Callable[[], tuple[Manifest, Source]],
        point_in_time: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        def take(manifest: Manifest, source: Source) -> dict[str, Any]:
            return self.bootstrap(manifest, source, point_in_time)

        return backup_in_place.replace_in_place(mode, token, fetch, take)

    def commit_in_place(self, token: str) -> dict[str, Any]:
        return backup_in_place.commit_in_place(token)

    def check(self, manifest: Manifest, query: str | None, database: str | None) -> dict[str, Any]:
        identifier = system_identifier()
        expected = manifest.details.get("systemIdentifier")
        if manifest.method == "physical" and expected and identifier != expected:
            raise CheckFailed(
                f"the instance does not hold this backup's cluster: system identifier {identifier}, "
                f"the backup's {expected}"
            )
        rows: dict[str, int] = {}
        for name in databases():
            with connect(name) as conn:
                tables = conn.execute(
                    "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables"
                    " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
                ).fetchall()
                # Every row read: a table that cannot be read fails the check.
                rows[name] = sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for (t,) in tables)
        result: dict[str, Any] = {"rows": rows, "systemIdentifier": identifier}
        if query:
            with connect(database or "postgres") as conn:
                try:
                    found = conn.execute(query).fetchone()
                except psycopg.Error as error:
                    raise CheckFailed(f"spec.verify.query failed: {error}") from error
            value = found[0] if found else None
            if not value:
                raise CheckFailed(f"spec.verify.query returned {value!r}: it must return true or non-zero")
            result["query"] = str(value)
        return result


DRIVER = PostgresDriver()
