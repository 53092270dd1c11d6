"""`Backup`, decided: a pure planner of one pass from what it observed (the Job, the storage,
the instance), and of its deletion. `backup.take.BackupKind` observes and runs the actions.

A Backup is one attempt, never repeated: Pending (its storage or instance not ready) ->
Running (Job `<backup>-backup`) -> Completed (its report: bytes, objects, WAL positions) or
Failed (the Job's reason; its partial objects deleted). Deleted, a Completed one takes its
objects with it unless `deletionPolicy: Retain`; a Running one stops its Job first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backup.job import DeleteJob, StartJob
from backup.manifest import Manifest, location, manifest_key
from backup.point_in_time import Archive, load_archive
from backup.resources import COMPLETED, FAILED, PENDING, RUNNING, BackupSpec, BackupStatus, ready_condition
from backup.storage import S3Spec, StorageError
from framework.kube.api import EventNote
from framework.kube.jobs import NO_JOB, JobView, job_name
from framework.kube.times import seconds_between
from framework.object_controller import Outcome, Ref
from framework.plugin import ServicePlugin
from framework.spec import DeletionPolicy

# Set by a BackupPlan's retention on a Backup it deletes: its objects go with it, whatever its
# deletionPolicy (Retain, for every Backup a plan makes: deleting a namespace, or
# `kubectl delete backups --all`, must not delete the off-site copies).
PRUNED_BY = "statefleet.dev/pruned-by"
STORAGE_NOT_READ = StorageError("StorageNotFound", "the storage was not read")


@dataclass(frozen=True)
class BackupView:
    """What one pass observed of a Backup and the objects it works with."""

    name: str
    namespace: str
    uid: str
    spec: BackupSpec
    status: BackupStatus
    deleting: bool = False
    pruned: bool = False  # deleted by its plan's retention (`PRUNED_BY`)
    job: JobView = NO_JOB
    storage: S3Spec | None = None  # read while it may start, clean up or delete
    storage_error: StorageError | None = None
    instance: dict[str, Any] | None = None  # read before it starts
    imported: Manifest | None = None  # spec.importFrom's manifest, read until it completes
    import_error: StorageError | None = None


@dataclass(frozen=True)
class DeleteObjects:
    """Every object under the backup's prefix, its manifest first (it stops existing before its
    parts go). `best_effort`: a failure is told in the outcome (`partial objects remain`)."""

    manifest: str
    best_effort: bool = False


Action = StartJob | DeleteJob | DeleteObjects


@dataclass(frozen=True)
class BackupStep:
    outcome: Outcome
    actions: tuple[Action, ...] = ()


def failed(reason: str, message: str, now: str, **fields: Any) -> Outcome:
    fields = {"phase": FAILED, "reason": reason, "message": message, "completedAt": now, **fields}
    return Outcome(False, reason, message, fields=fields, events=(EventNote("Warning", reason, message),))


def plan_backup(view: BackupView, plugins: Mapping[str, ServicePlugin], now: str) -> BackupStep:
    """One pass of a living Backup. `now`: the time written into status."""
    spec, status = view.spec, view.status
    if status.phase == COMPLETED:
        return BackupStep(Outcome(True, "Completed", f"{status.bytes or 0} bytes in {status.location}"))
    if status.phase == FAILED:
        return BackupStep(Outcome(False, status.reason or "Failed", status.message or "the backup failed"))
    plugin = plugins.get(spec.service.kind)
    if plugin is None or plugin.backups is None:
        known = ", ".join(sorted(k for k, p in plugins.items() if p.backups))
        message = f"spec.service.kind: {spec.service.kind} has no backups; one of {known}"
        return BackupStep(failed("UnknownService", message, now))
    backups = plugin.backups
    method = spec.method or backups.methods[0]
    if method not in backups.methods:
        message = f"spec.method: {plugin.kind} backups are {' or '.join(backups.methods)}, not {method}"
        return BackupStep(failed("UnsupportedMethod", message, now))
    if spec.import_from:
        return plan_import(view, plugin, now)
    name = job_name(view.name, "backup")
    job = view.job
    if not job.exists and status.phase == RUNNING:
        return fail_and_clean_up(view, "JobLost", f"Job {name} was deleted before it ended", now)
    if not job.exists:
        return start(view, plugin, method, now)
    if job.state.phase == RUNNING:
        progress = job.progress
        done = f": {progress.get('bytes', 0)} bytes so far" if progress else ""
        fields = {"progress": progress} if progress else {}
        return BackupStep(
            Outcome(False, "Running", f"Job {name} is running{done}", fields=fields, retry_in=5)
        )
    if job.state.phase == FAILED:
        return fail_and_clean_up(view, job.state.reason, job.state.message, now)
    result = job.state.result or {}
    fields = {
        "phase": COMPLETED,
        "bytes": result.get("bytes", 0),
        "objects": result.get("objects", 0),
        "version": result.get("version"),
        "startedAt": result.get("startedAt") or status.started_at,
        "completedAt": result.get("finishedAt") or now,
        "manifest": result.get("manifest") or status.manifest,
        "progress": None,
        "peakMemoryBytes": (result.get("peakMemoryBytes") or {}).get("job"),
    }
    fields["durationSeconds"] = seconds_between(fields["startedAt"], fields["completedAt"])
    if result.get("physical"):
        fields["physical"] = result["physical"]
    message = f"{fields['bytes']} bytes in {status.location}"
    note = EventNote("Normal", "Completed", message)
    return BackupStep(Outcome(True, "Completed", message, fields=fields, events=(note,)))


def plan_import(view: BackupView, plugin: ServicePlugin, now: str) -> BackupStep:
    """A backup already in the storage (`spec.importFrom`): Completed as its manifest says, once
    the manifest was read; Failed when there is none there, or it is another service's."""
    spec = view.spec
    where = spec.import_from or ""
    if view.storage is None:
        error = view.storage_error or STORAGE_NOT_READ
        waiting = frozenset({Ref("BackupStorage", spec.storage)})
        return BackupStep(
            Outcome(
                False, error.reason, str(error), depends_on=waiting, retry_in=30, fields={"phase": PENDING}
            )
        )
    if view.import_error is not None:
        error = view.import_error
        if error.reason not in ("ManifestMissing", "ManifestInvalid"):  # the storage refused: again
            return BackupStep(
                Outcome(False, error.reason, str(error), retry_in=30, fields={"phase": PENDING})
            )
        return BackupStep(failed("ImportNotFound", f"spec.importFrom: {error}", now))
    manifest = view.imported
    if manifest is None:
        return BackupStep(Outcome(False, "Importing", f"the manifest of {where} is read", retry_in=5))
    if manifest.kind != plugin.kind:
        message = f"spec.service.kind: {where} is a backup of a {manifest.kind}, not of a {plugin.kind}"
        return BackupStep(failed("KindMismatch", message, now))
    fields: dict[str, Any] = {
        "phase": COMPLETED,
        "method": manifest.method,
        "bytes": manifest.size,
        "objects": len(manifest.objects),
        "version": manifest.version,
        "startedAt": manifest.started_at,
        "completedAt": manifest.finished_at,
        "durationSeconds": seconds_between(manifest.started_at, manifest.finished_at),
        "location": f"s3://{view.storage.bucket}/{where}",
        "manifest": manifest_key(where),
    }
    if manifest.physical:
        fields["physical"] = manifest.physical.model_dump(by_alias=True)
    if manifest.instance_spec is not None:
        fields["instanceSpec"] = manifest.instance_spec
    source = f"{manifest.kind} {manifest.namespace}/{manifest.instance}, Backup {manifest.backup}"
    message = f"imported {where}: {manifest.size} bytes, a {manifest.method} backup of {source}"
    note = EventNote("Normal", "Imported", message)
    return BackupStep(Outcome(True, "Completed", message, fields=fields, events=(note,)))


