"""`PostgresUser`: a role in a Postgres instance, optionally with a database of its own, its
password in a Secret.

Every pass reads what the server has and plans (pure, `plan_role`) what differs (and a
harmless `GRANT CONNECT`), so a pass repeated creates nothing twice. Each role the operator
creates carries a comment naming its resource (`statefleet:<namespace>/<name>`): a role
someone else made is never taken over or dropped, and memberships that would hand out a
superuser's powers or another user's role are refused. A password Secret changed by hand
is applied within a minute (every user is looked at again that often; Secrets are not
watched, which would mean reading every Secret of the cluster).

Deleting the resource drops the role after `REASSIGN OWNED` (what it owned, its database
included, goes to `postgres`: no data is lost) and `DROP OWNED` in every database, unless
`deletionPolicy: Retain` keeps it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from psycopg import AsyncConnection, sql
from pydantic import ConfigDict, Field

from framework.kube.api import EventNote, get_or_none
from framework.kube.model import ApiModel, immutable
from framework.object_controller import (
    CredentialsStatus,
    ObjectKind,
    Outcome,
    Ref,
    password_secret_field,
    user_password,
)
from framework.spec import DeletionPolicy
from services.postgres import backup_replace
from services.postgres.instances import Servers

ROLE_PATTERN = re.compile(r"^[a-z_][a-z0-9_-]{0,62}$")
RESERVED_ROLES = frozenset({"postgres", "streaming_replica", "public", "current_user", "session_user"})
# Memberships that would hand out the superuser's powers: the superuser itself, replication,
# and the predefined roles that read or write the server's files or run its programs (the
# superuser's password is in the server's environment).
FORBIDDEN_MEMBERSHIPS = frozenset(
    {
        "postgres",
        "streaming_replica",
        "pg_execute_server_program",
        "pg_read_server_files",
        "pg_write_server_files",
    }
)
STATEMENT_TIMEOUT = 60.0  # seconds: CREATE DATABASE copies a template


class PostgresUserSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.role) || (!self.role.startsWith('pg_') && "
                    "!(self.role in ['postgres', 'streaming_replica', 'public']))",
                    "message": "role: postgres, streaming_replica, public and pg_* are the server's own",
                },
                {
                    "rule": "has(self.role) == has(oldSelf.role) && "
                    "(!has(self.role) || self.role == oldSelf.role)",
                    "message": "role is immutable",
                },
                {
                    "rule": "!has(self.memberOf) || self.memberOf.all(r, !(r in "
                    + str(sorted(FORBIDDEN_MEMBERSHIPS)).replace("'", '"')
                    + "))",
                    "message": "memberOf may not grant the superuser's powers: "
                    + ", ".join(sorted(FORBIDDEN_MEMBERSHIPS)),
                },
            ]
        },
    )
    instance: str = Field(
        min_length=1,
        description="The Postgres, in the same namespace.",
        json_schema_extra=immutable("instance"),
    )
    role: str | None = Field(
        default=None,
        pattern=ROLE_PATTERN.pattern,
        description="The role's name; the resource's name when empty. Immutable.",
    )
    database: str | None = Field(
        default=None,
        max_length=63,
        description="The database the user works in (its own with ownDatabase, named after the role "
        "when empty); postgres when empty otherwise.",
    )
    own_database: bool = Field(default=False, description="Create the database, owned by the role.")
    member_of: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Roles to grant, e.g. pg_read_all_data, pg_write_all_data, pg_monitor.",
    )
    connection_limit: int = Field(default=-1, ge=-1, description="-1: no limit.")
    password_secret: str | None = password_secret_field("role")
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.DELETE,
        description="Delete drops the role (what it owned goes to postgres); Retain keeps it.",
    )


def role_name(name: str, spec: PostgresUserSpec) -> str:
    """The role's name, or ValueError naming the field that gives it."""
    role = spec.role or name
    where = "spec.role" if spec.role else "metadata.name (the role's name when spec.role is empty)"
    if not ROLE_PATTERN.match(role):
        raise ValueError(f"{where}: {role!r} is not a role name (lower case letters, digits, _ and -)")
    if role in RESERVED_ROLES or role.startswith("pg_"):
        raise ValueError(f"{where}: {role!r} is the server's own role")
    return role


