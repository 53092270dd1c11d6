"""Credentials rotation (`spec.rotateCredentials`), service-neutral and pure: an instance's
generated passwords replaced without downtime, in three steps recorded in
`status.credentialsRotation`, so an operator restarted mid-way goes on where it stopped:

    Staged   a new random password under `next-password` beside `password` in each of the
             Secrets that rotate (framework action `StageCredentials`, the instance controller's);
             the servers still take the old one, every client still uses it.
    Applied  the servers take the new passwords (the plugin's own action, `Rotation.apply`);
             the operator's connections try `password`, then `next-password`
             (`framework.kube.secrets.Passwords`).
    Rotated  each Secret's `password` is the new one, `next-password` is gone
             (framework action `SwapCredentials`, right after the plugin applied them again:
             idempotent, so a server that lost them meanwhile has them back first).

Every step is idempotent and decided from the status and the Secrets alone. A request that
changes while a rotation is under way waits for that one to finish, then starts its own: a
rotation is never abandoned half way (the servers may already take the new passwords).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from framework.kube.api import EventNote
from framework.kube.model import StatusModel
from framework.kube.secrets import NEXT_PASSWORD

SPEC_FIELD = "rotateCredentials"  # a request token: a new value asks for a new rotation
STATUS_FIELD = "credentialsRotation"
STAGED, APPLIED, ROTATED = "Staged", "Applied", "Rotated"
UNDER_WAY = (STAGED, APPLIED)


def rotate_credentials_field(credentials: str, command: str) -> Any:
    """`spec.rotateCredentials` of a service whose plugin has the `Rotation` capability: its
    `credentials` said in words, the `command` that asks for a rotation."""
    return Field(
        default=None,
        max_length=64,
        description=f"Rotate the instance's own credentials ({credentials}, in the Secrets the operator "
        f"made) without downtime: any new value (an RFC 3339 time, as `{command}` sets) asks for one "
        "rotation; status.credentialsRotation follows it (Staged, Applied, Rotated). Dropped from a "
        "spec restored from a backup.",
    )


class CredentialsRotationStatus(StatusModel):
    requested: str | None = Field(default=None, description="the spec.rotateCredentials this rotation serves")
    phase: Literal["Staged", "Applied", "Rotated"] | None = Field(
        default=None,
        description="Staged: new passwords beside the old in the Secrets (next-password); Applied: the "
        "servers take them; Rotated: the Secrets hold them as password",
    )
    started_at: str | None = None
    completed_at: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class StageCredentials:
    """A new random `next-password` in each of these Secrets that has none (the instance
    controller carries it out; a password already staged is kept)."""

    secrets: tuple[str, ...]
    length: int = 32


@dataclass(frozen=True)
class SwapCredentials:
    """Each of these Secrets' `next-password` becomes its `password` (the instance controller
    carries it out; a Secret with no `next-password` is left alone: swapped already)."""

    secrets: tuple[str, ...]


FRAMEWORK_ACTIONS = (StageCredentials, SwapCredentials)


@dataclass(frozen=True)
class RotationStep:
    """One pass of a rotation: what to record (None: nothing changes) and what to do, in order:
    stage, apply (the plugin's action), swap."""

    status: dict[str, Any] | None = None
    stage: bool = False
    apply: bool = False
    swap: bool = False
    events: tuple[EventNote, ...] = field(default_factory=tuple)


def under_way(status: Mapping[str, Any] | None) -> bool:
    """A rotation has started and not finished (`status.credentialsRotation`)."""
    return (status or {}).get("phase") in UNDER_WAY


def pending(spec: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether this instance's pass needs its generated Secrets (a rotation asked for or under
    way), from the resource's spec and status as stored."""
    rotation = status.get(STATUS_FIELD) or {}
    requested = spec.get(SPEC_FIELD)
    return under_way(rotation) or bool(requested and requested != rotation.get("requested"))


def staged_in(secrets: Mapping[str, dict[str, Any]], suffixes: tuple[str, ...]) -> dict[str, bool] | None:
    """Which of the rotating Secrets (by suffix) hold a `next-password`; None when they were not
    read on this pass (`Observed.secrets` holds {} for those). A missing Secret is not staged."""
    found = {suffix: secrets.get(suffix) for suffix in suffixes}
    if any(secret == {} for secret in found.values()):
        return None
    return {suffix: NEXT_PASSWORD in ((secret or {}).get("data") or {}) for suffix, secret in found.items()}


def plan_rotation(
    requested: str | None,
    status: Mapping[str, Any] | None,
    staged: Mapping[str, bool] | None,
    now: str,
    waiting: str | None = None,
    fresh: bool = False,
) -> RotationStep:
    """The next step of the rotation `requested` (spec.rotateCredentials) from `status`
    (status.credentialsRotation), `staged` (`staged_in`: which Secrets hold a next password;
    None: not read) and `waiting` (the plugin's reason its servers cannot take new passwords
    now: a failover under way, a primary that does not answer; None: they can). `fresh`: an
    instance whose children were never applied: its passwords are new already, so a request
    it was made with is served at once."""
    current = dict(status or {})
    if not under_way(current):
        if not requested or requested == current.get("requested"):
            return RotationStep()
        if fresh:
            done = {"requested": requested, "phase": ROTATED, "startedAt": now, "completedAt": now}
            return RotationStep({**done, "message": "a new instance: its passwords are new"})
        if staged is None:
            return RotationStep()  # the Secrets are read on the next pass (`pending`)
        started = {"requested": requested, "phase": STAGED, "startedAt": now, "completedAt": None}
        message = "new passwords staged in the Secrets (next-password)"
        return RotationStep(
            {**started, "message": _waiting(message, waiting)},
            stage=True,
            events=(EventNote("Normal", "CredentialsRotationStarted", f"{message}: rotating ({requested})"),),
        )
    if staged is None:
        return RotationStep()
    phase = current["phase"]
    later = (
        f"; the request {requested} follows once this one is done"
        if requested and requested != current.get("requested")
        else ""
    )
    if phase == STAGED:
        if not all(staged.values()):  # the servers were not given them yet: stage (again)
            message = "new passwords staged in the Secrets (next-password)"
            return RotationStep({**current, "message": _waiting(message, waiting) + later}, stage=True)
        if waiting:
            message = _waiting("new passwords staged in the Secrets (next-password)", waiting) + later
            return RotationStep(
                {**current, "message": message} if message != current.get("message") else None
            )
        message = "the servers take the new passwords; the Secrets are swapped next"
        return RotationStep({**current, "phase": APPLIED, "message": message + later}, apply=True)
    # APPLIED: applied again, then swapped (a Secret swapped by an earlier pass is left alone)
    done = {**current, "phase": ROTATED, "completedAt": now, "message": "the Secrets hold the new passwords"}
    event = EventNote(
        "Normal", "CredentialsRotated", f"the Secrets hold the new passwords ({current['requested']})"
    )
    if not any(staged.values()):  # swapped by a pass that could not record it
        return RotationStep(done, events=(event,))
    if waiting:
        message = _waiting("the servers take the new passwords; the Secrets are swapped next", waiting)
        message += later
        return RotationStep({**current, "message": message} if message != current.get("message") else None)
    return RotationStep(done, apply=True, swap=True, events=(event,))


def _waiting(message: str, waiting: str | None) -> str:
    return f"{message}; waiting: {waiting}" if waiting else message
