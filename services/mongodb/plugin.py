"""MongoDB: a replica set the operator initiates and reconfigures from its members' replies.

Two servers can serve it, as the version catalog's `flavor` says: `mongod` (MongoDB itself: a
replica set of `spec.members`) and `ferretdb` (FerretDB, which speaks MongoDB's protocol over
SQLite and has no replication: one member only). The replica set logic is pure
(`services/mongodb/replicaset.py`); this module asks the servers and carries out its steps.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import quote

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Secret
from pymongo.errors import AutoReconnect, PyMongoError

from framework.catalog import ResolvedVersion
from framework.certificates import service_hosts
from framework.kube.api import EventNote
from framework.kube.meta import content_hash
from framework.kube.pods import pod_ip
from framework.kube.secrets import NEXT_PASSWORD, PASSWORD, decoded
from framework.plugin import (
    CHANGE_REFUSED,
    TLS_SERVER,
    Backups,
    Bindings,
    GeneratedSecret,
    Inspection,
    Observed,
    Operations,
    Refusal,
    Rotation,
    ServicePlan,
    ServicePlugin,
    ServiceStatus,
    Tls,
    UnknownAction,
    decided,
    refused_spec,
)
from framework.servers import Answers, ask_servers, ready_of, ready_pods
from framework.volumes import claim_context, refuse_storage_change
from services.mongodb.replicaset import (
    Hello,
    Initiate,
    MemberState,
    Reconfigure,
    SetConfig,
    SetView,
    StepDown,
    member_host,
    parse_config,
    parse_status,
    plan_replica_set,
)
from services.mongodb.servers import (
    CHANGE_TIMEOUT_MS,
    FERRETDB,
    FERRETDB_TLS_PORT,
    MONGOD,
    Servers,
    tls_address,
)
from services.mongodb.spec import MongoDBSpec, MongoDBStatus
from services.mongodb.users import MongoDBUserKind

ROOT = GeneratedSecret("root", fixed={"username": "root"}, random=("password",))
KEYFILE = GeneratedSecret("keyfile", random=("keyfile",), length=64)  # members authenticate each other
SERVERS = Servers(ROOT.name("{name}"), f"{{name}}-{TLS_SERVER}")
INSPECT_FORMING, INSPECT_FORMED = 3.0, 15.0
ROLE_LABEL = "statefleet.dev/role"


@dataclass(frozen=True)
class SetFacts:
    """An inspection's findings (`Inspection.facts`)."""

    members: Answers[Hello]
    config: SetConfig | None  # from the primary
    states: tuple[MemberState, ...] | None


def flavor_of(version: ResolvedVersion) -> str:
    return version.flavor or MONGOD


def last_facts(observed: Observed) -> SetFacts | None:
    return observed.inspection.facts if observed.inspection else None


def replica_set(spec: MongoDBSpec, observed: Observed) -> SetView:
    facts = last_facts(observed)
    return plan_replica_set(
        name=observed.name,
        namespace=observed.namespace,
        wanted=spec.members,
        answers=facts.members.current(observed) if facts else {},
        config=facts.config if facts else None,
        states=facts.states if facts else None,
        priorities=spec.priority_by_pod(observed.name),
        initiated_before=bool(observed.status.get("initialized")),
    )


def standalone_answer(observed: Observed) -> Hello | None:
    """A FerretDB server's `hello` (it runs alone)."""
    facts = last_facts(observed)
    return (facts.members.current(observed) if facts else {}).get(f"{observed.name}-0")


def pod_address(observed: Observed, pod: str) -> str | None:
    """The TLS listener of `pod`'s server (None: the pod has no IP)."""
    ip = next((pod_ip(p) for p in observed.pods if p["metadata"]["name"] == pod), None)
    return tls_address(ip, observed.status.get("flavor")) if ip else None


@dataclass(frozen=True)
class SetRootPassword:
    """The root user's password the Secret stages (`framework.credentials`: its `next-password`,
    else its `password`) set on the primary `pod` (`updateUser`, acknowledged by a majority: a
    member elected later has it), then checked to log in there. FerretDB takes `updateUser` too
    (its users in admin.system.users; FERRETDB_SETUP_PASSWORD only counts while the admin
    database does not exist yet)."""

    pod: str


