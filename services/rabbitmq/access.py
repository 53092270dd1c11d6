"""Pure: the management API requests that make a RabbitMQ cluster's users, vhosts and
permissions agree with their resources, or why they must not be made.

Each user and vhost the operator creates carries a tag naming its resource
(`statefleet:<namespace>/<name>`): a user or vhost someone else made is never taken over or
deleted. A password is sent only when the user is created or its Secret changed; the tags of
a user are changed with the password hash RabbitMQ already has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from framework.kube.api import EventNote

ALL = ".*"
# User tags that mean something to RabbitMQ (the management UI and API's permissions).
KNOWN_TAGS = ("administrator", "monitoring", "policymaker", "management", "impersonator")


def marker(namespace: str, name: str) -> str:
    return f"statefleet:{namespace}/{name}"


def user_path(user: str) -> str:
    return f"users/{quote(user, safe='')}"


def vhost_path(vhost: str) -> str:
    return f"vhosts/{quote(vhost, safe='')}"


def permission_path(vhost: str, user: str) -> str:
    return f"permissions/{quote(vhost, safe='')}/{quote(user, safe='')}"


def tags_of(found: dict[str, Any] | None) -> frozenset[str]:
    """A user's or vhost's tags: a list, or (older servers) one comma-separated string."""
    tags = (found or {}).get("tags") or []
    if isinstance(tags, str):
        tags = tags.split(",")
    return frozenset(tag.strip() for tag in tags if tag.strip())


@dataclass(frozen=True)
class Request:
    method: str  # PUT or DELETE
    path: str
    body: dict[str, Any] | None = None


@dataclass
class AccessPlan:
    requests: list[Request] = field(default_factory=list)
    refusal: str | None = None
    events: list[EventNote] = field(default_factory=list)


@dataclass(frozen=True)
class Permissions:
    configure: str = ALL
    write: str = ALL
    read: str = ALL

    def body(self) -> dict[str, str]:
        return {"configure": self.configure, "write": self.write, "read": self.read}

    @classmethod
    def found(cls, reply: dict[str, Any] | None) -> Permissions | None:
        if reply is None:
            return None
        return cls(reply.get("configure", ""), reply.get("write", ""), reply.get("read", ""))


@dataclass(frozen=True)
class WantedUser:
    username: str
    marker: str
    tags: frozenset[str]
    password: str
    password_changed: bool
    own_vhost: str | None  # the vhost made for it, with every permission on it


def plan_user(
    wanted: WantedUser,
    user: dict[str, Any] | None,
    vhost: dict[str, Any] | None,
    permissions: Permissions | None,
) -> AccessPlan:
    """`user`, `vhost`, `permissions`: what the cluster has (`vhost` and `permissions` only
    read for an own vhost)."""
    plan = AccessPlan()
    if user is not None and wanted.marker not in tags_of(user):
        plan.refusal = (
            f"the user {wanted.username} exists and was not created for this resource "
            f"(its tags are {sorted(tags_of(user))}): choose another spec.username, or delete it"
        )
        return plan
    if wanted.own_vhost and vhost is not None and wanted.marker not in tags_of(vhost):
        plan.refusal = (
            f"spec.ownVhost: the vhost {wanted.own_vhost} exists and was not created for this resource; "
            "ownVhost takes only a vhost it created"
        )
        return plan
    tags = ",".join(sorted(wanted.tags | {wanted.marker}))
    if user is None or wanted.password_changed:
        plan.requests.append(
            Request("PUT", user_path(wanted.username), {"password": wanted.password, "tags": tags})
        )
        if user is None:
            plan.events.append(EventNote("Normal", "UserCreated", f"user {wanted.username} created"))
        else:
            plan.events.append(
                EventNote("Normal", "PasswordChanged", f"the password of {wanted.username} was set")
            )
    elif tags_of(user) != wanted.tags | {wanted.marker}:
        kept = {
            "password_hash": user.get("password_hash", ""),
            "hashing_algorithm": user.get("hashing_algorithm"),
        }
        plan.requests.append(Request("PUT", user_path(wanted.username), {**kept, "tags": tags}))
    if wanted.own_vhost:
        if vhost is None:
            plan.requests.append(Request("PUT", vhost_path(wanted.own_vhost), {"tags": wanted.marker}))
            plan.events.append(EventNote("Normal", "VhostCreated", f"vhost {wanted.own_vhost} created"))
        if permissions != Permissions():
            plan.requests.append(
                Request("PUT", permission_path(wanted.own_vhost, wanted.username), Permissions().body())
            )
    return plan


def plan_vhost(vhost: str, mark: str, description: str, found: dict[str, Any] | None) -> AccessPlan:
    plan = AccessPlan()
    if found is not None and mark not in tags_of(found):
        plan.refusal = (
            f"the vhost {vhost} exists and was not created for this resource: "
            "choose another spec.name, or delete it"
        )
        return plan
    if found is None or (found.get("description") or "") != description:
        plan.requests.append(Request("PUT", vhost_path(vhost), {"description": description, "tags": mark}))
        if found is None:
            plan.events.append(EventNote("Normal", "VhostCreated", f"vhost {vhost} created"))
    return plan


def plan_permission(vhost: str, user: str, wanted: Permissions, found: Permissions | None) -> AccessPlan:
    if found == wanted:
        return AccessPlan()
    return AccessPlan(requests=[Request("PUT", permission_path(vhost, user), wanted.body())])
