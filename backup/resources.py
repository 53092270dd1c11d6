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

from backup.job import DeleteJob, StartJob, build_job
from backup.sealing import Keyring, SealError, keyring_from, secret_source
from backup.storage import CREDENTIAL_KEYS, BackupStorageSpec, S3Spec, StorageError, explain, s3_client
from framework.binding import ServiceRef
from framework.kube import conditions
from framework.kube.api import get_or_none
from framework.kube.jobs import job_name
from framework.kube.model import ApiModel, StatusModel, free_form
from framework.kube.secrets import decoded
from framework.object_controller import ObjectKind, Outcome
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
    archive: str | None = Field(
        default=None,
        description="s3://bucket/prefix of the archive that holds its WAL (empty: the backup holds it)",
    )


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
    import_from: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        pattern=r"^[^/](.*[^/])?$",
        description="A backup already in the storage, by its location (the key prefix of its manifest, "
        "as `statefleet backups found` lists them): this Backup stands for it and takes nothing, e.g. "
        "in a new namespace or cluster after a disaster. The manifest must be of spec.service.kind; "
        "restoring it needs no other object. With deletionPolicy Delete, deleting this Backup deletes "
        "those objects.",
    )


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


async def storage_keyring(client: AsyncClient, namespace: str, spec: S3Spec) -> Keyring | None:
    """The storage's sealing keys, for what the operator itself reads of it (a manifest to
    import, an archive's timeline histories); None when it does not encrypt. `SealError`
    KeyMissing or KeyInvalid naming the Secret and the entry."""
    if spec.encryption is None:
        return None
    source = secret_source(spec.encryption)
    secret = await get_or_none(client, Secret, spec.encryption.keys_secret, namespace)
    if secret is None:
        raise SealError("KeyMissing", f"{source} does not exist")
    return keyring_from(decoded(secret), spec.encryption.key, source)


class BackupStorageKind(ObjectKind):
    kind = "BackupStorage"
    plural = "backupstorages"
    spec_model = BackupStorageSpec
    finalizes = False

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: BackupStorageSpec) -> Outcome:
        try:
            namespace = body["metadata"]["namespace"]
            s3, s3_api = await storage_client(client, namespace, body["metadata"]["name"])
            await asyncio.to_thread(s3_api.head_bucket, Bucket=s3.bucket)
            # Checked here so that a key missing is said before a backup fails for it.
            keyring = await storage_keyring(client, namespace, s3)
            sealing = f"; sealing with key {keyring.current} ({keyring.current_id()})" if keyring else ""
        except Exception as error:
            found = explain(error, spec.s3.bucket)
            return Outcome(False, found.reason, str(found), retry_in=30)
        where = f"s3://{s3.bucket}/{s3.prefix}".rstrip("/")
        return Outcome(True, "Available", f"{where} answers{sealing}", retry_in=300)

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
        start: StartJob,
        storage: S3Spec,
        service_env: list[dict[str, Any]],
        owned_by: tuple[str, dict[str, Any]] | None = None,
        client_of: dict[str, str] | None = None,
    ) -> None:
        if not self.job_image:
            raise StorageError("NoJobImage", "the operator runs without --job-image: it cannot start Jobs")
        job = build_job(
            owner_kind=self.kind,
            owner=body,
            action=start.action,
            request=start.request,
            storage=storage,
            service_env=service_env,
            image=self.job_image,
            deadline_seconds=start.deadline_seconds,
            retries=start.retries,
            owned_by=owned_by,
            client_of=client_of,
        )
        await client.create(codecs.from_dict(job))

    async def delete_job(self, client: AsyncClient, body: dict[str, Any], delete: DeleteJob) -> None:
        cascade = CascadeType.FOREGROUND if delete.foreground else CascadeType.BACKGROUND
        name = job_name(body["metadata"]["name"], delete.action)
        await client.delete(Job, name, namespace=body["metadata"]["namespace"], cascade=cascade)
