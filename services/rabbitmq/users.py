"""`RabbitMQUser`, `RabbitMQVhost`, `RabbitMQPermission`: a cluster's users, vhosts and
permissions as resources of their own, made through the management API.

Every pass reads what the cluster has and sends (planned in `services.rabbitmq.access`, pure)
only what differs, so a pass repeated makes nothing twice. A password Secret changed by hand
is applied within a minute (every object is looked at again that often). Deleting a user
deletes it (and, RabbitMQ does it, its permissions) but keeps the vhost made for it, whose
queues hold messages; a vhost is deleted with its resource only with `deletionPolicy: Delete`.
"""

from __future__ import annotations

import re
from typing import Any

from lightkube import AsyncClient
from pydantic import ConfigDict, Field

from framework.kube import conditions
from framework.kube.api import get_or_none
from framework.kube.model import ApiModel, StatusModel, immutable, optional_immutable
from framework.object_controller import (
    CredentialsStatus,
    ObjectKind,
    Outcome,
    Ref,
    password_secret_field,
    user_password,
)
from framework.spec import DeletionPolicy
from services.rabbitmq.access import (
    KNOWN_TAGS,
    AccessPlan,
    Permissions,
    WantedUser,
    marker,
    permission_path,
    plan_permission,
    plan_user,
    plan_vhost,
    tags_of,
    user_path,
    vhost_path,
)
from services.rabbitmq.management import Management

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}$"
RESERVED_USERS = frozenset({"guest"})


INSTANCE_FIELD = Field(
    min_length=1,
    description="The RabbitMQ, in the same namespace.",
    json_schema_extra=immutable("instance"),
)


class RabbitMQUserSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=optional_immutable("username"))
    instance: str = INSTANCE_FIELD
    username: str | None = Field(
        default=None, pattern=NAME_PATTERN, description="The user's name; the resource's name when empty."
    )
    tags: list[str] = Field(
        default_factory=list,
        max_length=len(KNOWN_TAGS),
        description="RabbitMQ user tags: " + ", ".join(KNOWN_TAGS) + ".",
        json_schema_extra={"items": {"type": "string", "enum": list(KNOWN_TAGS)}},
    )
    own_vhost: bool = Field(
        default=False,
        description="A vhost named after the user, with every permission on it (kept when the user goes).",
    )
    password_secret: str | None = password_secret_field()
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.DELETE, description="Delete deletes the user; Retain keeps it."
    )


class RabbitMQVhostSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=optional_immutable("name"))
    instance: str = INSTANCE_FIELD
    name: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="The vhost's name; the resource's name when empty.",
    )
    description: str = Field(default="", max_length=1024)
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN,
        description="Delete deletes the vhost with its queues and messages; Retain (the default) keeps it.",
    )


class RabbitMQPermissionSpec(ApiModel):
    instance: str = INSTANCE_FIELD
    user: str = Field(
        pattern=NAME_PATTERN,
        description="The user's name (in RabbitMQ).",
        json_schema_extra=immutable("user"),
    )
    vhost: str = Field(
        min_length=1, max_length=255, description="The vhost's name.", json_schema_extra=immutable("vhost")
    )
    configure: str = Field(default=".*", description="Regular expression of the resources it may configure.")
    write: str = Field(default=".*", description="... it may publish to.")
    read: str = Field(default=".*", description="... it may consume from.")


def checked_name(value: str, where: str) -> str:
    if not re.match(NAME_PATTERN, value):
        raise ValueError(f"{where}: {value!r} is not a name (letters, digits, _ . -)")
    return value


def own_vhost_clash(
    user: str, vhost: str, found_user: dict[str, Any], found_vhost: dict[str, Any]
) -> str | None:
    """A user's permissions on the vhost made for it (`ownVhost`) are its RabbitMQUser's: a
    RabbitMQPermission would undo them on every pass, and revoke them when deleted."""
    shared = {tag for tag in tags_of(found_user) & tags_of(found_vhost) if tag.startswith("statefleet:")}
    if user == vhost and shared:
        owner = sorted(shared)[0].removeprefix("statefleet:")
        return (
            f"spec.vhost: {vhost} is the own vhost of user {user}, whose permissions "
            f"RabbitMQUser {owner} keeps"
        )
    return None


class RabbitMQUserStatus(CredentialsStatus):
    username: str | None = None
    vhost: str | None = Field(default=None, description="its own vhost")


class RabbitMQVhostStatus(StatusModel):
    vhost: str | None = None


