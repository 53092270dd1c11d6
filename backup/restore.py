"""`Restore`: a backup into a new instance (created from the spec the backup recorded), or over
an existing one (`target.replace`). A logical backup is restored online by a Job, the instance's
databases kept aside until the restore and its check succeeded (the driver's `restore` with `replace`); a
physical one in place, through the instance's plugin (`backup.in_place`), after a Job verified
every object. Its state lives in `status`, so a restarted operator goes on where it stopped.
"""

from __future__ import annotations

import contextlib
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
from backup.job import DEFAULT_DEADLINE
from backup.resources import (
    COMPLETED,
    FAILED,
    IMMUTABLE,
    PENDING,
    RUNNING,
    BackupKind,
    BackupSpec,
    JobKind,
    Phase,
    backups_of,
    ready_condition,
    storage_client,
)
from backup.storage import CREDENTIAL_KEYS, S3Spec, StorageError
from framework.kube.api import EventNote, get_or_none
from framework.kube.jobs import job_name, read_job, termination
from framework.kube.meta import API_VERSION, LABEL_INSTANCE, LABEL_NAME, owner_reference
from framework.kube.model import ApiModel
from framework.kube.secrets import decoded
from framework.kube.times import now_text, parse_time
from framework.object_controller import Outcome, Ref
from framework.plugin import ServicePlugin

RESTORED_BY = "statefleet.dev/restored-by"  # annotation on an instance a Restore created
# <instance>-bootstrap: the Secret a new instance's pods read a physical backup with (the
# plugin's templates name it so too).
BOOTSTRAP_SECRET = "bootstrap"


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
    database: str | None = Field(
        default=None, description="Where the query runs; empty: the service's default, if it has one."
    )


class RestoreSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=IMMUTABLE)
    backup: str = Field(min_length=1, description="The Backup, in the same namespace.")
    target: RestoreTarget
    check: RestoreCheck | None = Field(
        default=None, description="After the restore, read every table (and run the query): a restore test."
    )


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


ROLLBACK_RETRIES = 3  # a rollback Job's pod is run again this many times (10 s, 20 s, 40 s apart)


def replace_token(uid: str) -> str:
    """What names the data a replacing restore keeps aside: the Restore's own."""
    return uid.replace("-", "")[:8]


def replace_refusal(spec: RestoreSpec, plugin: ServicePlugin, method: str) -> tuple[str, str] | None:
    """Why a Restore must not go into its existing target, or None when it may."""
    kind = plugin.kind
    if not spec.target.replace:
        return (
            "TargetExists",
            f"spec.target.name: {kind} {spec.target.name} exists: restore into a new instance, or set "
            "spec.target.replace to replace its data with the backup's",
        )
    backups = backups_of(plugin)
    if method not in backups.replaces_online + backups.in_place_methods():
        others = [m for m in backups.methods if m in backups.replaces_online + backups.in_place_methods()]
        alternative = f", or restore a {' or '.join(others)} backup in place" if others else ""
        return (
            "ReplaceRefused",
            f"spec.target.replace: a {method} backup of a {kind} is restored into a new instance only; "
            f"restore it into a new instance{alternative}",
        )
    if spec.target.spec:
        return ("ReplaceRefused", "spec.target.spec: applies to a new instance, not with spec.target.replace")
    return None


