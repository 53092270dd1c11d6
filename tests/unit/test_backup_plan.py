"""Backup plans: cron schedules, retries with backoff, retention. All pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from backup.plan import BackupPlanSpec, VerifySpec, backup_to_verify, build_verify_restore, plan_backups
from backup.restore_plan import RestoreSpec
from backup.retention import Candidate, RetentionSpec, to_prune
from backup.schedule import Schedule, ScheduleError
from framework.kube.jobs import job_name

pytestmark = pytest.mark.unit


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "after", "fires"),
    [
        ("0 2 * * *", "2026-11-30 01:59", "2026-11-30 02:00"),
        ("0 2 * * *", "2026-11-30 02:00", "2026-12-01 02:00"),
        ("*/15 * * * *", "2026-11-30 10:07", "2026-11-30 10:15"),
        ("30 3 * * 0", "2026-11-30 00:00", "2026-12-06 03:30"),  # Sunday
        ("30 3 * * sun", "2026-11-30 00:00", "2026-12-06 03:30"),
        ("0 0 1 * *", "2026-11-30 12:00", "2026-12-01 00:00"),
        ("0 0 29 2 *", "2026-03-01 00:00", "2028-02-29 00:00"),  # the next leap day
        ("0 12 13 * 5", "2026-11-30 00:00", "2026-12-04 12:00"),  # the 13th OR a Friday
        ("@hourly", "2026-11-30 10:07", "2026-11-30 11:00"),
        ("0 9-17/4 * * mon-fri", "2026-12-05 08:00", "2026-12-07 09:00"),  # Saturday -> Monday
    ],
)
def test_a_schedule_fires_when_crontab_would(expression: str, after: str, fires: str) -> None:
    assert Schedule.parse(expression).next_after(at(after)) == at(fires)


@pytest.mark.parametrize(
    ("expression", "complaint"),
    [
        ("0 2 * *", "five fields"),
        ("61 * * * *", "minute"),
        ("0 25 * * *", "hour"),
        ("0 0 * 13 *", "month"),
        ("*/0 * * * *", "step"),
        ("0 0 5-1 * *", "backwards"),
        ("0 0 * * funday", "day of week"),
    ],
)
def test_a_bad_schedule_names_the_field(expression: str, complaint: str) -> None:
    with pytest.raises(ScheduleError, match=complaint):
        Schedule.parse(expression)
    with pytest.raises(ValidationError, match="schedule"):
        BackupPlanSpec.model_validate(
            {"service": {"kind": "Postgres", "name": "d"}, "storage": "s", "schedule": expression}
        )


def test_a_schedule_that_never_fires_is_an_error() -> None:
    with pytest.raises(ScheduleError, match="never fires"):
        Schedule.parse("0 0 30 2 *").next_after(at("2026-01-01 00:00"))


def completed(name: str, when: str, verified: bool = False) -> Candidate:
    return Candidate(name, "Completed", at(when), verified)


def test_retention_keeps_the_last_n_and_the_newest_per_day_week_month() -> None:
    backups = [completed(f"d{day:02d}", f"2026-11-{day:02d} 02:00") for day in range(1, 31)]
    backups += [completed("oct", "2026-10-15 02:00"), completed("sep", "2026-09-15 02:00")]
    pruned = to_prune(backups, RetentionSpec(keepLast=3, daily=7, weekly=4, monthly=6))
    kept = {b.name for b in backups} - set(pruned)
    # Last 3 and the last 7 days overlap; weeks end on Sundays (Nov 29, 22, 15) besides this one.
    assert kept == {f"d{d:02d}" for d in range(24, 31)} | {"d22", "d15", "oct", "sep"}
    assert pruned[0] == "d01"  # oldest first


def test_retention_never_deletes_the_newest_verified_or_an_unfinished_backup() -> None:
    backups = [
        completed("old-verified", "2026-11-01 02:00", verified=True),
        completed("a", "2026-11-02 02:00"),
        completed("b", "2026-11-03 02:00"),
        Candidate("running", "Running", at("2026-11-04 02:00")),
    ]
    assert to_prune(backups, RetentionSpec(keepLast=1)) == ["a"]


def test_retention_keeps_only_the_latest_failures() -> None:
    failed = [Candidate(f"f{i}", "Failed", at(f"2026-11-0{i} 02:00")) for i in range(1, 6)]
    assert to_prune([*failed, completed("ok", "2026-11-06 02:00")], RetentionSpec()) == ["f1", "f2"]


SPEC = BackupPlanSpec.model_validate(
    {"service": {"kind": "Postgres", "name": "demo"}, "storage": "s3", "schedule": "0 2 * * *"}
)
CREATED = at("2026-11-29 12:00")


def test_nothing_before_the_first_time_then_one_backup_at_it() -> None:
    waiting = plan_backups(at("2026-11-30 01:00"), "nightly", CREATED, SPEC, {}, [])
    assert waiting.create is None
    assert waiting.wake_at == at("2026-11-30 02:00")
    due = plan_backups(at("2026-11-30 02:00:05"), "nightly", CREATED, SPEC, {}, [])
    assert due.create == "nightly-20261130-020005"
    assert due.fields["lastScheduleTime"] == "2026-11-30T02:00:00Z"
    assert due.fields["nextScheduleTime"] == "2026-12-01T02:00:00Z"


def test_missed_runs_make_one_backup_not_many() -> None:
    status = {"lastScheduleTime": "2026-11-20T02:00:00Z"}
    decision = plan_backups(at("2026-11-30 09:00"), "nightly", CREATED, SPEC, status, [])
    assert decision.create is not None
    assert decision.fields["lastScheduleTime"] == "2026-11-30T02:00:00Z"


def test_one_backup_at_a_time() -> None:
    running = [Candidate("nightly-1", "Running", at("2026-11-30 02:00"))]
    status = {"lastScheduleTime": "2026-11-29T02:00:00Z"}
    decision = plan_backups(at("2026-11-30 02:10"), "nightly", CREATED, SPEC, status, running)
    assert decision.create is None
    assert decision.reason == "BackupRunning"


def test_failures_are_retried_with_growing_delays_until_the_next_run() -> None:
    status = {"lastScheduleTime": "2026-11-30T02:00:00Z"}
    one = [Candidate("n1", "Failed", at("2026-11-30 02:01"))]
    backing_off = plan_backups(at("2026-11-30 02:01:30"), "nightly", CREATED, SPEC, status, one)
    assert (backing_off.create, backing_off.reason) == (None, "BackingOff")
    assert backing_off.wake_at == at("2026-11-30 02:02")
    retry = plan_backups(at("2026-11-30 02:02"), "nightly", CREATED, SPEC, status, one)
    assert retry.reason == "Retrying"
    assert retry.create is not None
    three = [Candidate(f"n{i}", "Failed", at("2026-11-30 02:01") + timedelta(minutes=i)) for i in range(3)]
    later = plan_backups(at("2026-11-30 02:04"), "nightly", CREATED, SPEC, status, three)
    assert later.wake_at == at("2026-11-30 02:03") + timedelta(minutes=4)  # 1, 2, then 4 minutes
    # An hour at most, and never past the next scheduled run.
    many = [Candidate(f"m{i}", "Failed", at("2026-11-30 02:00") + timedelta(seconds=i)) for i in range(12)]
    capped = plan_backups(at("2026-11-30 02:30"), "nightly", CREATED, SPEC, status, many)
    assert capped.wake_at == at("2026-11-30 02:00:11") + timedelta(hours=1)
    status_late = {"lastScheduleTime": "2026-11-30T02:00:00Z"}
    near_next = [Candidate("n", "Failed", at("2026-12-01 01:59:30"))] * 1
    waits = plan_backups(at("2026-12-01 01:59:40"), "nightly", CREATED, SPEC, status_late, near_next)
    assert waits.wake_at == at("2026-12-01 02:00")  # the schedule comes first


def test_suspended_plans_start_nothing_but_still_prune() -> None:
    spec = SPEC.model_copy(update={"suspend": True, "retention": RetentionSpec(keepLast=1)})
    backups = [completed("a", "2026-11-01 02:00"), completed("b", "2026-11-02 02:00")]
    decision = plan_backups(at("2026-11-30 03:00"), "nightly", CREATED, spec, {}, backups)
    assert decision.create is None
    assert decision.reason == "Suspended"
    assert decision.prune == ["a"]


def test_without_a_schedule_of_its_own_each_new_backup_is_tested_once() -> None:
    verify = VerifySpec(enabled=True)
    newest = Candidate("n2", "Completed", at("2026-11-30 02:05"))
    first = backup_to_verify(verify, CREATED, at("2026-11-30 02:06"), newest, tested=False)
    assert (first.backup, first.scheduled_for, first.wake_at) == ("n2", None, None)
    assert backup_to_verify(verify, CREATED, at("2026-11-30 02:06"), newest, tested=True).backup is None
    assert backup_to_verify(verify, CREATED, at("2026-11-30 02:06"), None, tested=False).backup is None


def test_on_a_schedule_of_its_own_the_newest_backup_is_tested_again_each_time() -> None:
    verify = VerifySpec(enabled=True, schedule="0 4 * * sun")
    newest = Candidate("n2", "Completed", at("2026-11-30 02:05"))
    last = at("2026-11-29 04:00")  # a Sunday: tested then
    waiting = backup_to_verify(verify, last, at("2026-12-01 10:00"), newest, tested=True)
    assert (waiting.backup, waiting.wake_at) == (None, at("2026-12-06 04:00"))
    due = backup_to_verify(verify, last, at("2026-12-06 04:00:05"), newest, tested=True)
    assert (due.backup, due.scheduled_for, due.wake_at) == (
        "n2",
        at("2026-12-06 04:00"),
        at("2026-12-13 04:00"),
    )
    # Weeks missed make one test, not many.
    late = backup_to_verify(verify, last, at("2026-12-30 00:00"), newest, tested=True)
    assert late.scheduled_for == at("2026-12-27 04:00")
    # Nothing to test at its time: the time is used up all the same (no burst of tests later).
    empty = backup_to_verify(verify, last, at("2026-12-06 04:01"), None, tested=False)
    assert (empty.backup, empty.scheduled_for) == (None, at("2026-12-06 04:00"))
    with pytest.raises(ValidationError, match="schedule"):
        VerifySpec(enabled=True, schedule="61 * * * *")


def test_each_scheduled_test_of_one_backup_has_its_own_restore_and_throwaway() -> None:
    plan = {"name": "demo-nightly-with-a-rather-long-name", "namespace": "apps"}
    backup = {
        "metadata": {"name": "demo-nightly-with-a-rather-long-name-20261130-020000", "uid": "abcdef012345"}
    }
    once = build_verify_restore(plan, SPEC, backup)
    again = build_verify_restore(plan, SPEC, backup, at("2026-12-06 04:00"), {"instances": 1})
    later = build_verify_restore(plan, SPEC, backup, at("2026-12-13 04:00"))
    names = {r["metadata"]["name"] for r in (once, again, later)}
    targets = {r["spec"]["target"]["name"] for r in (once, again, later)}
    assert len(names) == len(targets) == 3
    assert all(len(name) <= 63 for name in names)
    # The throwaway is the plugin's smallest instance, deleted with its volumes.
    rabbit = build_verify_restore(plan, SPEC, backup, throwaway={"replicas": 1})
    assert rabbit["spec"]["target"]["spec"] == {"replicas": 1, "deletionPolicy": "Delete"}
    # Their Jobs' names (cut to fit a label) stay apart too, down to the minute.
    half_past = build_verify_restore(plan, SPEC, backup, at("2026-12-13 04:30"))
    jobs = {job_name(r["metadata"]["name"], "restore") for r in (once, again, later, half_past)}
    assert len(jobs) == 4
    assert all(len(target) <= 40 for target in targets)  # RestoreTarget.name's limit
    assert again["spec"]["target"]["spec"] == {"instances": 1, "deletionPolicy": "Delete"}


def test_the_restore_test_of_an_archived_instances_backup_replays_its_archive_to_the_newest_point() -> None:
    plan = {"name": "nightly", "namespace": "apps"}
    backup = {"metadata": {"name": "nightly-20261130-020000", "uid": "abcdef012345"}}
    replayed = build_verify_restore(plan, SPEC, backup, replay_archive=True)
    point = replayed["spec"]["pointInTime"]
    assert point == {"instance": SPEC.service.name, "storage": SPEC.storage}  # no target: the newest
    assert replayed["spec"]["backup"] == "nightly-20261130-020000"  # from this backup, not one chosen
    RestoreSpec.model_validate(replayed["spec"])
    assert "pointInTime" not in build_verify_restore(plan, SPEC, backup)["spec"]