class AccessKind(ObjectKind):
    """What the three kinds share: the instance they live in, reached through its Service."""

    def __init__(self, management: Management, instances: Any) -> None:
        self.management = management
        self.instances = instances  # the RabbitMQ resource class

    async def address(
        self, client: AsyncClient, namespace: str, instance: str
    ) -> tuple[str | None, Outcome | None]:
        """The management API's address, or the Outcome that says why there is none yet."""
        depends = frozenset({Ref("RabbitMQ", instance)})
        found = await get_or_none(client, self.instances, instance, namespace)
        if found is None:
            return None, Outcome(
                False,
                "InstanceNotFound",
                f"spec.instance: RabbitMQ {instance} does not exist in namespace {namespace}",
                depends_on=depends,
            )
        ready = conditions.find((found.get("status") or {}).get("conditions"), conditions.READY)
        if not ready or ready.get("status") != "True":
            return None, Outcome(
                False,
                "InstanceNotReady",
                f"RabbitMQ {instance} is not ready yet",
                depends_on=depends,
                retry_in=5,
            )
        return await self.management.service_address(client, namespace, instance), None

    async def send(
        self, client: AsyncClient, namespace: str, instance: str, ip: str, plan: AccessPlan
    ) -> None:
        for request in plan.requests:
            await self.management.change(
                client, namespace, instance, ip, request.method, request.path, request.body
            )

    async def delete(
        self,
        client: AsyncClient,
        body: dict[str, Any],
        instance: str,
        what: str,
        path: str,
        marked: bool = True,
    ) -> Outcome:
        """Deletes `what` (at `path`) from the instance; with `marked`, only when it carries this
        resource's mark (what someone else made stays)."""
        meta = body["metadata"]
        namespace = meta["namespace"]
        ip, waiting = await self.address(client, namespace, instance)
        if waiting and waiting.reason == "InstanceNotFound":
            return Outcome(True, "InstanceGone", f"RabbitMQ {instance} is gone, and {what} with it")
        if waiting:
            return Outcome(False, "DeletionBlocked", f"to delete {what}: {waiting.message}", retry_in=5)
        assert ip is not None
        if marked:
            found = await self.management.read(client, namespace, instance, ip, path)
            if found is None or marker(namespace, meta["name"]) not in tags_of(found):
                return Outcome(True, "Deleted", f"{what}: not there, or not this resource's")
        await self.management.change(client, namespace, instance, ip, "DELETE", path)
        return Outcome(True, "Deleted", f"{what}: deleted from RabbitMQ {instance}")


class RabbitMQUserKind(AccessKind):
    kind = "RabbitMQUser"
    plural = "rabbitmqusers"
    short_names = ("rmquser",)
    spec_model = RabbitMQUserSpec
    status_model = RabbitMQUserStatus

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: RabbitMQUserSpec) -> Outcome:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        status = body.get("status") or {}
        where = (
            "spec.username"
            if spec.username
            else "metadata.name (the user's name when spec.username is empty)"
        )
        try:
            username = checked_name(spec.username or name, where)
        except ValueError as error:
            return Outcome(False, "InvalidSpec", str(error))
        if username in RESERVED_USERS:
            return Outcome(False, "InvalidSpec", f"{where}: {username} is RabbitMQ's own")
        depends = frozenset({Ref("RabbitMQ", spec.instance)})
        ip, waiting = await self.address(client, namespace, spec.instance)
        if waiting:
            return waiting
        assert ip is not None
        found = await user_password(client, self.kind, body, spec.password_secret, username, depends)
        if isinstance(found, Outcome):
            return found
        secret_name, password, version = found.secret, found.password, found.version
        vhost = username if spec.own_vhost else None
        wanted = WantedUser(
            username=username,
            marker=marker(namespace, name),
            tags=frozenset(spec.tags),
            password=password,
            password_changed=status.get("passwordVersion") != version,
            own_vhost=vhost,
        )
        read = self.management.read
        user = await read(client, namespace, spec.instance, ip, user_path(username))
        found_vhost = await read(client, namespace, spec.instance, ip, vhost_path(vhost)) if vhost else None
        permissions = (
            Permissions.found(
                await read(client, namespace, spec.instance, ip, permission_path(vhost, username))
            )
            if vhost
            else None
        )
        planned = plan_user(wanted, user, found_vhost, permissions)
        if planned.refusal:
            return Outcome(False, "Refused", planned.refusal, depends_on=depends)
        await self.send(client, namespace, spec.instance, ip, planned)
        where_to = f" with its own vhost {vhost}" if vhost else ""
        return Outcome(
            True,
            "Reconciled",
            f"user {username} in RabbitMQ {spec.instance}{where_to}; password from Secret {secret_name}",
            fields={"username": username, "vhost": vhost, "secret": secret_name, "passwordVersion": version},
            depends_on=depends,
            events=tuple(planned.events),
        )

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: RabbitMQUserSpec) -> Outcome:
        if spec.deletion_policy == DeletionPolicy.RETAIN:
            return Outcome(True, "Retained", "the user is kept (deletionPolicy Retain)")
        username = spec.username or body["metadata"]["name"]
        return await self.delete(client, body, spec.instance, f"user {username}", user_path(username))

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns[0:0] = [
            {"name": "Instance", "type": "string", "jsonPath": ".spec.instance"},
            {"name": "User", "type": "string", "jsonPath": ".status.username"},
            {"name": "Vhost", "type": "string", "jsonPath": ".status.vhost"},
        ]
        return columns


