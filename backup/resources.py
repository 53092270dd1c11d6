"""`BackupStorage`, `Backup` and `Restore`: the service-neutral resources of the backup engine,
run by the framework's in-service controller (`framework.inservice`).

A `Backup` is one attempt, never repeated: it waits for its storage and a ready instance, runs
one Job (`backup.job`), and ends Completed (the manifest is written) or Failed (with the
reason its Job reported; partial objects are removed). Its state lives in `status`, so a
restarted operator follows the same Job. A `Restore` checks its backup, creates the target
instance when it does not exist (from the spec the backup recorded), waits for it, and runs
a restore Job, which verifies every object's checksum before it applies anything.
"""

from __future__ import annotations

import asyncio
import base64
import calendar
import json
import time
from typing import Any

from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import CascadeType, PatchType
from pydantic import ConfigDict, Field

from backup import in_place
from backup.job import DEFAULT_DEADLINE, JobState, build_job, job_name, job_state, last_progress, termination
from backup.manifest import location, manifest_key
from backup.storage import CREDENTIAL_KEYS, S3Spec, StorageError, delete_prefix, explain, s3_client
from framework import conditions
from framework.api import get_or_none
from framework.binding import ServiceRef
from framework.inservice import InServiceKind, Outcome, Ref
from framework.plugin import LABEL_INSTANCE, LABEL_NAME, ServicePlugin
from framework.reconcile import API_VERSION, EventNote, owner_reference
from framework.spec import ApiModel, DeletionPolicy

IMMUTABLE = {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "spec is immutable"}]}
PENDING, RUNNING, COMPLETED, FAILED = "Pending", "Running", "Completed", "Failed"
RESTORED_BY = "statefleet.dev/restored-by"  # annotation on an instance a Restore created
# <instance>-bootstrap: the Secret a new instance's pods read a physical backup with (the
# plugin's templates name it so too).
BOOTSTRAP_SECRET = "bootstrap"


class BackupStorageSpec(ApiModel):
    s3: S3Spec


class BackupSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=IMMUTABLE)
    service: ServiceRef
    storage: str = Field(min_length=1, description="The BackupStorage, in the same namespace.")
    method: str | None = Field(
        default=None, description="physical or logical for Postgres; the service's first when empty."
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN,
        description="Delete: deleting the Backup deletes its objects. Retain keeps them.",
    )
    deadline_seconds: int = Field(default=6 * 3600, ge=60, description="The Job's time limit.")


class RestoreTarget(ApiModel):
    kind: str = Field(min_length=1)
    name: str = Field(
        min_length=1, max_length=40, description="The instance; created from the backup when missing."
    )
    spec: dict[str, Any] = Field(
        default_factory=dict,
        description="Fields of the new instance's spec over the backup's recorded one, e.g. {instances: 1}.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    replace: bool = Field(
        default=False,
        description="Restore into this existing instance. A logical backup replaces the databases it "
        "holds, online (sessions on them are ended); a physical one replaces the whole cluster: the "
        "instance stops, its primary's data is kept aside and the backup put in its place, the other "
        "pods clone it. Either way the instance's own data is kept until the restore and its check "
        "succeeded, and put back otherwise.",
    )


class RestoreCheck(ApiModel):
    query: str | None = Field(
        default=None, description="Run once restored; its first value must be true or non-zero."
    )
    database: str = Field(default="postgres", description="Where the query runs.")


class RestoreSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=IMMUTABLE)
    backup: str = Field(min_length=1, description="The Backup, in the same namespace.")
    target: RestoreTarget
    check: RestoreCheck | None = Field(
        default=None, description="After the restore, read every table (and run the query): a restore test."
    )


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


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


class BackupStorageKind(InServiceKind):
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


async def read_job(
    client: AsyncClient, namespace: str, name: str
) -> tuple[dict[str, Any] | None, JobState, Any]:
    """The Job, where it stands, and its latest progress line."""
    job = await get_or_none(client, Job, name, namespace)
    if job is None:
        return None, JobState(RUNNING), None
    pods = [p.to_dict() async for p in client.list(Pod, namespace=namespace, labels={"job-name": name})]
    pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)
    state = job_state(job, pod)
    progress = None
    if state.phase == RUNNING and pod and (pod.get("status") or {}).get("phase") == "Running":
        try:
            lines = [
                line async for line in client.log(pod["metadata"]["name"], namespace=namespace, tail_lines=5)
            ]
            progress = last_progress("".join(lines))
        except ApiError:
            pass  # the log is not there yet
    return job, state, progress


def seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    parse = lambda s: time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ"))  # noqa: E731
    return max(0.0, parse(end) - parse(start))


ISO = "%Y-%m-%dT%H:%M:%SZ"


def now_iso() -> str:
    return time.strftime(ISO, time.gmtime())


def ready_condition(body: dict[str, Any] | None) -> bool:
    found = conditions.find(((body or {}).get("status") or {}).get("conditions"), conditions.READY)
    return bool(found and found.get("status") == "True")


class JobKind(InServiceKind):
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
        )
        await client.create(codecs.from_dict(job))


class BackupKind(JobKind):
    kind = "Backup"
    plural = "backups"
    spec_model = BackupSpec

    def ended(self, status: dict[str, Any]) -> Outcome:
        if status.get("phase") == COMPLETED:
            return Outcome(True, "Completed", f"{status.get('bytes', 0)} bytes in {status.get('location')}")
        return Outcome(False, status.get("reason") or "Failed", status.get("message") or "the backup failed")

    def failed(self, reason: str, message: str, **fields: Any) -> Outcome:
        return Outcome(
            False,
            reason,
            message,
            fields={
                "phase": FAILED,
                "reason": reason,
                "message": message,
                "completedAt": now_iso(),
                **fields,
            },
        )

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: BackupSpec) -> Outcome:
        status = body.get("status") or {}
        if status.get("phase") in (COMPLETED, FAILED):
            return self.ended(status)
        meta = body["metadata"]
        namespace = meta["namespace"]
        plugin = self.plugins.get(spec.service.kind)
        if plugin is None or not plugin.backup_driver:
            known = ", ".join(sorted(k for k, p in self.plugins.items() if p.backup_driver))
            return self.failed(
                "UnknownService", f"spec.service.kind: {spec.service.kind} has no backups; one of {known}"
            )
        method = spec.method or plugin.backup_methods[0]
        if method not in plugin.backup_methods:
            return self.failed(
                "UnsupportedMethod",
                f"spec.method: {plugin.kind} backups are {' or '.join(plugin.backup_methods)}, not {method}",
            )
        storage_ref, service_ref = Ref("BackupStorage", spec.storage), Ref(plugin.kind, spec.service.name)
        waiting = frozenset({storage_ref, service_ref})
        name = job_name(meta["name"], "backup")
        job, state, progress = await read_job(client, namespace, name)
        if job is None and status.get("phase") == RUNNING:
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
                "driver": plugin.backup_driver,
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
                plugin.backup_env(spec.service.name),
                spec.deadline_seconds,
            )
            fields = {
                "phase": RUNNING,
                "method": method,
                "job": name,
                "startedAt": now_iso(),
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
            "startedAt": result.get("startedAt") or status.get("startedAt"),
            "completedAt": result.get("finishedAt") or now_iso(),
            "manifest": result.get("manifest") or status.get("manifest"),
            "progress": None,
            "peakMemoryBytes": (result.get("peakMemoryBytes") or {}).get("job"),
        }
        fields["durationSeconds"] = seconds_between(fields["startedAt"], fields["completedAt"])
        if result.get("physical"):
            fields["physical"] = result["physical"]
        message = f"{fields['bytes']} bytes in {status.get('location')}"
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
        status = body.get("status") or {}
        if not status.get("manifest"):
            return 0  # never started
        s3, s3_api = await storage_client(client, body["metadata"]["namespace"], spec.storage)
        prefix = status["manifest"].rsplit("/", 1)[0]
        return await asyncio.to_thread(delete_prefix, s3_api, s3, prefix, status["manifest"])

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: BackupSpec) -> Outcome:
        phase = (body.get("status") or {}).get("phase")
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

    def status_properties(self) -> dict[str, Any]:
        string, integer = {"type": "string"}, {"type": "integer", "format": "int64"}
        return {
            "phase": {"type": "string", "enum": [PENDING, RUNNING, COMPLETED, FAILED]},
            "reason": string,
            "message": string,
            "method": string,
            "job": string,
            "location": {"type": "string", "description": "s3://bucket/prefix of the backup's objects"},
            "manifest": {
                "type": "string",
                "description": "the manifest's key: the backup exists once it does",
            },
            "startedAt": string,
            "completedAt": string,
            "durationSeconds": {"type": "number"},
            "bytes": integer,
            "objects": integer,
            "peakMemoryBytes": {
                "type": "integer",
                "format": "int64",
                "description": "the backup Job's own peak",
            },
            "version": {"type": "string", "description": "the server's version when it was taken"},
            "progress": {"type": "object", "nullable": True, "x-kubernetes-preserve-unknown-fields": True},
            "physical": {
                "type": "object",
                "properties": {"timeline": integer, "startLsn": string, "endLsn": string},
            },
            "instanceSpec": {
                "type": "object",
                "description": "the instance's spec when taken: a Restore's new instance starts from it",
                "x-kubernetes-preserve-unknown-fields": True,
            },
        }

    def printer_columns(self) -> list[dict[str, Any]]:
        return [
            {"name": "Service", "type": "string", "jsonPath": ".spec.service.name"},
            {"name": "Method", "type": "string", "jsonPath": ".status.method"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Bytes", "type": "integer", "jsonPath": ".status.bytes"},
            {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]


async def bootstrap_failure(
    client: AsyncClient, plugin: ServicePlugin, namespace: str, instance: str
) -> tuple[str, str] | None:
    """The reason and message a new instance's restore init container failed with, if it did."""
    labels = {LABEL_INSTANCE: instance, LABEL_NAME: plugin.service}
    async for pod in client.list(Pod, namespace=namespace, labels=labels):
        for container in pod.to_dict().get("status", {}).get("initContainerStatuses") or []:
            if container.get("name") != "restore":
                continue
            for state in (container.get("state") or {}, container.get("lastState") or {}):
                terminated = state.get("terminated") or {}
                if terminated.get("exitCode"):
                    report, how = termination({"status": {"containerStatuses": [{"state": state}]}})
                    if report and "error" in report:
                        return report["error"]["reason"], report["error"]["message"]
                    return "BootstrapFailed", f"the restore init container ended: {how}"
    return None


def replace_token(uid: str) -> str:
    """What names the data a replacing restore keeps aside: the Restore's own."""
    return uid.replace("-", "")[:8]


def replace_refusal(
    spec: RestoreSpec, kind: str, method: str, in_place_served: bool = False
) -> tuple[str, str] | None:
    """Why a Restore must not go into its existing target, or None when it may."""
    if not spec.target.replace:
        return (
            "TargetExists",
            f"spec.target.name: {kind} {spec.target.name} exists: restore into a new instance, or set "
            "spec.target.replace to replace its data with the backup's",
        )
    if method != "logical" and not in_place_served:
        return (
            "ReplaceRefused",
            f"spec.target.replace: a {method} backup of a {kind} becomes a new instance's data; restore "
            "it into a new instance, or restore a logical backup in place",
        )
    if spec.target.spec:
        return ("ReplaceRefused", "spec.target.spec: applies to a new instance, not with spec.target.replace")
    return None


class RestoreKind(JobKind):
    kind = "Restore"
    plural = "restores"
    spec_model = RestoreSpec
    finalizes = True  # a replacing restore deleted while it runs is rolled back before it goes

    def failed(self, reason: str, message: str) -> Outcome:
        return Outcome(
            False,
            reason,
            message,
            fields={"phase": FAILED, "reason": reason, "message": message, "completedAt": now_iso()},
            events=(EventNote("Warning", reason, message),),
        )

    def completed(self, message: str, details: dict[str, Any] | None = None) -> Outcome:
        fields = {"phase": COMPLETED, "completedAt": now_iso(), "message": message, "progress": None}
        return Outcome(
            True,
            "Completed",
            message,
            fields={**fields, "details": details} if details is not None else fields,
            events=(EventNote("Normal", "Completed", message),),
        )

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: RestoreSpec) -> Outcome:
        status = body.get("status") or {}
        if status.get("phase") == COMPLETED:
            return Outcome(True, "Completed", status.get("message") or "restored")
        if status.get("phase") == FAILED:
            return Outcome(False, status.get("reason") or "Failed", status.get("message") or "failed")
        meta = body["metadata"]
        namespace = meta["namespace"]
        backup_ref = Ref("Backup", spec.backup)
        backup = await get_or_none(client, BackupKind.resource(), spec.backup, namespace)
        if status.get("inPlace") and (
            status["inPlace"] == "rollback" or (backup or {}).get("status", {}).get("phase") != COMPLETED
        ):
            # Under way in the instance: whatever happened to the Backup since, it ends there.
            plugin = self.plugins[spec.target.kind]
            target = await get_or_none(client, plugin.resource(), spec.target.name, namespace)
            if target is None:
                return self.failed("TargetDeleted", f"{plugin.kind} {spec.target.name} was deleted")
            gone = ("BackupNotFound", f"spec.backup: Backup {spec.backup} is gone or no longer completed")
            return await self.roll_back_in_place(client, body, plugin, target, gone)
        if backup is None:
            return Outcome(
                False,
                "BackupNotFound",
                f"spec.backup: Backup {spec.backup} does not exist",
                depends_on=frozenset({backup_ref}),
                fields={"phase": PENDING},
            )
        backup_status = backup.get("status") or {}
        if backup_status.get("phase") == FAILED:
            return self.failed("BackupFailed", f"Backup {spec.backup} failed: nothing to restore")
        if backup_status.get("phase") != COMPLETED:
            return Outcome(
                False,
                "BackupNotCompleted",
                f"Backup {spec.backup} is {backup_status.get('phase', 'Pending')}",
                depends_on=frozenset({backup_ref}),
                fields={"phase": PENDING},
            )
        backup_spec = BackupSpec.model_validate(backup["spec"])
        if spec.target.kind != backup_spec.service.kind:
            return self.failed(
                "KindMismatch",
                f"spec.target.kind: a backup of a {backup_spec.service.kind} restores into a "
                f"{backup_spec.service.kind}, not a {spec.target.kind}",
            )
        plugin = self.plugins[spec.target.kind]
        method = backup_status.get("method") or "logical"
        target_ref = Ref(plugin.kind, spec.target.name)
        waiting = frozenset({backup_ref, target_ref})
        try:
            s3, _ = await storage_client(client, namespace, backup_spec.storage)
        except StorageError as error:
            return Outcome(False, error.reason, str(error), retry_in=30, fields={"phase": PENDING})
        location_prefix = backup_status["manifest"].rsplit("/", 1)[0]
        target = await get_or_none(client, plugin.resource(), spec.target.name, namespace)
        if target is None:
            if status.get("createdTarget") or status.get("replacing"):
                return self.failed(
                    "TargetDeleted", f"{plugin.kind} {spec.target.name} was deleted during the restore"
                )
            recorded = {
                k: v for k, v in (backup_status.get("instanceSpec") or {}).items() if k != "switchover"
            }
            try:
                target_spec = plugin.restored_spec(
                    {**recorded, **spec.target.spec}, backup_status.get("version") or "", method
                )
            except ValueError as error:
                return self.failed("TargetRefused", f"spec.target.spec: {error}")
            target_spec["bootstrap"] = {"fromBackup": {"name": spec.backup}}
            desired = {
                "apiVersion": API_VERSION,
                "kind": plugin.kind,
                "metadata": {
                    "name": spec.target.name,
                    "namespace": namespace,
                    "annotations": {RESTORED_BY: f"{meta['name']}/{meta['uid']}"},
                },
                "spec": target_spec,
            }
            target = (await client.create(codecs.from_dict(desired))).to_dict()
            await self.ensure_bootstrap_secret(client, target, s3, plugin, location_prefix)
            return Outcome(
                False,
                "CreatingTarget",
                f"{plugin.kind} {spec.target.name} created from Backup {spec.backup}",
                depends_on=waiting,
                retry_in=10,
                fields={"phase": PENDING, "createdTarget": True},
                events=(EventNote("Normal", "CreatingTarget", f"{plugin.kind} {spec.target.name} created"),),
            )
        made_by_this = f"{meta['name']}/{meta['uid']}"
        replacing = (target["metadata"].get("annotations") or {}).get(RESTORED_BY) != made_by_this
        replacing = replacing or bool(status.get("replacing"))
        if replacing:
            refusal = replace_refusal(spec, plugin.kind, method, plugin.restores_in_place)
            if refusal:
                return self.failed(*refusal)
            if method != "logical":
                return await self.restore_in_place(
                    client,
                    body,
                    spec,
                    plugin,
                    target,
                    s3,
                    location_prefix,
                    backup_status.get("version") or "",
                )
        else:
            await self.ensure_bootstrap_secret(client, target, s3, plugin, location_prefix)
        name = job_name(meta["name"], "restore")
        job, state, progress = await read_job(client, namespace, name)
        failure: tuple[str, str] | None = None
        if job is None and status.get("phase") == RUNNING:
            failure = ("JobLost", f"Job {name} was deleted before it ended")
        elif job is not None and state.phase == FAILED:
            failure = (state.reason, state.message)
        if failure and replacing:
            return await self.roll_back(client, body, plugin, target, s3, failure)
        if failure:
            return self.failed(*failure)
        if job is None:
            failure = await bootstrap_failure(client, plugin, namespace, spec.target.name)
            if failure:
                return self.failed(*failure)
            if not ready_condition(target):
                return Outcome(
                    False,
                    "TargetNotReady",
                    f"{plugin.kind} {spec.target.name} is not ready yet",
                    depends_on=waiting,
                    retry_in=15,
                    fields={"phase": PENDING},
                )
            # A logical backup is restored into the running instance; a physical one already is
            # its data: the Job checks that it is this backup's cluster, and reads it.
            request = {
                "action": "restore" if method == "logical" else "check",
                "driver": plugin.backup_driver,
                "storage": s3.to_api(),
                "location": location_prefix,
            }
            if replacing:
                request["replace"] = replace_token(meta["uid"])
            if spec.check or method != "logical":
                request["check"] = (spec.check or RestoreCheck()).to_api()
            await self.start_job(client, body, "restore", request, s3, plugin.backup_env(spec.target.name))
            return Outcome(
                False,
                "Running",
                f"Job {name} restores Backup {spec.backup} into {plugin.kind} {spec.target.name}",
                fields={"phase": RUNNING, "job": name, "startedAt": now_iso(), "replacing": replacing},
                retry_in=3,
            )
        if state.phase == RUNNING:
            return Outcome(
                False, "Running", f"Job {name} is running", fields={"progress": progress}, retry_in=5
            )
        result = state.result or {}
        restored = result.get("bytes", 0)
        message = f"Backup {spec.backup} restored into {plugin.kind} {spec.target.name}: {restored} bytes"
        return self.completed(message, result.get("details"))

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: RestoreSpec) -> Outcome:
        """Deleted while it replaced an instance's databases: its Job is stopped (and gone, pod
        and all, so it holds nothing) and the instance gets its own data back before the Restore
        goes. Any other Restore goes at once."""
        status = body.get("status") or {}
        if status.get("phase") != RUNNING or not status.get("replacing"):
            return Outcome(True, "Finalized", "nothing to undo")
        meta = body["metadata"]
        namespace = meta["namespace"]
        backup = await get_or_none(client, BackupKind.resource(), spec.backup, namespace)
        plugin = self.plugins.get(spec.target.kind)
        target = plugin and await get_or_none(client, plugin.resource(), spec.target.name, namespace)
        if plugin is None or target is None or (backup is None and not status.get("inPlace")):
            return Outcome(True, "Finalized", "its backup or its target is gone: nothing to put back")
        restore_job = job_name(meta["name"], "restore")
        job, state, _ = await read_job(client, namespace, restore_job)
        if job is not None and state.phase == RUNNING:
            if not (job.get("metadata") or {}).get("deletionTimestamp"):
                await client.delete(Job, restore_job, namespace=namespace, cascade=CascadeType.FOREGROUND)
            return Outcome(
                False, "Stopping", f"deleted while it ran: Job {restore_job} is stopped first", retry_in=3
            )
        deleted = ("Deleted", "the Restore was deleted while it ran")
        if status.get("inPlace"):
            outcome = await self.roll_back_in_place(client, body, plugin, target, deleted)
        else:
            s3, _ = await storage_client(client, namespace, BackupSpec.model_validate(backup["spec"]).storage)
            outcome = await self.roll_back(client, body, plugin, target, s3, deleted)
        if outcome.reason == "RollingBack":
            return outcome
        note = EventNote("Normal" if outcome.ready else "Warning", "Withdrawn", outcome.message)
        return Outcome(True, "Withdrawn", outcome.message, events=(note,))

    async def roll_back(
        self,
        client: AsyncClient,
        body: dict[str, Any],
        plugin: ServicePlugin,
        target: dict[str, Any],
        s3: S3Spec,
        failure: tuple[str, str],
    ) -> Outcome:
        """A replacing restore failed: once the instance answers, a Job of its own makes sure it
        holds its own data again (the restore's Job does so itself unless it was killed), then
        the Restore fails. The Job decides from what the instance recorded, not from storage."""
        meta, status = body["metadata"], body.get("status") or {}
        spec = RestoreSpec.model_validate(body["spec"])
        first = status.get("rollingBack") or {"reason": failure[0], "message": failure[1]}
        reason, message = first["reason"], first["message"]
        instance = f"{plugin.kind} {spec.target.name}"
        name = job_name(meta["name"], "rollback")
        job, state, _ = await read_job(client, meta["namespace"], name)
        if job is None and status.get("rollbackStarted"):
            return self.failed("RollbackLost", f"{message}; Job {name}, which put the data back, was deleted")
        if job is None:
            if not ready_condition(target):
                return Outcome(
                    False,
                    "RollingBack",
                    f"the restore failed ({reason}); {instance}'s data is put back once it is ready",
                    depends_on=frozenset({Ref(plugin.kind, spec.target.name)}),
                    retry_in=15,
                    fields={"phase": RUNNING, "rollingBack": first},
                )
            request = {
                "action": "rollback",
                "driver": plugin.backup_driver,
                "storage": s3.to_api(),
                "replace": replace_token(meta["uid"]),
            }
            await self.start_job(client, body, "rollback", request, s3, plugin.backup_env(spec.target.name))
            return Outcome(
                False,
                "RollingBack",
                f"the restore failed ({reason}): Job {name} puts {instance}'s own data back",
                fields={"phase": RUNNING, "rollingBack": first, "rollbackStarted": True},
                retry_in=3,
                events=(EventNote("Warning", reason, message),),
            )
        if state.phase == RUNNING:
            return Outcome(False, "RollingBack", f"Job {name} puts {instance}'s own data back", retry_in=5)
        if state.phase == FAILED:
            return self.failed(
                "RollbackFailed",
                f"{message}; putting {instance}'s data back failed too ({state.message}): what was kept "
                f"aside has {replace_token(meta['uid'])} in its name",
            )
        details = (state.result or {}).get("details") or {}
        if details.get("committed"):
            # The restore had succeeded; only its Job's report was lost.
            done = f"Backup {spec.backup} restored into {instance} (found committed after its Job ended)"
            return self.completed(done, details)
        put_back = details.get("putBack") or []
        back = f" ({', '.join(put_back)} put back)" if put_back else ""
        return self.failed(reason, f"{message}; {instance} holds its own data again{back}")

    async def restore_in_place(
        self,
        client: AsyncClient,
        body: dict[str, Any],
        spec: RestoreSpec,
        plugin: ServicePlugin,
        target: dict[str, Any],
        s3: S3Spec,
        location_prefix: str,
        backup_version: str,
    ) -> Outcome:
        """A physical backup over the running target (`backup.in_place`): the instance is asked
        to stop and take it (status.inPlace: restore), a Job checks it and drops what was kept
        aside (check), and on any failure the instance is asked to put its data back (rollback)."""
        meta, status = body["metadata"], body.get("status") or {}
        token = replace_token(meta["uid"])
        instance = f"{plugin.kind} {spec.target.name}"
        record = (target.get("status") or {}).get(in_place.STATUS_FIELD) or {}
        ours = record if record.get("token") == token else {}
        waiting = frozenset({Ref(plugin.kind, spec.target.name)})
        step = status.get("inPlace")
        if step is None:
            if in_place.under_way(record) and not ours:
                return Outcome(
                    False,
                    "TargetBusy",
                    f"{instance} is being restored by Restore {record.get('restore')}",
                    depends_on=waiting,
                    retry_in=15,
                    fields={"phase": PENDING},
                )
            running = str((target.get("status") or {}).get("version") or "")
            try:  # a data directory starts on its own major version only
                plugin.restored_spec({"version": running}, str(backup_version), "physical")
            except ValueError as error:
                return self.failed("TargetRefused", f"spec.target.name: {instance} is at {error}")
            if not ready_condition(target):
                return Outcome(
                    False,
                    "TargetNotReady",
                    f"{instance} is not ready yet",
                    depends_on=waiting,
                    retry_in=15,
                    fields={"phase": PENDING},
                )
            await self.ensure_bootstrap_secret(client, target, s3, plugin, location_prefix, replace=token)
            await self.ask(client, plugin, target, in_place.request(token, meta["name"], in_place.RESTORE))
            message = (
                f"{instance} stops; its primary's data is kept aside (…before-{token}) and Backup "
                f"{spec.backup} put in its place, its other pods clone it"
            )
            return Outcome(
                False,
                "Stopping",
                message,
                depends_on=waiting,
                retry_in=10,
                fields={"phase": RUNNING, "startedAt": now_iso(), "replacing": True, "inPlace": "restore"},
                events=(EventNote("Normal", "RestoringInPlace", message),),
            )
        if step == "rollback":
            return await self.roll_back_in_place(client, body, plugin, target, None)
        if step == "restore":
            if ours.get("phase") == in_place.FAILED:
                failure = (ours.get("reason") or "RestoreFailed", ours.get("message") or "the restore failed")
                return await self.roll_back_in_place(client, body, plugin, target, failure)
            started = status.get("startedAt")
            if started and time.time() - calendar.timegm(time.strptime(started, ISO)) > DEFAULT_DEADLINE:
                # A server that never starts on the restored data (or pods that never stop).
                late = f"{instance} did not serve the backup within {DEFAULT_DEADLINE // 3600} h"
                return await self.roll_back_in_place(client, body, plugin, target, ("DeadlineExceeded", late))
            if ours.get("phase") != in_place.RESTORED or not ready_condition(target):
                phase = ours.get("phase") or in_place.STOPPING
                return Outcome(
                    False,
                    phase,
                    f"{instance}: {ours.get('message') or 'asked to stop'}",
                    depends_on=waiting,
                    retry_in=15,
                    fields={"progress": {"instance": phase}},
                )
            request = {
                "action": "check",
                "driver": plugin.backup_driver,
                "storage": s3.to_api(),
                "location": location_prefix,
                "replace": token,
                "check": (spec.check or RestoreCheck()).to_api(),
            }
            await self.start_job(client, body, "restore", request, s3, plugin.backup_env(spec.target.name))
            name = job_name(meta["name"], "restore")
            return Outcome(
                False,
                "Checking",
                f"{instance} holds Backup {spec.backup}: Job {name} checks it",
                fields={"inPlace": "check", "job": name, "progress": None},
                retry_in=3,
            )
        name = job_name(meta["name"], "restore")
        job, state, _ = await read_job(client, meta["namespace"], name)
        if job is None:
            return await self.roll_back_in_place(
                client, body, plugin, target, ("JobLost", f"Job {name} was deleted before it ended")
            )
        if state.phase == RUNNING:
            return Outcome(False, "Checking", f"Job {name} checks {instance}", retry_in=5)
        if state.phase == FAILED:
            return await self.roll_back_in_place(client, body, plugin, target, (state.reason, state.message))
        await self.ask(client, plugin, target, None)
        result = state.result or {}
        message = f"Backup {spec.backup} restored over {instance}, checked; what it held before is removed"
        return self.completed(message, result.get("details"))

    async def roll_back_in_place(
        self,
        client: AsyncClient,
        body: dict[str, Any],
        plugin: ServicePlugin,
        target: dict[str, Any],
        failure: tuple[str, str] | None,
    ) -> Outcome:
        """The restore in place failed (or was withdrawn): the instance is asked to stop again
        and put its own data back; the Restore fails once it has."""
        meta, status = body["metadata"], body.get("status") or {}
        spec = RestoreSpec.model_validate(body["spec"])
        token = replace_token(meta["uid"])
        instance = f"{plugin.kind} {spec.target.name}"
        given = {"reason": failure[0], "message": failure[1]} if failure else {}
        first = status.get("rollingBack") or given
        reason, message = first.get("reason", "Failed"), first.get("message", "the restore failed")
        record = (target.get("status") or {}).get(in_place.STATUS_FIELD) or {}
        ours = record if record.get("token") == token else {}
        if status.get("inPlace") != "rollback":
            await self.ask(client, plugin, target, in_place.request(token, meta["name"], in_place.ROLLBACK))
            note = f"{message}: {instance} stops again and gets its own data back"
            return Outcome(
                False,
                "RollingBack",
                note,
                depends_on=frozenset({Ref(plugin.kind, spec.target.name)}),
                retry_in=10,
                fields={"phase": RUNNING, "inPlace": "rollback", "rollingBack": first, "progress": None},
                events=(EventNote("Warning", reason, note),),
            )
        if not ours:  # asked on an earlier pass, and the instance never started this restore
            await self.ask(client, plugin, target, None)
            return self.failed(reason, f"{message}; {instance} was not changed")
        phase = ours.get("phase") if ours.get("mode") == in_place.ROLLBACK else None
        if phase == in_place.COMMITTED:
            await self.ask(client, plugin, target, None)
            done = f"Backup {spec.backup} restored over {instance} (found committed after its check ended)"
            return self.completed(done)
        if phase == in_place.ROLLED_BACK:
            await self.ask(client, plugin, target, None)
            return self.failed(reason, f"{message}; {instance} holds its own data again")
        if phase == in_place.FAILED:
            return self.failed(
                "RollbackFailed",
                f"{message}; putting {instance}'s data back failed too ({ours.get('message')}): it is kept "
                f"aside under a name with {token} in it",
            )
        return Outcome(
            False,
            "RollingBack",
            f"{instance}: {ours.get('message') or 'asked to put its data back'}",
            depends_on=frozenset({Ref(plugin.kind, spec.target.name)}),
            retry_in=15,
        )

    async def ask(
        self, client: AsyncClient, plugin: ServicePlugin, target: dict[str, Any], request: str | None
    ) -> None:
        """Sets (or, with None, removes) the in-place restore request on the instance."""
        meta = target["metadata"]
        if (meta.get("annotations") or {}).get(in_place.ANNOTATION) == request:
            return
        await client.patch(
            plugin.resource(),
            meta["name"],
            {"metadata": {"annotations": {in_place.ANNOTATION: request}}},
            namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )

    async def ensure_bootstrap_secret(
        self,
        client: AsyncClient,
        target: dict[str, Any],
        s3: S3Spec,
        plugin: ServicePlugin,
        location_prefix: str,
        replace: str | None = None,
    ) -> None:
        """What an instance's pods read to fetch a physical backup: the request and the storage's
        keys, in a Secret owned by the instance. A new instance's pods wait until it exists; a
        restore in place (`replace`, its token) writes its own request over an earlier one."""
        meta = target["metadata"]
        name = f"{meta['name']}-{BOOTSTRAP_SECRET}"
        existing = await get_or_none(client, Secret, name, meta["namespace"])
        if existing is not None and replace is None:
            return
        storage_secret = await get_or_none(client, Secret, s3.credentials_secret, meta["namespace"])
        keys = decoded(storage_secret or {})
        request = {
            "action": "bootstrap",
            "driver": plugin.backup_driver,
            "storage": s3.to_api(),
            "location": location_prefix,
        }
        if replace:
            request["replace"] = replace
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": plugin.labels(meta["name"]),
                "ownerReferences": [owner_reference(plugin.kind, target)],
            },
            "stringData": {"request": json.dumps(request), **{k: keys.get(k, "") for k in CREDENTIAL_KEYS}},
        }
        if existing is None:
            await client.create(codecs.from_dict(secret))
        else:
            await client.patch(
                Secret, name, {"stringData": secret["stringData"]}, namespace=meta["namespace"]
            )

    def status_properties(self) -> dict[str, Any]:
        string = {"type": "string"}
        return {
            "phase": {"type": "string", "enum": [PENDING, RUNNING, COMPLETED, FAILED]},
            "reason": string,
            "message": string,
            "job": string,
            "startedAt": string,
            "completedAt": string,
            "createdTarget": {"type": "boolean"},
            "replacing": {"type": "boolean"},
            "rollingBack": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "rollbackStarted": {"type": "boolean"},
            "inPlace": {
                "type": "string",
                "enum": ["restore", "check", "rollback"],
                "description": "a physical backup restored over the instance: the step it is at",
            },
            "progress": {"type": "object", "nullable": True, "x-kubernetes-preserve-unknown-fields": True},
            "details": {"type": "object", "nullable": True, "x-kubernetes-preserve-unknown-fields": True},
        }

    def printer_columns(self) -> list[dict[str, Any]]:
        return [
            {"name": "Backup", "type": "string", "jsonPath": ".spec.backup"},
            {"name": "Target", "type": "string", "jsonPath": ".spec.target.name"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]


def backup_kinds(plugins: list[ServicePlugin], job_image: str) -> list[InServiceKind]:
    from backup.plan import BackupPlanKind  # it builds on the kinds above

    return [
        BackupStorageKind(),
        BackupKind(plugins, job_image),
        BackupPlanKind(plugins),
        RestoreKind(plugins, job_image),
    ]