def start(view: BackupView, plugin: ServicePlugin, method: str, now: str) -> BackupStep:
    """Once its storage answers and its instance is ready: the Job, and where it writes."""
    spec = view.spec
    assert plugin.backups is not None
    waiting = frozenset({Ref("BackupStorage", spec.storage), Ref(plugin.kind, spec.service.name)})
    if view.storage is None:
        error = view.storage_error or STORAGE_NOT_READ
        outcome = Outcome(
            False, error.reason, str(error), depends_on=waiting, retry_in=30, fields={"phase": PENDING}
        )
        return BackupStep(outcome)
    instance = f"{plugin.kind} {spec.service.name}"
    if view.instance is None:
        message = f"spec.service.name: {instance} does not exist"
        outcome = Outcome(False, "ServiceNotFound", message, depends_on=waiting, fields={"phase": PENDING})
        return BackupStep(outcome)
    if not ready_condition(view.instance):
        message = f"{instance} is not ready: the backup starts once it is"
        fields = {"phase": PENDING}
        return BackupStep(
            Outcome(False, "InstanceNotReady", message, depends_on=waiting, retry_in=15, fields=fields)
        )
    s3 = view.storage
    where = location(s3.prefix, view.namespace, plugin.kind, spec.service.name, view.name, view.uid)
    archive = wal_archive(plugin, method, view.instance.get("spec") or {}, spec.storage)
    not_archiving = archive.not_archiving(view.instance) if archive else None
    if not_archiving:
        # The backup is complete only once its WAL is archived: it waits for archiving.
        message = (
            f"{instance} is not known to archive its WAL now ({not_archiving}), and this backup's WAL "
            "goes there: it starts once it does"
        )
        fields = {"phase": PENDING}
        return BackupStep(
            Outcome(False, "WalNotArchiving", message, depends_on=waiting, retry_in=30, fields=fields)
        )
    request = {
        "action": "backup",
        "driver": plugin.backups.driver,
        "storage": s3.to_api(),
        "location": where,
        "method": method,
        "backup": {"namespace": view.namespace, "name": view.name, "uid": view.uid},
        "service": {"kind": plugin.kind, "name": spec.service.name},
        "instanceSpec": view.instance.get("spec") or {},
    }
    if archive is not None:
        request["archive"] = archive.prefix(s3.prefix, view.namespace, spec.service.name)
    name = job_name(view.name, "backup")
    fields = {
        "phase": RUNNING,
        "method": method,
        "job": name,
        "startedAt": now,
        "location": f"s3://{s3.bucket}/{where}",
        "manifest": manifest_key(where),
        "instanceSpec": view.instance.get("spec") or {},
    }
    outcome = Outcome(
        False,
        "Running",
        f"Job {name} takes a {method} backup of {instance}",
        fields=fields,
        retry_in=3,
        events=(EventNote("Normal", "Started", f"Job {name} takes a {method} backup"),),
    )
    return BackupStep(outcome, (StartJob("backup", request, deadline_seconds=spec.deadline_seconds),))


