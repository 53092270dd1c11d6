"""A physical backup restored over a running instance: what a `Restore` and the instance's
plugin say to each other.

The Restore asks with an annotation on the instance (`ANNOTATION`: token, Restore, mode); the
plugin answers in the instance's `status.inPlaceRestore` (token, mode, phase, the pod that
takes the backup, a message). A plugin that serves it (`Backups.restores_in_place`)
stops every pod, starts them again with an init container that, in the pod that was the
primary, keeps the old data aside (named after the token) and puts the backup in its place,
and in the others drops the copies they held (they clone the new primary). The Restore then
checks the instance with a Job, which also drops what was kept aside. When anything fails,
the Restore asks for `ROLLBACK`: the pods stop again and the old data goes back in place.

Phases of one mode: STOPPING (no pod may run: replicas 0), STARTING (the pods run the init
container), then RESTORED or ROLLED_BACK, COMMITTED (a rollback found the restore already
checked and committed) or FAILED.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any

from pydantic import Field

from framework.kube.model import StatusModel

ANNOTATION = "statefleet.dev/restore-in-place"
STATUS_FIELD = "inPlaceRestore"


class Mode(StrEnum):
    """What a Restore asks of the instance."""

    RESTORE = "restore"
    ROLLBACK = "rollback"


class InPlacePhase(StrEnum):
    """Where the instance stands in what it was asked (`status.inPlaceRestore.phase`)."""

    STOPPING = "Stopping"
    STARTING = "Starting"
    RESTORED = "Restored"
    ROLLED_BACK = "RolledBack"
    COMMITTED = "Committed"
    FAILED = "Failed"


class InPlaceRecord(StatusModel):
    """The instance's answer (`status.inPlaceRestore`)."""

    token: str | None = Field(default=None, description="names the data kept aside")
    restore: str | None = None
    mode: Mode | None = None
    pod: str | None = Field(default=None, description="the pod that takes the backup")
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    started_at: str | None = None


RESTORE, ROLLBACK = Mode
STOPPING, STARTING, RESTORED, ROLLED_BACK, COMMITTED, FAILED = InPlacePhase
FINISHED = frozenset({RESTORED, ROLLED_BACK, COMMITTED, FAILED})
TOKEN = re.compile(r"^[0-9a-f]{8}$")


def request(token: str, restore: str, mode: str) -> str:
    return json.dumps({"token": token, "restore": restore, "mode": mode}, sort_keys=True)


def request_of(annotations: dict[str, str] | None) -> dict[str, str] | None:
    """The request an instance carries, None when it carries none or one that is not ours."""
    raw = (annotations or {}).get(ANNOTATION)
    if not raw:
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(found, dict) or not TOKEN.match(str(found.get("token", ""))):
        return None
    if found.get("mode") not in (RESTORE, ROLLBACK):
        return None
    return {"token": found["token"], "restore": str(found.get("restore", "")), "mode": found["mode"]}


def under_way(record: dict[str, Any] | None) -> bool:
    return bool(record) and (record or {}).get("phase") not in FINISHED


def record_of(instance: dict[str, Any]) -> dict[str, Any]:
    """The instance's answer (any Restore's), {} when it has none."""
    return (instance.get("status") or {}).get(STATUS_FIELD) or {}


def record_for(instance: dict[str, Any], token: str) -> dict[str, Any]:
    """The instance's answer to the restore `token` names, {} when it answers another or none."""
    record = record_of(instance)
    return record if record.get("token") == token else {}


def held_by(annotations: dict[str, str] | None, record: dict[str, Any], token: str) -> str | None:
    """The Restore that holds the instance against the restore `token` names, None when it is
    free: another Restore's request until that restore ended (rolled back, committed, or its
    rollback failed: what it kept aside then waits for a person, not for it), or a record
    still under way."""
    asked = request_of(annotations)
    if asked and asked["token"] != token:
        theirs = record if record.get("token") == asked["token"] else {}
        ended = theirs.get("phase") in (ROLLED_BACK, COMMITTED) or (
            theirs.get("phase") == FAILED and theirs.get("mode") == ROLLBACK
        )
        if not ended:
            return asked["restore"]
    if under_way(record) and record.get("token") != token:
        return str(record.get("restore"))
    return None