def database_name(role: str, spec: PostgresUserSpec) -> str:
    return spec.database or (role if spec.own_database else "postgres")


def marker(namespace: str, name: str) -> str:
    return f"statefleet:{namespace}/{name}"


@dataclass(frozen=True)
class RoleFound:
    login: bool
    connection_limit: int
    comment: str | None
    member_of: frozenset[str]


@dataclass(frozen=True)
class DatabaseFound:
    owner: str
    comment: str | None


@dataclass(frozen=True)
class Wanted:
    role: str
    marker: str
    database: str
    own_database: bool
    member_of: frozenset[str]
    connection_limit: int
    password: str
    password_changed: bool
    granted_before: frozenset[str] = frozenset()  # memberships this resource granted earlier


@dataclass
class RolePlan:
    statements: list[sql.Composable] = field(default_factory=list)  # in one transaction
    database_statements: list[sql.Composable] = field(default_factory=list)  # each on its own
    refusal: str | None = None
    events: list[EventNote] = field(default_factory=list)


@dataclass(frozen=True)
class Grantable:
    """A role someone asks to be a member of."""

    privileged: bool  # superuser, replication, createrole or bypassrls
    comment: str | None  # another PostgresUser's mark, if it is one


def plan_role(
    wanted: Wanted,
    role: RoleFound | None,
    database: DatabaseFound | None,
    grantable: dict[str, Grantable],
) -> RolePlan:
    """The statements that make the server agree with `wanted`, or why it must not be done.
    `grantable`: the wanted memberships that exist as roles."""
    plan = RolePlan()
    ident = sql.Identifier(wanted.role)
    if role is not None and role.comment != wanted.marker:
        plan.refusal = (
            f"the role {wanted.role} exists and was not created for this resource "
            f"(its comment is {role.comment!r}): choose another spec.role, or drop it"
        )
        return plan
    missing = sorted(wanted.member_of - set(grantable))
    if missing:
        plan.refusal = f"spec.memberOf: no role {', '.join(missing)} in this instance"
        return plan
    unsafe = sorted(
        name
        for name, found in grantable.items()
        if name in FORBIDDEN_MEMBERSHIPS
        or found.privileged
        or (found.comment or "").startswith("statefleet:")  # another resource's role
    )
    if unsafe:
        plan.refusal = (
            f"spec.memberOf: {', '.join(unsafe)} would give this role powers or data that are "
            "not its own (a superuser, replication, server files, another user's role)"
        )
        return plan
    if database is None and not wanted.own_database:
        plan.refusal = f"spec.database: no database {wanted.database} in this instance"
        return plan
    if (
        database is not None
        and wanted.own_database
        and database.owner != wanted.role
        and database.comment != wanted.marker
    ):
        plan.refusal = (
            f"spec.database: the database {wanted.database} exists, owned by {database.owner}; "
            "ownDatabase takes only a database it created"
        )
        return plan
    password = sql.Literal(wanted.password)
    options = sql.SQL("LOGIN CONNECTION LIMIT {}").format(sql.Literal(wanted.connection_limit))
    if role is None:
        plan.statements += [
            sql.SQL("CREATE ROLE {} WITH {} PASSWORD {}").format(
                ident, options, sql.Literal(wanted.password)
            ),
            sql.SQL("COMMENT ON ROLE {} IS {}").format(ident, sql.Literal(wanted.marker)),
        ]
        plan.events.append(EventNote("Normal", "RoleCreated", f"role {wanted.role} created"))
    else:
        if not role.login or role.connection_limit != wanted.connection_limit:
            plan.statements.append(sql.SQL("ALTER ROLE {} WITH {}").format(ident, options))
        if wanted.password_changed:
            plan.statements.append(sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(ident, password))
            plan.events.append(
                EventNote("Normal", "PasswordChanged", f"the password of {wanted.role} was set")
            )
    current = role.member_of if role else frozenset()
    for grant in sorted(wanted.member_of - current):
        plan.statements.append(sql.SQL("GRANT {} TO {}").format(sql.Identifier(grant), ident))
    for revoke in sorted((wanted.granted_before & current) - wanted.member_of):
        plan.statements.append(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(revoke), ident))
    db = sql.Identifier(wanted.database)
    if wanted.own_database and database is None:
        plan.database_statements += [  # CREATE DATABASE cannot run inside a transaction
            sql.SQL("CREATE DATABASE {} OWNER {}").format(db, ident),
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(db, sql.Literal(wanted.marker)),
        ]
        plan.events.append(EventNote("Normal", "DatabaseCreated", f"database {wanted.database} created"))
    elif wanted.own_database and database is not None and database.owner != wanted.role:
        plan.statements.append(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(db, ident))
    elif not wanted.own_database:
        plan.statements.append(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(db, ident))
    return plan


