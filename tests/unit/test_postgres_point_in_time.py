"""Point-in-time recovery of a Postgres: which base backup, how far the archive reaches (and
what it refuses before anything is made), the recovery settings, and what the templates and
the bootstrap make of it."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from backup.point_in_time import BaseBackup, Reach, Unreachable
from framework.instance_plan import plan
from framework.spec import RecoveryTarget
from services.postgres import PLUGIN
from services.postgres.backup_driver import DRIVER, RECOVERY_MARK
from services.postgres.point_in_time import ArchiveListing, file_name, not_needed, reach, recovery_settings
from services.postgres.wal_archive import SEGMENT_SIZE, segment_name
from tests.unit.manifests import physical_manifest
from tests.unit.test_postgres_bootstrap import FILES, compressed_tar, source_of
from tests.unit.test_postgres_wal_archive import CATALOG, observed

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC).timestamp()
HISTORY_2 = "1\t0/5000000\tno recovery target specified\n"  # timeline 2 began in segment 5


def listing(segments: dict[str, float], histories: dict[int, str] | None = None) -> ArchiveListing:
    files = dict(segments)
    for timeline in histories or {}:
        files[f"{timeline:08X}.history"] = T0
    return ArchiveListing("s3://b/apps/postgres/demo/wal", files, histories or {})


def archive(last: int = 9, skip: int | None = None) -> ArchiveListing:
    """Segments 1 to `last`, one a minute from T0; from 5 on timeline 2 (with 1's .partial)."""
    segments = {}
    for number in range(1, last + 1):
        if number != skip:
            segments[segment_name(1 if number < 5 else 2, number)] = T0 + 60 * number
    segments[segment_name(1, 5) + ".partial"] = T0 + 300
    return listing(segments, {2: HISTORY_2})


def base(name: str, minute: int, timeline: int = 1) -> BaseBackup:
    start = f"0/{minute * SEGMENT_SIZE:X}"
    return BaseBackup(name, T0 + 60 * minute + 1, timeline, start, f"0/{minute * SEGMENT_SIZE + 0x100:X}")


BACKUPS = [base("monday", 1), base("tuesday", 3), base("wednesday", 6, timeline=2)]


def at(minute: float) -> RecoveryTarget:
    return RecoveryTarget(time=datetime.fromtimestamp(T0 + 60 * minute, UTC))


def test_the_newest_backup_before_a_time_is_chosen_across_a_timeline_switch() -> None:
    chosen = reach(archive(), BACKUPS, at(4.5))
    assert isinstance(chosen, Reach)
    assert chosen.backup == "tuesday"  # wednesday ended after 4:30
    assert chosen.reachable_from == "2026-12-04T12:01:01Z"
    assert chosen.reachable_to == "2026-12-04T12:09:00Z (LSN 0/A000000)"
    newest = reach(archive(), BACKUPS, RecoveryTarget())
    assert isinstance(newest, Reach)
    assert newest.backup == "wednesday"
    assert newest.target == "the newest point archived"


def test_an_lsn_picks_the_newest_backup_that_ended_before_it() -> None:
    chosen = reach(archive(), BACKUPS, RecoveryTarget(lsn="0/3000200"))
    assert isinstance(chosen, Reach)
    assert chosen.backup == "tuesday"


@pytest.mark.parametrize(
    ("target", "field", "words"),
    [
        (
            at(0.5),
            "spec.pointInTime.time",
            "is before the oldest base backup; reachable from 2026-12-04T12:01:01Z",
        ),
        (at(9.5), "spec.pointInTime.time", "is past what the archive holds; reachable from"),
        (
            RecoveryTarget(lsn="0/100"),
            "spec.pointInTime.lsn",
            "before the end of the oldest base backup (0/1000100)",
        ),
        (RecoveryTarget(lsn="0/B000000"), "spec.pointInTime.lsn", "is past what the archive holds"),
    ],
)
def test_a_target_out_of_reach_is_refused_naming_the_field_and_the_range(
    target: RecoveryTarget, field: str, words: str
) -> None:
    refused = reach(archive(), BACKUPS, target)
    assert isinstance(refused, Unreachable)
    assert refused.field == field
    assert words in refused.message
    assert "to 2026-12-04T12:09:00Z" in refused.message


def test_a_gap_bounds_what_is_reachable_and_refuses_a_target_that_needs_what_follows() -> None:
    gapped = archive(skip=7)
    before = reach(gapped, BACKUPS, at(5.5))
    assert isinstance(before, Reach)
    assert before.reachable_to == "2026-12-04T12:06:00Z (LSN 0/7000000)"
    past = reach(gapped, BACKUPS, at(8))
    assert isinstance(past, Unreachable)
    assert f"{segment_name(2, 7)} is missing from the archive" in past.message
    newest = reach(gapped, BACKUPS, RecoveryTarget())
    assert isinstance(newest, Unreachable)
    assert newest.field == "spec.pointInTime"
    assert "name a time or an LSN before it" in newest.message
    # A gap before the chosen backup's start does not matter.
    assert isinstance(reach(archive(skip=2), BACKUPS, at(4.5)), Reach)


def test_no_backup_or_no_wal_is_refused() -> None:
    none = reach(archive(), [], RecoveryTarget())
    assert isinstance(none, Unreachable)
    assert "no completed physical Backup" in none.message
    empty = reach(listing({}), BACKUPS, RecoveryTarget())
    assert isinstance(empty, Unreachable)
    assert "holds no WAL" in empty.message
    lost = reach(listing({segment_name(2, 6): T0}), BACKUPS, RecoveryTarget())
    assert isinstance(lost, Unreachable)
    assert "lacks the history file of its newest timeline 2" in lost.message


def test_a_backup_on_a_timeline_the_newest_does_not_descend_from_is_not_used() -> None:
    forked = [base("other", 6, timeline=3)]
    assert isinstance(reach(archive(), forked, RecoveryTarget()), Unreachable)


def test_recovery_settings_say_the_target_once_and_quote_a_name() -> None:
    time_target = RecoveryTarget(time=datetime(2026, 12, 4, 12, 0, 30, tzinfo=UTC), inclusive=False)
    assert recovery_settings(time_target) == [
        'restore_command = \'bash /etc/statefleet/restore-wal.sh "%f" "%p"\'',
        "recovery_target_timeline = 'latest'",
        "recovery_target_action = 'promote'",
        "recovery_target_time = '2026-12-04T12:00:30+00:00'",
        "recovery_target_inclusive = off",
    ]
    assert (
        recovery_settings(RecoveryTarget(name="before 'drop'"))[-1]
        == "recovery_target_name = 'before ''drop'''"
    )
    assert recovery_settings(RecoveryTarget(xid=1234))[-2:] == [
        "recovery_target_xid = '1234'",
        "recovery_target_inclusive = on",
    ]
    assert not [
        line for line in recovery_settings(RecoveryTarget()) if line.startswith("recovery_target_time ")
    ]


def test_at_most_one_target_is_refused_at_admission() -> None:
    rule = RecoveryTarget.model_json_schema()["x-kubernetes-validations"][0]["rule"]
    assert "has(self.time)" in rule
    assert "<= 1" in rule
    with pytest.raises(ValueError, match="timezone"):
        RecoveryTarget.model_validate({"time": "2026-12-04T12:00:00"})


def test_archive_keys_name_their_wal_files() -> None:
    assert file_name("p/wal/0000000100000000/000000010000000000000003.zst") == "000000010000000000000003"
    assert file_name("p/wal/00000002.history.zst") == "00000002.history"
    assert file_name("p/wal/SYSTEM") is None


def test_the_bootstrap_sets_the_recovery_and_its_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pgdata = tmp_path / "pgdata"
    monkeypatch.setenv("PGDATA", str(pgdata))
    files = {**FILES, "postgresql.auto.conf": b"# Do not edit this file manually!\n"}
    point = {"archive": "s3://b/apps/postgres/demo/wal", "target": {"lsn": "0/3000200", "inclusive": True}}
    manifest = physical_manifest()
    result = DRIVER.bootstrap(manifest, source_of(compressed_tar(files)), point)
    assert result["pointInTime"] == point
    auto = (pgdata / "postgresql.auto.conf").read_text()
    assert "recovery_target_lsn = '0/3000200'" in auto
    assert auto.startswith("# Do not edit")
    assert (pgdata / "recovery.signal").exists()
    assert "0/3000200" in (pgdata / RECOVERY_MARK).read_text()


def rendered(spec: dict[str, Any]) -> dict[str, Any]:
    planned = plan(PLUGIN, observed(spec), CATALOG, "uid-1")
    return {child["kind"]: child for child in planned.children}


def test_a_point_in_time_instance_runs_the_wal_restore_sidecar_after_the_restore_and_a_checked_script() -> (
    None
):
    bootstrap = {"fromBackup": {"name": "nightly"}, "pointInTime": {"time": "2026-12-04T12:00:00Z"}}
    children = rendered({"instances": 2, "storage": {"size": "1Gi"}, "bootstrap": bootstrap})
    pod = children["StatefulsetRollout"]["spec"]["statefulSet"]["template"]["spec"]
    names = [c["name"] for c in pod["initContainers"]]
    assert names == ["restore", "wal-restore"]
    assert pod["initContainers"][1]["restartPolicy"] == "Always"
    script = children["ConfigMap"]["data"]["restore-wal.sh"]
    checked = subprocess.run(["shellcheck", "-s", "bash", "-"], input=script, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
    plain = rendered({"instances": 2, "storage": {"size": "1Gi"}, "bootstrap": {"fromBackup": {"name": "n"}}})
    assert "restore-wal.sh" not in plain["ConfigMap"]["data"]
    plain_pod = plain["StatefulsetRollout"]["spec"]["statefulSet"]["template"]["spec"]
    assert [c["name"] for c in plain_pod["initContainers"]] == ["restore"]


def test_an_old_primarys_segments_past_the_switch_are_no_gap_and_no_newer_end() -> None:
    # The old primary archived segments 5 to 11 of timeline 1 after timeline 2 began in 5: a
    # recovery along timeline 2 never reads them.
    old_primary = archive()
    files = dict(old_primary.files)
    files.update({segment_name(1, n): T0 + 60 * n for n in range(5, 12)})
    listed = ArchiveListing(old_primary.location, files, old_primary.histories)
    newest = reach(listed, BACKUPS, RecoveryTarget())
    assert isinstance(newest, Reach), newest
    assert newest.reachable_to == "2026-12-04T12:09:00Z (LSN 0/A000000)"


def test_a_backup_of_an_old_timeline_past_its_switch_is_not_used() -> None:
    # Taken on timeline 1 after timeline 2 began at 0/5000000: another history.
    diverged = [BaseBackup("late", T0 + 400, 1, "0/6000000", "0/6000100")]
    assert isinstance(reach(archive(), diverged, RecoveryTarget()), Unreachable)


def test_a_restore_point_or_a_transaction_is_searched_from_the_oldest_backup() -> None:
    for target in (RecoveryTarget(name="before-upgrade"), RecoveryTarget(xid=1234)):
        chosen = reach(archive(), BACKUPS, target)
        assert isinstance(chosen, Reach)
        assert chosen.backup == "monday"


def test_a_restore_point_name_that_the_server_would_misread_is_refused() -> None:
    for name in ("a\\b", "a\nb"):
        with pytest.raises(ValueError, match="pattern"):
            RecoveryTarget(name=name)


def test_retention_deletes_the_wal_before_the_oldest_kept_backup_and_never_a_history() -> None:
    names = list(archive().files)
    kept = [base("tuesday", 3), base("wednesday", 6, timeline=2)]
    assert not_needed(names, kept) == [segment_name(1, 1), segment_name(1, 2)]
    labels = [f"{segment_name(1, 2)}.00000028.backup", f"{segment_name(1, 2)}.partial", "00000002.history"]
    assert not_needed(labels, kept) == labels[:2]
    assert not_needed(names, []) == []  # no backup left: nothing is known to be unneeded


def test_the_end_of_a_base_backup_needs_only_its_own_wal_on_its_own_timeline() -> None:
    # A gap after wednesday's end does not matter: the recovery stops where it is consistent.
    chosen = reach(archive(skip=8), BACKUPS, RecoveryTarget(immediate=True))
    assert isinstance(chosen, Reach), chosen
    assert (chosen.backup, chosen.target) == ("wednesday", "the end of the base backup")
    assert recovery_settings(RecoveryTarget(immediate=True))[1:3] == [
        "recovery_target = 'immediate'",
        "recovery_target_timeline = 'current'",
    ]
    # Its own segment missing: it never becomes consistent, refused before anything is made.
    short = reach(archive(skip=6), BACKUPS, RecoveryTarget(immediate=True))
    assert isinstance(short, Unreachable)
    assert short.field == "spec.pointInTime.immediate"
    assert f"{segment_name(2, 6)} is missing" in short.message
    rule = RecoveryTarget.model_json_schema()["x-kubernetes-validations"][0]["rule"]
    assert "self.immediate" in rule
