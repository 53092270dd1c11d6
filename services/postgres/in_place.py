"""A physical backup restored over a running Postgres instance (see `backup.in_place` for the
protocol): a pure function of the request, the record in status, the pods and the StatefulSet.

Stopping: replicas 0 and the pod template gets the init container with the token and mode;
the primary's planning is held (pods that go down on purpose must not start a failover).
Once no pod runs and the StatefulSet carries that template, the pods start again: the pod
that was the primary takes the backup (or, rolling back, its old data) in its init
container, then starts as the primary; the others clone it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backup import in_place
from framework.kube.api import EventNote
from framework.kube.jobs import termination

INIT_CONTAINER = "restore"


@dataclass(frozen=True)
class InPlaceStep:
    record: dict[str, Any] | None  # status.inPlaceRestore (None: never asked)
    stopped: bool = False  # replicas 0
    held: bool = False  # the primary's planning waits
    init_env: dict[str, str] = field(default_factory=dict)  # the init container's, empty: none
    events: tuple[EventNote, ...] = ()


def init_outcome(pod: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    """How the pod's restore init container ended in this life of the pod: ("done", result),
    ("failed", error) or None (not yet, or not at all)."""
    for status in ((pod or {}).get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") != INIT_CONTAINER:
            continue
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            terminated = state.get("terminated")
            if not terminated:
                continue
            report, how = termination({"status": {"containerStatuses": [{"state": state}]}})
            if terminated.get("exitCode") == 0:
                return "done", (report or {}).get("result") or {}
            error = (report or {}).get("error") or {}
            return "failed", {
                "reason": error.get("reason") or "InitContainerFailed",
                "message": error.get("message") or f"the {INIT_CONTAINER} init container ended: {how}",
            }
    return None


POD_ANNOTATION = "statefleet.dev/restore-step"  # on the pod template: token/mode/pod


def pod_annotation(env: dict[str, str]) -> str:
    return f"{env['RESTORE_TOKEN']}/{env['RESTORE_MODE']}/{env['RESTORE_POD']}"


def stopped_with(statefulset: dict[str, Any] | None, env: dict[str, str]) -> bool:
    """The StatefulSet is scaled to zero and its pod template is the one with this init
    container environment (its annotation says so): the pods it starts next take that step."""
    spec = (statefulset or {}).get("spec") or {}
    if statefulset is None or spec.get("replicas", 1) != 0:
        return False
    annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(POD_ANNOTATION) == pod_annotation(env)


def plan_in_place(
    request: dict[str, str] | None,
    record: dict[str, Any] | None,
    primary: str,
    pods: list[dict[str, Any]],
    statefulset: dict[str, Any] | None,
    primaries: frozenset[str] = frozenset(),
    now: str = "",
) -> InPlaceStep:
    """`primaries`: the pods whose server answered as the primary in this life of the pod."""
    record = dict(record) if record else None
    events: list[EventNote] = []
    withdrawn = record is not None and (request is None or request["token"] != record.get("token"))
    if (
        record
        and record["mode"] == in_place.RESTORE
        and record["phase"] in (in_place.STOPPING, in_place.STARTING, in_place.FAILED)
        and (withdrawn or (request is not None and request["mode"] == in_place.ROLLBACK))
    ):
        # Asked to undo it, or no Restore asks for it any more (deleted, or another one's
        # request): nothing unchecked is left in place.
        record = {
            **record,
            "mode": in_place.ROLLBACK,
            "phase": in_place.STOPPING,
            "message": f"every pod stops; {record['pod']} then gets its own data back",
        }
        events.append(EventNote("Warning", "RestoreRollingBack", record["message"]))
    elif request and (record is None or record.get("token") != request["token"]):
        if request["mode"] == in_place.RESTORE and not in_place.under_way(record):
            record = {
                "token": request["token"],
                "restore": request["restore"],
                "mode": in_place.RESTORE,
                "pod": primary,
                "phase": in_place.STOPPING,
                "startedAt": now,
                "message": f"every pod stops; {primary} then takes Restore {request['restore']}'s backup",
            }
            events.append(EventNote("Normal", "RestoreStopping", record["message"]))
    elif request and record and request["mode"] == in_place.ROLLBACK and record["mode"] == in_place.RESTORE:
        # Restored, then its check failed.
        record = {
            **record,
            "mode": in_place.ROLLBACK,
            "phase": in_place.STOPPING,
            "message": f"every pod stops; {record['pod']} then gets its own data back",
        }
        events.append(EventNote("Warning", "RestoreRollingBack", record["message"]))
    if record is None:
        return InPlaceStep(None)
    env = {"RESTORE_TOKEN": record["token"], "RESTORE_MODE": record["mode"], "RESTORE_POD": record["pod"]}
    phase = record["phase"]
    if phase == in_place.STOPPING:
        if pods or not stopped_with(statefulset, env):
            return InPlaceStep(record, stopped=True, held=True, init_env=env, events=tuple(events))
        record = {**record, "phase": in_place.STARTING, "message": f"{record['pod']} runs its init container"}
        phase = in_place.STARTING
    if phase != in_place.STARTING:
        return InPlaceStep(record, init_env=env, events=tuple(events))
    pod = next((p for p in pods if p["metadata"]["name"] == record["pod"]), None)
    outcome = init_outcome(pod)
    restoring = record["mode"] == in_place.RESTORE
    if outcome is None:
        return InPlaceStep(record, held=True, init_env=env, events=tuple(events))
    state, details = outcome
    if state == "failed":
        what = "taking the backup" if restoring else "putting its own data back"
        message = f"{record['pod']} failed {what}: {details['reason']}: {details['message']}"
        record = {**record, "phase": in_place.FAILED, "reason": details["reason"], "message": message}
        events.append(EventNote("Warning", "RestoreFailed" if restoring else "RollbackFailed", message))
        # A failed restore waits for its rollback; a failed rollback is left to the planning
        # (and to a person: the old data is kept aside under the token).
        return InPlaceStep(record, held=restoring, init_env=env, events=tuple(events))
    if record["pod"] not in primaries:
        return InPlaceStep(record, init_env=env, events=tuple(events))  # the planning promotes it
    if restoring:
        message = f"{record['pod']} holds the backup and is the primary; its old data is kept aside"
        record = {**record, "phase": in_place.RESTORED, "message": message}
        events.append(EventNote("Normal", "RestoreStarted", message))
    elif details.get("committed"):
        message = f"{record['pod']} keeps the backup: the restore had been checked and committed"
        record = {**record, "phase": in_place.COMMITTED, "message": message}
        events.append(EventNote("Normal", "RestoreCommitted", message))
    else:
        message = f"{record['pod']} holds its own data again and is the primary"
        record = {**record, "phase": in_place.ROLLED_BACK, "message": message}
        events.append(EventNote("Normal", "RestoreRolledBack", message))
    return InPlaceStep(record, init_env=env, events=tuple(events))