class RabbitMQVhostKind(AccessKind):
    kind = "RabbitMQVhost"
    plural = "rabbitmqvhosts"
    short_names = ("rmqvhost",)
    spec_model = RabbitMQVhostSpec
    status_model = RabbitMQVhostStatus

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: RabbitMQVhostSpec) -> Outcome:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        vhost = spec.name or name
        ip, waiting = await self.address(client, namespace, spec.instance)
        if waiting:
            return waiting
        assert ip is not None
        depends = frozenset({Ref("RabbitMQ", spec.instance)})
        found = await self.management.read(client, namespace, spec.instance, ip, vhost_path(vhost))
        planned = plan_vhost(vhost, marker(namespace, name), spec.description, found)
        if planned.refusal:
            return Outcome(False, "Refused", planned.refusal, depends_on=depends)
        await self.send(client, namespace, spec.instance, ip, planned)
        return Outcome(
            True,
            "Reconciled",
            f"vhost {vhost} in RabbitMQ {spec.instance}",
            fields={"vhost": vhost},
            depends_on=depends,
            events=tuple(planned.events),
        )

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: RabbitMQVhostSpec) -> Outcome:
        vhost = spec.name or body["metadata"]["name"]
        if spec.deletion_policy == DeletionPolicy.RETAIN:
            return Outcome(True, "Retained", f"vhost {vhost} is kept with its queues (deletionPolicy Retain)")
        return await self.delete(
            client, body, spec.instance, f"vhost {vhost} with its queues", vhost_path(vhost)
        )

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns[0:0] = [
            {"name": "Instance", "type": "string", "jsonPath": ".spec.instance"},
            {"name": "Vhost", "type": "string", "jsonPath": ".status.vhost"},
        ]
        return columns


class RabbitMQPermissionKind(AccessKind):
    kind = "RabbitMQPermission"
    plural = "rabbitmqpermissions"
    short_names = ("rmqperm",)
    spec_model = RabbitMQPermissionSpec

    async def reconcile(
        self, client: AsyncClient, body: dict[str, Any], spec: RabbitMQPermissionSpec
    ) -> Outcome:
        namespace = body["metadata"]["namespace"]
        ip, waiting = await self.address(client, namespace, spec.instance)
        if waiting:
            return waiting
        assert ip is not None
        depends = frozenset({Ref("RabbitMQ", spec.instance)})
        read = self.management.read
        found_objects = {}
        for what, path in (("user", user_path(spec.user)), ("vhost", vhost_path(spec.vhost))):
            found_objects[what] = await read(client, namespace, spec.instance, ip, path)
            if found_objects[what] is None:
                value = spec.user if what == "user" else spec.vhost
                return Outcome(
                    False,
                    "NotFound",
                    f"spec.{what}: no {what} {value} in RabbitMQ {spec.instance} yet",
                    depends_on=depends,
                    retry_in=10,
                )
        refusal = own_vhost_clash(spec.user, spec.vhost, found_objects["user"], found_objects["vhost"])
        if refusal:
            return Outcome(False, "Refused", refusal, depends_on=depends)
        wanted = Permissions(spec.configure, spec.write, spec.read)
        found = Permissions.found(
            await read(client, namespace, spec.instance, ip, permission_path(spec.vhost, spec.user))
        )
        await self.send(
            client, namespace, spec.instance, ip, plan_permission(spec.vhost, spec.user, wanted, found)
        )
        return Outcome(
            True,
            "Reconciled",
            f"{spec.user} on vhost {spec.vhost}: configure {spec.configure!r}, write {spec.write!r}, "
            f"read {spec.read!r}",
            depends_on=depends,
        )

    async def finalize(
        self, client: AsyncClient, body: dict[str, Any], spec: RabbitMQPermissionSpec
    ) -> Outcome:
        what = f"the permission of {spec.user} on vhost {spec.vhost}"
        return await self.delete(
            client, body, spec.instance, what, permission_path(spec.vhost, spec.user), False
        )

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns[0:0] = [
            {"name": "Instance", "type": "string", "jsonPath": ".spec.instance"},
            {"name": "User", "type": "string", "jsonPath": ".spec.user"},
            {"name": "Vhost", "type": "string", "jsonPath": ".spec.vhost"},
        ]
        return columns
