"""`MongoDBUser`: a user of one `MongoDB`, defined in its own database (its authSource), made
on the primary as root and planned by `services/mongodb/access.py` (pure): a pass repeated
makes nothing twice, a password Secret edited by hand is applied within a minute. Deleting the
resource drops the user (`deletionPolicy: Retain` keeps it); data is never dropped.

On FerretDB a user has no roles (FerretDB refuses them, and enforces none: any user may read
and write every database); the status says so.
"""

from __future__ import annotations

from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from pydantic import ConfigDict, Field
from pymongo.errors import OperationFailure, PyMongoError

from framework.kube import conditions
from framework.kube.api import get_or_none
from framework.kube.model import ApiModel, immutable, optional_immutable
from framework.object_controller import (
    CredentialsStatus,
    ObjectKind,
    Outcome,
    Ref,
    password_secret_field,
    user_password,
)
from framework.spec import DeletionPolicy
from services.mongodb.access import WantedUser, marker, ours, plan_user
from services.mongodb.servers import CHANGE_TIMEOUT_MS, FERRETDB, Servers, tls_address

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$"
DATABASE_PATTERN = r"^[A-Za-z0-9_\-]{1,63}$"  # no . / \ " $ or space, as MongoDB wants
RESERVED_DATABASES = ("admin", "local", "config")


class RoleSpec(ApiModel):
    role: str = Field(min_length=1, description="A built-in or custom role, e.g. readWrite, read, dbAdmin.")
    db: str = Field(pattern=DATABASE_PATTERN, description="The database the role applies to.")


class MongoDBUserSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=optional_immutable("username"))
    instance: str = Field(
        min_length=1,
        description="The MongoDB, in the same namespace.",
        json_schema_extra=immutable("instance"),
    )
    username: str | None = Field(
        default=None, pattern=NAME_PATTERN, description="The user's name; the resource's name when empty."
    )
    database: str = Field(
        pattern=DATABASE_PATTERN,
        description="The database the user is defined in (its authSource) and, unless roles say otherwise, "
        "may read and write.",
        json_schema_extra=immutable("database"),
    )
    roles: list[RoleSpec] | None = Field(
        default=None,
        max_length=32,
        description="The user's roles; readWrite on its database when empty. (FerretDB has no roles.)",
    )
    password_secret: str | None = password_secret_field()
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.DELETE, description="Delete drops the user (never its data); Retain keeps it."
    )


class MongoDBUserStatus(CredentialsStatus):
    username: str | None = None
    database: str | None = Field(default=None, description="where the user is defined (its authSource)")
    created: bool | None = Field(default=None, description="this resource made the user")
    roles: list[str] | None = None
    hosts: list[str] | None = None
    replica_set: str | None = None


