"""The `wal-restore` sidecar of a Postgres whose pod takes a physical backup and replays WAL
after it (a point-in-time Restore; a backup whose WAL its instance archived; in a new instance
or in place) (`python -m services.postgres.wal_restore`): while that pod's server recovers, it
hands the server the WAL files it asks for from the archive, and fetches the next ones ahead.

The server's `restore_command` (`restore-wal.sh`) leaves a wish, `<spool>/want/<file>`, and
waits; the sidecar puts the file, decompressed and checked against its sha256, at
`<spool>/<file>` (on the data volume: the script moves it into pg_wal without a copy), or
says `<spool>/missing/<file>` when the archive does not have it. A storage that fails is tried
again and again: a file never reported missing for an error, since the server would take
that for the end of the archive and stop recovering early.

Once recovery ended (start.sh removes the recovery mark) and at every later start of the pod,
it has nothing to do and idles as a shell waiting for its signal to stop.

Configuration: PGDATA; POD_NAME; STATEFLEET_BACKUP_REQUEST (the bootstrap Secret's request:
`storage`, `pointInTime.archive`, and the storage's sealing keys when it encrypts: every file
is then opened, and one that does not open is never handed to the server);
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from backup.sealing import REQUEST_FIELD, keyring_of
from backup.storage import S3Spec, s3_client
from services.postgres.backup_driver import RECOVERY_MARK
from services.postgres.point_in_time import RESTORE_SPOOL, list_archive, read_wal
from services.postgres.wal_archive import SEGMENT, segment_number, segment_on, timeline_starts
from services.postgres.wal_archiver import JsonLines

AHEAD = 8  # segments fetched before the server asks (128 MiB on the volume at most)
PARALLEL = 4
POLL = 0.02
RELIST_EVERY = 2.0  # seconds: a file not listed is looked for again at most this often
IDLE = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"

log = logging.getLogger("statefleet.wal_restore")


class Restorer:
    def __init__(self, pgdata: Path, spool: Path, request: dict[str, Any], keys: tuple[str, str]) -> None:
        self.pgdata, self.spool = pgdata, spool
        self.spec = S3Spec.model_validate(request["storage"])
        archive = str(request["pointInTime"]["archive"])
        self.prefix = archive.removeprefix(f"s3://{self.spec.bucket}/")
        self.client = s3_client(self.spec, *keys)
        self.keyring = keyring_of(self.spec, os.environ, request.get(REQUEST_FIELD))
        self.listing: dict[str, str] = {}
        self.listed_at = 0.0
        self.starts: list[tuple[int, int]] = [(1, 0)]
        self.pool = ThreadPoolExecutor(PARALLEL)
        self.busy: dict[str, Future[None]] = {}
        self.placed: set[str] = set()  # files put in the spool, until the server took them
        self.highest = -1  # the newest segment the server asked for or took
        for folder in (spool, spool / "want", spool / "missing"):
            folder.mkdir(parents=True, exist_ok=True)

    def recovering(self) -> bool:
        return (self.pgdata / RECOVERY_MARK).exists()

    def relist(self) -> None:
        found = list_archive(self.client, self.spec, self.prefix)
        self.listing = {name: key for name, (key, _) in found.items()}
        self.listed_at = time.monotonic()
        timelines = [int(n[:8], 16) for n in self.listing if SEGMENT.match(n)] or [1]
        newest = max(timelines)
        history = f"{newest:08X}.history"
        text = self.fetch_bytes(history).decode() if history in self.listing else ""
        self.starts = timeline_starts(newest, text)

    def fetch_bytes(self, name: str) -> bytes:
        return read_wal(self.client, self.spec.bucket, self.listing[name], self.keyring)

    def fetch(self, name: str) -> None:
        data = self.fetch_bytes(name)
        partial = self.spool / f".{name}.partial"
        partial.write_bytes(data)
        if os.geteuid() == 0:  # run beside a server of another user (a benchmark): it writes there
            owner = self.spool.stat()
            os.chown(partial, owner.st_uid, owner.st_gid)
        partial.rename(self.spool / name)
        self.placed.add(name)

    def start(self, name: str) -> None:
        if name not in self.busy and not (self.spool / name).exists():
            self.busy[name] = self.pool.submit(self.fetch, name)

    def answer(self, name: str) -> None:
        """One wish of the server's."""
        if len(name) == 24 and SEGMENT.match(name):
            self.highest = max(self.highest, segment_number(name))
        if name not in self.listing and time.monotonic() - self.listed_at >= RELIST_EVERY:
            self.relist()
        if name in self.listing:
            self.start(name)
        elif time.monotonic() - self.listed_at < RELIST_EVERY:  # listed since it was asked
            (self.spool / "missing" / name).touch()
            (self.spool / "want" / name).unlink(missing_ok=True)

    def taken(self) -> None:
        """Files the server took (moved away): what it reads next is past them; files fetched
        ahead that it went past are never asked for and go."""
        for name in list(self.placed):
            if not (self.spool / name).exists():
                self.placed.discard(name)
                if len(name) == 24 and SEGMENT.match(name):
                    self.highest = max(self.highest, segment_number(name))
        for name in list(self.placed):
            if len(name) == 24 and SEGMENT.match(name) and segment_number(name) < self.highest:
                (self.spool / name).unlink(missing_ok=True)
                self.placed.discard(name)

    def ahead(self) -> None:
        """The segments the server will ask for next, along the newest timeline."""
        if self.highest < 0:
            return
        ready = sum(1 for name in self.placed if SEGMENT.match(name))
        for number in range(self.highest + 1, self.highest + 1 + AHEAD):
            if ready + len(self.busy) >= AHEAD:
                return
            name = segment_on(self.starts, number)
            if name in self.listing and name not in self.busy and not (self.spool / name).exists():
                self.start(name)

    def settle(self) -> None:
        for name, future in list(self.busy.items()):
            if not future.done():
                continue
            del self.busy[name]
            error = future.exception()
            if error is not None:  # asked again on the next pass while it is wanted
                self.say(f"fetching {name} from s3://{self.spec.bucket}/{self.prefix} failed: {error}")

    def say(self, message: str) -> None:
        """A failure, in the log and where restore-wal.sh tells the server's log; then a pause."""
        log.warning(message)
        with contextlib.suppress(FileNotFoundError):  # the recovery ended meanwhile
            (self.spool / "last-error").write_text(message + "\n")
        time.sleep(1)

    def run(self) -> None:
        self.relist()
        log.info("serving WAL from s3://%s/%s: %d files", self.spec.bucket, self.prefix, len(self.listing))
        while self.recovering():
            try:
                for wish in sorted(os.scandir(self.spool / "want"), key=lambda e: e.name):
                    self.answer(wish.name)
                self.taken()
                self.ahead()
            except Exception as error:  # the storage: tried again, never a file called missing
                self.say(f"reading s3://{self.spec.bucket}/{self.prefix} failed: {error}")
            self.settle()
            time.sleep(POLL)
        log.info("the recovery ended")


def idle() -> None:
    """Nothing to serve: a shell that stops at once when asked (no interpreter held)."""
    os.execvp("bash", ["bash", "-c", IDLE])


def main() -> int:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    pgdata = Path(os.environ["PGDATA"])
    if not (pgdata / RECOVERY_MARK).exists():
        idle()
    request = json.loads(os.environ["STATEFLEET_BACKUP_REQUEST"])
    keys = (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    with contextlib.suppress(KeyboardInterrupt):
        spool = Path(os.environ.get("STATEFLEET_WAL_RESTORE_SPOOL", RESTORE_SPOOL))
        Restorer(pgdata, spool, request, keys).run()
    idle()
    return 0


if __name__ == "__main__":
    sys.exit(main())
