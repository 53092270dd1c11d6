"""Continuous WAL archiving: the pure half (names, keys, what to upload next, the condition).

Every server of an instance with `spec.walArchive` runs with `archive_mode = always` and a
`wal-archiver` sidecar (`wal_archiver.py`). PostgreSQL marks each finished WAL file ready
(`pg_wal/archive_status/<file>.ready`); the sidecar uploads ready files several at a time,
compressed and with their sha256, and leaves a word in a spool directory both containers
share; `archive_command` (`archive-wal.sh`) waits for that word, so PostgreSQL recycles a file
only once it is stored. No interpreter starts per segment.

A standby archives too (`always`), a while after its file is ready and only when the primary
has not: WAL that a primary lost before it could archive it is then still archived by the
standby that received it, so a failover leaves no gap. A promoted standby archives the new
timeline's history file and the old timeline's last segment as `.partial`, as PostgreSQL names
them. Nothing already stored is overwritten with other content.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import Field, ValidationError

from backup import in_place
from backup.storage import BackupStorageSpec, object_key
from framework.kube.conditions import Condition
from framework.kube.model import ApiModel, StatusModel, describe_validation_error

ARCHIVER_PORT = 9180
SPOOL = "/var/run/statefleet-wal"  # the emptyDir the server and the archiver share
ARCHIVED_DIR = "archived"  # the archiver's word to archive_command: <file> is stored
CONDITION = "ContinuousArchiving"
# A standby leaves a file to the primary this long before it looks whether it is stored.
STANDBY_DELAY = 15.0
# The server's archive_command waits this long for the archiver's word, then fails (and
# PostgreSQL tries the file again): a bound on how long a stuck archiver holds it unseen.
COMMAND_WAIT = 60
# A key of the instance's ConfigMap, read afresh by the archivers and archive_command (the
# kubelet updates a mounted ConfigMap in place: holding or releasing restarts no pod).
HOLD_KEY = "wal-archive-hold"

SEGMENT = re.compile(r"^[0-9A-F]{24}(\.partial|\.[0-9A-F]{8}\.backup)?$")
HISTORY = re.compile(r"^[0-9A-F]{8}\.history$")


class WalArchiveSpec(ApiModel):
    storage: str = Field(
        min_length=1,
        max_length=253,
        description="The BackupStorage (same namespace) every WAL file goes to, under "
        "<prefix>/<namespace>/postgres/<name>/wal/.",
    )
    archive_timeout_seconds: int = Field(
        default=5,
        ge=1,
        le=3600,
        description="A WAL file is closed and archived at least this often while there are writes: a "
        "bound on the commits lost with every volume of the instance (archive_timeout).",
    )
    parallel: int = Field(default=4, ge=1, le=16, description="WAL files uploading at once, per server.")


def is_wal_file(name: str) -> bool:
    return bool(SEGMENT.match(name) or HISTORY.match(name))


def archive_prefix(storage_prefix: str, namespace: str, instance: str) -> str:
    """Where an instance's WAL goes: beside its backups (`backup.manifest.backup_location`)."""
    return object_key(storage_prefix, namespace, "postgres", instance, "wal")


def wal_key(prefix: str, name: str) -> str:
    """A segment (or its `.partial`, or a backup label) under its timeline and log number, as
    PostgreSQL's own archive layouts group them; history files at the top."""
    if HISTORY.match(name):
        return object_key(prefix, f"{name}.zst")
    return object_key(prefix, name[:16], f"{name}.zst")


def system_key(prefix: str) -> str:
    """The database system the archive belongs to: a server of another never writes there."""
    return object_key(prefix, "SYSTEM")


def upload_order(name: str) -> tuple[int, str]:
    """Timeline history files first (a restore needs them to choose its timeline), then WAL
    oldest first, as PostgreSQL's archiver orders them."""
    return (0 if HISTORY.match(name) else 1, name)


