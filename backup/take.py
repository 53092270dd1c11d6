"""`Backup`: one attempt at a backup of an instance, run by a Job (`backup.job`). The decisions
are `backup.take_plan`'s; this module observes (the Job, the storage, the instance) and runs
the actions. Its state lives in `status`, so a restarted operator follows the same Job.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from lightkube import AsyncClient

from backup.job import DeleteJob, StartJob
from backup.manifest import read_manifest
from backup.point_in_time import BaseBackup
from backup.resources import (
    COMPLETED,
    FAILED,
    RUNNING,
    BackupSpec,
    BackupStatus,
    JobKind,
    storage_client,
    storage_keyring,
)
from backup.storage import StorageError, delete_prefix, explain
from backup.take_plan import (
    PRUNED_BY,
    BackupStep,
    BackupView,
    DeleteObjects,
    plan_backup,
    plan_backup_deletion,
)
from framework.kube.api import EventNote, get_or_none
from framework.kube.jobs import job_name, observe_job
from framework.kube.times import now_text, parse_time
from framework.network_policy import client_labels
from framework.object_controller import Outcome
from framework.plugin import ServicePlugin


class BackupKind(JobKind):
    kind = "Backup"
    plural = "backups"
    spec_model = BackupSpec
    status_model = BackupStatus
    deleted_by_operator = True  # a plan's retention

    async def observe(self, client: AsyncClient, body: dict[str, Any], spec: BackupSpec) -> BackupView:
        meta = body["metadata"]
        namespace = meta["namespace"]
        status = BackupStatus.model_validate(body.get("status") or {})
        view = BackupView(
            name=meta["name"],
            namespace=namespace,
            uid=meta["uid"],
            spec=spec,
            status=status,
            deleting=bool(meta.get("deletionTimestamp")),
            pruned=PRUNED_BY in (meta.get("annotations") or {}),
        )
        if status.phase in (COMPLETED, FAILED) and not view.deleting:
            return view  # ended: nothing more to read
        job = await observe_job(client, namespace, job_name(meta["name"], "backup"))
        # The storage is read when the Backup may start, clean up after a failure, or go.
        running = job.exists and job.state.phase == RUNNING
        storage, storage_error, s3_api = None, None, None
        if view.deleting or not running:
            try:
                storage, s3_api = await storage_client(client, namespace, spec.storage)
            except StorageError as error:
                storage_error = error
        plugin = self.plugins.get(spec.service.kind)
        instance, imported, import_error = None, None, None
        starting = not job.exists and status.phase != RUNNING and not view.deleting
        if plugin is not None and starting and not spec.import_from:
            instance = await get_or_none(client, plugin.resource(), spec.service.name, namespace)
        if spec.import_from and starting and storage is not None:
            try:
                keyring = await storage_keyring(client, namespace, storage)
                imported = await asyncio.to_thread(read_manifest, s3_api, storage, spec.import_from, keyring)
            except StorageError as error:
                import_error = error
            except ValueError as error:
                import_error = StorageError("ManifestInvalid", f"{spec.import_from}: not a manifest: {error}")
            except (BotoCoreError, ClientError) as error:
                import_error = explain(error, storage.bucket)
        return replace(
            view,
            job=job,
            storage=storage,
            storage_error=storage_error,
            instance=instance,
            imported=imported,
            import_error=import_error,
        )

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: BackupSpec) -> Outcome:
        view = await self.observe(client, body, spec)
        return await self.run(client, body, view, plan_backup(view, self.plugins, now_text()))

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: BackupSpec) -> Outcome:
        view = await self.observe(client, body, spec)
        return await self.run(client, body, view, plan_backup_deletion(view))

    async def run(
        self, client: AsyncClient, body: dict[str, Any], view: BackupView, step: BackupStep
    ) -> Outcome:
        outcome = step.outcome
        for action in step.actions:
            match action:
                case StartJob():
                    plugin = self.plugins[view.spec.service.kind]
                    assert plugin.backups is not None
                    assert view.storage is not None
                    env = plugin.backups.job_env(view.spec.service.name)
                    reaches = client_labels(plugin.service, view.spec.service.name)
                    await self.start_job(client, body, action, view.storage, env, client_of=reaches)
                case DeleteJob():
                    await self.delete_job(client, body, action)
                case DeleteObjects():
                    try:
                        deleted = await self.delete_objects(client, view, action.manifest)
                    except Exception as error:
                        if not action.best_effort:
                            raise
                        outcome = with_note(outcome, f" (its partial objects remain: {explain(error, '')})")
                    else:
                        if not action.best_effort:  # the deletion of a Backup: say how much went
                            outcome = replace(outcome, message=f"{deleted} objects deleted from the storage")
        return outcome

    async def delete_objects(self, client: AsyncClient, view: BackupView, manifest: str) -> int:
        s3, s3_api = await storage_client(client, view.namespace, view.spec.storage)
        prefix = manifest.rsplit("/", 1)[0]
        return await asyncio.to_thread(delete_prefix, s3_api, s3, prefix, manifest)

    def printer_columns(self) -> list[dict[str, Any]]:
        return [
            {"name": "Service", "type": "string", "jsonPath": ".spec.service.name"},
            {"name": "Method", "type": "string", "jsonPath": ".status.method"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Bytes", "type": "integer", "jsonPath": ".status.bytes"},
            {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]


def with_note(outcome: Outcome, note: str) -> Outcome:
    """A failure's outcome with what its cleanup could not do added to its message."""
    message = outcome.message + note
    fields = {**outcome.fields, "message": message}
    events = tuple(EventNote(e.type, e.reason, message) for e in outcome.events)
    return replace(outcome, message=message, fields=fields, events=events)


async def base_backups(
    client: AsyncClient,
    namespace: str,
    plugin: ServicePlugin,
    instance: str,
    storage: str,
    only: str | None = None,
    leaving: frozenset[str] = frozenset(),
) -> list[BaseBackup]:
    """The completed backups of a bootstrap method (physical) of `instance` in `storage`, with
    their WAL positions: the base backups a point-in-time recovery can start from (`only`: that
    one alone); not those being deleted, nor those named in `leaving`."""
    assert plugin.backups is not None
    found = []
    async for listed in client.list(BackupKind.resource(), namespace=namespace):
        backup = listed.to_dict()
        name = backup["metadata"]["name"]
        spec = BackupSpec.model_validate(backup["spec"])
        status = BackupStatus.model_validate(backup.get("status") or {})
        physical = status.physical
        if (
            spec.service.kind != plugin.kind
            or spec.service.name != instance
            or spec.storage != storage
            or (only and name != only)
            or name in leaving
            or backup["metadata"].get("deletionTimestamp")
            or status.phase != COMPLETED
            or status.method not in plugin.backups.bootstrap_methods
            or physical is None
            or not (physical.timeline and physical.start_lsn and physical.end_lsn)
        ):
            continue
        completed = parse_time(status.completed_at) or datetime.now(UTC)
        found.append(
            BaseBackup(name, completed.timestamp(), physical.timeline, physical.start_lsn, physical.end_lsn)
        )
    return found