async def read_role(connection: AsyncConnection[Any], role: str) -> RoleFound | None:
    row = await (
        await connection.execute(
            """select r.rolcanlogin, r.rolconnlimit, shobj_description(r.oid, 'pg_authid'),
                      array(select g.rolname from pg_auth_members m join pg_roles g on g.oid = m.roleid
                            where m.member = r.oid)
               from pg_roles r where r.rolname = %s""",
            (role,),
        )
    ).fetchone()
    return RoleFound(row[0], row[1], row[2], frozenset(row[3])) if row else None


async def read_database(connection: AsyncConnection[Any], database: str) -> DatabaseFound | None:
    row = await (
        await connection.execute(
            """select pg_get_userbyid(d.datdba), shobj_description(d.oid, 'pg_database')
               from pg_database d where d.datname = %s""",
            (database,),
        )
    ).fetchone()
    return DatabaseFound(row[0], row[1]) if row else None


async def primary_address(client: AsyncClient, instance: dict[str, Any]) -> str | None:
    """The primary's pod IP, when a primary is settled and its pod ready."""
    status = instance.get("status") or {}
    primary = status.get("currentPrimary")
    if not primary or status.get("targetPrimary"):
        return None
    pod = await get_or_none(client, Pod, primary, instance["metadata"]["namespace"])
    if pod is None or (pod.get("metadata") or {}).get("labels", {}).get("statefleet.dev/role") != "primary":
        return None
    return (pod.get("status") or {}).get("podIP")


class PostgresUserStatus(CredentialsStatus):
    role: str | None = None
    database: str | None = None
    member_of: list[str] | None = None