def due(
    ready: dict[str, float],
    now: float,
    standby: bool,
    busy: frozenset[str],
    slots: int,
) -> list[str]:
    """The ready files to start uploading now: `ready` maps each to when it was first seen
    ready; `busy` are on their way; at most `slots` more start. A standby leaves each file to
    its primary for STANDBY_DELAY first."""
    waiting = [
        name
        for name in ready
        if name not in busy and is_wal_file(name) and (not standby or now - ready[name] >= STANDBY_DELAY)
    ]
    return sorted(waiting, key=upload_order)[: max(slots, 0)]


class ArchiverReport(StatusModel):
    """What an archiver says of itself (`GET /status` on ARCHIVER_PORT); also the instance's
    `status.walArchive`, from its primary's archiver."""

    pod: str | None = None
    role: str | None = Field(default=None, description="primary or standby, as the archiver saw its server")
    system: str | None = Field(default=None, description="the database system identifier")
    prefix: str | None = Field(default=None, description="s3://bucket/key where the WAL goes")
    last_archived_wal: str | None = None
    last_archived_at: str | None = None
    last_failed_wal: str | None = None
    last_failed_at: str | None = None
    last_error: str | None = None
    failing: bool | None = Field(default=None, description="the last attempt failed")
    pending: int | None = Field(default=None, description="WAL files ready on the volume, not yet stored")
    pending_bytes: int | None = Field(default=None, json_schema_extra={"format": "int64"})
    oldest_pending_seconds: float | None = Field(
        default=None, description="how long the oldest of them has waited: how far archiving is behind"
    )
    archived: int | None = Field(default=None, description="files stored since the archiver started")
    held: str | None = Field(
        default=None, description="why it stores nothing now (a restore over the instance under way)"
    )


def archiving_condition(primary: str, report: ArchiverReport | None, primary_ready: bool) -> Condition:
    """ContinuousArchiving: True while the primary's archiver stores what its server makes,
    False while it fails, Unknown while it cannot be asked."""
    if report is None:  # not known: the server's own archiving is not told by its absence
        if not primary_ready:
            return Condition(CONDITION, None, "PrimaryNotReady", f"waiting for primary {primary}")
        return Condition(
            CONDITION, None, "ArchiverNotAnswering", f"the WAL archiver of {primary} does not answer"
        )
    behind = (
        f"{report.pending or 0} WAL files ({(report.pending_bytes or 0) / 2**20:.0f} MiB) wait on the volume"
    )
    if report.held:
        return Condition(
            CONDITION, False, "ArchivingHeld", f"{primary} holds its WAL: {report.held}; {behind}"
        )
    if report.failing:
        return Condition(
            CONDITION,
            False,
            "ArchiveFailing",
            f"archiving {report.last_failed_wal or 'WAL'} from {primary} failed: "
            f"{report.last_error}; {behind}",
        )
    last = report.last_archived_wal
    message = f"{primary} archived {last} at {report.last_archived_at}" if last else f"{primary} archives"
    return Condition(CONDITION, True, "Archiving", f"{message}; {behind}")


def archive_hold(request: dict[str, str] | None, record: dict[str, Any] | None) -> str:
    """Why the instance's servers archive nothing now ("": they archive). While a physical
    restore over the instance is under way (stopping, restored and being checked, rolled back),
    its WAL stays on the volumes: the recovered server promotes itself to a new timeline, and a
    timeline abandoned by a rollback, once in the archive, would be followed by every later
    recovery to the latest point and collide with the instance's own next promotion."""
    if request is None and not in_place.under_way(record):
        return ""
    asked = request or record or {}
    return (
        f"a restore over the instance (Restore {asked.get('restore')}, token {asked.get('token')}) is under "
        "way: the WAL made meanwhile is archived once the restore is kept, never if it is rolled back"
    )


