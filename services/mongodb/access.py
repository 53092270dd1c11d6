"""Pure: what to send a MongoDB server so that a `MongoDBUser` exists as its spec says.

A user the operator made carries `customData.statefleet: <namespace>/<name>` on mongod; on
FerretDB, which refuses custom data and roles (it enforces none), the resource's status
remembers that it made the user. A user someone else made is never changed or dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def marker(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


@dataclass(frozen=True)
class WantedUser:
    username: str
    database: str  # where the user is defined (its authSource)
    password: str
    password_changed: bool  # the password Secret changed since it was last applied
    roles: tuple[tuple[str, str], ...]  # (role, db); empty on FerretDB
    marker: str
    custom_data: bool  # the server keeps customData (mongod), so the marker lives there


@dataclass
class UserPlan:
    commands: list[dict[str, Any]] = field(default_factory=list)  # run on `database`, in order
    refusal: str | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)


def roles_of(found: dict[str, Any]) -> set[tuple[str, str]]:
    return {(r["role"], r["db"]) for r in found.get("roles") or []}


def ours(found: dict[str, Any], wanted: WantedUser, made_here: bool) -> bool:
    if wanted.custom_data:
        return (found.get("customData") or {}).get("statefleet") == wanted.marker
    return made_here


def plan_user(wanted: WantedUser, found: dict[str, Any] | None, made_here: bool) -> UserPlan:
    """`found`: the user as `usersInfo` shows it (None: no such user); `made_here`: the
    resource's status says it created this user."""
    roles = [{"role": role, "db": db} for role, db in wanted.roles]
    if found is None:
        command: dict[str, Any] = {"createUser": wanted.username, "pwd": wanted.password, "roles": roles}
        if wanted.custom_data:
            command["customData"] = {"statefleet": wanted.marker}
        return UserPlan(
            [command],
            events=[
                ("Normal", "UserCreated", f"user {wanted.username} created in database {wanted.database}")
            ],
        )
    if not ours(found, wanted, made_here):
        return UserPlan(
            refusal=f"user {wanted.username} already exists in database {wanted.database} and this resource "
            "did not make it: choose another spec.username, or drop that user first"
        )
    plan = UserPlan()
    update: dict[str, Any] = {}
    if wanted.password_changed:
        update["pwd"] = wanted.password
    if wanted.custom_data and roles_of(found) != set(wanted.roles):
        update["roles"] = roles
    if update:
        plan.commands.append({"updateUser": wanted.username, **update})
        changed = " and ".join(
            what for what, key in (("password", "pwd"), ("roles", "roles")) if key in update
        )
        plan.events.append(("Normal", "UserUpdated", f"user {wanted.username}: {changed} changed"))
    return plan
