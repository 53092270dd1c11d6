"""`BackupPlan`: Backups on a cron schedule, retried with backoff after a failure, pruned by
retention. The decision is a pure function of the clock, the plan and its Backups
(`plan_backups`); the kind only reads, creates and deletes.

A plan's Backups carry its label, not an owner reference: deleting a plan never deletes a
backup. They are created with deletionPolicy Retain, so deleting them otherwise (a namespace
deleted, `kubectl delete backups --all`, a GitOps prune) leaves their objects in the storage;
retention marks a Backup (`PRUNED_BY`) before it deletes it, so pruning one removes its objects.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.types import PatchType
from pydantic import Field, field_validator

from backup.point_in_time import Archive, load_archive
from backup.resources import COMPLETED, FAILED, backups_of, storage_client
from backup.restore import RestoreKind
from backup.restore_plan import RestoreStatus
from backup.retention import Candidate, RetentionSpec, to_prune
from backup.schedule import Schedule, ScheduleError
from backup.storage import StorageError
from backup.take import BackupKind, base_backups
from backup.take_plan import PRUNED_BY
from framework.binding import ServiceRef
from framework.kube import conditions
from framework.kube.api import EventNote, get_or_none, post_event
from framework.kube.conditions import Condition
from framework.kube.meta import API_VERSION, LABEL_MANAGED_BY, LABEL_PART_OF, MANAGER
from framework.kube.model import ApiModel, StatusModel
from framework.kube.times import format_time, parse_time
from framework.object_controller import ObjectKind, Outcome, Ref
from framework.plugin import ServicePlugin

PLAN_LABEL = "statefleet.dev/backup-plan"
VERIFY_LABEL = "statefleet.dev/verification"
RETRY_FIRST, RETRY_MAX = 60.0, 3600.0  # seconds: 1 min, 2, 4 ... at most an hour


def parsed_schedule(schedule: str) -> str:
    try:
        Schedule.parse(schedule)
    except ScheduleError as error:
        raise ValueError(str(error)) from error
    return schedule


class VerifySpec(ApiModel):
    enabled: bool = Field(default=False, description="Restore each new backup into a throwaway instance.")
    schedule: str | None = Field(
        default=None,
        description="Restore tests on a schedule of their own (cron, UTC): each time, the newest "
        "completed backup is tested, whether it was before or not. Empty: each new backup, once.",
    )
    query: str | None = Field(
        default=None, description="Run on the restored copy; its first value must be true or non-zero."
    )
    database: str | None = Field(
        default=None, description="Where the query runs; empty: the service's default, if it has one."
    )

    @field_validator("schedule")
    @classmethod
    def valid_schedule(cls, schedule: str | None) -> str | None:
        return None if schedule is None else parsed_schedule(schedule)


class BackupPlanSpec(ApiModel):
    service: ServiceRef
    storage: str = Field(min_length=1, description="The BackupStorage, in the same namespace.")
    schedule: str = Field(min_length=1, description='Cron, five fields, UTC, e.g. "0 2 * * *"; or @daily.')
    method: str | None = Field(
        default=None, description="The kind of backup; the service's first when empty."
    )
    retention: RetentionSpec = Field(default_factory=RetentionSpec)
    suspend: bool = Field(default=False, description="No new backups while true; retention still applies.")
    deadline_seconds: int = Field(default=6 * 3600, ge=60, description="Each backup Job's time limit.")
    verify: VerifySpec = Field(
        default_factory=VerifySpec,
        description="Restore tests: every table of the copy is read, the query runs, the Backup records "
        "Verified, the copy is removed.",
    )

    @field_validator("schedule")
    @classmethod
    def valid_schedule(cls, schedule: str) -> str:
        return parsed_schedule(schedule)


@dataclass(frozen=True)
class PlanDecision:
    create: str | None  # the name of a Backup to create now
    scheduled_for: datetime | None  # the schedule time it serves (None: a retry)
    prune: list[str]
    wake_at: datetime | None
    reason: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


def last_fire_at_or_before(schedule: Schedule, since: datetime, now: datetime) -> datetime | None:
    """The latest time in (since, now] the schedule fired: missed runs make one backup, not many."""
    latest, moment = None, since
    for _ in range(100_000):
        moment = schedule.next_after(moment)
        if moment > now:
            break
        latest = moment
    return latest


def backup_name(plan: str, moment: datetime) -> str:
    return f"{plan[:44]}-{moment.strftime('%Y%m%d-%H%M%S')}"


def plan_backups(
    now: datetime,
    name: str,
    created: datetime,
    spec: BackupPlanSpec,
    status: dict[str, Any],
    backups: list[Candidate],
) -> PlanDecision:
    """Pure: whether to start a backup now, what to prune, when to look again."""
    schedule = Schedule.parse(spec.schedule)
    last_scheduled = parse_time(status.get("lastScheduleTime")) or created
    newest_first = sorted(backups, key=lambda b: b.at, reverse=True)
    active = [b for b in newest_first if b.phase not in (COMPLETED, FAILED)]
    ended = [b for b in newest_first if b.phase in (COMPLETED, FAILED)]
    failures = 0
    for backup in ended:
        if backup.phase != FAILED:
            break
        failures += 1
    prune = to_prune(backups, spec.retention)
    completed = next((b for b in ended if b.phase == COMPLETED), None)
    fields: dict[str, Any] = {
        "lastBackup": newest_first[0].name if newest_first else None,
        "lastSuccessfulBackup": completed.name if completed else None,
        "consecutiveFailures": failures,
        "backups": len([b for b in backups if b.name not in prune]),
    }
    next_due = schedule.next_after(last_scheduled)
    fields["nextScheduleTime"] = format_time(next_due)
    if spec.suspend:
        return PlanDecision(None, None, prune, None, "Suspended", "spec.suspend: no new backups", fields)
    if active:  # one at a time: a run the schedule asked for meanwhile starts once it ends
        return PlanDecision(
            None, None, prune, None, "BackupRunning", f"Backup {active[0].name} is {active[0].phase}", fields
        )
    due = last_fire_at_or_before(schedule, last_scheduled, now)
    if due is not None:
        fields["lastScheduleTime"] = format_time(due)
        fields["nextScheduleTime"] = format_time(schedule.next_after(due))
        create = backup_name(name, now)
        return PlanDecision(create, due, prune, None, "BackupStarted", f"Backup {create} started", fields)
    if failures:
        delay = min(RETRY_FIRST * 2 ** (failures - 1), RETRY_MAX)
        retry_at = ended[0].at + timedelta(seconds=delay)
        if retry_at < next_due:
            fields["nextRetryTime"] = format_time(retry_at)
            if now >= retry_at:
                create = backup_name(name, now)
                message = f"Backup {create} retries after {failures} failed (the last: {ended[0].name})"
                return PlanDecision(create, None, prune, None, "Retrying", message, fields)
            message = f"{failures} failed in a row; the next attempt at {format_time(retry_at)}"
            return PlanDecision(None, None, prune, retry_at, "BackingOff", message, fields)
    fields["nextRetryTime"] = None
    if completed and not failures:
        return PlanDecision(
            None, None, prune, next_due, "Scheduled", f"next backup at {format_time(next_due)}", fields
        )
    if failures:
        last = ended[0].name
        message = f"{failures} failed in a row (the last: {last}); the next at {format_time(next_due)}"
        return PlanDecision(None, None, prune, next_due, "LastBackupFailed", message, fields)
    return PlanDecision(
        None, None, prune, next_due, "Scheduled", f"first backup at {format_time(next_due)}", fields
    )


@dataclass(frozen=True)
class VerifyDecision:
    backup: str | None  # the backup to test now
    scheduled_for: datetime | None  # the verify schedule's time it serves
    wake_at: datetime | None


def backup_to_verify(
    verify: VerifySpec, last_scheduled: datetime, now: datetime, newest: Candidate | None, tested: bool
) -> VerifyDecision:
    """Pure: which backup a restore test takes now. Without a schedule of its own, the newest
    completed backup once (`tested`: it has a Verified condition); with one, the newest at each
    of its times, tested before or not."""
    if not verify.schedule:
        return VerifyDecision(newest.name if newest and not tested else None, None, None)
    schedule = Schedule.parse(verify.schedule)
    due = last_fire_at_or_before(schedule, last_scheduled, now)
    wake_at = schedule.next_after(due or last_scheduled)
    if due is None:
        return VerifyDecision(None, None, wake_at)
    return VerifyDecision(newest.name if newest else None, due, wake_at)  # the time used up either way


def build_verify_restore(
    plan_meta: dict[str, Any],
    spec: BackupPlanSpec,
    backup: dict[str, Any],
    at: datetime | None = None,
    throwaway: dict[str, Any] | None = None,
    replay_archive: bool = False,
) -> dict[str, Any]:
    """A Restore of `backup` into a throwaway single instance, with the plan's check; `at`, the
    verify schedule's time, tells apart the tests of one backup (and their throwaways). With
    `replay_archive` (a physical backup of an instance that archives to the plan's storage),
    the throwaway also replays the archive to its newest point: a broken archive fails the test."""
    name, uid = backup["metadata"]["name"], backup["metadata"]["uid"]
    restore_name, target_name = f"{name[:50]}-verify", f"{plan_meta['name'][:24]}-verify-{uid[:6]}"
    if at is not None:
        when = at.strftime("%d%H%M")
        restore_name = f"{name[:41]}-verify-{when}"  # its Jobs' names keep the time (job_name)
        target_name = f"{plan_meta['name'][:17]}-verify-{uid[:6]}-{when}"
    check: dict[str, Any] = {"database": spec.verify.database}
    if spec.verify.query:
        check["query"] = spec.verify.query
    return {
        "apiVersion": API_VERSION,
        "kind": "Restore",
        "metadata": {
            "name": restore_name,
            "namespace": plan_meta["namespace"],
            "labels": {
                LABEL_MANAGED_BY: MANAGER,
                LABEL_PART_OF: "statefleet",
                PLAN_LABEL: plan_meta["name"],
                VERIFY_LABEL: "true",
            },
        },
        "spec": {
            "backup": name,
            "target": {
                "kind": spec.service.kind,
                "name": target_name,
                "spec": {**(throwaway or {}), "deletionPolicy": "Delete"},
            },
            "check": check,
            **(
                {"pointInTime": {"instance": spec.service.name, "storage": spec.storage}}
                if replay_archive
                else {}
            ),
        },
    }


async def record_verification(
    client: AsyncClient, backup: dict[str, Any], passed: bool, message: str
) -> None:
    status = backup.get("status") or {}
    verified = Condition(
        "Verified", passed, "RestoreTestPassed" if passed else "RestoreTestFailed", message[:1000]
    )
    merged = conditions.merge_conditions(
        status.get("conditions"), [verified], backup["metadata"].get("generation", 0)
    )
    await client.patch(
        BackupKind.resource().Status,
        backup["metadata"]["name"],
        {"status": {"conditions": merged}},
        namespace=backup["metadata"]["namespace"],
        patch_type=PatchType.MERGE,
    )


async def delete_quietly(client: AsyncClient, resource: Any, name: str, namespace: str) -> None:
    try:
        await client.delete(resource, name, namespace=namespace)
    except ApiError as error:
        if error.status.code != 404:
            raise


def candidate(body: dict[str, Any]) -> Candidate:
    status = body.get("status") or {}
    at = parse_time(status.get("completedAt")) or parse_time(body["metadata"]["creationTimestamp"])
    verified = any(
        c.get("type") == "Verified" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return Candidate(body["metadata"]["name"], status.get("phase") or "Pending", at, verified)


class Verification(StatusModel):
    backup: str | None = None
    result: str | None = None  # Passed or Failed
    message: str | None = None
    at: str | None = None


class BackupPlanStatus(StatusModel):
    """`status` of a BackupPlan besides its conditions."""

    last_schedule_time: str | None = None
    next_schedule_time: str | None = None
    next_retry_time: str | None = None
    last_backup: str | None = None
    last_successful_backup: str | None = None
    consecutive_failures: int | None = None
    backups: int | None = Field(default=None, description="the plan's backups retention keeps")
    last_verify_schedule_time: str | None = None
    next_verify_time: str | None = Field(default=None, json_schema_extra={"nullable": True})
    last_verification: Verification | None = Field(
        default=None, description="the last restore test: which backup, Passed or Failed, why, when"
    )


class BackupPlanKind(ObjectKind):
    kind = "BackupPlan"
    plural = "backupplans"
    spec_model = BackupPlanSpec
    status_model = BackupPlanStatus
    finalizes = False

    def __init__(self, plugins: list[ServicePlugin]) -> None:
        self.plugins = {p.kind: p for p in plugins}

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: BackupPlanSpec) -> Outcome:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        resource = BackupKind.resource()
        backups = [
            b.to_dict() async for b in client.list(resource, namespace=namespace, labels={PLAN_LABEL: name})
        ]
        now = datetime.now(UTC)
        created = parse_time(meta["creationTimestamp"]) or now
        decision = plan_backups(
            now, name, created, spec, body.get("status") or {}, [candidate(b) for b in backups]
        )
        events = []
        for old in decision.prune:
            try:
                marked = {"metadata": {"annotations": {PRUNED_BY: name}}}
                await client.patch(resource, old, marked, namespace=namespace, patch_type=PatchType.MERGE)
                await client.delete(resource, old, namespace=namespace)
                events.append(EventNote("Normal", "Pruned", f"Backup {old} deleted by retention"))
            except ApiError as error:
                if error.status.code != 404:
                    raise
        if decision.prune:
            try:
                note = await self.prune_archive(client, namespace, spec, frozenset(decision.prune))
            except (StorageError, BotoCoreError, ClientError) as error:
                # Tried again with the next backups retention deletes; never more than they allow.
                note = EventNote("Warning", "WalPruneFailed", f"the WAL of deleted backups stays: {error}")
            if note is not None:
                events.append(note)
        created_ref: frozenset[Ref] = frozenset()
        if decision.create:
            await client.create(codecs.from_dict(self.build_backup(body, spec, decision.create)))
            created_ref = frozenset({Ref("Backup", decision.create)})
            events.append(EventNote("Normal", decision.reason, decision.message))
        depends = frozenset(Ref("Backup", b["metadata"]["name"]) for b in backups) | created_ref
        verification: dict[str, Any] = {}
        verify_wake_at = None
        if spec.verify.enabled:
            verification, verify_events, verify_refs, verify_wake_at = await self.verify(
                client, body, spec, backups, decision.prune, now
            )
            events.extend(verify_events)
            depends |= verify_refs
        # A Backup's changes call for a pass (it ends, or is deleted); the clock calls for the rest.
        retry_in = 300.0
        for wake_at in (decision.wake_at, verify_wake_at):
            if wake_at is not None:
                retry_in = min(retry_in, max(1.0, (wake_at - now).total_seconds()))
        ready, reason, message = (
            decision.reason in ("Scheduled", "BackupRunning", "BackupStarted", "Suspended"),
            decision.reason,
            decision.message,
        )
        last = (
            verification.get("lastVerification") or (body.get("status") or {}).get("lastVerification") or {}
        )
        if ready and last.get("result") == "Failed":
            ready, reason = False, "VerificationFailed"
            message = f"Backup {last.get('backup')} failed its restore test: {last.get('message')}"
        return Outcome(
            ready,
            reason,
            message,
            fields={**decision.fields, **verification},
            depends_on=depends,
            retry_in=retry_in,
            events=tuple(events),
        )

    async def archive_of(self, client: AsyncClient, namespace: str, spec: BackupPlanSpec) -> Archive | None:
        """The continuous archive of the plan's instance, when it archives to the plan's storage
        (its base backups are then the plan's and the others there)."""
        plugin = self.plugins.get(spec.service.kind)
        if plugin is None or plugin.backups is None or plugin.backups.point_in_time is None:
            return None
        archive = load_archive(plugin.backups.point_in_time)
        instance = await get_or_none(client, plugin.resource(), spec.service.name, namespace)
        if instance is None or archive.storage_of(instance.get("spec") or {}) != spec.storage:
            return None
        return archive

    async def prune_archive(
        self, client: AsyncClient, namespace: str, spec: BackupPlanSpec, pruned: frozenset[str]
    ) -> EventNote | None:
        """Retention covers WAL: once it deleted backups, the WAL no base backup left in the
        storage needs goes (the newest verified one is always among those left)."""
        archive = await self.archive_of(client, namespace, spec)
        plugin = self.plugins[spec.service.kind]
        if archive is None:
            return None
        kept = await base_backups(client, namespace, plugin, spec.service.name, spec.storage, leaving=pruned)
        if not kept:
            return None
        s3, s3_api = await storage_client(client, namespace, spec.storage)
        prefix = archive.prefix(s3.prefix, namespace, spec.service.name)
        deleted = await asyncio.to_thread(archive.prune, s3_api, s3, prefix, kept)
        if not deleted:
            return None
        oldest = min(kept, key=lambda b: b.completed_at).name
        where = f"s3://{s3.bucket}/{prefix}"
        message = f"{deleted} WAL files older than Backup {oldest}, the oldest kept, deleted from {where}"
        return EventNote("Normal", "WalPruned", message)

    async def verify(
        self,
        client: AsyncClient,
        plan: dict[str, Any],
        spec: BackupPlanSpec,
        backups: list[dict[str, Any]],
        pruned: list[str],
        now: datetime,
    ) -> tuple[dict[str, Any], list[EventNote], frozenset[Ref], datetime | None]:
        """Restore tests, one at a time: the backup `backup_to_verify` picks is restored into a
        throwaway instance with a check; the result goes on the Backup (condition Verified) and
        the plan (`lastVerification`), then the throwaway goes. Returns when to look again."""
        meta = plan["metadata"]
        namespace = meta["namespace"]
        restores = [
            r.to_dict()
            async for r in client.list(
                RestoreKind.resource(),
                namespace=namespace,
                labels={PLAN_LABEL: meta["name"], VERIFY_LABEL: "true"},
            )
        ]
        fields: dict[str, Any] = {}
        events: list[EventNote] = []
        refs: set[Ref] = set()
        by_name = {b["metadata"]["name"]: b for b in backups}
        for restore in restores:
            status = RestoreStatus.model_validate(restore.get("status") or {})
            backup_name = restore["spec"]["backup"]
            if status.phase not in (COMPLETED, FAILED):
                refs.add(Ref("Restore", restore["metadata"]["name"]))
                continue
            passed = status.phase == COMPLETED
            check = (status.details or {}).get("check") or {}
            message = (
                f"restored into a throwaway instance; rows read: {check.get('rows')}"
                if passed
                else f"{status.reason}: {status.message}"
            )
            backup = by_name.get(backup_name)
            if backup is not None:
                await record_verification(client, backup, passed, message)
                note = EventNote(
                    "Normal" if passed else "Warning",
                    "Verified" if passed else "VerificationFailed",
                    f"Backup {backup_name}: {message}",
                )
                await post_event(client, "Backup", backup, note)
                events.append(note)
            fields["lastVerification"] = {
                "backup": backup_name,
                "result": "Passed" if passed else "Failed",
                "message": message[:1000],
                "at": format_time(datetime.now(UTC)),
            }
            target = restore["spec"]["target"]
            plugin = self.plugins.get(target["kind"])
            if plugin is not None and status.created_target:
                await delete_quietly(client, plugin.resource(), target["name"], namespace)
            await delete_quietly(client, RestoreKind.resource(), restore["metadata"]["name"], namespace)
        if refs:
            return fields, events, frozenset(refs), None
        verifying = {r["spec"]["backup"] for r in restores}
        completed = [candidate(b) for b in backups]
        completed = [c for c in completed if c.phase == COMPLETED and c.name not in pruned]
        newest = max(completed, key=lambda c: c.at) if completed else None
        tested = newest is not None and (
            newest.name in verifying
            or conditions.find((by_name[newest.name].get("status") or {}).get("conditions"), "Verified")
            is not None
        )
        last_scheduled = parse_time((plan.get("status") or {}).get("lastVerifyScheduleTime"))
        decision = backup_to_verify(
            spec.verify, last_scheduled or parse_time(meta["creationTimestamp"]) or now, now, newest, tested
        )
        fields["nextVerifyTime"] = format_time(decision.wake_at) if decision.wake_at else None
        if decision.backup:
            verified_plugin = self.plugins.get(spec.service.kind)
            physical = (by_name[decision.backup].get("status") or {}).get("physical") is not None
            archived = physical and await self.archive_of(client, namespace, spec) is not None
            restore = build_verify_restore(
                meta,
                spec,
                by_name[decision.backup],
                decision.scheduled_for,
                backups_of(verified_plugin).throwaway_spec if verified_plugin else None,
                replay_archive=archived,
            )
            try:
                await client.create(codecs.from_dict(restore))
            except ApiError as error:
                if error.status.code != 409:
                    raise
                return fields, events, frozenset(refs), now + timedelta(seconds=10)  # the last one still goes
            refs.add(Ref("Restore", restore["metadata"]["name"]))
        if decision.scheduled_for:
            fields["lastVerifyScheduleTime"] = format_time(decision.scheduled_for)
        return fields, events, frozenset(refs), decision.wake_at

    def build_backup(self, plan: dict[str, Any], spec: BackupPlanSpec, name: str) -> dict[str, Any]:
        backup_spec: dict[str, Any] = {
            "service": spec.service.to_api(),
            "storage": spec.storage,
            "deletionPolicy": "Retain",
            "deadlineSeconds": spec.deadline_seconds,
        }
        if spec.method:
            backup_spec["method"] = spec.method
        return {
            "apiVersion": API_VERSION,
            "kind": "Backup",
            "metadata": {
                "name": name,
                "namespace": plan["metadata"]["namespace"],
                "labels": {
                    LABEL_MANAGED_BY: MANAGER,
                    LABEL_PART_OF: "statefleet",
                    PLAN_LABEL: plan["metadata"]["name"],
                },
            },
            "spec": backup_spec,
        }

    def printer_columns(self) -> list[dict[str, Any]]:
        return [
            {"name": "Service", "type": "string", "jsonPath": ".spec.service.name"},
            {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"},
            {"name": "Last", "type": "string", "jsonPath": ".status.lastSuccessfulBackup"},
            {"name": "Next", "type": "string", "jsonPath": ".status.nextScheduleTime"},
            {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]
