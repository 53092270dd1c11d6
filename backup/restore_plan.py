"""`Restore`, decided: its spec and status, what one pass observed, and a pure planner that
turns that into the actions of the pass and where the Restore stands (`backup.restore` runs
them). Every route is a function of the observation, unit-tested like the rollout plan.

Routes (`status.route` is not stored: the route follows from status and the target):
- new instance: the target is created from the backup's recorded spec (`createdTarget`); a
  physical backup is its data from the start (its pods read it with the bootstrap Secret), a
  logical one is restored by a Job once it is ready; a Job checks it.
- replace, online (a method in `Backups.replaces_online`): a Job restores into the running
  instance with a token, keeping its databases aside; on failure a rollback Job puts them back
  (`rollingBack`, `rollbackStarted`).
- replace, in place (`Backups.in_place_methods`): a Job verifies every object while the instance
  serves, the instance is asked to stop and take the backup (`inPlace: restore`), a Job checks
  it (`inPlace: check`); on failure the instance is asked to put its data back
  (`inPlace: rollback`).
- withdrawn: a Restore deleted while it replaces stops its Job and rolls back before it goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field

from backup import in_place
from backup.job import DEFAULT_DEADLINE, DeleteJob, StartJob
from backup.point_in_time import Reach, Unreachable
from backup.resources import (
    COMPLETED,
    FAILED,
    IMMUTABLE,
    PENDING,
    RUNNING,
    BackupSpec,
    Phase,
    backups_of,
    ready_condition,
)
from backup.storage import S3Spec, StorageError
from framework.kube.api import EventNote
from framework.kube.jobs import NO_JOB, JobView, job_name
from framework.kube.meta import API_VERSION
from framework.kube.model import ApiModel, StatusModel, free_form
from framework.kube.times import parse_time
from framework.object_controller import Outcome, Ref
from framework.plugin import ServicePlugin
from framework.spec import ONE_TARGET, RecoveryTarget

END_OF_BACKUP = RecoveryTarget(immediate=True)

RESTORED_BY = "statefleet.dev/restored-by"  # annotation on an instance a Restore created
ROLLBACK_RETRIES = 3  # a rollback Job's pod is run again this many times (10 s, 20 s, 40 s apart)


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


class PointInTime(RecoveryTarget):
    """Where a Restore recovers to, from an instance's continuous archive."""

    model_config = ConfigDict(json_schema_extra=ONE_TARGET)
    instance: str = Field(
        min_length=1,
        max_length=63,
        description="The archived instance (same namespace and kind as the target); it may be gone.",
    )
    storage: str | None = Field(
        default=None,
        min_length=1,
        description="The BackupStorage holding its archive and base backups; empty: the one the "
        "instance archives to.",
    )
    namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="The namespace the instance archived from, when not the Restore's (e.g. one deleted "
        "with everything in it): its base backups are then Backups here that import them "
        "(spec.importFrom).",
    )

    def target(self) -> RecoveryTarget:
        """The point alone, as the new instance's spec.bootstrap.pointInTime says it."""
        return RecoveryTarget.model_validate(self.model_dump(include=set(RecoveryTarget.model_fields)))

    def source_namespace(self, own: str) -> str:
        return self.namespace or own


ONE_SOURCE = {
    "x-kubernetes-validations": [
        *IMMUTABLE["x-kubernetes-validations"],
        {
            "rule": "has(self.backup) || has(self.pointInTime)",
            "message": "spec.backup or spec.pointInTime is required",
        },
    ]
}


class RestoreSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=ONE_SOURCE)
    backup: str | None = Field(
        default=None,
        min_length=1,
        description="The Backup, in the same namespace; with pointInTime, chosen when empty (the newest "
        "completed physical one before the target).",
    )
    point_in_time: PointInTime | None = Field(
        default=None,
        description="Recover to a point of an instance's continuous archive: a physical backup into a "
        "new instance, then its WAL replayed to the target.",
    )
    target: RestoreTarget
    check: RestoreCheck | None = Field(
        default=None, description="After the restore, read every table (and run the query): a restore test."
    )


class InPlaceStep(StrEnum):
    """Where a physical restore over a running instance stands (`status.inPlace`)."""

    RESTORE = "restore"  # the instance was asked to stop and take the backup
    CHECK = "check"  # it serves the backup: a Job checks it
    ROLLBACK = "rollback"  # the instance was asked to put its own data back