class RestoreKind(JobKind):
    kind = "Restore"
    plural = "restores"
    spec_model = RestoreSpec
    deleted_by_operator = True  # a verification's throwaway Restores
    finalizes = True  # a replacing restore deleted while it runs is rolled back before it goes

    def failed(self, reason: str, message: str) -> Outcome:
        return Outcome(
            False,
            reason,
            message,
            fields={"phase": FAILED, "reason": reason, "message": message, "completedAt": now_text()},
            events=(EventNote("Warning", reason, message),),
        )

    def completed(self, message: str, details: dict[str, Any] | None = None) -> Outcome:
        fields = {"phase": COMPLETED, "completedAt": now_text(), "message": message, "progress": None}
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
            # A restore under way stays Running: its finalizer reads that.
            fields = {} if status.get("phase") == RUNNING else {"phase": PENDING}
            return Outcome(False, error.reason, str(error), retry_in=30, fields=fields)
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
                target_spec = backups_of(plugin).restored_spec(
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
            refusal = replace_refusal(spec, plugin, method)
            if refusal:
                return self.failed(*refusal)
            if method in backups_of(plugin).bootstrap_methods:
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
            # A logical backup is restored into the running instance; a physical one (a bootstrap
            # method) already is its data: the Job checks that it is this backup's, and reads it.
            request = {
                "action": "check" if method in backups_of(plugin).bootstrap_methods else "restore",
                "driver": backups_of(plugin).driver,
                "storage": s3.to_api(),
                "location": location_prefix,
            }
            if replacing:
                request["replace"] = replace_token(meta["uid"])
            if spec.check or method in backups_of(plugin).bootstrap_methods:
                request["check"] = (spec.check or RestoreCheck()).to_api()
            await self.start_job(
                client, body, "restore", request, s3, backups_of(plugin).job_env(spec.target.name)
            )
            return Outcome(
                False,
                "Running",
                f"Job {name} restores Backup {spec.backup} into {plugin.kind} {spec.target.name}",
                fields={"phase": RUNNING, "job": name, "startedAt": now_text(), "replacing": replacing},
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
        goes. Any other Restore goes at once. Either way it leaves nothing of its own on the
        instance (its request, a rollback Job the instance owns)."""
        outcome = await self.undo_before_going(client, body, spec)
        if outcome.ready:
            await self.leave_nothing_behind(client, body, spec)
        return outcome

    async def undo_before_going(
        self, client: AsyncClient, body: dict[str, Any], spec: RestoreSpec
    ) -> Outcome:
        status = body.get("status") or {}
        phase = status.get("phase")
        replacing = phase == RUNNING and status.get("replacing")
        in_place_step = status.get("inPlace") and phase not in (COMPLETED, FAILED)
        if not (replacing or in_place_step):
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

    async def leave_nothing_behind(
        self, client: AsyncClient, body: dict[str, Any], spec: RestoreSpec
    ) -> None:
        """Its rollback Job (owned by the instance when started while the Restore was being
        deleted) and its request on the instance (a claim whose step was never recorded: the
        instance then undoes what it started by itself) go with the Restore."""
        meta = body["metadata"]
        with contextlib.suppress(ApiError):
            rollback = job_name(meta["name"], "rollback")
            await client.delete(Job, rollback, namespace=meta["namespace"], cascade=CascadeType.BACKGROUND)
        plugin = self.plugins.get(spec.target.kind)
        with contextlib.suppress(ApiError):  # best effort: the finalizer never waits for it
            target = plugin and await get_or_none(
                client, plugin.resource(), spec.target.name, meta["namespace"]
            )
            asked = in_place.request_of((target or {}).get("metadata", {}).get("annotations"))
            if plugin and target and asked and asked["token"] == replace_token(meta["uid"]):
                await self.ask(client, plugin, target, None)

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
        deleting = bool(meta.get("deletionTimestamp"))
        if job is None and status.get("rollbackStarted") and not deleting:
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
                "driver": backups_of(plugin).driver,
                "storage": s3.to_api(),
                "replace": replace_token(meta["uid"]),
            }
            # Idempotent (it decides from what the instance recorded): retried before it gives up.
            # A Restore being deleted, perhaps in the foreground (where the garbage collector
            # deletes its Jobs as they come), has its target own the Job; `finalize` deletes it.
            # A Job the collector took is started again.
            owned_by = (plugin.kind, target) if deleting else None
            await self.start_job(
                client,
                body,
                "rollback",
                request,
                s3,
                backups_of(plugin).job_env(spec.target.name),
                retries=ROLLBACK_RETRIES,
                owned_by=owned_by,
            )
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
                f"{message}; putting {instance}'s data back failed too, {ROLLBACK_RETRIES + 1} times "
                f"({state.message}): what was kept "
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
        """A physical backup over the running target (`backup.in_place`): a Job verifies every
        object while the target serves, then the instance is asked to stop and take it
        (status.inPlace: restore), a Job checks it and drops what was kept aside (check), and on
        any failure the instance is asked to put its data back (rollback)."""
        meta, status = body["metadata"], body.get("status") or {}
        token = replace_token(meta["uid"])
        instance = f"{plugin.kind} {spec.target.name}"
        record = in_place.record_of(target)
        ours = in_place.record_for(target, token)
        waiting = frozenset({Ref(plugin.kind, spec.target.name)})
        step = status.get("inPlace")
        if step is None:
            annotations = target["metadata"].get("annotations")
            asked = in_place.request_of(annotations)
            claimed = asked is not None and asked["token"] == token  # on an earlier pass
            other = in_place.held_by(annotations, record, token)
            if other is not None:
                return Outcome(
                    False,
                    "TargetBusy",
                    f"{instance} is being restored by Restore {other}",
                    depends_on=waiting,
                    retry_in=15,
                    fields={"phase": PENDING},
                )
            if not claimed:
                running = str((target.get("status") or {}).get("version") or "")
                try:  # a data directory starts on its own major version only
                    backups_of(plugin).restored_spec({"version": running}, str(backup_version), "physical")
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
                verifying = await self.verify_before_stop(client, body, spec, instance, s3, location_prefix)
                if verifying is not None:
                    return verifying
                # The claim, on the instance as it was read: of two Restores asking at once, one
                # gets a conflict and finds the other's request on its next pass.
                request = in_place.request(token, meta["name"], in_place.RESTORE)
                if not await self.ask(client, plugin, target, request, claim=True):
                    return Outcome(
                        False,
                        "TargetBusy",
                        f"{instance} changed while this Restore asked for it: it looks again",
                        depends_on=waiting,
                        retry_in=3,
                        fields={"phase": PENDING},
                    )
            # Claimed (now or on a pass that ended before its status was written): the request
            # for the pods, then the step recorded.
            await self.ensure_bootstrap_secret(client, target, s3, plugin, location_prefix, replace=token)
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
                fields={"phase": RUNNING, "startedAt": now_text(), "replacing": True, "inPlace": "restore"},
                events=(EventNote("Normal", "RestoringInPlace", message),),
            )
        if step == "rollback":
            return await self.roll_back_in_place(client, body, plugin, target, None)
        if step == "restore":
            if ours.get("phase") == in_place.FAILED:
                failure = (ours.get("reason") or "RestoreFailed", ours.get("message") or "the restore failed")
                return await self.roll_back_in_place(client, body, plugin, target, failure)
            started = status.get("startedAt")
            begun = parse_time(started)
            if begun and time.time() - begun.timestamp() > DEFAULT_DEADLINE:
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
                "driver": backups_of(plugin).driver,
                "storage": s3.to_api(),
                "location": location_prefix,
                "replace": token,
                "check": (spec.check or RestoreCheck()).to_api(),
            }
            await self.start_job(
                client, body, "restore", request, s3, backups_of(plugin).job_env(spec.target.name)
            )
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

    async def verify_before_stop(
        self,
        client: AsyncClient,
        body: dict[str, Any],
        spec: RestoreSpec,
        instance: str,
        s3: S3Spec,
        location_prefix: str,
    ) -> Outcome | None:
        """A Job reads every object of the backup while the instance still serves: a corrupted
        backup fails the Restore with no downtime. None once it passed."""
        meta = body["metadata"]
        name = job_name(meta["name"], "verify")
        job, state, progress = await read_job(client, meta["namespace"], name)
        if job is None:
            request = {"action": "verify", "storage": s3.to_api(), "location": location_prefix}
            await self.start_job(client, body, "verify", request, s3, [])
            return Outcome(
                False,
                "Verifying",
                f"Job {name} checks every object of Backup {spec.backup} before {instance} stops",
                fields={"phase": RUNNING, "startedAt": now_text(), "job": name},
                retry_in=3,
            )
        if state.phase == RUNNING:
            return Outcome(
                False, "Verifying", f"Job {name} is running", fields={"progress": progress}, retry_in=5
            )
        if state.phase == FAILED:
            return self.failed(state.reason, f"{state.message}; {instance} was not stopped")
        verified = ((state.result or {}).get("details") or {}).get("location")
        if verified != location_prefix:  # the Backup made again meanwhile, or an older image's Job
            with contextlib.suppress(ApiError):
                await client.delete(Job, name, namespace=meta["namespace"], cascade=CascadeType.BACKGROUND)
            return Outcome(False, "Verifying", f"Job {name} verified {verified}: verified again", retry_in=5)
        return None

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
        ours = in_place.record_for(target, token)
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
        self,
        client: AsyncClient,
        plugin: ServicePlugin,
        target: dict[str, Any],
        request: str | None,
        claim: bool = False,
    ) -> bool:
        """Sets (or, with None, removes) the in-place restore request on the instance. With
        `claim`, only on the instance as it was read (its resourceVersion): False when it
        changed since."""
        meta = target["metadata"]
        if (meta.get("annotations") or {}).get(in_place.ANNOTATION) == request:
            return True
        patch: dict[str, Any] = {"annotations": {in_place.ANNOTATION: request}}
        if claim:
            patch["resourceVersion"] = meta["resourceVersion"]
        try:
            await client.patch(
                plugin.resource(),
                meta["name"],
                {"metadata": patch},
                namespace=meta["namespace"],
                patch_type=PatchType.MERGE,
            )
        except ApiError as error:
            if claim and error.status.code == 409:
                return False
            raise
        return True

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
            "driver": backups_of(plugin).driver,
            "storage": s3.to_api(),
            "location": location_prefix,
        }
        if replace:  # its objects were verified by a Job before the instance stopped
            request.update({"replace": replace, "verified": True})
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
            "phase": {"type": "string", "enum": [phase.value for phase in Phase]},
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
