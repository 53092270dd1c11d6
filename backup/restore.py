"""`Restore`: a backup into a new instance (created from the spec the backup recorded), or over
an existing one (`target.replace`). `backup.restore_plan` decides each pass from what it
observed; this module observes (the Backup, its storage, the target, the Restore's Jobs) and
runs the actions the plan returns. Its state lives in `status`, so a restarted operator goes on
where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import PatchType

from backup import in_place
from backup.job import DeleteJob, StartJob
from backup.point_in_time import Reach, Unreachable, load_archive
from backup.resources import (
    COMPLETED,
    FAILED,
    BackupSpec,
    JobKind,
    backups_of,
    storage_client,
    storage_keyring,
)
from backup.restore_plan import (
    RESTORED_BY,
    Action,
    Ask,
    CreateTarget,
    InPlaceStep,
    RestorePlanner,
    RestoreSpec,
    RestoreStatus,
    RestoreView,
    Step,
    WriteBootstrapSecret,
    wal_archive_of,
)
from backup.sealing import REQUEST_FIELD
from backup.storage import CREDENTIAL_KEYS, S3Spec, StorageError, explain
from backup.take import BackupKind, base_backups
from framework.kube.api import get_or_none
from framework.kube.jobs import job_name, observe_job, termination
from framework.kube.meta import LABEL_INSTANCE, LABEL_NAME, owner_reference
from framework.kube.secrets import decoded
from framework.kube.times import now_text
from framework.network_policy import client_labels
from framework.object_controller import Outcome
from framework.plugin import ServicePlugin

# <instance>-bootstrap: the Secret a new instance's pods read a physical backup with (the
# plugin's templates name it so too).
BOOTSTRAP_SECRET = "bootstrap"
JOB_ACTIONS = ("restore", "verify", "rollback")


async def bootstrap_failure(
    client: AsyncClient, plugin: ServicePlugin, namespace: str, instance: str, recovering: bool = False
) -> tuple[str, str] | None:
    """The reason and message a new instance's restore init container failed with, if it did;
    `recovering` (an instance this Restore made to recover to a point): also a container that
    ended with an error report and has not run again since."""
    labels = {LABEL_INSTANCE: instance, LABEL_NAME: plugin.service}
    async for pod in client.list(Pod, namespace=namespace, labels=labels):
        status = pod.to_dict().get("status", {})
        for container in (status.get("containerStatuses") or []) if recovering else []:
            current = container.get("state") or {}
            if "running" in current:
                continue
            state = current if "terminated" in current else container.get("lastState") or {}
            report, _ = termination({"status": {"containerStatuses": [{"state": state}]}})
            if state.get("terminated", {}).get("exitCode") and report and "error" in report:
                return report["error"]["reason"], report["error"]["message"]
        for container in status.get("initContainerStatuses") or []:
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


class RestoreKind(JobKind):
    kind = "Restore"
    plural = "restores"
    spec_model = RestoreSpec
    status_model = RestoreStatus
    deleted_by_operator = True  # a verification's throwaway Restores
    finalizes = True  # a replacing restore deleted while it runs is rolled back before it goes

    async def observe(self, client: AsyncClient, body: dict[str, Any], spec: RestoreSpec) -> RestoreView:
        meta = body["metadata"]
        namespace = meta["namespace"]
        status = RestoreStatus.model_validate(body.get("status") or {})
        view = RestoreView(
            name=meta["name"],
            uid=meta["uid"],
            spec=spec,
            status=status,
            deleting=bool(meta.get("deletionTimestamp")),
            now=time.time(),
        )
        if status.phase in (COMPLETED, FAILED) and not view.deleting:
            return view  # ended: nothing more to read
        plugin = self.plugins.get(spec.target.kind)
        if spec.point_in_time is not None and status.point_in_time is None:
            target = plugin and await get_or_none(client, plugin.resource(), spec.target.name, namespace)
            chooses = target is None or spec.target.replace  # else refused: it exists
            reach = await self.observe_archive(client, namespace, spec, plugin) if chooses else None
            return replace(view, target=target or None, reach=reach)
        # A point-in-time Restore's backup is the one it chose (status.pointInTime.backup).
        name = spec.backup or (status.point_in_time.backup if status.point_in_time else None)
        backup = await get_or_none(client, BackupKind.resource(), name, namespace) if name else None
        storage, storage_error = None, None
        if backup is not None and (backup.get("status") or {}).get("phase") == COMPLETED:
            try:
                storage, _ = await storage_client(
                    client, namespace, BackupSpec.model_validate(backup["spec"]).storage
                )
            except StorageError as error:
                storage_error = error
        target = plugin and await get_or_none(client, plugin.resource(), spec.target.name, namespace)
        jobs = {}
        for action in JOB_ACTIONS:
            job = await observe_job(client, namespace, job_name(meta["name"], action))
            if job.exists:
                jobs[action] = job
        failure = None
        if plugin is not None and target is not None and "restore" not in jobs:
            made = (target["metadata"].get("annotations") or {}).get(
                RESTORED_BY
            ) == f"{meta['name']}/{meta['uid']}"
            # A server that replays an archive after the backup reports a failed recovery in its
            # container's termination message: in an instance this Restore made, or in place.
            replays = spec.point_in_time is not None or bool(wal_archive_of(backup))
            recovering = replays and (made or status.in_place == InPlaceStep.RESTORE)
            failure = await bootstrap_failure(client, plugin, namespace, spec.target.name, recovering)
        return replace(
            view,
            backup=backup,
            storage=storage,
            storage_error=storage_error,
            target=target or None,
            jobs=jobs,
            bootstrap_failure=failure,
        )

    async def observe_archive(
        self, client: AsyncClient, namespace: str, spec: RestoreSpec, plugin: ServicePlugin | None
    ) -> Reach | Unreachable | StorageError | None:
        """What the archive of spec.pointInTime.instance allows: read once, before a base
        backup is chosen (None: the service has no point-in-time recovery)."""
        wanted = spec.point_in_time
        assert wanted is not None
        if plugin is None or plugin.backups is None or plugin.backups.point_in_time is None:
            return None
        archive = load_archive(plugin.backups.point_in_time)
        storage = wanted.storage
        if storage is None:
            source = await get_or_none(
                client, plugin.resource(), wanted.instance, wanted.source_namespace(namespace)
            )
            storage = archive.storage_of((source or {}).get("spec") or {})
            if storage is None:
                why = "archives nothing" if source else "does not exist"
                return Unreachable(
                    "spec.pointInTime.storage",
                    f"{plugin.kind} {wanted.instance} {why}: name the BackupStorage that holds its archive",
                )
        try:
            s3, s3_api = await storage_client(client, namespace, storage)
            prefix = archive.prefix(s3.prefix, wanted.source_namespace(namespace), wanted.instance)
            keyring = await storage_keyring(client, namespace, s3)
            observed = await asyncio.to_thread(archive.observe, s3_api, s3, prefix, keyring)
        except StorageError as error:
            return error
        except (BotoCoreError, ClientError) as error:
            return explain(error, storage)
        backups = await base_backups(client, namespace, plugin, wanted.instance, storage, only=spec.backup)
        return archive.reach(observed, backups, wanted.target())

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: RestoreSpec) -> Outcome:
        view = await self.observe(client, body, spec)
        step = RestorePlanner(view, self.plugins, now_text()).plan()
        return await self.run(client, body, view, step)

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: RestoreSpec) -> Outcome:
        view = await self.observe(client, body, spec)
        step = RestorePlanner(view, self.plugins, now_text()).plan_withdrawal()
        return await self.run(client, body, view, step)

    async def run(self, client: AsyncClient, body: dict[str, Any], view: RestoreView, step: Step) -> Outcome:
        """The step's actions, in order; a claim that lost its race ends the pass with
        `step.on_conflict`."""
        target = view.target
        for action in step.actions:
            try:
                done, target = await self.act(client, body, view, target, action)
            except ApiError:
                if getattr(action, "best_effort", False):
                    continue  # the withdrawal never waits for it
                raise
            if not done:
                assert step.on_conflict is not None
                return step.on_conflict
        return step.outcome

    async def act(
        self,
        client: AsyncClient,
        body: dict[str, Any],
        view: RestoreView,
        target: dict[str, Any] | None,
        action: Action,
    ) -> tuple[bool, dict[str, Any] | None]:
        namespace = body["metadata"]["namespace"]
        plugin = self.plugins.get(view.spec.target.kind)
        match action:
            case CreateTarget(body=desired):
                desired = {**desired, "metadata": {**desired["metadata"], "namespace": namespace}}
                return True, (await client.create(codecs.from_dict(desired))).to_dict()
            case WriteBootstrapSecret():
                assert plugin is not None
                assert target is not None
                assert view.storage is not None
                await self.write_bootstrap_secret(client, plugin, target, view.storage, action)
            case StartJob():
                assert plugin is not None
                assert view.storage is not None
                env = backups_of(plugin).job_env(view.spec.target.name) if action.service_env else []
                owned_by = (plugin.kind, target) if action.owned_by_target and target else None
                reaches = client_labels(plugin.service, view.spec.target.name) if action.service_env else None
                await self.start_job(client, body, action, view.storage, env, owned_by, reaches)
            case DeleteJob():
                await self.delete_job(client, body, action)
            case Ask():
                assert plugin is not None
                assert target is not None
                return await self.ask(client, plugin, target, action.request, action.claim), target
        return True, target

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

    async def write_bootstrap_secret(
        self,
        client: AsyncClient,
        plugin: ServicePlugin,
        target: dict[str, Any],
        storage: S3Spec,
        action: WriteBootstrapSecret,
    ) -> None:
        """What an instance's pods read to fetch a physical backup: the request and the storage's
        keys, in a Secret owned by the instance. A new instance's pods wait until it exists. A
        storage that encrypts: its keys Secret's entries go in the request (REQUEST_FIELD), as
        they are (a key missing is the pod's failure to report, naming it)."""
        meta = target["metadata"]
        name = f"{meta['name']}-{BOOTSTRAP_SECRET}"
        existing = await get_or_none(client, Secret, name, meta["namespace"])
        if existing is not None and not action.replace:
            return
        keys = decoded(await get_or_none(client, Secret, storage.credentials_secret, meta["namespace"]) or {})
        request = dict(action.request)
        if storage.encryption is not None:
            sealing = await get_or_none(client, Secret, storage.encryption.keys_secret, meta["namespace"])
            request[REQUEST_FIELD] = decoded(sealing)
        data = {"request": json.dumps(request), **{k: keys.get(k, "") for k in CREDENTIAL_KEYS}}
        if existing is not None:
            await client.patch(Secret, name, {"stringData": data}, namespace=meta["namespace"])
            return
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": plugin.labels(meta["name"]),
                "ownerReferences": [owner_reference(plugin.kind, target)],
            },
            "stringData": data,
        }
        await client.create(codecs.from_dict(secret))

    def printer_columns(self) -> list[dict[str, Any]]:
        return [
            {"name": "Backup", "type": "string", "jsonPath": ".spec.backup"},
            {"name": "Target", "type": "string", "jsonPath": ".spec.target.name"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]
