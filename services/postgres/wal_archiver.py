"""The `wal-archiver` sidecar of every Postgres server with `spec.walArchive`
(`python -m services.postgres.wal_archiver`): it uploads the WAL files its server marks ready
and tells `archive_command` when each is stored (see `wal_archive.py` for the whole scheme).

One long-lived process per server: no interpreter, client or connection starts per segment,
and several files upload at once while PostgreSQL's archiver waits on the oldest. It runs as a
native sidecar, so at a pod's end it stops only after the server did, having stored what the
server's last checkpoint left ready.

Configuration: PGDATA; POD_NAME; STATEFLEET_WAL_ARCHIVE (JSON: `s3`, the BackupStorage's
settings, `prefix`, `parallel`) or STATEFLEET_WAL_ERROR (why it cannot archive, e.g. the
storage does not exist); the storage's keys as files in CREDENTIALS (a Secret volume, so new
keys reach a running archiver); with `s3.encryption`, the sealing keys as files in KEYS (the
keys Secret's volume, read for each file as the credentials are) and each file sealed with the
entry `s3.encryption.key` names; the ConfigMap's `wal-archive-hold` under STATEFLEET_CONFIG,
read every second (non-empty: nothing is stored, see `wal_archive.archive_hold`). It answers
`GET /status` (JSON, `ArchiverReport`) and `GET /metrics` (Prometheus) on ARCHIVER_PORT.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import struct
import sys
import time
from pathlib import Path
from typing import Any

import zstandard
from botocore.exceptions import BotoCoreError, ClientError
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from backup.sealing import Keyring, secret_source
from backup.storage import CREDENTIAL_KEYS, S3Spec, StorageError, explain, put_bytes, s3_client
from framework.kube.times import now_text
from services.postgres.wal_archive import (
    ARCHIVED_DIR,
    ARCHIVER_PORT,
    HISTORY,
    HOLD_KEY,
    SPOOL,
    ArchiverReport,
    due,
    system_key,
    wal_key,
)

CREDENTIALS = Path(os.environ.get("STATEFLEET_WAL_CREDENTIALS", "/etc/statefleet-wal-credentials"))
KEYS = Path(os.environ.get("STATEFLEET_WAL_KEYS", "/etc/statefleet-wal-keys"))
HOLD = Path(os.environ.get("STATEFLEET_CONFIG", "/etc/statefleet")) / HOLD_KEY  # the ConfigMap's key
POLL = 0.05  # seconds between looks at archive_status: a segment's wait before its upload starts
RETRY_MAX = 30.0  # seconds: failures are retried sooner at first, then every RETRY_MAX
# A file stored stays `.ready` until archive_command has seen the word: it is not looked at
# again for this long (past it, the word is left again: the server may have restarted and asks
# anew).
STORED_QUIET = 10.0
COMPRESSION_LEVEL = 3
MEASURE_EVERY = 1.0  # seconds between counts of what waits (thousands of files after an outage)


class WalFileGone(Exception):
    """The server removed the file (an orphan .ready, as pg_rewind leaves them)."""


log = logging.getLogger("statefleet.wal_archiver")


def system_identifier(pgdata: Path) -> str:
    """The database system identifier: the first field of `global/pg_control`."""
    with (pgdata / "global" / "pg_control").open("rb") as control:
        return str(struct.unpack("<Q", control.read(8))[0])


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.archived = Counter("statefleet_wal_archive_archived", "WAL files stored", registry=self.registry)
        self.archived_bytes = Counter(
            "statefleet_wal_archive_archived_bytes",
            "WAL bytes stored (before compression)",
            registry=self.registry,
        )
        self.uploaded_bytes = Counter(
            "statefleet_wal_archive_uploaded_bytes",
            "bytes sent to the storage (compressed)",
            registry=self.registry,
        )
        self.failures = Counter("statefleet_wal_archive_failures", "failed attempts", registry=self.registry)
        self.pending = Gauge(
            "statefleet_wal_archive_pending_files", "WAL files waiting", registry=self.registry
        )
        self.pending_bytes = Gauge(
            "statefleet_wal_archive_pending_bytes", "bytes of WAL waiting", registry=self.registry
        )
        self.lag = Gauge(
            "statefleet_wal_archive_lag_seconds",
            "how long the oldest waiting file has waited",
            registry=self.registry,
        )
        self.last_archived = Gauge(
            "statefleet_wal_archive_last_archived_timestamp_seconds",
            "when the last file was stored",
            registry=self.registry,
        )
        self.failing = Gauge(
            "statefleet_wal_archive_failing", "1 while the last attempt failed", registry=self.registry
        )
        self.held = Gauge(
            "statefleet_wal_archive_held",
            "1 while a restore over the instance holds the WAL on the volume",
            registry=self.registry,
        )


class Archiver:
    def __init__(
        self, pgdata: Path, spool: Path, pod: str, settings: dict[str, Any] | None, error: str | None
    ):
        self.pgdata, self.spool, self.pod = pgdata, spool, pod
        self.status_dir = pgdata / "pg_wal" / "archive_status"
        self.spec = S3Spec.model_validate(settings["s3"]) if settings else None
        self.prefix = settings["prefix"] if settings else ""
        self.parallel = int(settings.get("parallel", 4)) if settings else 1
        self.config_error = error
        self.client: Any = None
        self.keys: list[str] = []
        self.system_checked = False
        self.busy: dict[str, asyncio.Task[None]] = {}
        self.stored: dict[str, float] = {}  # file -> when it was stored (while still .ready)
        self.failed: dict[str, str] = {}  # ready files whose last attempt failed -> why
        self.measured_at = 0.0
        self.held_read_at = 0.0
        self.retry_at = 0.0
        self.retry_wait = 1.0
        self.report = ArchiverReport(pod=pod, archived=0)
        self.metrics = Metrics()
        self.stopping = asyncio.Event()
        (spool / ARCHIVED_DIR).mkdir(parents=True, exist_ok=True)
        # Words of an earlier life of this container: the server asks anew for each file.
        for word in (spool / ARCHIVED_DIR).iterdir():
            word.unlink(missing_ok=True)
        if self.spec:
            self.report.prefix = f"s3://{self.spec.bucket}/{self.prefix}"

    # --- the storage (blocking: run in threads) -------------------------------------------
    def _client(self) -> Any:
        """A client with the keys the Secret holds now (read each time: a few bytes, and a key
        revoked and replaced reaches the archiver as soon as the kubelet updates the volume)."""
        keys = []
        for key in CREDENTIAL_KEYS:
            path = CREDENTIALS / key
            if not path.exists():
                raise StorageError("CredentialsMissing", f"the storage's credentials Secret lacks {key}")
            keys.append(path.read_text().strip())
        if self.client is None or keys != self.keys:
            assert self.spec is not None
            self.client, self.keys = s3_client(self.spec, *keys), keys
        return self.client

    def _check_system(self) -> None:
        """The archive is this database system's, or empty: never mix another's WAL in."""
        assert self.spec is not None
        client, ours = self._client(), system_identifier(self.pgdata)
        self.report.system = ours
        key = system_key(self.prefix)
        try:
            theirs = client.get_object(Bucket=self.spec.bucket, Key=key)["Body"].read().decode().strip()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                raise
            put_bytes(client, self.spec, key, f"{ours}\n".encode())
            return
        if theirs != ours:
            raise StorageError(
                "ArchiveOfAnotherSystem",
                f"s3://{self.spec.bucket}/{key} says the archive belongs to database system {theirs}; this "
                f"server's is {ours}: give this instance another storage or prefix (spec.walArchive.storage)",
            )

    def _store(self, name: str) -> tuple[int, int]:
        """Stores one WAL file unless it is there already (stored by another server of the
        instance, or before a restart). Returns (bytes read, bytes sent)."""
        assert self.spec is not None
        if not self.system_checked:
            self._check_system()
            self.system_checked = True
        client, key = self._client(), wal_key(self.prefix, name)
        try:
            stored = client.head_object(Bucket=self.spec.bucket, Key=key).get("Metadata", {})
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        else:
            # Stored already. A segment is not compared: a standby's copy may differ from its
            # primary's past the last record (seen after timeline switches). A history file is:
            # another one of that name is another server's promotion to the same timeline.
            if (
                HISTORY.match(name)
                and stored.get("wal-sha256") != hashlib.sha256(self._read(name)).hexdigest()
            ):
                raise StorageError(
                    "ArchiveConflict",
                    f"s3://{self.spec.bucket}/{key} holds another history for timeline {name[:8]}: "
                    "two servers were promoted to it; this server's WAL on it is not archived",
                )
            return 0, 0
        data = self._read(name)
        body = zstandard.ZstdCompressor(level=COMPRESSION_LEVEL).compress(data)
        if self.spec.encryption is not None:  # compressed first: sealed bytes do not compress
            body = self._keyring().seal(key, body)
        metadata = {"wal-sha256": hashlib.sha256(data).hexdigest(), "wal-size": str(len(data))}
        put_bytes(client, self.spec, key, body, metadata=metadata)
        return len(data), len(body)

    def _keyring(self) -> Keyring:
        """The sealing keys the Secret holds now (read for each file, as the credentials: a key
        added and named reaches the archiver with the kubelet's update of the volume)."""
        assert self.spec is not None
        assert self.spec.encryption is not None
        return Keyring.from_directory(KEYS, self.spec.encryption.key, secret_source(self.spec.encryption))

    def _read(self, name: str) -> bytes:
        try:
            return (self.pgdata / "pg_wal" / name).read_bytes()
        except FileNotFoundError as error:
            raise WalFileGone(name) from error

    # --- the loop -----------------------------------------------------------------------
    def ready(self) -> dict[str, float]:
        """Ready WAL files, with when each became ready (its .ready file's time)."""
        found = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.status_dir):
                if entry.name.endswith(".ready"):
                    with contextlib.suppress(FileNotFoundError):
                        found[entry.name.removesuffix(".ready")] = entry.stat().st_mtime
        return found

    def standby(self) -> bool:
        return (self.pgdata / "standby.signal").exists()

    async def run(self) -> None:
        while not self.stopping.is_set():
            ready = self.ready()
            now = time.time()
            if now - self.measured_at >= MEASURE_EVERY:
                self._measure(ready, now)
            self._forget(ready)
            if now - self.held_read_at >= MEASURE_EVERY:
                self._read_hold(now)
            if self.report.held:
                pass  # the files wait on the volume (see wal_archive.archive_hold)
            elif self.config_error:
                self._failed(None, self.config_error)
            elif now >= self.retry_at:
                self.stored = {name: at for name, at in self.stored.items() if name in ready}
                quiet = {name for name, at in self.stored.items() if now - at < STORED_QUIET}
                slots = self.parallel - len(self.busy)
                for name in due(ready, now, self.standby(), frozenset(self.busy) | quiet, slots):
                    self.busy[name] = asyncio.create_task(self._archive(name))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), POLL if not self.config_error else 5.0)
        if self.busy:
            await asyncio.wait(self.busy.values(), timeout=20)

    async def _archive(self, name: str) -> None:
        try:
            read, sent = await asyncio.to_thread(self._store, name)
        except WalFileGone:
            log.info("%s is gone from pg_wal: not archived", name)
            self.stored[name] = time.time()  # not asked about again while its .ready stays
            return
        except (BotoCoreError, ClientError, StorageError, OSError) as error:
            failure = explain(error, self.spec.bucket if self.spec else "")
            self.system_checked = self.system_checked and failure.reason != "ArchiveOfAnotherSystem"
            self._failed(name, f"{failure.reason}: {failure}")
            return
        finally:
            self.busy.pop(name, None)
        if (self.status_dir / f"{name}.ready").exists():  # else the server is done with it
            (self.spool / ARCHIVED_DIR / name).touch()
        self.stored[name] = time.time()
        self.retry_wait = 1.0
        self.failed.pop(name, None)
        if self.report.failing and not self.failed:
            (self.spool / "last-error").unlink(missing_ok=True)
        self.report.failing = bool(self.failed)
        if self.report.last_archived_wal is None or name > self.report.last_archived_wal:
            self.report.last_archived_wal = name
        self.report.last_archived_at = now_text()
        self.report.archived = (self.report.archived or 0) + 1
        self.metrics.archived.inc()
        self.metrics.archived_bytes.inc(read)
        self.metrics.uploaded_bytes.inc(sent)
        self.metrics.last_archived.set(time.time())
        self.metrics.failing.set(int(self.report.failing))

    def _failed(self, name: str | None, error: str) -> None:
        if not self.report.failing or self.report.last_error != error:
            log.warning("cannot archive %s: %s", name or "WAL", error)
        if name:
            self.failed[name] = error
        self.report.failing = True
        self.report.last_failed_wal = name or self.report.last_failed_wal
        self.report.last_failed_at = now_text()
        self.report.last_error = error
        self.metrics.failures.inc()
        self.metrics.failing.set(1)
        (self.spool / "last-error").write_text(error + "\n")
        self.retry_at = time.time() + self.retry_wait
        self.retry_wait = min(self.retry_wait * 2, RETRY_MAX)

    def _read_hold(self, now: float) -> None:
        self.held_read_at = now
        try:
            held = HOLD.read_text().strip() or None
        except OSError:
            held = None
        if held and held != self.report.held:
            log.warning("holding the WAL on the volume: %s", held)
        elif self.report.held and not held:
            log.info("the hold is lifted: archiving again")
        self.report.held = held
        self.metrics.held.set(int(bool(held)))

    def _forget(self, ready: dict[str, float]) -> None:
        """What the server is done with: failures of files no longer ready (stored by another
        server, or gone), and the words of files it is done with (archive-wal.sh leaves them)."""
        for name in [name for name in self.failed if name not in ready]:
            del self.failed[name]
        if self.report.failing and not self.failed and not self.config_error:
            self.report.failing = False
            self.metrics.failing.set(0)
            (self.spool / "last-error").unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            for word in os.scandir(self.spool / ARCHIVED_DIR):
                if word.name not in ready and word.name not in self.busy:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(word.path)

    def _measure(self, ready: dict[str, float], now: float) -> None:
        self.measured_at = now
        sizes = 0
        for name in ready:
            with contextlib.suppress(FileNotFoundError):
                sizes += (self.pgdata / "pg_wal" / name).stat().st_size
        self.report.role = "standby" if self.standby() else "primary"
        self.report.pending = len(ready)
        self.report.pending_bytes = sizes
        self.report.oldest_pending_seconds = round(now - min(ready.values()), 1) if ready else 0.0
        self.metrics.pending.set(len(ready))
        self.metrics.pending_bytes.set(sizes)
        self.metrics.lag.set(self.report.oldest_pending_seconds)

    # --- what it says of itself ---------------------------------------------------------
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            path = request.split()[1].decode() if len(request.split()) > 1 else "/"
            if path == "/metrics":
                body, kind = generate_latest(self.metrics.registry), "text/plain; version=0.0.4"
            elif path == "/status":
                body, kind = json.dumps(self.report.to_api()).encode(), "application/json"
            else:
                body, kind = b"not found\n", "text/plain"
            status = "404 Not Found" if body == b"not found\n" else "200 OK"
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (OSError, TimeoutError, IndexError):
            pass
        finally:
            writer.close()


async def main_async() -> None:
    settings = (
        json.loads(os.environ["STATEFLEET_WAL_ARCHIVE"]) if os.environ.get("STATEFLEET_WAL_ARCHIVE") else None
    )
    archiver = Archiver(
        Path(os.environ["PGDATA"]),
        Path(os.environ.get("STATEFLEET_WAL_SPOOL", SPOOL)),
        os.environ.get("POD_NAME", ""),
        settings,
        os.environ.get("STATEFLEET_WAL_ERROR") or (None if settings else "no storage configured"),
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, archiver.stopping.set)
    server = await asyncio.start_server(archiver.serve, host="0.0.0.0", port=ARCHIVER_PORT)
    async with server:
        await archiver.run()


class JsonLines(logging.Formatter):
    """One JSON object per line, naming the pod, as the operator's own logs do."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "timestamp": now_text(),
                "level": record.levelname.lower(),
                "message": record.getMessage(),
                "object": {"kind": "Pod", "name": os.environ.get("POD_NAME", "")},
            }
        )


def main() -> int:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    asyncio.run(main_async())
    return 0


if __name__ == "__main__":
    sys.exit(main())