class MongoDBRotation(Rotation):
    """The root user's password (`spec.rotateCredentials`). The pods' MONGO_INITDB_ROOT_PASSWORD
    and FERRETDB_SETUP_PASSWORD count only when the data is new: no member restarts."""

    secrets = (ROOT,)

    def primary(self, observed: Observed) -> str | None:
        if observed.status.get("flavor") == FERRETDB:
            return f"{observed.name}-0" if standalone_answer(observed) else None
        return (observed.status.get("replicaSet") or {}).get("primary")

    def waiting(self, observed: Observed) -> str | None:
        primary = self.primary(observed)
        if primary is None:
            return "no primary answers"
        if primary not in ready_pods(observed):
            return f"the primary {primary} is not ready"
        return None

    def apply(self, observed: Observed) -> SetRootPassword:
        return SetRootPassword(self.primary(observed) or f"{observed.name}-0")  # not waiting: known


class MongoDBTls(Tls):
    def hosts(self, name: str, namespace: str) -> list[str]:
        return service_hosts([name], namespace, pods_of=f"{name}-nodes")


class MongoDBBindings(Bindings):
    user_kind = "MongoDBUser"

    def user_spec(self, binding: str, instance: str) -> dict[str, Any]:
        # Each application its own user, owning a database named after the binding.
        return {"instance": instance, "database": binding}

    def secret_data(
        self, service: dict[str, Any], user: dict[str, Any], credentials: dict[str, str], ca: str | None
    ) -> dict[str, str]:
        meta, status = service["metadata"], user["status"]
        username, database, password = status["username"], status["database"], credentials["password"]
        # TLS always (the plaintext listener may be off): clients verify the server with the
        # CA, which `ca.crt` holds. `hosts`: the TLS listeners, as the instance's status gives them.
        hosts = status.get("hosts") or [f"{meta['name']}.{meta['namespace']}.svc:{FERRETDB_TLS_PORT}"]
        host, port = hosts[0].rsplit(":", 1)
        options = f"authSource={quote(database, safe='')}&tls=true"
        if status.get("replicaSet"):
            options += f"&replicaSet={quote(status['replicaSet'], safe='')}"
        return {
            "type": "mongodb",
            "provider": "statefleet",
            "host": host,
            "port": port,
            "tls": "true",
            **({"ca.crt": ca} if ca else {}),
            "username": username,
            "password": password,
            "database": database,
            "uri": f"mongodb://{quote(username, safe='')}:{quote(password, safe='')}@{','.join(hosts)}/"
            f"{quote(database, safe='')}?{options}",
        }


class MongoDBBackups(Backups):
    driver = "services.mongodb.backup_driver"
    methods = ("dump",)
    throwaway_spec: ClassVar[dict[str, Any]] = {"members": 1}

    def job_env(self, name: str) -> list[dict[str, Any]]:
        # The client Service's TLS port, whichever server is behind it (templates/mongodb).
        return [
            {"name": "MONGODB_HOST", "value": name},
            {"name": "MONGODB_PORT", "value": str(FERRETDB_TLS_PORT)},
            {
                "name": "MONGODB_CA",
                "valueFrom": {"secretKeyRef": {"name": f"{name}-{TLS_SERVER}", "key": "ca.crt"}},
            },
            ROOT.env("MONGODB_USERNAME", name, "username"),
            ROOT.env("MONGODB_PASSWORD", name, "password"),
        ]


