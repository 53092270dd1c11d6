"""Every route of a `Restore`, planned from what a pass observed: into a new instance (logical
and physical), over a running one online (logical) and in place (physical), withdrawn while it
replaces, rolled back, and lost Jobs. Each test walks a route pass by pass, as the operator
would, feeding the status each pass wrote into the next."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from backup import in_place
from backup.job import DeleteJob, StartJob
from backup.point_in_time import Reach, Unreachable
from backup.restore import RestoreKind
from backup.restore_plan import (
    ROLLBACK_RETRIES,
    Ask,
    CreateTarget,
    RestorePlanner,
    RestoreSpec,
    RestoreStatus,
    RestoreView,
    Step,
    WriteBootstrapSecret,
    replace_token,
)
from backup.storage import S3Spec, StorageError
from framework.kube.crd import dropped_fields
from framework.kube.jobs import JobState, JobView
from framework.kube.times import format_time
from services.postgres import PLUGIN as POSTGRES

pytestmark = pytest.mark.unit

S3 = S3Spec(endpoint="http://10.244.0.1:9000", bucket="backups", prefix="apps/", credentialsSecret="s3-creds")
UID = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
TOKEN = replace_token(UID)
PLUGINS = {POSTGRES.kind: POSTGRES}
NOW = 1_800_000_000.0
STATUS_SCHEMA = RestoreKind([POSTGRES], "job-image").crd()["spec"]["versions"][0]["schema"][
    "openAPIV3Schema"
]["properties"]["status"]


def backup(method: str = "logical", phase: str = "Completed", version: str = "16.4") -> dict[str, Any]:
    return {
        "metadata": {"name": "nightly"},
        "spec": {"service": {"kind": "Postgres", "name": "demo"}, "storage": "s3"},
        "status": {
            "phase": phase,
            "method": method,
            "version": version,
            "manifest": "apps/apps/postgres/demo/nightly-01234567/manifest.json",
            "instanceSpec": {
                "version": "16",
                "instances": 3,
                "switchover": {"to": "demo-1"},
                "rotateCredentials": "2026-01-01T00:00:00Z",
            },
        },
    }


def target(ready: bool = True, made_by_this: bool = False, **status: Any) -> dict[str, Any]:
    annotations = {"statefleet.dev/restored-by": f"back/{UID}"} if made_by_this else {}
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "metadata": {"name": "demo", "namespace": "apps", "annotations": annotations, "resourceVersion": "7"},
        "status": {"conditions": [condition], "version": "16.4", **status},
    }


def asked(
    target_body: dict[str, Any], mode: str, token: str = TOKEN, restore: str = "back"
) -> dict[str, Any]:
    body = {**target_body, "metadata": dict(target_body["metadata"])}
    body["metadata"]["annotations"] = {
        **body["metadata"]["annotations"],
        in_place.ANNOTATION: in_place.request(token, restore, mode),
    }
    return body


def answered(
    target_body: dict[str, Any], mode: str, phase: str, token: str = TOKEN, **more: Any
) -> dict[str, Any]:
    record = {"token": token, "restore": "back", "mode": mode, "phase": phase, **more}
    return {**target_body, "status": {**target_body["status"], in_place.STATUS_FIELD: record}}


def job(phase: str = "Running", deleting: bool = False, **more: Any) -> JobView:
    return JobView(
        True, deleting, JobState(phase, **more), progress={"bytes": 10} if phase == "Running" else None
    )


def view(replace_it: bool = False, check: bool = False, **observed: Any) -> RestoreView:
    spec: dict[str, Any] = {
        "backup": "nightly",
        "target": {"kind": "Postgres", "name": "demo", "replace": replace_it},
    }
    if check:
        spec["check"] = {"query": "select count(*) from accounts"}
    fields: dict[str, Any] = {"backup": backup(), "storage": S3, "now": NOW, **observed}
    return RestoreView(
        name="back", uid=UID, spec=RestoreSpec.model_validate(spec), status=RestoreStatus(), **fields
    )


def plan(observed: RestoreView, withdrawal: bool = False) -> Step:
    planner = RestorePlanner(observed, PLUGINS, format_time(NOW))
    step = planner.plan_withdrawal() if withdrawal else planner.plan()
    # What a pass writes is what the API server keeps: a field missing from the CRD's status
    # schema would be dropped, and the next pass would not find it.
    for outcome in (step.outcome, step.on_conflict):
        if outcome is not None:
            assert dropped_fields(outcome.fields, STATUS_SCHEMA) == []
    return step


def then(observed: RestoreView, step: Step, **changes: Any) -> RestoreView:
    """The next pass: what the step wrote into status, and what changed around it."""
    written = {**observed.status.to_api(), **{k: v for k, v in step.outcome.fields.items()}}
    status = RestoreStatus.model_validate({k: v for k, v in written.items() if v is not None})
    return replace(observed, status=status, **changes)


def actions_of(step: Step, kind: type) -> list[Any]:
    return [action for action in step.actions if isinstance(action, kind)]


def test_a_logical_backup_goes_into_a_new_instance_made_from_its_recorded_spec() -> None:
    first = view()
    step = plan(first)
    assert step.outcome.reason == "CreatingTarget"
    (create,) = actions_of(step, CreateTarget)
    assert create.body["kind"] == "Postgres"
    assert create.body["metadata"]["name"] == "demo"
    assert create.body["metadata"]["annotations"] == {"statefleet.dev/restored-by": f"back/{UID}"}
    # The recorded spec, without the requests it recorded (a switchover, a credentials rotation:
    # the plugin's one-shot fields), bootstrapped from this backup.
    assert POSTGRES.one_shot_fields() == ("switchover", "rotateCredentials")
    assert create.body["spec"] == {
        "version": "16",
        "instances": 3,
        "bootstrap": {"fromBackup": {"name": "nightly"}},
    }
    (secret,) = actions_of(step, WriteBootstrapSecret)
    assert secret.request["action"] == "bootstrap"
    assert not secret.replace
    assert step.outcome.fields["createdTarget"] is True

    waiting = then(first, step, target=target(ready=False, made_by_this=True))
    step = plan(waiting)
    assert step.outcome.reason == "TargetNotReady"
    assert not actions_of(step, StartJob)

    ready = replace(waiting, target=target(made_by_this=True))
    step = plan(ready)
    (start,) = actions_of(step, StartJob)
    assert start.action == "restore"
    assert start.service_env
    assert start.request["action"] == "restore"
    assert "replace" not in start.request
    assert "check" not in start.request
    assert start.request["location"] == "apps/apps/postgres/demo/nightly-01234567"
    assert step.outcome.fields["phase"] == "Running"
    assert step.outcome.fields["replacing"] is False

    running = then(ready, step, jobs={"restore": job()})
    step = plan(running)
    assert step.outcome.reason == "Running"
    assert step.outcome.fields["progress"] == {"bytes": 10}
    assert not step.actions or all(isinstance(a, WriteBootstrapSecret) for a in step.actions)

    done = replace(
        running, jobs={"restore": job("Succeeded", result={"bytes": 4096, "details": {"tables": 3}})}
    )
    step = plan(done)
    assert step.outcome.ready
    assert step.outcome.fields["phase"] == "Completed"
    assert step.outcome.fields["details"] == {"tables": 3}
    assert "4096 bytes" in step.outcome.message

    ended = then(done, step)
    assert plan(ended).outcome.ready
    assert plan(ended).actions == ()


def test_a_physical_backup_is_the_new_instances_data_and_a_job_checks_it() -> None:
    ready = view(backup=backup("physical"), target=target(made_by_this=True))
    step = plan(ready)
    (start,) = actions_of(step, StartJob)
    assert start.request["action"] == "check"
    assert start.request["check"] == {}


def archived_backup() -> dict[str, Any]:
    """A physical backup whose WAL its instance archived (none in the backup itself)."""
    body = backup("physical")
    archive = "s3://backups/apps/apps/postgres/demo/wal"
    body["status"]["physical"] = {
        "timeline": 2,
        "startLsn": "0/5000028",
        "endLsn": "0/5000100",
        "archive": archive,
    }
    return body


def test_a_backup_whose_wal_is_in_the_archive_is_replayed_to_its_end_in_a_new_instance_or_in_place() -> None:
    step = plan(view(backup=archived_backup()))
    (create,) = actions_of(step, CreateTarget)
    assert create.body["spec"]["bootstrap"] == {
        "fromBackup": {"name": "nightly"},
        "pointInTime": {"immediate": True, "inclusive": True},
    }
    (secret,) = actions_of(step, WriteBootstrapSecret)
    assert secret.request["pointInTime"] == {
        "archive": "s3://backups/apps/apps/postgres/demo/wal",
        "target": {"immediate": True, "inclusive": True},
    }
    # Over the running instance too: its pod that takes the backup replays it the same way.
    verified = view(
        replace_it=True,
        backup=archived_backup(),
        target=target(),
        jobs={
            "verify": job(
                "Succeeded", result={"details": {"location": "apps/apps/postgres/demo/nightly-01234567"}}
            )
        },
    )
    _, in_place_secret = plan(verified).actions
    assert isinstance(in_place_secret, WriteBootstrapSecret)
    assert in_place_secret.request["pointInTime"] == secret.request["pointInTime"]
    assert in_place_secret.request["replace"] == TOKEN


def test_a_new_instance_whose_restore_init_container_failed_fails_the_restore_with_its_reason() -> None:
    failing = view(
        backup=backup("physical"),
        target=target(ready=False, made_by_this=True),
        bootstrap_failure=("ChecksumMismatch", "base.tar: sha256 differs"),
    )
    step = plan(failing)
    assert step.outcome.fields["phase"] == "Failed"
    assert step.outcome.reason == "ChecksumMismatch"


def test_a_physical_backup_cannot_start_a_new_instance_on_another_major_version() -> None:
    step = plan(view(backup=backup("physical", version="15.8")))
    assert step.outcome.reason == "TargetRefused"
    assert "spec.target.spec" in step.outcome.message
    assert not actions_of(step, CreateTarget)


def test_an_existing_instance_is_refused_unless_the_restore_replaces_it() -> None:
    step = plan(view(target=target()))
    assert step.outcome.reason == "TargetExists"
    assert "spec.target.replace" in step.outcome.message
    assert step.actions == ()


def test_a_restore_waits_for_its_backup_and_fails_with_a_failed_one() -> None:
    assert plan(view(backup=None)).outcome.reason == "BackupNotFound"
    running = plan(view(backup=backup(phase="Running")))
    assert running.outcome.reason == "BackupNotCompleted"
    assert running.outcome.fields == {"phase": "Pending"}
    assert plan(view(backup=backup(phase="Failed"))).outcome.fields["phase"] == "Failed"


def test_a_storage_that_cannot_be_read_keeps_a_running_restore_running() -> None:
    error = StorageError("CredentialsMissing", "s3.credentialsSecret: Secret s3-creds does not exist")
    pending = plan(view(storage=None, storage_error=error))
    assert pending.outcome.reason == "CredentialsMissing"
    assert pending.outcome.fields == {"phase": "Pending"}
    running = view(storage=None, storage_error=error)
    running = replace(running, status=RestoreStatus(phase="Running", replacing=True))
    assert plan(running).outcome.fields == {}


def test_a_logical_restore_over_an_instance_keeps_its_data_aside_and_puts_it_back_when_it_fails() -> None:
    first = view(replace_it=True, check=True, target=target())
    step = plan(first)
    (start,) = actions_of(step, StartJob)
    assert start.request["replace"] == TOKEN
    assert start.request["check"]["query"].startswith("select")
    assert not actions_of(step, WriteBootstrapSecret)  # an existing instance has its own data
    assert step.outcome.fields["replacing"] is True

    failed_job = then(
        first, step, jobs={"restore": job("Failed", reason="RestoreFailed", message="pg_restore")}
    )
    step = plan(failed_job)
    (rollback,) = actions_of(step, StartJob)
    assert rollback.action == "rollback"
    assert rollback.request["action"] == "rollback"
    assert rollback.request["replace"] == TOKEN
    assert rollback.retries == ROLLBACK_RETRIES
    assert not rollback.owned_by_target
    assert step.outcome.reason == "RollingBack"
    assert step.outcome.fields["rollingBack"] == {"reason": "RestoreFailed", "message": "pg_restore"}

    rolling = then(failed_job, step, jobs={**failed_job.jobs, "rollback": job()})
    assert plan(rolling).outcome.reason == "RollingBack"
    assert plan(rolling).actions == ()

    put_back = replace(
        rolling, jobs={**rolling.jobs, "rollback": job("Succeeded", result={"details": {"putBack": ["app"]}})}
    )
    step = plan(put_back)
    assert step.outcome.fields["phase"] == "Failed"
    assert step.outcome.reason == "RestoreFailed"
    assert "holds its own data again (app put back)" in step.outcome.message

    committed = replace(
        rolling, jobs={**rolling.jobs, "rollback": job("Succeeded", result={"details": {"committed": True}})}
    )
    assert plan(committed).outcome.fields["phase"] == "Completed"

    twice = replace(rolling, jobs={**rolling.jobs, "rollback": job("Failed", message="no space")})
    step = plan(twice)
    assert step.outcome.reason == "RollbackFailed"
    assert TOKEN in step.outcome.message


def test_a_rollback_waits_for_the_instance_to_answer() -> None:
    failing = view(replace_it=True, target=target(ready=False), jobs={"restore": job("Failed", reason="X")})
    failing = replace(failing, status=RestoreStatus(phase="Running", replacing=True))
    step = plan(failing)
    assert step.outcome.reason == "RollingBack"
    assert step.actions == ()
    assert step.outcome.fields == {"phase": "Running", "rollingBack": {"reason": "X", "message": ""}}


def test_lost_jobs_fail_the_restore_or_roll_it_back() -> None:
    running = replace(view(target=target(made_by_this=True)), status=RestoreStatus(phase="Running"))
    assert plan(running).outcome.reason == "JobLost"
    replacing = replace(
        view(replace_it=True, target=target()), status=RestoreStatus(phase="Running", replacing=True)
    )
    step = plan(replacing)
    assert step.outcome.reason == "RollingBack"
    assert actions_of(step, StartJob)[0].action == "rollback"
    lost = then(replacing, step)
    assert plan(lost).outcome.reason == "RollbackLost"


def test_a_physical_backup_over_a_running_instance_is_verified_then_claimed_then_checked() -> None:
    first = view(replace_it=True, backup=backup("physical"), target=target())
    step = plan(first)
    (verify,) = actions_of(step, StartJob)
    assert verify.action == "verify"
    assert not verify.service_env
    assert "driver" not in verify.request
    assert step.outcome.reason == "Verifying"

    verifying = then(first, step, jobs={"verify": job()})
    assert plan(verifying).outcome.reason == "Verifying"
    assert plan(verifying).actions == ()

    elsewhere = replace(
        verifying, jobs={"verify": job("Succeeded", result={"details": {"location": "apps/older"}})}
    )
    step = plan(elsewhere)
    assert step.actions == (DeleteJob("verify", best_effort=True),)  # verified again

    verified = replace(
        verifying,
        jobs={
            "verify": job(
                "Succeeded", result={"details": {"location": "apps/apps/postgres/demo/nightly-01234567"}}
            )
        },
    )
    step = plan(verified)
    claim, secret = step.actions
    assert claim == Ask(in_place.request(TOKEN, "back", in_place.RESTORE), claim=True)
    assert isinstance(secret, WriteBootstrapSecret)
    assert secret.replace
    assert secret.request["verified"] is True
    assert step.on_conflict is not None
    assert step.on_conflict.reason == "TargetBusy"
    assert step.outcome.fields["inPlace"] == "restore"

    # A pass that claimed but ended before its status was written claims no more.
    claimed = replace(verified, target=asked(target(), in_place.RESTORE))
    again = plan(claimed)
    assert [type(a) for a in again.actions] == [WriteBootstrapSecret]
    assert again.on_conflict is None

    stopping = then(
        verified, step, target=answered(asked(target(ready=False), "restore"), "restore", "Stopping")
    )
    step = plan(stopping)
    assert step.outcome.reason == "Stopping"
    assert step.actions == ()

    restored = replace(stopping, target=answered(asked(target(), "restore"), "restore", "Restored"))
    step = plan(restored)
    (check,) = actions_of(step, StartJob)
    assert check.action == "restore"
    assert check.request["action"] == "check"
    assert check.request["replace"] == TOKEN
    assert step.outcome.fields["inPlace"] == "check"

    checking = then(restored, step, jobs={"restore": job()})
    assert plan(checking).outcome.reason == "Checking"
    checked = replace(checking, jobs={"restore": job("Succeeded", result={"details": {"tables": 2}})})
    step = plan(checked)
    assert step.outcome.fields["phase"] == "Completed"
    assert step.actions == (Ask(None),)


def test_a_physical_restore_waits_while_another_restore_holds_the_instance() -> None:
    other = asked(target(), in_place.RESTORE, token="ffffffff", restore="other")
    step = plan(view(replace_it=True, backup=backup("physical"), target=other))
    assert step.outcome.reason == "TargetBusy"
    assert "Restore other" in step.outcome.message
    assert step.actions == ()


def test_a_physical_restore_refuses_an_instance_on_another_major_version_before_it_stops() -> None:
    step = plan(view(replace_it=True, backup=backup("physical", version="15.8"), target=target()))
    assert step.outcome.reason == "TargetRefused"
    assert step.actions == ()


def in_place_at(step: str, target_body: dict[str, Any], **observed: Any) -> RestoreView:
    status = RestoreStatus(phase="Running", replacing=True, inPlace=step, startedAt=format_time(NOW - 60))
    return replace(
        view(replace_it=True, backup=backup("physical"), target=target_body, **observed), status=status
    )


def test_a_failed_physical_restore_in_place_is_rolled_back_by_the_instance() -> None:
    failing = in_place_at(
        "restore",
        answered(asked(target(ready=False), "restore"), "restore", "Failed", message="pg_ctl failed"),
    )
    step = plan(failing)
    assert step.actions == (Ask(in_place.request(TOKEN, "back", in_place.ROLLBACK)),)
    assert step.outcome.fields["inPlace"] == "rollback"

    rolling = then(
        failing, step, target=answered(asked(target(ready=False), "rollback"), "rollback", "Starting")
    )
    assert plan(rolling).outcome.reason == "RollingBack"
    assert plan(rolling).actions == ()

    back = replace(rolling, target=answered(asked(target(), "rollback"), "rollback", "RolledBack"))
    step = plan(back)
    assert step.outcome.fields["phase"] == "Failed"
    assert step.actions == (Ask(None),)
    assert "pg_ctl failed" in step.outcome.message
    assert "holds its own data again" in step.outcome.message

    committed = replace(rolling, target=answered(asked(target(), "rollback"), "rollback", "Committed"))
    assert plan(committed).outcome.fields["phase"] == "Completed"

    stuck = replace(
        rolling, target=answered(asked(target(), "rollback"), "rollback", "Failed", message="disk")
    )
    assert plan(stuck).outcome.reason == "RollbackFailed"

    untouched = replace(rolling, target=asked(target(), "rollback"))  # the instance never started it
    step = plan(untouched)
    assert "was not changed" in step.outcome.message
    assert step.actions == (Ask(None),)


def test_a_physical_restore_that_never_serves_is_rolled_back_after_the_deadline() -> None:
    late = in_place_at("restore", answered(asked(target(ready=False), "restore"), "restore", "Starting"))
    assert plan(late).outcome.reason == "Starting"
    late = replace(late, now=NOW + 7 * 3600)
    step = plan(late)
    assert step.outcome.fields["inPlace"] == "rollback"
    assert step.outcome.fields["rollingBack"]["reason"] == "DeadlineExceeded"


def test_a_server_that_cannot_recover_in_place_to_the_point_is_rolled_back_at_once() -> None:
    starting = answered(asked(target(ready=False), "restore"), "restore", "Starting")
    failed = ("RecoveryFailed", "the recovery to the point failed: FATAL: recovery ended before the target")
    replaying = replace(in_place_at("restore", starting, bootstrap_failure=failed), backup=archived_backup())
    step = plan(replaying)
    assert step.outcome.fields["inPlace"] == "rollback"
    assert step.outcome.fields["rollingBack"]["reason"] == "RecoveryFailed"
    # A backup that holds its WAL replays nothing: only the instance's own record tells.
    assert plan(in_place_at("restore", starting, bootstrap_failure=failed)).outcome.reason == "Starting"


def test_a_check_job_lost_or_failed_rolls_the_instance_back() -> None:
    restored = answered(asked(target(), "restore"), "restore", "Restored")
    assert plan(in_place_at("check", restored)).outcome.fields["rollingBack"]["reason"] == "JobLost"
    failed = in_place_at(
        "check", restored, jobs={"restore": job("Failed", reason="CheckFailed", message="0")}
    )
    assert plan(failed).outcome.fields["rollingBack"]["reason"] == "CheckFailed"


def test_a_backup_gone_during_a_restore_in_place_rolls_it_back() -> None:
    restoring = in_place_at("restore", answered(asked(target(ready=False), "restore"), "restore", "Starting"))
    step = plan(replace(restoring, backup=None, storage=None))
    assert step.outcome.fields["inPlace"] == "rollback"
    assert step.outcome.fields["rollingBack"]["reason"] == "BackupNotFound"
    gone = plan(replace(restoring, backup=None, storage=None, target=None))
    assert gone.outcome.reason == "TargetDeleted"


def test_a_restore_withdrawn_while_it_replaces_stops_its_job_and_puts_the_data_back_before_it_goes() -> None:
    running = view(replace_it=True, target=target(), deleting=True, jobs={"restore": job()})
    running = replace(running, status=RestoreStatus(phase="Running", replacing=True, job="back-restore"))
    step = plan(running, withdrawal=True)
    assert not step.outcome.ready
    assert step.actions == (DeleteJob("restore", foreground=True),)
    assert plan(replace(running, jobs={"restore": job(deleting=True)}), withdrawal=True).actions == ()

    stopped = replace(running, jobs={"restore": job("Failed", reason="DeadlineExceeded")})
    step = plan(stopped, withdrawal=True)
    (rollback,) = actions_of(step, StartJob)
    assert rollback.owned_by_target  # the garbage collector would take a Job the Restore owns
    assert step.outcome.reason == "RollingBack"
    assert not step.outcome.ready

    back = then(stopped, step, jobs={"rollback": job("Succeeded", result={"details": {"putBack": ["app"]}})})
    step = plan(back, withdrawal=True)
    assert step.outcome.ready
    assert step.outcome.reason == "Withdrawn"
    assert [e.reason for e in step.outcome.events] == ["Withdrawn"]
    assert step.actions == (DeleteJob("rollback", best_effort=True),)


def test_a_restore_in_place_withdrawn_asks_the_instance_for_its_data_and_leaves_no_request() -> None:
    restoring = in_place_at("restore", answered(asked(target(ready=False), "restore"), "restore", "Starting"))
    restoring = replace(restoring, deleting=True)
    step = plan(restoring, withdrawal=True)
    assert step.actions == (Ask(in_place.request(TOKEN, "back", in_place.ROLLBACK)),)
    assert not step.outcome.ready

    back = then(restoring, step, target=answered(asked(target(), "rollback"), "rollback", "RolledBack"))
    step = plan(back, withdrawal=True)
    assert step.outcome.ready
    assert step.outcome.reason == "Withdrawn"
    assert step.actions == (Ask(None), DeleteJob("rollback", best_effort=True), Ask(None, best_effort=True))


def test_a_restore_with_nothing_to_undo_goes_at_once() -> None:
    ended = replace(view(target=target(), deleting=True), status=RestoreStatus(phase="Completed"))
    step = plan(ended, withdrawal=True)
    assert step.outcome.ready
    assert step.actions == (DeleteJob("rollback", best_effort=True),)
    # A claim whose step was never recorded: the request goes with the Restore.
    claimed = replace(
        view(target=asked(target(), "restore"), deleting=True), status=RestoreStatus(phase="Pending")
    )
    step = plan(claimed, withdrawal=True)
    assert step.actions == (DeleteJob("rollback", best_effort=True), Ask(None, best_effort=True))


def test_the_status_schema_is_generated_from_the_status_model() -> None:
    properties = STATUS_SCHEMA["properties"]
    assert properties["inPlace"]["enum"] == ["restore", "check", "rollback"]
    assert properties["phase"]["enum"] == ["Pending", "Running", "Completed", "Failed"]
    assert properties["rollingBack"]["properties"].keys() == {"reason", "message"}
    assert properties["progress"]["x-kubernetes-preserve-unknown-fields"] is True
    assert dropped_fields({"rollingBack": {"reason": "X", "other": 1}}, STATUS_SCHEMA) == [
        "status.rollingBack.other"
    ]


def point_in_time_view(reach: Any, **observed: Any) -> RestoreView:
    spec = RestoreSpec.model_validate(
        {
            "pointInTime": {"instance": "demo", "time": "2026-12-04T12:00:00Z", "inclusive": False},
            "target": {"kind": "Postgres", "name": "before"},
        }
    )
    return RestoreView(
        name="back", uid=UID, spec=spec, status=RestoreStatus(), now=NOW, reach=reach, **observed
    )


REACH = Reach(
    backup="nightly",
    archive="s3://backups/apps/apps/postgres/demo/wal",
    reachableFrom="2026-12-04T02:00:00Z",
    reachableTo="2026-12-04T12:10:00Z (LSN 0/9000000)",
    target="time 2026-12-04T12:00:00+00:00",
)


def test_a_point_in_time_restore_chooses_its_backup_first_then_makes_a_recovering_instance() -> None:
    first = point_in_time_view(REACH)
    step = plan(first)
    assert step.outcome.reason == "BackupChosen"
    assert step.actions == ()
    assert step.outcome.fields["pointInTime"]["backup"] == "nightly"
    assert "2026-12-04T02:00:00Z to 2026-12-04T12:10:00Z" in step.outcome.message

    chosen = then(first, step, reach=None, backup=backup("physical"), storage=S3)
    step = plan(chosen)
    (create,) = actions_of(step, CreateTarget)
    assert create.body["spec"]["bootstrap"] == {
        "fromBackup": {"name": "nightly"},
        "pointInTime": {"time": "2026-12-04T12:00:00Z", "inclusive": False},
    }
    (secret,) = actions_of(step, WriteBootstrapSecret)
    assert secret.request["pointInTime"] == {
        "archive": "s3://backups/apps/apps/postgres/demo/wal",
        "target": {"time": "2026-12-04T12:00:00Z", "inclusive": False},
    }
    # Once made, it goes as any physical restore: the instance's pods recover, a Job checks it.
    ready = then(chosen, step, target=target(made_by_this=True))
    (start,) = actions_of(plan(ready), StartJob)
    assert start.request["action"] == "check"


def test_a_point_the_archive_cannot_reach_fails_before_anything_is_made() -> None:
    refused = Unreachable("spec.pointInTime.time", "2026-12-04T12:00:00+00:00 is past what the archive holds")
    step = plan(point_in_time_view(refused))
    assert step.outcome.fields["phase"] == "Failed"
    assert step.outcome.reason == "TargetUnreachable"
    assert step.outcome.message.startswith("spec.pointInTime.time: 2026-12-04T12:00:00+00:00 is past")
    assert step.actions == ()
    unread = plan(point_in_time_view(StorageError("AccessDenied", "the S3 server refused the credentials")))
    assert unread.outcome.reason == "AccessDenied"
    assert unread.outcome.fields["phase"] == "Pending"
    taken = plan(point_in_time_view(REACH, target=target()))
    assert taken.outcome.reason == "TargetExists"
    assert taken.actions == ()


def test_a_point_in_time_restore_recovers_an_existing_instance_in_place_only_when_asked() -> None:
    spec = RestoreSpec.model_validate(
        {
            "pointInTime": {"instance": "demo", "time": "2026-12-04T12:00:00Z", "inclusive": False},
            "target": {"kind": "Postgres", "name": "demo", "replace": True},
        }
    )
    first = RestoreView(
        name="back", uid=UID, spec=spec, status=RestoreStatus(), now=NOW, reach=REACH, target=target()
    )
    step = plan(first)
    assert step.outcome.reason == "BackupChosen"
    chosen = then(
        first,
        step,
        reach=None,
        backup=backup("physical"),
        storage=S3,
        jobs={
            "verify": job(
                "Succeeded", result={"details": {"location": "apps/apps/postgres/demo/nightly-01234567"}}
            )
        },
    )
    claim, secret = plan(chosen).actions
    assert isinstance(claim, Ask)
    assert isinstance(secret, WriteBootstrapSecret)
    assert secret.request["pointInTime"] == {
        "archive": "s3://backups/apps/apps/postgres/demo/wal",
        "target": {"time": "2026-12-04T12:00:00Z", "inclusive": False},
    }