def archiver_context(
    spec: WalArchiveSpec | None,
    storage: dict[str, Any] | None,
    namespace: str,
    instance: str,
    hold: str = "",
) -> dict[str, Any] | None:
    """What the templates need to run the archiver (None: no archiving). A storage that does not
    exist, or is invalid, still gets the archiver, which reports why it cannot archive: the
    server keeps its WAL meanwhile, as PostgreSQL does when archiving fails."""
    if spec is None:
        return None
    context: dict[str, Any] = {
        # Each upload holds a file, its compressed copy and the client's buffers: 189-238 MiB
        # measured at 4 uploads at once (docs/benchmarks.md).
        "memory_limit_mib": 160 + 64 * spec.parallel,
        "timeout": spec.archive_timeout_seconds,
        "port": ARCHIVER_PORT,
        "wait": COMMAND_WAIT,
        "settings": None,
        "error": None,
        "credentials_secret": None,
        "keys_secret": None,  # the storage encrypts: its sealing keys, as a volume
        "hold": hold,
    }
    if storage is None:
        context["error"] = f"spec.walArchive.storage: BackupStorage {spec.storage} does not exist"
        return context
    try:
        s3 = BackupStorageSpec.model_validate(storage.get("spec") or {}).s3
    except ValidationError as error:
        context["error"] = f"BackupStorage {spec.storage}: {describe_validation_error(error)}"
        return context
    settings = {
        "s3": s3.model_dump(by_alias=True, exclude_none=True),
        "prefix": archive_prefix(s3.prefix, namespace, instance),
        "parallel": spec.parallel,
    }
    context.update(
        settings=json.dumps(settings, sort_keys=True),
        credentials_secret=s3.credentials_secret,
        keys_secret=s3.encryption.keys_secret if s3.encryption else None,
    )
    return context


SEGMENT_SIZE = 16 * 2**20  # the server's default (initdb --wal-segsize): the only size used here
SEGMENTS_PER_LOG = 2**32 // SEGMENT_SIZE


def lsn_value(lsn: str) -> int:
    """`0/5000060` as a number."""
    high, low = lsn.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def segment_name(timeline: int, segment: int) -> str:
    return f"{timeline:08X}{segment // SEGMENTS_PER_LOG:08X}{segment % SEGMENTS_PER_LOG:08X}"


def segment_number(name: str) -> int:
    return int(name[8:16], 16) * SEGMENTS_PER_LOG + int(name[16:24], 16)


def timeline_switches(history: str) -> list[tuple[int, int]]:
    """A timeline history file's lines as (parent timeline, where it ended), oldest first."""
    switches = []
    for line in history.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not line.lstrip().startswith("#"):
            switches.append((int(fields[0]), lsn_value(fields[1])))
    return switches


def timeline_starts(timeline: int, history: str) -> list[tuple[int, int]]:
    """(timeline, its first segment) along `timeline`'s ancestry, oldest first: each begins in
    the segment where its parent ended. `history`: the timeline's history file ('' for 1)."""
    switches = timeline_switches(history)
    chain = [parent for parent, _ in switches] + [timeline]
    return [(chain[0], 0)] + [(chain[i + 1], ended // SEGMENT_SIZE) for i, (_, ended) in enumerate(switches)]


def segment_on(starts: list[tuple[int, int]], segment: int) -> str:
    """The name a recovery reads segment number `segment` by: from the newest timeline that
    had begun by then (at a switch, the new timeline's segment, not the old one's `.partial`)."""
    return segment_name([t for t, first in starts if first <= segment][-1], segment)


def missing_segments(
    archived: set[str], timeline: int, history: str, last: int, first: int | None = None
) -> list[str]:
    """The segments a recovery to segment `last` of `timeline` would ask for and not find,
    from segment `first` (None: the oldest archived on this timeline's ancestry)."""
    starts = timeline_starts(timeline, history)
    ours = {t for t, _ in starts}
    numbers = [
        segment_number(n) for n in archived if len(n) == 24 and SEGMENT.match(n) and int(n[:8], 16) in ours
    ]
    if first is None and not numbers:
        return [segment_name(timeline, last)]
    begin = min(numbers) if first is None else first
    return [segment_on(starts, s) for s in range(begin, last + 1) if segment_on(starts, s) not in archived]