class MongoDBPlugin(ServicePlugin):
    kind = "MongoDB"
    plural = "mongodbs"
    short_names = ("mdb",)
    service = "mongodb"
    spec_model = MongoDBSpec
    generated_secrets = (ROOT, KEYFILE)
    child_kinds = ("Service", "PodDisruptionBudget", "StatefulsetRollout")
    actions = (Initiate, Reconfigure, StepDown, SetRootPassword)
    status_model = MongoDBStatus
    bindings = MongoDBBindings()
    backups = MongoDBBackups()
    tls = MongoDBTls()
    rotation = MongoDBRotation()

    def plan(
        self, spec: MongoDBSpec, version: ResolvedVersion, observed: Observed, now: float
    ) -> ServicePlan:
        unservable = self.refuse_version(spec, version, observed)
        if unservable:
            return refused_spec(unservable)
        # The flavor the status last recorded decides how the servers are operated; the
        # catalog's version, how they are rendered and read (a change of flavor was refused
        # above, so a replica set's view exists whenever the version is mongod's).
        recorded = observed.status.get("flavor")
        view = None if recorded == FERRETDB else replica_set(spec, observed)
        operations = self.operations(observed, view)
        refusal = refuse_storage_change(spec.storage, observed) or self.refuse_tls_change(
            spec, version, observed
        )
        if refusal:
            return ServicePlan(None, operations, refusal=Refusal(CHANGE_REFUSED, refusal))
        # initialized, which `operations` may set, is read only to decide whether to initiate:
        # the view of the status as read is the view of the status as decided.
        return ServicePlan(
            self.reading(spec, version, decided(observed, operations), view),
            operations,
            self.template_context(spec, version, observed, view),
        )

    def refuse_tls_change(
        self, spec: MongoDBSpec, version: ResolvedVersion, observed: Observed
    ) -> str | None:
        """A mongod replica set keeps the TLS mode it was made with: members rolled one at a time
        onto requireTLS could not reach those still taking plaintext, nor those onto them."""
        if flavor_of(version) != MONGOD or not observed.status.get("initialized"):
            return None
        made_with = bool(observed.status.get("tlsRequired"))  # a set made before: no TLS at all
        if spec.tls.required == made_with:
            return None
        return (
            f"spec.tls.required: this mongod replica set was made with it {str(made_with).lower()}; "
            "changing it would roll members that cannot reach each other: set it back, or back up "
            "and restore into a new instance made with it"
        )

    def refuse_version(self, spec: MongoDBSpec, version: ResolvedVersion, observed: Observed) -> str | None:
        flavor, before = flavor_of(version), observed.status.get("flavor")
        if before and flavor != before:
            return (
                f"spec.version: {version.version} is served by {flavor}, and this instance's data is "
                f"{before}'s: the server cannot change under it; back it up, restore it into a new instance"
            )
        if flavor == FERRETDB and spec.members > 1:
            return (
                f"spec.members: version {version.version} is served here by FerretDB, which has no "
                "replication: it runs 1 member"
            )
        return None

    def in_service_kinds(self) -> list[Any]:
        return [MongoDBUserKind(SERVERS, self.resource())]

    def template_context(
        self, spec: MongoDBSpec, version: ResolvedVersion, observed: Observed, view: SetView | None
    ) -> dict[str, Any]:
        flavor = flavor_of(version)
        replicas = spec.members
        if flavor == MONGOD and view is not None:
            # A member leaves the set before its pod goes; without a config fresh from a
            # primary (an election, a restart), no pod goes at all.
            running = ((observed.statefulset or {}).get("spec") or {}).get("replicas") or 0
            replicas = max(replicas, view.keep_replicas if view.primary else running)
        return {
            "flavor": flavor,
            "replicas": replicas,
            "root_secret": ROOT.name(observed.name),
            "keyfile_secret": KEYFILE.name(observed.name),
            "settings_hash": content_hash(f"{flavor}/{version.version}"),
            **claim_context(spec.storage, observed),
        }

    def operations(self, observed: Observed, view: SetView | None) -> Operations:
        if view is None:  # FerretDB: one server, no replica set
            answer = standalone_answer(observed)
            return Operations(
                status={
                    "initialized": observed.status.get("initialized") or answer is not None,
                    "replicaSet": None,
                },
                pod_labels={f"{observed.name}-0": {ROLE_LABEL: "primary"}} if answer else {},
                inspect_in=INSPECT_FORMED if answer else INSPECT_FORMING,
            )
        before = observed.status.get("replicaSet") or {}
        events = []
        if view.primary and before.get("primary") and view.primary != before.get("primary"):
            events.append(
                EventNote("Normal", "PrimaryChanged", f"{view.primary} is primary (was {before['primary']})")
            )
        roles = {
            pod["metadata"]["name"]: {
                ROLE_LABEL: "primary" if pod["metadata"]["name"] == view.primary else "secondary"
            }
            for pod in observed.pods
        }
        return Operations(
            pod_labels=roles if view.primary else {},
            actions=list(view.actions),
            status={
                "initialized": observed.status.get("initialized") or view.initiated or None,
                "replicaSet": {
                    "name": observed.name,
                    "primary": view.primary,
                    "members": list(view.members),
                    "healthy": view.healthy,
                    "syncing": list(view.syncing),
                    "message": view.message,
                },
            },
            events=events,
            inspect_in=INSPECT_FORMING
            if view.actions or not view.primary or view.syncing
            else INSPECT_FORMED,
        )

    async def inspect(
        self, client: AsyncClient, observed: Observed, previous: Inspection | None
    ) -> Inspection | None:
        flavor = observed.status.get("flavor")
        members = await ask_servers(
            observed,
            lambda _, ip: SERVERS.hello(client, observed.namespace, observed.name, tls_address(ip, flavor)),
        )
        config, states = None, None
        primaries = [
            pod
            for pod in observed.pods
            if (hello := members.by_pod.get(pod["metadata"]["name"]))
            and hello.writable_primary
            and hello.set_name
        ]
        if len(primaries) == 1:
            ip = pod_ip(primaries[0])
            assert ip is not None
            address = tls_address(ip, flavor)
            try:
                config = parse_config(
                    await SERVERS.command(
                        client, observed.namespace, observed.name, address, {"replSetGetConfig": 1}
                    )
                )
                states = parse_status(
                    await SERVERS.command(
                        client, observed.namespace, observed.name, address, {"replSetGetStatus": 1}
                    )
                )
            except PyMongoError:
                config, states = None, None
        return Inspection(
            at=asyncio.get_running_loop().time(),
            facts=SetFacts(members, config, states),
            answered=members.answered,
        )

    async def perform(self, client: AsyncClient, observed: Observed, action: Any) -> None:
        if isinstance(action, SetRootPassword):
            await self.set_root_password(client, observed, action)
            return
        if isinstance(action, Initiate):
            command: dict[str, Any] = {"replSetInitiate": action.config}
        elif isinstance(action, Reconfigure):
            command = {"replSetReconfig": action.config}
        elif isinstance(action, StepDown):
            command = {"replSetStepDown": 60, "secondaryCatchUpPeriodSecs": 15}
        else:
            raise UnknownAction(self, action)
        address = pod_address(observed, action.pod)
        if address is None:
            raise RuntimeError(f"{action}: {action.pod} has no IP")
        with suppress(AutoReconnect):  # a primary stepping down closes its connections
            await SERVERS.command(
                client, observed.namespace, observed.name, address, command, CHANGE_TIMEOUT_MS
            )

    async def set_root_password(
        self, client: AsyncClient, observed: Observed, action: SetRootPassword
    ) -> None:
        data = decoded(
            (await client.get(Secret, ROOT.name(observed.name), namespace=observed.namespace)).to_dict()
        )
        username, password = data["username"], data.get(NEXT_PASSWORD) or data[PASSWORD]
        address = pod_address(observed, action.pod)
        if address is None:
            raise RuntimeError(f"cannot set the root user's new password: {action.pod} has no IP")
        command = {"updateUser": username, "pwd": password, "writeConcern": {"w": "majority"}}
        await SERVERS.command(client, observed.namespace, observed.name, address, command, CHANGE_TIMEOUT_MS)
        if not await SERVERS.logs_in(
            client, observed.namespace, observed.name, address, username, password, "admin"
        ):
            raise RuntimeError(f"the root user's new password does not log in on {action.pod}")

    def reading(
        self, spec: MongoDBSpec, version: ResolvedVersion, observed: Observed, view: SetView | None
    ) -> ServiceStatus:
        flavor = flavor_of(version)
        ready = ready_of(observed, spec.members)
        wanted = {f"{observed.name}-{i}" for i in range(spec.members)}
        service = f"{observed.name}.{observed.namespace}.svc"
        hosts = [
            member_host(f"{observed.name}-{i}", observed.name, observed.namespace)
            for i in range(spec.members)
        ]
        fields: dict[str, Any] = {
            "flavor": flavor,
            "rootSecret": ROOT.name(observed.name),
            "tlsRequired": spec.tls.required,  # not refused: what the servers are made with now
        }
        if flavor == FERRETDB:
            answer = standalone_answer(observed)
            serving = answer is not None and ready == 1
            message = "FerretDB answers" if answer else "waiting for FerretDB to answer"
            tls_host = f"{service}:{FERRETDB_TLS_PORT}"
            fields["endpoints"] = {
                "tlsUri": f"mongodb://{tls_host}/?tls=true",
                **({} if spec.tls.required else {"uri": f"mongodb://{service}:27017/"}),
            }
            fields["hosts"] = [tls_host]
            return ServiceStatus(ready, spec.members, serving, message, fields=fields)
        assert view is not None  # a replica set's
        serving = view.primary is not None and view.healthy > len(view.members) // 2
        complete = view.primary is not None and view.healthy == spec.members and set(view.members) == wanted
        members = f"mongodb://{','.join(hosts)}/?replicaSet={observed.name}"
        fields["endpoints"] = {
            "tlsUri": f"{members}&tls=true",
            **({} if spec.tls.required else {"uri": members}),
        }
        fields["hosts"] = hosts
        return ServiceStatus(
            ready_instances=ready,
            instances=spec.members,
            ready=serving,
            degraded=serving and not complete,
            message=view.message,
            fields=fields,
        )

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns.insert(3, {"name": "Primary", "type": "string", "jsonPath": ".status.replicaSet.primary"})
        return columns