class Failure(StatusModel):
    """The first failure of a replacing restore, kept while it is rolled back."""

    reason: str = "Failed"
    message: str = "the restore failed"


class RestoreStatus(StatusModel):
    """`status` of a Restore besides its conditions: the memory a restarted operator goes on from."""

    phase: Phase | None = None
    reason: str | None = None
    message: str | None = None
    job: str | None = None
    started_at: str | None = None
    completed_at: str | None = None
    created_target: bool | None = Field(default=None, description="the target was created by this Restore")
    replacing: bool | None = Field(default=None, description="it restores over an existing instance")
    rolling_back: Failure | None = Field(default=None, description="why a replacing restore is undone")
    rollback_started: bool | None = Field(default=None, description="the rollback Job was started")
    in_place: InPlaceStep | None = Field(
        default=None, description="a physical backup restored over the instance: the step it is at"
    )
    progress: dict[str, Any] | None = free_form("the running Job's latest progress", nullable=True)
    details: dict[str, Any] | None = free_form(
        "what the Job reported of the restore and its check", nullable=True
    )
    point_in_time: Reach | None = Field(
        default=None, description="the base backup chosen and the archive's reach"
    )


@dataclass(frozen=True)
class RestoreView:
    """What one pass observed of a Restore and the objects it works with."""

    name: str
    uid: str
    spec: RestoreSpec
    status: RestoreStatus
    deleting: bool = False
    backup: dict[str, Any] | None = None
    storage: S3Spec | None = None  # read when the backup exists
    storage_error: StorageError | None = None
    target: dict[str, Any] | None = None
    jobs: Mapping[str, JobView] = field(default_factory=dict)  # by action: restore, verify, rollback
    bootstrap_failure: tuple[str, str] | None = None  # a new instance's restore init container's
    # spec.pointInTime, before a base backup was chosen: what the archive allows, or why not read
    reach: Reach | Unreachable | StorageError | None = None
    now: float = 0.0  # seconds since the epoch

    def job(self, action: str) -> JobView:
        return self.jobs.get(action, NO_JOB)

    @property
    def wal_archive(self) -> str | None:
        """Where the backup's WAL is, when not in the backup itself: its instance's archive."""
        return wal_archive_of(self.backup)


def wal_archive_of(backup: dict[str, Any] | None) -> str | None:
    physical = ((backup or {}).get("status") or {}).get("physical") or {}
    return physical.get("archive") or None


# The actions of one pass, run in order by `backup.restore`.


@dataclass(frozen=True)
class CreateTarget:
    body: dict[str, Any]


@dataclass(frozen=True)
class WriteBootstrapSecret:
    """What the target's pods read a physical backup with; an existing one is kept unless
    `replace` (a restore in place writes its own request over an earlier one)."""

    request: dict[str, Any]
    replace: bool = False


@dataclass(frozen=True)
class Ask:
    """Sets (None: removes) the in-place request on the target. A `claim` is made only on the
    target as it was read; when it changed since, the pass ends with `Step.on_conflict`."""

    request: str | None
    claim: bool = False
    best_effort: bool = False


Action = CreateTarget | WriteBootstrapSecret | StartJob | DeleteJob | Ask


@dataclass(frozen=True)
class Step:
    outcome: Outcome
    actions: tuple[Action, ...] = ()
    on_conflict: Outcome | None = None


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


def failed(reason: str, message: str, now: str) -> Outcome:
    return Outcome(
        False,
        reason,
        message,
        fields={"phase": FAILED, "reason": reason, "message": message, "completedAt": now},
        events=(EventNote("Warning", reason, message),),
    )


def completed(message: str, now: str, details: dict[str, Any] | None = None) -> Outcome:
    fields: dict[str, Any] = {"phase": COMPLETED, "completedAt": now, "message": message, "progress": None}
    if details is not None:
        fields["details"] = details
    return Outcome(
        True, "Completed", message, fields=fields, events=(EventNote("Normal", "Completed", message),)
    )


