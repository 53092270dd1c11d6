"""Point-in-time recovery of a Postgres (`backup.point_in_time`): the archive `wal_archiver`
writes, as a Restore reads it, and the recovery settings the new instance's first pod runs
with (the WAL comes from the `wal-restore` sidecar, `wal_restore.py`).

The base backup is the newest completed physical one of the archived instance, in the
archive's storage, on the archive's newest timeline's ancestry, that ended before the target;
from its start the archive must hold every segment through the target. Reachable times are
what the storage recorded when each file was stored: a file's WAL is older than that.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import zstandard

from backup.point_in_time import Archive, BaseBackup, Reach, Unreachable
from backup.sealing import Keyring, open_sealed, refuse_sealed
from backup.storage import S3Spec, delete_keys
from framework.kube import conditions
from framework.spec import RecoveryTarget
from services.postgres.wal_archive import (
    CONDITION,
    HISTORY,
    SEGMENT,
    SEGMENT_SIZE,
    archive_prefix,
    lsn_value,
    missing_segments,
    segment_number,
    segment_on,
    timeline_starts,
    timeline_switches,
)

RESTORE_SPOOL = "/var/lib/postgresql/data/wal-restore"  # on the data volume: a file is moved, not copied


@dataclass(frozen=True)
class ArchiveListing:
    location: str  # s3://bucket/prefix
    files: dict[str, float]  # WAL file name -> when it was stored
    histories: dict[int, str]  # timeline -> its history file


def when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def reach(listing: ArchiveListing, backups: list[BaseBackup], target: RecoveryTarget) -> Reach | Unreachable:
    """The base backup for `target` and how far the archive reaches from it; or what refuses."""
    segments = {n for n in listing.files if len(n) == 24 and SEGMENT.match(n)}
    if not segments:
        return Unreachable("spec.pointInTime.instance", f"{listing.location} holds no WAL")
    timeline = max([int(n[:8], 16) for n in segments] + list(listing.histories))
    if timeline > 1 and timeline not in listing.histories:
        return Unreachable(
            "spec.pointInTime.instance",
            f"{listing.location} lacks the history file of its newest timeline {timeline}",
        )
    history = listing.histories.get(timeline, "")
    starts = timeline_starts(timeline, history)
    chain = {t for t, _ in starts}
    # Where each ancestor timeline ended: a backup of it that ended later holds WAL the newest
    # timeline does not descend from.
    ended = dict(timeline_switches(history))
    usable = sorted(
        (b for b in backups if b.timeline in chain and lsn_value(b.end_lsn) <= ended.get(b.timeline, 2**64)),
        key=lambda b: b.completed_at,
    )
    if not usable:
        return Unreachable(
            "spec.pointInTime.instance",
            f"no completed physical Backup of the instance is in the archive's storage on its timelines "
            f"{sorted(chain)}: take one (a Backup with method physical) before recovering to a point",
        )
    # The newest segment a recovery along the newest timeline reads (an ancestor's segments past
    # its switch, such as an old primary archived, are not on the way).
    newest = max(segment_number(n) for n in segments if segment_on(starts, segment_number(n)) == n)
    oldest = when(usable[0].completed_at)

    def range_text(backup: BaseBackup) -> tuple[str, float, int, list[str]]:
        first = lsn_value(backup.start_lsn) // SEGMENT_SIZE
        missing = missing_segments(segments, timeline, history, newest, first)
        end = (segment_number(missing[0]) if missing else newest + 1) - 1
        stored = [listing.files[n] for n in segments if segment_number(n) == end and int(n[:8], 16) in chain]
        end_time = max(stored) if stored else backup.completed_at
        text = f"reachable from {oldest} to {when(end_time)} (LSN {lsn_text((end + 1) * SEGMENT_SIZE)})"
        return text, end_time, (end + 1) * SEGMENT_SIZE, missing

    eligible = usable
    if target.time is not None:
        moment = target.time.timestamp()
        eligible = [b for b in usable if b.completed_at <= moment]
        if not eligible:
            return Unreachable(
                "spec.pointInTime.time",
                f"{target.time_text()} is before the oldest base backup; {range_text(usable[-1])[0]}",
            )
    elif target.lsn is not None:
        eligible = [b for b in usable if lsn_value(b.end_lsn) <= lsn_value(target.lsn)]
        if not eligible:
            return Unreachable(
                "spec.pointInTime.lsn",
                f"{target.lsn} is before the end of the oldest base backup ({usable[0].end_lsn}); "
                f"{range_text(usable[-1])[0]}",
            )
    # A restore point or a transaction is not placed before replay: from the oldest backup, the
    # whole archive is searched (a time or an LSN: the newest backup before it, the least replay).
    by_name = target.name is not None or target.xid is not None
    chosen = eligible[0] if by_name else eligible[-1]
    text, end_time, end_lsn, missing = range_text(chosen)
    gap = f": {missing[0]} is missing from the archive" if missing else ""
    if target.time is not None and target.time.timestamp() > end_time:
        return Unreachable(
            "spec.pointInTime.time", f"{target.time_text()} is past what the archive holds{gap}; {text}"
        )
    if target.lsn is not None and lsn_value(target.lsn) > end_lsn:
        return Unreachable(
            "spec.pointInTime.lsn", f"{target.lsn} is past what the archive holds{gap}; {text}"
        )
    if target.immediate:
        last = (lsn_value(chosen.end_lsn) - 1) // SEGMENT_SIZE
        short = [n for n in missing if segment_number(n) <= last]
        if short:
            return Unreachable(
                "spec.pointInTime.immediate",
                f"{short[0]} is missing from the archive: Backup {chosen.name} never becomes "
                f"consistent; {text}",
            )
    elif missing and target.time is None and target.lsn is None:
        # Where a name, a transaction or the newest point lies is not known before replay: a
        # gap would end the recovery short of it, silently.
        return Unreachable(
            "spec.pointInTime",
            f"the archive has a gap{gap}: name a time or an LSN before it; {text}",
        )
    return Reach(
        backup=chosen.name,
        archive=listing.location,
        reachable_from=oldest,
        reachable_to=text.split(" to ", 1)[1],
        target=target.describe(),
    )


def recovery_settings(target: RecoveryTarget) -> list[str]:
    """postgresql.auto.conf lines of the first pod's recovery: WAL from the sidecar, the
    newest timeline, promoted at the target (none: at the end of the archive; immediate: as
    soon as the base backup is consistent, on its own timeline)."""
    if target.immediate:
        # The base backup's own timeline: a later one need not descend from it.
        return [
            'restore_command = \'bash /etc/statefleet/restore-wal.sh "%f" "%p"\'',
            "recovery_target = 'immediate'",
            "recovery_target_timeline = 'current'",
            "recovery_target_action = 'promote'",
        ]
    lines = [
        'restore_command = \'bash /etc/statefleet/restore-wal.sh "%f" "%p"\'',
        "recovery_target_timeline = 'latest'",
        "recovery_target_action = 'promote'",
    ]
    if target.time is not None:
        lines.append(f"recovery_target_time = '{target.time.isoformat()}'")
    elif target.lsn is not None:
        lines.append(f"recovery_target_lsn = '{target.lsn}'")
    elif target.name is not None:
        lines.append(f"recovery_target_name = '{target.name.replace(chr(39), chr(39) * 2)}'")
    elif target.xid is not None:
        lines.append(f"recovery_target_xid = '{target.xid}'")
    if target.time is not None or target.lsn is not None or target.xid is not None:
        lines.append(f"recovery_target_inclusive = {'on' if target.inclusive else 'off'}")
    return lines


def not_needed(names: list[str], kept: list[BaseBackup]) -> list[str]:
    """The WAL files no recovery from a kept base backup reads: segments (and their
    `.partial`s and backup labels) before the oldest one's start, on every timeline. History
    files stay (a recovery reads every timeline's); nothing goes when no backup is kept."""
    if not kept:
        return []
    first = min(lsn_value(b.start_lsn) for b in kept) // SEGMENT_SIZE
    return sorted(n for n in names if SEGMENT.match(n) and segment_number(n[:24]) < first)


def file_name(key: str) -> str | None:
    """The WAL file a key of the archive holds (None: not one, e.g. SYSTEM)."""
    base = key.rsplit("/", 1)[-1]
    if not base.endswith(".zst"):
        return None
    name = base[: -len(".zst")]
    return name if SEGMENT.match(name) or HISTORY.match(name) else None


def list_archive(s3_api: Any, s3: S3Spec, prefix: str) -> dict[str, tuple[str, float]]:
    """Every WAL file of the archive: name -> (key, when stored)."""
    found: dict[str, tuple[str, float]] = {}
    pages = s3_api.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix + "/")
    for page in pages:
        for item in page.get("Contents") or []:
            name = file_name(item["Key"])
            if name:
                found[name] = (item["Key"], item["LastModified"].timestamp())
    return found


