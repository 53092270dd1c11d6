"""Every route of a `Backup`, planned from what a pass observed: waiting for its storage and its
instance, started, running, completed, failed or lost (its partial objects deleted), and deleted
(kept, its Job stopped first, its objects deleted, its storage gone)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from backup.commands.found import backup_name, imported_backup
from backup.job import DeleteJob, StartJob
from backup.manifest import ManifestObject
from backup.resources import BackupSpec, BackupStatus
from backup.storage import S3Spec, StorageError
from backup.take import BackupKind
from backup.take_plan import BackupStep, BackupView, DeleteObjects, plan_backup, plan_backup_deletion
from framework.kube.crd import dropped_fields
from framework.kube.jobs import JobState, JobView
from services.mongodb import PLUGIN as MONGODB
from services.postgres import PLUGIN as POSTGRES
from tests.unit.manifests import physical_manifest

pytestmark = pytest.mark.unit

S3 = S3Spec(endpoint="http://10.244.0.1:9000", bucket="backups", prefix="apps/", credentialsSecret="s3-creds")
PLUGINS = {POSTGRES.kind: POSTGRES, MONGODB.kind: MONGODB}
NOW = "2026-12-03T20:00:00Z"
SCHEMA = BackupKind([POSTGRES], "job-image").crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["status"]
MANIFEST = "apps/apps/postgres/demo/nightly-0a1b2c3d/manifest.json"
READY = {
    "spec": {"version": "16", "instances": 2},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


def view(kind: str = "Postgres", method: str | None = None, **observed: Any) -> BackupView:
    spec = {"service": {"kind": kind, "name": "demo"}, "storage": "s3", "method": method}
    fields: dict[str, Any] = {"storage": S3, "instance": READY, **observed}
    return BackupView(
        name="nightly",
        namespace="apps",
        uid="0a1b2c3d-0000",
        spec=BackupSpec.model_validate({k: v for k, v in spec.items() if v is not None}),
        status=BackupStatus(),
        **fields,
    )


def running(**observed: Any) -> BackupView:
    status = BackupStatus(
        phase="Running", manifest=MANIFEST, startedAt="2026-12-03T19:59:00Z", location="s3://b/p"
    )
    return replace(view(**observed), status=status, instance=None)


def job(phase: str, **more: Any) -> JobView:
    return JobView(
        True, False, JobState(phase, **more), progress={"bytes": 100} if phase == "Running" else None
    )


def plan(observed: BackupView, deletion: bool = False) -> BackupStep:
    step = plan_backup_deletion(observed) if deletion else plan_backup(observed, PLUGINS, NOW)
    assert dropped_fields(step.outcome.fields, SCHEMA) == []  # the API server keeps what it writes
    return step


def test_a_backup_starts_once_its_storage_answers_and_its_instance_is_ready() -> None:
    error = StorageError("CredentialsMissing", "s3.credentialsSecret: Secret s3-creds does not exist")
    waiting = plan(view(storage=None, storage_error=error))
    assert (waiting.outcome.reason, waiting.outcome.fields, waiting.actions) == (
        "CredentialsMissing",
        {"phase": "Pending"},
        (),
    )
    assert plan(view(instance=None)).outcome.reason == "ServiceNotFound"
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert plan(view(instance=not_ready)).outcome.reason == "InstanceNotReady"

    step = plan(view())
    (start,) = step.actions
    assert isinstance(start, StartJob)
    assert start.action == "backup"
    assert start.request["method"] == "physical"  # the plugin's first method
    assert start.request["location"] == "apps/apps/postgres/demo/nightly-0a1b2c3d"
    assert start.request["driver"] == "services.postgres.backup_driver"
    assert start.deadline_seconds == 6 * 3600
    assert step.outcome.fields["manifest"] == MANIFEST
    assert step.outcome.fields["instanceSpec"] == {"version": "16", "instances": 2}
    assert step.outcome.fields["location"] == "s3://backups/apps/apps/postgres/demo/nightly-0a1b2c3d"


def test_a_physical_backup_leaves_its_wal_to_the_archive_only_when_that_is_in_its_own_storage() -> None:
    archiving = {"type": "ContinuousArchiving", "status": "True", "reason": "Archiving", "message": "ok"}
    conditions = [*READY["status"]["conditions"], archiving]

    def request(method: str | None, wal_storage: str | None) -> dict[str, Any]:
        spec = {**READY["spec"], "walArchive": {"storage": wal_storage} if wal_storage else None}
        (start,) = plan(
            view(method=method, instance={"spec": spec, "status": {"conditions": conditions}})
        ).actions
        assert isinstance(start, StartJob)
        return start.request

    assert request("physical", "s3")["archive"] == "apps/apps/postgres/demo/wal"
    assert "archive" not in request("physical", "elsewhere")  # its WAL goes in the tar
    assert "archive" not in request("physical", None)
    assert "archive" not in request("logical", "s3")
    # While the instance is not known to archive, a backup that relies on its archive waits.
    failing = {"type": "ContinuousArchiving", "status": "False", "reason": "ArchiveFailing", "message": "403"}
    stuck = {
        "spec": {**READY["spec"], "walArchive": {"storage": "s3"}},
        "status": {"conditions": [*READY["status"]["conditions"], failing]},
    }
    waiting = plan(view(method="physical", instance=stuck))
    assert (waiting.outcome.reason, waiting.outcome.fields, waiting.actions) == (
        "WalNotArchiving",
        {"phase": "Pending"},
        (),
    )
    assert "ContinuousArchiving False ArchiveFailing: 403" in waiting.outcome.message
    assert plan(view(method="logical", instance=stuck)).actions  # a logical one needs no archive


def test_a_backup_of_a_service_without_backups_or_of_a_method_it_has_not_fails_naming_the_field() -> None:
    unknown = plan(view(kind="Redis"))
    assert unknown.outcome.fields["phase"] == "Failed"
    assert "spec.service.kind" in unknown.outcome.message
    method = plan(view(kind="MongoDB", method="physical"))
    assert method.outcome.reason == "UnsupportedMethod"
    assert "spec.method: MongoDB backups are dump" in method.outcome.message


def test_a_running_backup_reports_its_progress_and_completes_with_its_job_s_report() -> None:
    step = plan(running(job=job("Running")))
    assert step.outcome.reason == "Running"
    assert step.outcome.fields == {"progress": {"bytes": 100}}
    assert step.actions == ()
    report = {
        "bytes": 4096,
        "objects": 2,
        "version": "16.4",
        "finishedAt": "2026-12-03T20:00:30Z",
        "physical": {"timeline": 2, "startLsn": "0/3000028", "endLsn": "0/3000100"},
        "peakMemoryBytes": {"job": 52428800},
    }
    done = plan(running(job=job("Succeeded", result=report)))
    assert done.outcome.ready
    assert done.outcome.fields["durationSeconds"] == 90
    assert done.outcome.fields["physical"]["timeline"] == 2
    assert done.outcome.fields["peakMemoryBytes"] == 52428800
    assert done.outcome.message == "4096 bytes in s3://b/p"


def test_a_failed_or_lost_backup_fails_and_deletes_what_it_uploaded() -> None:
    failed = plan(running(job=job("Failed", reason="StorageFull", message="the S3 server is out of space")))
    assert failed.outcome.fields["phase"] == "Failed"
    assert failed.outcome.reason == "StorageFull"
    assert failed.actions == (DeleteObjects(MANIFEST, best_effort=True),)
    lost = plan(running())
    assert lost.outcome.reason == "JobLost"
    assert lost.actions == (DeleteObjects(MANIFEST, best_effort=True),)
    error = StorageError("StorageNotFound", "spec.storage: BackupStorage s3 does not exist")
    unreachable = plan(running(storage=None, storage_error=error))
    assert "its partial objects remain: spec.storage: BackupStorage s3" in unreachable.outcome.message
    assert unreachable.actions == ()


def test_an_ended_backup_stays_as_it_ended() -> None:
    completed = replace(view(), status=BackupStatus(phase="Completed", bytes=10, location="s3://b/p"))
    assert plan(completed).outcome.ready
    assert plan(completed).actions == ()
    failed = replace(view(), status=BackupStatus(phase="Failed", reason="JobLost", message="gone"))
    assert (plan(failed).outcome.reason, plan(failed).outcome.message) == ("JobLost", "gone")


def test_a_deleted_backup_stops_its_job_first_then_takes_its_objects_unless_retained() -> None:
    step = plan(running(job=job("Running"), deleting=True), deletion=True)
    assert step.actions == (DeleteJob("backup", foreground=True),)
    assert not step.outcome.ready
    stopping = plan(running(job=replace(job("Running"), deleting=True), deleting=True), deletion=True)
    assert stopping.actions == ()
    gone = plan(running(deleting=True), deletion=True)
    assert gone.outcome.ready
    assert gone.actions == (DeleteObjects(MANIFEST),)
    completed = replace(view(deleting=True), status=BackupStatus(phase="Completed", manifest=MANIFEST))
    completed = replace(completed, spec=completed.spec.model_copy(update={"deletion_policy": "Delete"}))
    assert plan(completed, deletion=True).actions == (DeleteObjects(MANIFEST),)
    retained = replace(completed, spec=completed.spec.model_copy(update={"deletion_policy": "Retain"}))
    assert plan(retained, deletion=True).outcome.reason == "Retained"
    assert plan(retained, deletion=True).actions == ()
    missing = StorageError("StorageNotFound", "spec.storage: BackupStorage s3 does not exist")
    assert (
        plan(replace(completed, storage=None, storage_error=missing), deletion=True).outcome.reason
        == "StorageGone"
    )
    denied = StorageError("AccessDenied", "the S3 server refused the credentials")
    refused = plan(replace(completed, storage=None, storage_error=denied), deletion=True)
    assert (refused.outcome.ready, refused.outcome.retry_in) == (False, 30)
    assert plan(
        replace(view(deleting=True), status=BackupStatus(phase="Pending")), deletion=True
    ).outcome.ready


def test_a_backup_its_plan_pruned_takes_its_objects_though_it_is_retained() -> None:
    completed = replace(view(deleting=True), status=BackupStatus(phase="Completed", manifest=MANIFEST))
    assert completed.spec.deletion_policy == "Retain"  # the default, and what a plan sets
    assert plan(completed, deletion=True).outcome.reason == "Retained"
    pruned = replace(completed, pruned=True)
    assert plan(pruned, deletion=True).actions == (DeleteObjects(MANIFEST),)


def imported(location: str = "old/apps/postgres/demo/nightly-0a1b2c3d", **observed: Any) -> BackupView:
    found = view(instance=None, **observed)
    spec = found.spec.model_copy(update={"import_from": location})
    return replace(found, spec=spec)


def test_a_backup_already_in_the_storage_is_imported_as_its_manifest_says() -> None:
    location = "old/apps/postgres/demo/nightly-0a1b2c3d"
    assert plan(imported()).outcome.reason == "Importing"
    manifest = physical_manifest(
        ManifestObject(name="base.tar", key=f"{location}/base.tar", size=4096, sha256="ab" * 32),
        physical={"timeline": 2, "startLsn": "0/3000028", "endLsn": "0/3000100"},
    ).model_copy(update={"instance_spec": {"version": "16", "instances": 3}})
    step = plan(imported(imported=manifest))
    assert step.outcome.ready
    assert step.actions == ()  # nothing is taken
    fields = step.outcome.fields
    assert fields["manifest"] == f"{location}/manifest.json"
    assert fields["location"] == f"s3://backups/{location}"
    assert (fields["method"], fields["bytes"], fields["physical"]["timeline"]) == ("physical", 4096, 2)
    assert fields["instanceSpec"] == {"version": "16", "instances": 3}
    assert [e.reason for e in step.outcome.events] == ["Imported"]


def test_an_import_of_nothing_or_of_another_service_fails_naming_the_field() -> None:
    missing = StorageError(
        "ManifestMissing", "old/x/manifest.json does not exist: the backup never completed"
    )
    step = plan(imported(import_error=missing))
    assert step.outcome.fields["phase"] == "Failed"
    assert step.outcome.message.startswith("spec.importFrom: old/x/manifest.json does not exist")
    refused = plan(
        imported(import_error=StorageError("AccessDenied", "the S3 server refused the credentials"))
    )
    assert refused.outcome.fields == {"phase": "Pending"}
    other = physical_manifest().model_copy(update={"kind": "MongoDB"})
    mismatch = plan(imported(imported=other))
    assert mismatch.outcome.reason == "KindMismatch"
    assert mismatch.outcome.message.startswith("spec.service.kind:")


def test_an_imported_backup_is_named_after_its_location() -> None:
    assert backup_name("apps/apps/postgres/demo/nightly-0a1b2c3d") == "nightly-0a1b2c3d"
    body = imported_backup("p/x-1", physical_manifest(), "s3", "elsewhere")
    assert body["spec"] == {
        "service": {"kind": "Postgres", "name": "demo"},
        "storage": "s3",
        "importFrom": "p/x-1",
    }
    assert BackupSpec.model_validate(body["spec"]).import_from == "p/x-1"
    with pytest.raises(ValueError, match=r"import_from|importFrom"):
        BackupSpec.model_validate({**body["spec"], "importFrom": "/absolute/"})