class MongoDBUserKind(ObjectKind):
    kind = "MongoDBUser"
    plural = "mongodbusers"
    short_names = ("mdbuser",)
    spec_model = MongoDBUserSpec
    status_model = MongoDBUserStatus

    def __init__(self, servers: Servers, instances: Any) -> None:
        self.servers = servers
        self.instances = instances  # the MongoDB resource class

    async def primary(
        self, client: AsyncClient, namespace: str, instance: str
    ) -> tuple[dict[str, Any] | None, str | None, Outcome | None]:
        """The instance, its primary's TLS listener (`tls_address`), or the Outcome that says why
        there is none yet."""
        depends = frozenset({Ref("MongoDB", instance)})
        found = await get_or_none(client, self.instances, instance, namespace)
        if found is None:
            return (
                None,
                None,
                Outcome(
                    False,
                    "InstanceNotFound",
                    f"spec.instance: MongoDB {instance} does not exist in namespace {namespace}",
                    depends_on=depends,
                ),
            )
        status = found.get("status") or {}
        ready = conditions.find(status.get("conditions"), conditions.READY)
        primary = (status.get("replicaSet") or {}).get("primary") or (
            f"{instance}-0" if status.get("flavor") == FERRETDB else None
        )
        pod = await get_or_none(client, Pod, primary, namespace) if primary else None
        ip = ((pod or {}).get("status") or {}).get("podIP")
        if not ready or ready.get("status") != "True" or not ip:
            return (
                found,
                None,
                Outcome(
                    False,
                    "InstanceNotReady",
                    f"MongoDB {instance} is not ready yet",
                    depends_on=depends,
                    retry_in=5,
                ),
            )
        return found, tls_address(ip, status.get("flavor")), None

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: MongoDBUserSpec) -> Outcome:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        status = body.get("status") or {}
        username = spec.username or name
        if spec.database in RESERVED_DATABASES:
            return Outcome(False, "InvalidSpec", f"spec.database: {spec.database} is MongoDB's own")
        depends = frozenset({Ref("MongoDB", spec.instance)})
        instance, address, waiting = await self.primary(client, namespace, spec.instance)
        if waiting:
            return waiting
        assert instance is not None
        assert address is not None
        flavor = (instance.get("status") or {}).get("flavor")
        found_password = await user_password(client, self.kind, body, spec.password_secret, username, depends)
        if isinstance(found_password, Outcome):
            return found_password
        roles = tuple((r.role, r.db) for r in spec.roles) if spec.roles else (("readWrite", spec.database),)
        wanted = WantedUser(
            username=username,
            database=spec.database,
            password=found_password.password,
            password_changed=status.get("passwordVersion") != found_password.version,
            roles=() if flavor == FERRETDB else roles,
            marker=marker(namespace, name),
            custom_data=flavor != FERRETDB,
        )
        try:
            connecting = self.servers.connect(client, namespace, spec.instance, address, CHANGE_TIMEOUT_MS)
            async with connecting as mongo:
                database = mongo[spec.database]
                info = await database.command({"usersInfo": {"user": username, "db": spec.database}})
                found = next(iter(info.get("users") or []), None)
                made_here = bool(status.get("created"))
                if found is not None and not made_here and not wanted.custom_data:
                    # Made by a pass whose status write was lost: the password of our Secret opens it.
                    made_here = await self.servers.logs_in(
                        client, namespace, spec.instance, address, username, wanted.password, spec.database
                    )
                planned = plan_user(wanted, found, made_here=made_here)
                if planned.refusal:
                    return Outcome(False, "Refused", planned.refusal, depends_on=depends)
                for command in planned.commands:
                    await database.command(command)
        except PyMongoError as error:
            return Outcome(
                False, "ServerError", f"MongoDB {spec.instance}: {error}", depends_on=depends, retry_in=10
            )
        instance_status = instance.get("status") or {}
        note = "; FerretDB enforces no roles: the user may use every database" if flavor == FERRETDB else ""
        return Outcome(
            True,
            "Reconciled",
            f"user {username} in database {spec.database} of MongoDB {spec.instance}; password from Secret "
            f"{found_password.secret}{note}",
            fields={
                "username": username,
                "database": spec.database,
                "secret": found_password.secret,
                "passwordVersion": found_password.version,
                "created": True,
                "roles": [f"{role}@{db}" for role, db in wanted.roles],
                "hosts": instance_status.get("hosts"),
                "replicaSet": (instance_status.get("replicaSet") or {}).get("name"),
            },
            depends_on=depends,
            events=tuple(planned.events),
        )

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: MongoDBUserSpec) -> Outcome:
        if spec.deletion_policy == DeletionPolicy.RETAIN:
            return Outcome(True, "Retained", "the user is kept (deletionPolicy Retain)")
        meta = body["metadata"]
        namespace, username = meta["namespace"], spec.username or meta["name"]
        instance, address, waiting = await self.primary(client, namespace, spec.instance)
        if waiting and waiting.reason == "InstanceNotFound":
            return Outcome(
                True, "InstanceGone", f"MongoDB {spec.instance} is gone, and user {username} with it"
            )
        if waiting:
            return Outcome(
                False, "DeletionBlocked", f"to drop user {username}: {waiting.message}", retry_in=5
            )
        assert instance is not None
        assert address is not None
        flavor = (instance.get("status") or {}).get("flavor")
        probe = WantedUser(
            username, spec.database, "", False, (), marker(namespace, meta["name"]), flavor != FERRETDB
        )
        try:
            connecting = self.servers.connect(client, namespace, spec.instance, address, CHANGE_TIMEOUT_MS)
            async with connecting as mongo:
                database = mongo[spec.database]
                info = await database.command({"usersInfo": {"user": username, "db": spec.database}})
                found = next(iter(info.get("users") or []), None)
                made_here = bool((body.get("status") or {}).get("created"))
                if found is None or not ours(found, probe, made_here):
                    return Outcome(True, "Deleted", f"user {username}: not there, or not this resource's")
                await database.command({"dropUser": username})
        except OperationFailure as error:
            if error.code == 11:  # UserNotFound: dropped meanwhile
                return Outcome(True, "Deleted", f"user {username}: already dropped")
            return Outcome(False, "ServerError", f"to drop user {username}: {error}", retry_in=10)
        except PyMongoError as error:
            return Outcome(False, "ServerError", f"to drop user {username}: {error}", retry_in=10)
        return Outcome(True, "Deleted", f"user {username}: dropped from MongoDB {spec.instance}")

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns[0:0] = [
            {"name": "Instance", "type": "string", "jsonPath": ".spec.instance"},
            {"name": "User", "type": "string", "jsonPath": ".status.username"},
            {"name": "Database", "type": "string", "jsonPath": ".status.database"},
        ]
        return columns