def wal_archive(
    plugin: ServicePlugin, method: str, instance_spec: dict[str, Any], storage: str
) -> Archive | None:
    """The service's continuous archive when a backup by `method` relies on it for its WAL: a
    bootstrap method's, of an instance that archives into the backup's own storage."""
    backups = plugin.backups
    if backups is None or backups.point_in_time is None or method not in backups.bootstrap_methods:
        return None
    archive = load_archive(backups.point_in_time)
    return archive if archive.storage_of(instance_spec) == storage else None


def fail_and_clean_up(view: BackupView, reason: str, message: str, now: str) -> BackupStep:
    """A failed backup leaves nothing: a partial upload never counts."""
    if not view.status.manifest:  # never started
        return BackupStep(failed(reason, message, now, progress=None))
    if view.storage is None:
        error = view.storage_error or STORAGE_NOT_READ
        return BackupStep(
            failed(reason, f"{message} (its partial objects remain: {error})", now, progress=None)
        )
    return BackupStep(
        failed(reason, message, now, progress=None), (DeleteObjects(view.status.manifest, best_effort=True),)
    )


def plan_backup_deletion(view: BackupView) -> BackupStep:
    """A Backup deleted: its objects go with it when its deletionPolicy is Delete or its plan's
    retention deleted it, after its Job stopped."""
    status = view.status
    keep = view.spec.deletion_policy == DeletionPolicy.RETAIN and not view.pruned
    if status.phase == COMPLETED and keep:
        return BackupStep(
            Outcome(True, "Retained", "deletionPolicy Retain: the backup's objects stay in the storage")
        )
    if status.phase == RUNNING and view.job.exists and view.job.state.phase == RUNNING:
        # Its Job stopped, pod and all, first: an upload still going would leave objects
        # behind the deletion.
        name = job_name(view.name, "backup")
        stop = () if view.job.deleting else (DeleteJob("backup", foreground=True),)
        return BackupStep(
            Outcome(False, "Stopping", f"deleted while it ran: Job {name} is stopped first", retry_in=3), stop
        )
    if not status.manifest:
        return BackupStep(Outcome(True, "Deleted", "0 objects deleted from the storage"))
    if view.storage is None:
        error = view.storage_error or STORAGE_NOT_READ
        if error.reason == "StorageNotFound":
            return BackupStep(Outcome(True, "StorageGone", f"{error}: nothing can be deleted"))
        return BackupStep(
            Outcome(False, error.reason, f"the backup's objects cannot be deleted yet: {error}", retry_in=30)
        )
    return BackupStep(
        Outcome(True, "Deleted", "objects deleted from the storage"), (DeleteObjects(status.manifest),)
    )