class PostgresUserKind(ObjectKind):
    kind = "PostgresUser"
    plural = "postgresusers"
    short_names = ("pguser",)
    spec_model = PostgresUserSpec
    status_model = PostgresUserStatus

    def __init__(self, servers: Servers, instances: Any) -> None:
        self.servers = servers  # the instances' superusers
        self.instances = instances  # the Postgres resource class

    async def _instance(
        self, client: AsyncClient, namespace: str, spec: PostgresUserSpec
    ) -> tuple[dict[str, Any] | None, str | None]:
        instance = await get_or_none(client, self.instances, spec.instance, namespace)
        return instance, (await primary_address(client, instance) if instance else None)

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: PostgresUserSpec) -> Outcome:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        status = body.get("status") or {}
        try:
            role = role_name(name, spec)
        except ValueError as error:
            return Outcome(False, "InvalidSpec", str(error))
        database = database_name(role, spec)
        depends = frozenset({Ref("Postgres", spec.instance)})
        instance, address = await self._instance(client, namespace, spec)
        if instance is None:
            return Outcome(
                False,
                "InstanceNotFound",
                f"spec.instance: Postgres {spec.instance} does not exist in namespace {namespace}",
                depends_on=depends,
            )
        if address is None:
            return Outcome(
                False,
                "InstanceNotReady",
                f"Postgres {spec.instance} has no ready primary yet",
                depends_on=depends,
                retry_in=5,
            )
        found = await user_password(client, self.kind, body, spec.password_secret, role, depends)
        if isinstance(found, Outcome):
            return found
        secret_name, password, version = found.secret, found.password, found.version
        wanted = Wanted(
            role=role,
            marker=marker(namespace, name),
            database=database,
            own_database=spec.own_database,
            member_of=frozenset(spec.member_of),
            connection_limit=spec.connection_limit,
            password=password,
            password_changed=status.get("passwordVersion") != version,
            granted_before=frozenset(status.get("memberOf") or []),
        )
        async with await self.servers.connect(
            client, namespace, spec.instance, address, statement_timeout=STATEMENT_TIMEOUT
        ) as connection:
            found = await read_role(connection, role)
            database_found = await read_database(connection, database)
            existing = await (
                await connection.execute(
                    """select rolname, rolsuper or rolreplication or rolcreaterole or rolbypassrls,
                              shobj_description(oid, 'pg_authid')
                       from pg_roles where rolname = any(%s)""",
                    (list(wanted.member_of),),
                )
            ).fetchall()
            grantable = {name: Grantable(bool(privileged), comment) for name, privileged, comment in existing}
            # The server keeps (and logs, on an error) a SCRAM verifier, never the password.
            verifier = connection.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256")
            wanted = replace(wanted, password=verifier.decode())
            planned = plan_role(wanted, found, database_found, grantable)
            if planned.refusal:
                return Outcome(False, "Refused", planned.refusal, depends_on=depends)
            if planned.database_statements:
                # A replacing restore may have this database aside: making another would make
                # the restore fail (and roll back). It is made, if still missing, once it ends.
                row = await (await connection.execute(backup_replace.STATE_QUERY)).fetchone()
                restore = backup_replace.parse_state(row[0] if row else None)
                if backup_replace.under_way(restore):
                    assert restore is not None
                    return Outcome(
                        False,
                        "RestoreInProgress",
                        f"a restore ({restore.token}) is replacing the databases of Postgres "
                        f"{spec.instance}: database {database} is made, if still missing, once it ends",
                        depends_on=depends,
                        retry_in=15,
                    )
            async with connection.transaction():  # a role is made with its mark, or not at all
                for statement in planned.statements:
                    await connection.execute(statement)
            for statement in planned.database_statements:
                await connection.execute(statement)
        where = f" with its own database {database}" if spec.own_database else f", database {database}"
        return Outcome(
            True,
            "Reconciled",
            f"role {role} in Postgres {spec.instance}{where}; password from Secret {secret_name}",
            fields={
                "role": role,
                "database": database,
                "secret": secret_name,
                "passwordVersion": version,
                "memberOf": sorted(wanted.member_of),
            },
            depends_on=depends,
            events=tuple(planned.events),
        )

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: PostgresUserSpec) -> Outcome:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if spec.deletion_policy == DeletionPolicy.RETAIN:
            return Outcome(True, "Retained", "the role is kept (deletionPolicy Retain)")
        try:
            # From the spec, not the status: a role made by a pass that failed later has no status.
            role = role_name(name, spec)
        except ValueError:
            return Outcome(True, "Dropped", "no role was ever made (its name is invalid)")
        instance, address = await self._instance(client, namespace, spec)
        if instance is None:
            return Outcome(True, "InstanceGone", f"Postgres {spec.instance} is gone, and its role {role}")
        if address is None:
            return Outcome(
                False,
                "DeletionBlocked",
                f"waiting for a ready primary of Postgres {spec.instance} to drop the role {role}",
                depends_on=frozenset({Ref("Postgres", spec.instance)}),
                retry_in=5,
            )
        ident = sql.Identifier(role)
        async with await self.servers.connect(
            client, namespace, spec.instance, address, statement_timeout=STATEMENT_TIMEOUT
        ) as connection:
            found = await read_role(connection, role)
            if found is None or found.comment != marker(namespace, name):
                return Outcome(True, "Dropped", f"role {role} is not there, or not this resource's")
            databases = await (
                await connection.execute("select datname from pg_database where datallowconn order by 1")
            ).fetchall()
        for (database,) in databases:
            async with await self.servers.connect(
                client,
                namespace,
                spec.instance,
                address,
                dbname=database,
                statement_timeout=STATEMENT_TIMEOUT,
            ) as connection:
                await connection.execute(sql.SQL("REASSIGN OWNED BY {} TO postgres").format(ident))
                await connection.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        async with await self.servers.connect(
            client, namespace, spec.instance, address, statement_timeout=STATEMENT_TIMEOUT
        ) as connection:
            await connection.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))
        return Outcome(True, "Dropped", f"role {role} dropped from Postgres {spec.instance}")

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns[0:0] = [
            {"name": "Instance", "type": "string", "jsonPath": ".spec.instance"},
            {"name": "Role", "type": "string", "jsonPath": ".status.role"},
            {"name": "Database", "type": "string", "jsonPath": ".status.database"},
        ]
        return columns