class WalDamaged(Exception):
    """An archived WAL file whose content is not what the archiver stored."""


def read_wal(s3_api: Any, bucket: str, key: str, keyring: Keyring | None = None) -> bytes:
    """An archived WAL file, opened (a storage that encrypts: `keyring`; then nothing unsealed
    is taken), decompressed and checked against the sha256 it was stored with."""
    response = s3_api.get_object(Bucket=bucket, Key=key)
    body = response["Body"].read()
    if keyring is not None:
        body = open_sealed(keyring, key, body)
    else:
        refuse_sealed(key, body)
    data = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    expected = (response.get("Metadata") or {}).get("wal-sha256")
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise WalDamaged(f"{key}: the sha256 of its WAL is not the one it was stored with")
    return data


class PostgresArchive(Archive):
    def prefix(self, storage_prefix: str, namespace: str, instance: str) -> str:
        return archive_prefix(storage_prefix, namespace, instance)

    def storage_of(self, instance_spec: dict[str, Any]) -> str | None:
        return (instance_spec.get("walArchive") or {}).get("storage")

    def not_archiving(self, instance: dict[str, Any]) -> str | None:
        found = conditions.find((instance.get("status") or {}).get("conditions"), CONDITION)
        if found is None:
            return f"no {CONDITION} condition yet"
        if found.get("status") != "True":
            return f"{CONDITION} {found.get('status')} {found.get('reason')}: {found.get('message')}"
        return None

    def observe(self, s3_api: Any, s3: S3Spec, prefix: str, keyring: Keyring | None = None) -> ArchiveListing:
        found = list_archive(s3_api, s3, prefix)
        histories = {
            int(name[:8], 16): read_wal(s3_api, s3.bucket, key, keyring).decode()
            for name, (key, _) in found.items()
            if HISTORY.match(name)
        }
        files = {name: stored for name, (_, stored) in found.items()}
        return ArchiveListing(f"s3://{s3.bucket}/{prefix}", files, histories)

    def reach(self, observed: Any, backups: list[BaseBackup], target: RecoveryTarget) -> Reach | Unreachable:
        return reach(observed, backups, target)

    def prune(self, s3_api: Any, s3: S3Spec, prefix: str, kept: list[BaseBackup]) -> int:
        found = list_archive(s3_api, s3, prefix)
        return delete_keys(s3_api, s3, [found[name][0] for name in not_needed(list(found), kept)])


ARCHIVE = PostgresArchive()