class RestorePlanner:
    """One pass of one Restore: `plan` while it lives, `plan_withdrawal` once it is deleted."""

    def __init__(self, view: RestoreView, plugins: Mapping[str, ServicePlugin], now_text: str) -> None:
        self.view = view
        self.status = view.status
        chosen = view.status.point_in_time.backup if view.status.point_in_time else None
        # A point-in-time Restore's base backup, once chosen, is its backup from then on.
        self.spec = view.spec.model_copy(update={"backup": view.spec.backup or chosen})
        self.plugins = plugins
        self.now_text = now_text  # the time written into status (`completedAt`, `startedAt`)
        self.token = replace_token(view.uid)

    def failed(self, reason: str, message: str) -> Step:
        return Step(failed(reason, message, self.now_text))

    def completed(self, message: str, details: dict[str, Any] | None = None) -> Step:
        return Step(completed(message, self.now_text, details))

    @property
    def plugin(self) -> ServicePlugin:
        return self.plugins[self.spec.target.kind]

    @property
    def instance(self) -> str:
        return f"{self.plugin.kind} {self.spec.target.name}"

    @property
    def waiting_on_target(self) -> frozenset[Ref]:
        return frozenset({Ref(self.plugin.kind, self.spec.target.name)})

    def backup_phase(self) -> str | None:
        return ((self.view.backup or {}).get("status") or {}).get("phase")

    def location_prefix(self) -> str:
        return str(((self.view.backup or {}).get("status") or {})["manifest"]).rsplit("/", 1)[0]

    def bootstrap_secret(self) -> WriteBootstrapSecret:
        """What a new instance's pods read the backup with (kept once written); with a point in
        time, the archive they recover from and the target."""
        return WriteBootstrapSecret(self.bootstrap_request())

    def bootstrap_request(self, **more: Any) -> dict[str, Any]:
        """What the pods that take the backup read: where it is, and what they replay after."""
        replay = self.replay()
        if replay:
            more["pointInTime"] = replay
        return self.request("bootstrap", location=self.location_prefix(), **more)

    def replay(self) -> dict[str, Any] | None:
        """The archive the restored data recovers from, and to which point: spec.pointInTime's;
        else, for a backup whose WAL its instance archived, its own end (where its data is
        consistent); None for a backup that holds its WAL."""
        reach = self.status.point_in_time
        if self.spec.point_in_time is not None and reach is not None and reach.archive:
            return {"archive": reach.archive, "target": self.spec.point_in_time.target().to_api()}
        if self.view.wal_archive:
            return {"archive": self.view.wal_archive, "target": END_OF_BACKUP.to_api()}
        return None

    def target_not_ready(self, depends_on: frozenset[Ref]) -> Step:
        message = f"{self.instance} is not ready yet"
        pending = {"phase": PENDING}
        return Step(
            Outcome(False, "TargetNotReady", message, depends_on=depends_on, retry_in=15, fields=pending)
        )

    def request(self, action: str, **more: Any) -> dict[str, Any]:
        """A Job's (or the bootstrap Secret's) request to the service's driver."""
        assert self.view.storage is not None
        return {
            "action": action,
            "driver": backups_of(self.plugin).driver,
            "storage": self.view.storage.to_api(),
            **more,
        }

    # -- while it lives

    def plan(self) -> Step:
        view, spec, status = self.view, self.spec, self.status
        if status.phase == COMPLETED:
            return Step(Outcome(True, "Completed", status.message or "restored"))
        if status.phase == FAILED:
            return Step(Outcome(False, status.reason or "Failed", status.message or "failed"))
        if spec.point_in_time is not None and status.point_in_time is None:
            return self.choose_point_in_time()
        backup_ref = Ref("Backup", spec.backup or "")
        if status.in_place and (status.in_place == InPlaceStep.ROLLBACK or self.backup_phase() != COMPLETED):
            # Under way in the instance: whatever happened to the Backup since, it ends there.
            if view.target is None:
                return self.failed("TargetDeleted", f"{self.plugin.kind} {spec.target.name} was deleted")
            gone = ("BackupNotFound", f"spec.backup: Backup {spec.backup} is gone or no longer completed")
            return self.roll_back_in_place(gone)
        if view.backup is None:
            return Step(
                Outcome(
                    False,
                    "BackupNotFound",
                    f"spec.backup: Backup {spec.backup} does not exist",
                    depends_on=frozenset({backup_ref}),
                    fields={"phase": PENDING},
                )
            )
        if self.backup_phase() == FAILED:
            return self.failed("BackupFailed", f"Backup {spec.backup} failed: nothing to restore")
        if self.backup_phase() != COMPLETED:
            return Step(
                Outcome(
                    False,
                    "BackupNotCompleted",
                    f"Backup {spec.backup} is {self.backup_phase() or 'Pending'}",
                    depends_on=frozenset({backup_ref}),
                    fields={"phase": PENDING},
                )
            )
        backup_kind = BackupSpec.model_validate(view.backup["spec"]).service.kind
        if spec.target.kind != backup_kind:
            return self.failed(
                "KindMismatch",
                f"spec.target.kind: a backup of a {backup_kind} restores into a {backup_kind}, "
                f"not a {spec.target.kind}",
            )
        if view.storage is None:
            error = view.storage_error or StorageError("StorageNotFound", "the backup's storage was not read")
            # A restore under way stays Running: its finalizer reads that.
            fields = {} if status.phase == RUNNING else {"phase": PENDING}
            return Step(Outcome(False, error.reason, str(error), retry_in=30, fields=fields))
        if view.target is None:
            return self.create_target()
        backups = backups_of(self.plugin)
        method = view.backup["status"].get("method") or "logical"
        made_by_this = f"{view.name}/{view.uid}"
        annotations = view.target["metadata"].get("annotations") or {}
        replacing = annotations.get(RESTORED_BY) != made_by_this or bool(status.replacing)
        first: tuple[Action, ...] = ()
        if replacing:
            refusal = replace_refusal(spec, self.plugin, method)
            if refusal:
                return self.failed(*refusal)
            if method in backups.bootstrap_methods:
                return self.restore_in_place()
        else:
            first = (self.bootstrap_secret(),)
        step = self.restore_by_job(method, replacing)
        return Step(step.outcome, first + step.actions, step.on_conflict)

    def create_target(self) -> Step:
        view, spec, status = self.view, self.spec, self.status
        assert view.backup is not None
        if status.created_target or status.replacing:
            return self.failed(
                "TargetDeleted", f"{self.plugin.kind} {spec.target.name} was deleted during the restore"
            )
        backup_status = view.backup["status"]
        method = backup_status.get("method") or "logical"
        # What the source instance was asked to do once (a switchover, a rotation) is not asked again.
        one_shot = self.plugin.one_shot_fields()
        recorded = {k: v for k, v in (backup_status.get("instanceSpec") or {}).items() if k not in one_shot}
        try:
            target_spec = backups_of(self.plugin).restored_spec(
                {**recorded, **spec.target.spec}, backup_status.get("version") or "", method
            )
        except ValueError as error:
            return self.failed("TargetRefused", f"spec.target.spec: {error}")
        target_spec["bootstrap"] = {"fromBackup": {"name": spec.backup}}
        if spec.point_in_time is not None:
            if method not in backups_of(self.plugin).bootstrap_methods:
                return self.failed(
                    "TargetRefused",
                    f"spec.backup: a {method} backup is not recovered to a point: name a physical one",
                )
            target_spec["bootstrap"]["pointInTime"] = spec.point_in_time.target().to_api()
        elif view.wal_archive:
            target_spec["bootstrap"]["pointInTime"] = END_OF_BACKUP.to_api()
        body = {
            "apiVersion": API_VERSION,
            "kind": self.plugin.kind,
            "metadata": {"name": spec.target.name, "annotations": {RESTORED_BY: f"{view.name}/{view.uid}"}},
            "spec": target_spec,
        }
        return Step(
            Outcome(
                False,
                "CreatingTarget",
                f"{self.plugin.kind} {spec.target.name} created from Backup {spec.backup}",
                depends_on=frozenset({Ref("Backup", spec.backup)}) | self.waiting_on_target,
                retry_in=10,
                fields={"phase": PENDING, "createdTarget": True},
                events=(
                    EventNote("Normal", "CreatingTarget", f"{self.plugin.kind} {spec.target.name} created"),
                ),
            ),
            (
                CreateTarget(body),
                self.bootstrap_secret(),
            ),
        )

    def choose_point_in_time(self) -> Step:
        """Before anything is made: the base backup for the target, or why the archive cannot
        reach it (naming the field and the reachable range)."""
        view, spec = self.view, self.spec
        assert spec.point_in_time is not None
        plugin = self.plugins.get(spec.target.kind)
        if plugin is None or plugin.backups is None or plugin.backups.point_in_time is None:
            return self.failed(
                "PointInTimeUnsupported",
                f"spec.pointInTime: a {spec.target.kind} is not recovered to a point",
            )
        if view.target is not None and not spec.target.replace:
            return self.failed(
                "TargetExists",
                f"spec.target.name: {self.instance} exists: recover into a new instance, or set "
                "spec.target.replace to recover it in place",
            )
        reach = view.reach
        if isinstance(reach, Unreachable):
            return self.failed("TargetUnreachable", f"{reach.field}: {reach.message}")
        if isinstance(reach, StorageError) or reach is None:
            error = reach or StorageError("ArchiveNotRead", "the archive was not read")
            return Step(Outcome(False, error.reason, str(error), retry_in=30, fields={"phase": PENDING}))
        if spec.backup:
            reach = reach.model_copy(update={"backup": spec.backup})
        message = (
            f"recovering to {reach.target} from Backup {reach.backup} and {reach.archive}, "
            f"{reach.reachable_from} to {reach.reachable_to}"
        )
        return Step(
            Outcome(
                False,
                "BackupChosen",
                message,
                retry_in=1,
                fields={"phase": PENDING, "pointInTime": reach.to_api()},
                events=(EventNote("Normal", "BackupChosen", message),),
            )
        )

    def restore_by_job(self, method: str, replacing: bool) -> Step:
        """A logical backup restored into the running instance by a Job (or a physical one, the
        new instance's data from the start, checked by it)."""
        view, spec, status = self.view, self.spec, self.status
        assert view.target is not None
        name = job_name(view.name, "restore")
        job = view.job("restore")
        failure: tuple[str, str] | None = None
        if not job.exists and status.phase == RUNNING:
            failure = ("JobLost", f"Job {name} was deleted before it ended")
        elif job.exists and job.state.phase == FAILED:
            failure = (job.state.reason, job.state.message)
        if failure and replacing:
            return self.roll_back(failure)
        if failure:
            return self.failed(*failure)
        backups = backups_of(self.plugin)
        if not job.exists:
            if view.bootstrap_failure:
                return self.failed(*view.bootstrap_failure)
            if not ready_condition(view.target):
                return self.target_not_ready(frozenset({Ref("Backup", spec.backup)}) | self.waiting_on_target)
            # A logical backup is restored into the running instance; a physical one (a bootstrap
            # method) already is its data: the Job checks that it is this backup's, and reads it.
            physical = method in backups.bootstrap_methods
            request = self.request("check" if physical else "restore", location=self.location_prefix())
            if replacing:
                request["replace"] = self.token
            if spec.check or physical:
                request["check"] = (spec.check or RestoreCheck()).to_api()
            return Step(
                Outcome(
                    False,
                    "Running",
                    f"Job {name} restores Backup {spec.backup} into {self.instance}",
                    fields={
                        "phase": RUNNING,
                        "job": name,
                        "startedAt": self.now_text,
                        "replacing": replacing,
                    },
                    retry_in=3,
                ),
                (StartJob("restore", request),),
            )
        if job.state.phase == RUNNING:
            return Step(
                Outcome(
                    False, "Running", f"Job {name} is running", fields={"progress": job.progress}, retry_in=5
                )
            )
        result = job.state.result or {}
        restored = result.get("bytes", 0)
        reach = status.point_in_time
        if reach is not None:
            done = f"{self.instance} recovered to {reach.target} from Backup {spec.backup}, {reach.archive}"
            return self.completed(done, result.get("details"))
        return self.completed(
            f"Backup {spec.backup} restored into {self.instance}: {restored} bytes", result.get("details")
        )

    def roll_back(self, failure: tuple[str, str]) -> Step:
        """A replacing restore failed: once the instance answers, a Job of its own makes sure it
        holds its own data again (the restore's Job does so itself unless it was killed), then
        the Restore fails. The Job decides from what the instance recorded, not from storage."""
        view, spec, status = self.view, self.spec, self.status
        first = status.rolling_back or Failure(reason=failure[0], message=failure[1])
        reason, message = first.reason, first.message
        name = job_name(view.name, "rollback")
        job = view.job("rollback")
        if not job.exists and status.rollback_started and not view.deleting:
            return self.failed("RollbackLost", f"{message}; Job {name}, which put the data back, was deleted")
        if not job.exists:
            if not ready_condition(view.target):
                return Step(
                    Outcome(
                        False,
                        "RollingBack",
                        f"the restore failed ({reason}); {self.instance}'s data is put back once it is ready",
                        depends_on=self.waiting_on_target,
                        retry_in=15,
                        fields={"phase": RUNNING, "rollingBack": first.to_api()},
                    )
                )
            # Idempotent (it decides from what the instance recorded): retried before it gives up.
            # A Restore being deleted, perhaps in the foreground (where the garbage collector
            # deletes its Jobs as they come), has its target own the Job; the withdrawal deletes
            # it. A Job the collector took is started again.
            start = StartJob(
                "rollback",
                self.request("rollback", replace=self.token),
                retries=ROLLBACK_RETRIES,
                owned_by_target=view.deleting,
            )
            return Step(
                Outcome(
                    False,
                    "RollingBack",
                    f"the restore failed ({reason}): Job {name} puts {self.instance}'s own data back",
                    fields={"phase": RUNNING, "rollingBack": first.to_api(), "rollbackStarted": True},
                    retry_in=3,
                    events=(EventNote("Warning", reason, message),),
                ),
                (start,),
            )
        if job.state.phase == RUNNING:
            return Step(
                Outcome(False, "RollingBack", f"Job {name} puts {self.instance}'s own data back", retry_in=5)
            )
        if job.state.phase == FAILED:
            return self.failed(
                "RollbackFailed",
                f"{message}; putting {self.instance}'s data back failed too, {ROLLBACK_RETRIES + 1} times "
                f"({job.state.message}): what was kept aside has {self.token} in its name",
            )
        details = (job.state.result or {}).get("details") or {}
        if details.get("committed"):
            # The restore had succeeded; only its Job's report was lost.
            done = f"Backup {spec.backup} restored into {self.instance} (found committed after its Job ended)"
            return self.completed(done, details)
        put_back = details.get("putBack") or []
        back = f" ({', '.join(put_back)} put back)" if put_back else ""
        return self.failed(reason, f"{message}; {self.instance} holds its own data again{back}")

    def restore_in_place(self) -> Step:
        """A physical backup over the running target (`backup.in_place`): a Job verifies every
        object while the target serves, then the instance is asked to stop and take it
        (status.inPlace: restore), a Job checks it and drops what was kept aside (check), and on
        any failure the instance is asked to put its data back (rollback)."""
        view, spec, status = self.view, self.spec, self.status
        target = view.target
        assert target is not None
        assert view.backup is not None
        ours = in_place.record_for(target, self.token)
        waiting = self.waiting_on_target
        if status.in_place is None:
            annotations = target["metadata"].get("annotations")
            asked = in_place.request_of(annotations)
            claimed = asked is not None and asked["token"] == self.token  # on an earlier pass
            other = in_place.held_by(annotations, in_place.record_of(target), self.token)
            if other is not None:
                return Step(
                    Outcome(
                        False,
                        "TargetBusy",
                        f"{self.instance} is being restored by Restore {other}",
                        depends_on=waiting,
                        retry_in=15,
                        fields={"phase": PENDING},
                    )
                )
            claim: tuple[Action, ...] = ()
            on_conflict = None
            if not claimed:
                running = str((target.get("status") or {}).get("version") or "")
                backup_version = str(view.backup["status"].get("version") or "")
                try:  # a data directory starts on its own major version only
                    backups_of(self.plugin).restored_spec({"version": running}, backup_version, "physical")
                except ValueError as error:
                    return self.failed("TargetRefused", f"spec.target.name: {self.instance} is at {error}")
                if not ready_condition(target):
                    return self.target_not_ready(waiting)
                verifying = self.verify_before_stop()
                if verifying is not None:
                    return verifying
                # The claim, on the instance as it was read: of two Restores asking at once, one
                # gets a conflict and finds the other's request on its next pass.
                claim = (Ask(in_place.request(self.token, view.name, in_place.RESTORE), claim=True),)
                on_conflict = Outcome(
                    False,
                    "TargetBusy",
                    f"{self.instance} changed while this Restore asked for it: it looks again",
                    depends_on=waiting,
                    retry_in=3,
                    fields={"phase": PENDING},
                )
            # Claimed (now or on a pass that ended before its status was written): the request
            # for the pods, then the step recorded.
            secret = WriteBootstrapSecret(
                self.bootstrap_request(replace=self.token, verified=True), replace=True
            )
            message = (
                f"{self.instance} stops; its primary's data is kept aside (…before-{self.token}) and Backup "
                f"{spec.backup} put in its place, its other pods clone it"
            )
            return Step(
                Outcome(
                    False,
                    "Stopping",
                    message,
                    depends_on=waiting,
                    retry_in=10,
                    fields={
                        "phase": RUNNING,
                        "startedAt": self.now_text,
                        "replacing": True,
                        "inPlace": InPlaceStep.RESTORE.value,
                    },
                    events=(EventNote("Normal", "RestoringInPlace", message),),
                ),
                (*claim, secret),
                on_conflict,
            )
        if status.in_place == InPlaceStep.ROLLBACK:
            return self.roll_back_in_place(None)
        name = job_name(view.name, "restore")
        if status.in_place == InPlaceStep.RESTORE:
            if ours.get("phase") == in_place.FAILED:
                failure = (ours.get("reason") or "RestoreFailed", ours.get("message") or "the restore failed")
                return self.roll_back_in_place(failure)
            if view.bootstrap_failure and self.replay():  # its server could not recover to the point
                return self.roll_back_in_place(view.bootstrap_failure)
            begun = parse_time(status.started_at)
            if begun and view.now - begun.timestamp() > DEFAULT_DEADLINE:
                # A server that never starts on the restored data (or pods that never stop).
                late = f"{self.instance} did not serve the backup within {DEFAULT_DEADLINE // 3600} h"
                return self.roll_back_in_place(("DeadlineExceeded", late))
            if ours.get("phase") != in_place.RESTORED or not ready_condition(target):
                phase = ours.get("phase") or in_place.STOPPING
                return Step(
                    Outcome(
                        False,
                        phase,
                        f"{self.instance}: {ours.get('message') or 'asked to stop'}",
                        depends_on=waiting,
                        retry_in=15,
                        fields={"progress": {"instance": phase}},
                    )
                )
            request = self.request(
                "check",
                location=self.location_prefix(),
                replace=self.token,
                check=(spec.check or RestoreCheck()).to_api(),
            )
            return Step(
                Outcome(
                    False,
                    "Checking",
                    f"{self.instance} holds Backup {spec.backup}: Job {name} checks it",
                    fields={"inPlace": InPlaceStep.CHECK.value, "job": name, "progress": None},
                    retry_in=3,
                ),
                (StartJob("restore", request),),
            )
        job = view.job("restore")
        if not job.exists:
            return self.roll_back_in_place(("JobLost", f"Job {name} was deleted before it ended"))
        if job.state.phase == RUNNING:
            return Step(Outcome(False, "Checking", f"Job {name} checks {self.instance}", retry_in=5))
        if job.state.phase == FAILED:
            return self.roll_back_in_place((job.state.reason, job.state.message))
        result = job.state.result or {}
        message = (
            f"Backup {spec.backup} restored over {self.instance}, checked; what it held before is removed"
        )
        reach = status.point_in_time
        if reach is not None:
            message = (
                f"{self.instance} recovered in place to {reach.target} from Backup {spec.backup}, "
                f"{reach.archive}; what it held before is removed"
            )
        done = self.completed(message, result.get("details"))
        return Step(done.outcome, (Ask(None),))

    def verify_before_stop(self) -> Step | None:
        """A Job reads every object of the backup while the instance still serves: a corrupted
        backup fails the Restore with no downtime. None once it passed."""
        view, spec = self.view, self.spec
        assert view.storage is not None
        name = job_name(view.name, "verify")
        job = view.job("verify")
        if not job.exists:
            request = {
                "action": "verify",
                "storage": view.storage.to_api(),
                "location": self.location_prefix(),
            }
            return Step(
                Outcome(
                    False,
                    "Verifying",
                    f"Job {name} checks every object of Backup {spec.backup} before {self.instance} stops",
                    fields={"phase": RUNNING, "startedAt": self.now_text, "job": name},
                    retry_in=3,
                ),
                (StartJob("verify", request, service_env=False),),
            )
        if job.state.phase == RUNNING:
            return Step(
                Outcome(
                    False,
                    "Verifying",
                    f"Job {name} is running",
                    fields={"progress": job.progress},
                    retry_in=5,
                )
            )
        if job.state.phase == FAILED:
            return self.failed(job.state.reason, f"{job.state.message}; {self.instance} was not stopped")
        verified = ((job.state.result or {}).get("details") or {}).get("location")
        if verified != self.location_prefix():  # the Backup made again meanwhile, or an older image's Job
            return Step(
                Outcome(False, "Verifying", f"Job {name} verified {verified}: verified again", retry_in=5),
                (DeleteJob("verify", best_effort=True),),
            )
        return None

    def roll_back_in_place(self, failure: tuple[str, str] | None) -> Step:
        """The restore in place failed (or was withdrawn): the instance is asked to stop again
        and put its own data back; the Restore fails once it has."""
        view, spec, status = self.view, self.spec, self.status
        assert view.target is not None
        given = Failure(reason=failure[0], message=failure[1]) if failure else Failure()
        first = status.rolling_back or given
        reason, message = first.reason, first.message
        ours = in_place.record_for(view.target, self.token)
        if status.in_place != InPlaceStep.ROLLBACK:
            note = f"{message}: {self.instance} stops again and gets its own data back"
            return Step(
                Outcome(
                    False,
                    "RollingBack",
                    note,
                    depends_on=self.waiting_on_target,
                    retry_in=10,
                    fields={
                        "phase": RUNNING,
                        "inPlace": InPlaceStep.ROLLBACK.value,
                        "rollingBack": first.to_api(),
                        "progress": None,
                    },
                    events=(EventNote("Warning", reason, note),),
                ),
                (Ask(in_place.request(self.token, view.name, in_place.ROLLBACK)),),
            )
        if not ours:  # asked on an earlier pass, and the instance never started this restore
            return Step(
                self.failed(reason, f"{message}; {self.instance} was not changed").outcome, (Ask(None),)
            )
        phase = ours.get("phase") if ours.get("mode") == in_place.ROLLBACK else None
        if phase == in_place.COMMITTED:
            done = (
                f"Backup {spec.backup} restored over {self.instance} (found committed after its check ended)"
            )
            return Step(self.completed(done).outcome, (Ask(None),))
        if phase == in_place.ROLLED_BACK:
            return Step(
                self.failed(reason, f"{message}; {self.instance} holds its own data again").outcome,
                (Ask(None),),
            )
        if phase == in_place.FAILED:
            return self.failed(
                "RollbackFailed",
                f"{message}; putting {self.instance}'s data back failed too ({ours.get('message')}): "
                f"it is kept aside under a name with {self.token} in it",
            )
        return Step(
            Outcome(
                False,
                "RollingBack",
                f"{self.instance}: {ours.get('message') or 'asked to put its data back'}",
                depends_on=self.waiting_on_target,
                retry_in=15,
            )
        )

    # -- once deleted

    def plan_withdrawal(self) -> Step:
        """Deleted while it replaced an instance's data: its Job is stopped (and gone, pod and
        all, so it holds nothing) and the instance gets its own data back before the Restore
        goes. Any other Restore goes at once. Either way it leaves nothing of its own on the
        instance (its request, a rollback Job the instance owns)."""
        step = self.undo_before_going()
        if not step.outcome.ready:
            return step
        return Step(step.outcome, step.actions + self.leave_nothing_behind(), step.on_conflict)

    def undo_before_going(self) -> Step:
        view, spec, status = self.view, self.spec, self.status
        replacing = status.phase == RUNNING and status.replacing
        in_place_step = status.in_place and status.phase not in (COMPLETED, FAILED)
        if not (replacing or in_place_step):
            return Step(Outcome(True, "Finalized", "nothing to undo"))
        if (
            spec.target.kind not in self.plugins
            or view.target is None
            or (view.backup is None and not status.in_place)
        ):
            return Step(Outcome(True, "Finalized", "its backup or its target is gone: nothing to put back"))
        job = view.job("restore")
        if job.exists and job.state.phase == RUNNING:
            name = job_name(view.name, "restore")
            stop = () if job.deleting else (DeleteJob("restore", foreground=True),)
            return Step(
                Outcome(False, "Stopping", f"deleted while it ran: Job {name} is stopped first", retry_in=3),
                stop,
            )
        deleted = ("Deleted", "the Restore was deleted while it ran")
        if status.in_place:
            step = self.roll_back_in_place(deleted)
        elif view.storage is None:
            error = view.storage_error or StorageError("StorageNotFound", "the backup's storage was not read")
            return Step(
                Outcome(False, error.reason, f"its data cannot be put back yet: {error}", retry_in=30)
            )
        else:
            step = self.roll_back(deleted)
        if step.outcome.reason == "RollingBack":
            return step
        outcome = step.outcome
        note = EventNote("Normal" if outcome.ready else "Warning", "Withdrawn", outcome.message)
        return Step(Outcome(True, "Withdrawn", outcome.message, events=(note,)), step.actions)

    def leave_nothing_behind(self) -> tuple[Action, ...]:
        """Its rollback Job (owned by the instance when started while the Restore was being
        deleted) and its request on the instance (a claim whose step was never recorded: the
        instance then undoes what it started by itself) go with the Restore."""
        actions: list[Action] = [DeleteJob("rollback", best_effort=True)]
        asked = in_place.request_of(((self.view.target or {}).get("metadata") or {}).get("annotations"))
        if self.spec.target.kind in self.plugins and asked and asked["token"] == self.token:
            actions.append(Ask(None, best_effort=True))
        return tuple(actions)
