"""`BackupStorage` and `Backup`: the service-neutral resources of the backup engine,
run by the framework's object controller (`framework.object_controller`).

A `Backup` is one attempt, never repeated: it waits for its storage and a ready instance, runs
one Job (`backup.job`), and ends Completed (the manifest is written) or Failed (with the
reason its Job reported; partial objects are removed). Its state lives in `status`, so a
restarted operator follows the same Job. `Restore` (`backup.restore`) builds on them.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any

from lightkube import AsyncClient, codecs
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Secret
from lightkube.types import CascadeType
from pydantic import ConfigDict, Field

from backup.job import DEFAULT_DEADLINE, build_job
from backup.manifest import location, manifest_key
from backup.storage import CREDENTIAL_KEYS, S3Spec, StorageError, delete_prefix, explain, s3_client
from framework.binding import ServiceRef
from framework.kube import conditions
from framework.kube.api import EventNote, get_or_none
from framework.kube.jobs import job_name, read_job
from framework.kube.model import ApiModel, StatusModel, free_form
from framework.kube.secrets import decoded
from framework.kube.times import now_text, seconds_between
from framework.object_controller import ObjectKind, Outcome, Ref
from framework.plugin import Backups, ServicePlugin
from framework.spec import DeletionPolicy

IMMUTABLE = {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "spec is immutable"}]}


class Phase(StrEnum):
    """Where a Backup or a Restore stands (`status.phase`)."""

    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"


PENDING, RUNNING, COMPLETED, FAILED = Phase


INT64 = {"format": "int64"}  # sizes beyond 2 GiB


class PhysicalStatus(StatusModel):
    timeline: int | None = Field(default=None, json_schema_extra=INT64)
    start_lsn: str | None = None
    end_lsn: str | None = None


class BackupStatus(StatusModel):
    """`status` of a Backup besides its conditions."""

    phase: Phase | None = None
    reason: str | None = None
    message: str | None = None
    method: str | None = None
    job: str | None = None
    location: str | None = Field(default=None, description="s3://bucket/prefix of the backup's objects")
    manifest: str | None = Field(
        default=None, description="the manifest's key: the backup exists once it does"
    )
    started_at: str | None = None
    completed_at: str | None = None
    duration_seconds: float | None = None
    bytes: int | None = Field(default=None, json_schema_extra=INT64)
    objects: int | None = Field(default=None, json_schema_extra=INT64)
    peak_memory_bytes: int | None = Field(
        default=None, description="the backup Job's own peak", json_schema_extra=INT64
    )
    version: str | None = Field(default=None, description="the server's version when it was taken")
    progress: dict[str, Any] | None = free_form("the running Job's latest progress", nullable=True)
    physical: PhysicalStatus | None = None
    instance_spec: dict[str, Any] | None = free_form(
        "the instance's spec when taken: a Restore's new instance starts from it"
    )


class BackupStorageSpec(ApiModel):
    s3: S3Spec


class BackupSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=IMMUTABLE)
    service: ServiceRef
    storage: str = Field(min_length=1, description="The BackupStorage, in the same namespace.")
    method: str | None = Field(
        default=None,
        description="One of the methods the service offers (e.g. physical, logical); its first when empty.",
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN,
        description="Delete: deleting the Backup deletes its objects. Retain keeps them.",
    )
    deadline_seconds: int = Field(default=6 * 3600, ge=60, description="The Job's time limit.")


def backups_of(plugin: ServicePlugin) -> Backups:
    """The plugin's backups: a Backup, and so a Restore, is only ever of a service that has
    them (a Backup of any other fails at once, `UnknownService`)."""
    if plugin.backups is None:
        raise LookupError(f"{plugin.kind} has no backups")
    return plugin.backups


async def storage_client(client: AsyncClient, namespace: str, name: str) -> tuple[S3Spec, Any]:
    """The S3 settings of a BackupStorage and a boto3 client with its credentials."""
    body = await get_or_none(client, BackupStorageKind.resource(), name, namespace)
    if body is None:
        raise StorageError("StorageNotFound", f"spec.storage: BackupStorage {name} does not exist")
    spec = BackupStorageSpec.model_validate(body.get("spec") or {}).s3
    secret = await get_or_none(client, Secret, spec.credentials_secret, namespace)
    if secret is None:
        raise StorageError(
            "CredentialsMissing", f"s3.credentialsSecret: Secret {spec.credentials_secret} does not exist"
        )
    data = decoded(secret)
    missing = [k for k in CREDENTIAL_KEYS if not data.get(k)]
    if missing:
        raise StorageError(
            "CredentialsMissing",
            f"s3.credentialsSecret: Secret {spec.credentials_secret} lacks {', '.join(missing)}",
        )
    return spec, s3_client(spec, data["AWS_ACCESS_KEY_ID"], data["AWS_SECRET_ACCESS_KEY"])


class BackupStorageKind(ObjectKind):
    kind = "BackupStorage"
    plural = "backupstorages"
    spec_model = BackupStorageSpec
    finalizes = False

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: BackupStorageSpec) -> Outcome:
        try:
            s3, s3_api = await storage_client(client, body["metadata"]["namespace"], body["metadata"]["name"])
            await asyncio.to_thread(s3_api.head_bucket, Bucket=s3.bucket)
        except Exception as error:
            found = explain(error, spec.s3.bucket)
            return Outcome(False, found.reason, str(found), retry_in=30)
        where = f"s3://{s3.bucket}/{s3.prefix}".rstrip("/")
        return Outcome(True, "Available", f"{where} answers", retry_in=300)

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns[0:0] = [{"name": "Bucket", "type": "string", "jsonPath": ".spec.s3.bucket"}]
        return columns


def ready_condition(body: dict[str, Any] | None) -> bool:
    found = conditions.find(((body or {}).get("status") or {}).get("conditions"), conditions.READY)
    return bool(found and found.get("status") == "True")


class JobKind(ObjectKind):
    """A kind whose work runs in a Job from the operator's image."""

    def __init__(self, plugins: list[ServicePlugin], job_image: str) -> None:
        self.plugins = {p.kind: p for p in plugins}
        self.job_image = job_image

    async def start_job(
        self,
        client: AsyncClient,
        body: dict[str, Any],
        action: str,
        request: dict[str, Any],
        storage: S3Spec,
        service_env: list[dict[str, Any]],
        deadline_seconds: int = DEFAULT_DEADLINE,
        retries: int = 0,
        owned_by: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        if not self.job_image:
            raise StorageError("NoJobImage", "the operator runs without --job-image: it cannot start Jobs")
        job = build_job(
            owner_kind=self.kind,
            owner=body,
            action=action,
            request=request,
            storage=storage,
            service_env=service_env,
            image=self.job_image,
            deadline_seconds=deadline_seconds,
            retries=retries,
            owned_by=owned_by,
        )
        await client.create(codecs.from_dict(job))


class BackupKind(JobKind):
    kind = "Backup"
    plural = "backups"
    spec_model = BackupSpec
    status_model = BackupStatus
    deleted_by_operator = True  # a plan's retention

    def ended(self, status: BackupStatus) -> Outcome:
        if status.phase == COMPLETED:
            return Outcome(True, "Completed", f"{status.bytes or 0} bytes in {status.location}")
        return Outcome(False, status.reason or "Failed", status.message or "the backup failed")

    def failed(self, reason: str, message: str, **fields: Any) -> Outcome:
        return Outcome(
            False,
            reason,
            message,
            fields={
                "phase": FAILED,
                "reason": reason,
                "message": message,
                "completedAt": now_text(),
                **fields,
            },
        )

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: BackupSpec) -> Outcome:
        status = BackupStatus.model_validate(body.get("status") or {})
        if status.phase in (COMPLETED, FAILED):
            return self.ended(status)
        meta = body["metadata"]
        namespace = meta["namespace"]
        plugin = self.plugins.get(spec.service.kind)
        if plugin is None or plugin.backups is None:
            known = ", ".join(sorted(k for k, p in self.plugins.items() if p.backups))
            return self.failed(
                "UnknownService", f"spec.service.kind: {spec.service.kind} has no backups; one of {known}"
            )
        backups = plugin.backups
        method = spec.method or backups.methods[0]
        if method not in backups.methods:
            return self.failed(
                "UnsupportedMethod",
                f"spec.method: {plugin.kind} backups are {' or '.join(backups.methods)}, not {method}",
            )
        storage_ref, service_ref = Ref("BackupStorage", spec.storage), Ref(plugin.kind, spec.service.name)
        waiting = frozenset({storage_ref, service_ref})
        name = job_name(meta["name"], "backup")
        job, state, progress = await read_job(client, namespace, name)
        if job is None and status.phase == RUNNING:
            return await self.cleanup_failed(
                client, body, spec, "JobLost", f"Job {name} was deleted before it ended"
            )
        if job is None:
            try:
                s3, _ = await storage_client(client, namespace, spec.storage)
            except StorageError as error:
                return Outcome(
                    False,
                    error.reason,
                    str(error),
                    depends_on=waiting,
                    retry_in=30,
                    fields={"phase": PENDING},
                )
            instance = await get_or_none(client, plugin.resource(), spec.service.name, namespace)
            if instance is None:
                return Outcome(
                    False,
                    "ServiceNotFound",
                    f"spec.service.name: {plugin.kind} {spec.service.name} does not exist",
                    depends_on=waiting,
                    fields={"phase": PENDING},
                )
            if not ready_condition(instance):
                return Outcome(
                    False,
                    "InstanceNotReady",
                    f"{plugin.kind} {spec.service.name} is not ready: the backup starts once it is",
                    depends_on=waiting,
                    retry_in=15,
                    fields={"phase": PENDING},
                )
            where = location(s3.prefix, namespace, plugin.kind, spec.service.name, meta["name"], meta["uid"])
            request = {
                "action": "backup",
                "driver": backups.driver,
                "storage": s3.to_api(),
                "location": where,
                "method": method,
                "backup": {"namespace": namespace, "name": meta["name"], "uid": meta["uid"]},
                "service": {"kind": plugin.kind, "name": spec.service.name},
            }
            await self.start_job(
                client,
                body,
                "backup",
                request,
                s3,
                backups.job_env(spec.service.name),
                spec.deadline_seconds,
            )
            fields = {
                "phase": RUNNING,
                "method": method,
                "job": name,
                "startedAt": now_text(),
                "location": f"s3://{s3.bucket}/{where}",
                "manifest": manifest_key(where),
                "instanceSpec": instance.get("spec") or {},
            }
            return Outcome(
                False,
                "Running",
                f"Job {name} takes a {method} backup of {plugin.kind} {spec.service.name}",
                fields=fields,
                retry_in=3,
                events=(EventNote("Normal", "Started", f"Job {name} takes a {method} backup"),),
            )
        if state.phase == RUNNING:
            fields = {"progress": progress} if progress else {}
            done = f": {progress.get('bytes', 0)} bytes so far" if progress else ""
            return Outcome(False, "Running", f"Job {name} is running{done}", fields=fields, retry_in=5)
        if state.phase == "Failed":
            return await self.cleanup_failed(client, body, spec, state.reason, state.message)
        result = state.result or {}
        fields = {
            "phase": COMPLETED,
            "bytes": result.get("bytes", 0),
            "objects": result.get("objects", 0),
            "version": result.get("version"),
            "startedAt": result.get("startedAt") or status.started_at,
            "completedAt": result.get("finishedAt") or now_text(),
            "manifest": result.get("manifest") or status.manifest,
            "progress": None,
            "peakMemoryBytes": (result.get("peakMemoryBytes") or {}).get("job"),
        }
        fields["durationSeconds"] = seconds_between(fields["startedAt"], fields["completedAt"])
        if result.get("physical"):
            fields["physical"] = result["physical"]
        message = f"{fields['bytes']} bytes in {status.location}"
        return Outcome(
            True, "Completed", message, fields=fields, events=(EventNote("Normal", "Completed", message),)
        )

    async def cleanup_failed(
        self, client: AsyncClient, body: dict[str, Any], spec: BackupSpec, reason: str, message: str
    ) -> Outcome:
        """A failed backup leaves nothing: a partial upload never counts."""
        note = ""
        try:
            await self.delete_objects(client, body, spec)
        except Exception as error:
            note = f" (its partial objects remain: {explain(error, '')})"
        outcome = self.failed(reason, message + note, progress=None)
        return Outcome(
            outcome.ready,
            outcome.reason,
            outcome.message,
            fields=outcome.fields,
            events=(EventNote("Warning", reason, outcome.message),),
        )

    async def delete_objects(self, client: AsyncClient, body: dict[str, Any], spec: BackupSpec) -> int:
        manifest = BackupStatus.model_validate(body.get("status") or {}).manifest
        if not manifest:
            return 0  # never started
        s3, s3_api = await storage_client(client, body["metadata"]["namespace"], spec.storage)
        prefix = manifest.rsplit("/", 1)[0]
        return await asyncio.to_thread(delete_prefix, s3_api, s3, prefix, manifest)

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: BackupSpec) -> Outcome:
        phase = BackupStatus.model_validate(body.get("status") or {}).phase
        if phase == COMPLETED and spec.deletion_policy == DeletionPolicy.RETAIN:
            return Outcome(
                True, "Retained", "deletionPolicy Retain: the backup's objects stay in the storage"
            )
        if phase == RUNNING:
            # Its Job stopped, pod and all, first: an upload still going would leave objects
            # behind the deletion.
            meta = body["metadata"]
            name = job_name(meta["name"], "backup")
            job, state, _ = await read_job(client, meta["namespace"], name)
            if job is not None and state.phase == RUNNING:
                if not (job.get("metadata") or {}).get("deletionTimestamp"):
                    await client.delete(
                        Job, name, namespace=meta["namespace"], cascade=CascadeType.FOREGROUND
                    )
                return Outcome(
                    False, "Stopping", f"deleted while it ran: Job {name} is stopped first", retry_in=3
                )
        try:
            deleted = await self.delete_objects(client, body, spec)
        except StorageError as error:
            if error.reason == "StorageNotFound":
                return Outcome(True, "StorageGone", f"{error}: nothing can be deleted")
            return Outcome(
                False, error.reason, f"the backup's objects cannot be deleted yet: {error}", retry_in=30
            )
        return Outcome(True, "Deleted", f"{deleted} objects deleted from the storage")

    def printer_columns(self) -> list[dict[str, Any]]:
        return [
            {"name": "Service", "type": "string", "jsonPath": ".spec.service.name"},
            {"name": "Method", "type": "string", "jsonPath": ".status.method"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Bytes", "type": "integer", "jsonPath": ".status.bytes"},
            {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]
