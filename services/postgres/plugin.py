"""PostgreSQL: one primary and streaming replicas, in the official image's layout."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar
from urllib.parse import quote

import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod, Secret

from backup import in_place
from backup.resources import BackupStorageKind
from framework.catalog import ResolvedVersion
from framework.certificates import service_hosts
from framework.kube.api import EventNote
from framework.kube.meta import content_hash
from framework.kube.pods import pod_ip
from framework.kube.secrets import NEXT_PASSWORD, PASSWORD, decoded
from framework.kube.times import format_time
from framework.plugin import (
    CHANGE_REFUSED,
    Backups,
    Bindings,
    GeneratedSecret,
    Inspection,
    Observed,
    Operations,
    Reference,
    Refusal,
    Rotation,
    ServicePlan,
    ServicePlugin,
    ServiceStatus,
    Tls,
    UnknownAction,
    decided,
)
from framework.servers import NO_ANSWERS, Answers, ask_servers, ready_of, ready_pods
from framework.volumes import claim_context, refuse_storage_change
from services.postgres import commands as postgres_commands
from services.postgres.in_place import POD_ANNOTATION, InPlaceStep, plan_in_place, pod_annotation
from services.postgres.instances import APPLY_TIMEOUT, Servers, members_of, rw_endpoints
from services.postgres.primary import (
    Action,
    Facts,
    PrimaryInput,
    Promote,
    Reclone,
    Repoint,
    RestartPod,
    change_mark,
    ordinal,
    plan_primary,
)
from services.postgres.spec import PostgresSpec, PostgresStatus, template_hazards
from services.postgres.users import PostgresUserKind
from services.postgres.wal_archive import (
    ARCHIVER_PORT,
    CONDITION,
    ArchiverReport,
    archive_hold,
    archiver_context,
    archiving_condition,
)

ROLE_LABEL = "statefleet.dev/role"
WAL_HOLD_LABEL = "statefleet.dev/wal-archive"  # held or archiving: see wal_archive.archive_hold
WAL_STORAGE = "walStorage"  # Observed.references: the BackupStorage of spec.walArchive
SUPERUSER = GeneratedSecret("superuser", fixed={"username": "postgres"}, random=("password",))
REPLICATION = GeneratedSecret("replication", fixed={"username": "streaming_replica"}, random=("password",))


def current_primary(name: str, observed: Observed) -> str:
    """The primary's pod: the one status records, else the first instance."""
    return observed.status.get("currentPrimary") or f"{name}-0"


def in_place_step(
    observed: Observed, primaries: frozenset[str] = frozenset(), now: float = 0.0
) -> InPlaceStep:
    """Where a physical restore over this instance stands (`services.postgres.in_place`)."""
    return plan_in_place(
        in_place.request_of(observed.annotations),
        observed.status.get(in_place.STATUS_FIELD),
        current_primary(observed.name, observed),
        observed.pods,
        observed.statefulset,
        primaries,
        format_time(now) if now else "",
    )


# A renewed certificate reaches the pods' files within a minute or so (the kubelet's Secret
# refresh); the servers read it when reloaded, so they are reloaded every 20 s for 150 s.
TLS_RELOAD_WINDOW, TLS_RELOAD_EVERY = 150.0, 20.0
# The archivers report only when asked: a quiet, healthy instance is asked this often, so its
# status.walArchive and ContinuousArchiving follow them (a failure shows within this and a pass).
ARCHIVE_REPORTS_EVERY = 10.0


def next_inspection(probe_again: float | None, tls_reload: bool, archives: bool) -> float | None:
    """Seconds until the servers are asked again (None: not until something changes): what the
    primary's planning wants, sooner while certificates are reloaded or archivers report."""
    again = probe_again
    if tls_reload:
        again = min(again or TLS_RELOAD_EVERY, TLS_RELOAD_EVERY)
    if archives:
        again = min(again or ARCHIVE_REPORTS_EVERY, ARCHIVE_REPORTS_EVERY)
    return again


@dataclass(frozen=True)
class ReloadConfiguration:
    """`pg_reload_conf()` on these pods' servers: they read their certificate files again."""

    pods: tuple[str, ...]


def tls_reload_due(status: dict[str, Any], now: float) -> bool:
    issued = (status.get("tls") or {}).get("issuedAtSeconds")
    if not issued or now - issued > TLS_RELOAD_WINDOW:
        return False
    return now - float(status.get("tlsReloadedAtSeconds") or 0) >= TLS_RELOAD_EVERY


@dataclass(frozen=True)
class ApplyCredentials:
    """The passwords the Secrets stage (`framework.credentials`) set on the primary, read back
    from every standby that answers, and written into every pod's passfile."""

    primary: str
    pods: tuple[str, ...]


@dataclass(frozen=True)
class ServerFacts:
    """An inspection's findings (`Inspection.facts`)."""

    servers: Answers[Facts]
    rw_endpoints: frozenset[str] | None  # None: not looked at (no change of primary was under way)
    not_streaming_since: dict[str, float]  # standbys not streaming, since (monotonic)
    silent_since: dict[str, float]  # servers not answering, since (monotonic)
    primary: str | None  # the primary when asked: timers start again when it changes
    confirmed: frozenset[str]  # pods that answered as a primary in their current life
    archivers: dict[str, ArchiverReport | None] = field(default_factory=dict)  # with spec.walArchive
    change: tuple[Any, ...] = ()  # `change_mark` of the status the servers were asked under


SERVERS = Servers(SUPERUSER.name("{name}"))


def major(version: str) -> str:
    return version.split(".", 1)[0]


class PostgresTls(Tls):
    def hosts(self, name: str, namespace: str) -> list[str]:
        return service_hosts([f"{name}-rw", f"{name}-ro", name], namespace, pods_of=name)


class PostgresBindings(Bindings):
    user_kind = "PostgresUser"

    def user_spec(self, binding: str, instance: str) -> dict[str, Any]:
        # Each application its own role and its own database, named after the binding.
        return {"instance": instance, "ownDatabase": True}

    def secret_data(
        self, service: dict[str, Any], user: dict[str, Any], credentials: dict[str, str], ca: str | None
    ) -> dict[str, str]:
        meta, status = service["metadata"], user["status"]
        host = f"{meta['name']}-rw.{meta['namespace']}.svc"
        username, database, password = status["role"], status["database"], credentials["password"]
        # The CA under the names the servicebinding.io libraries read: `sslrootcert` is a file
        # name that Spring Cloud Bindings joins to the binding's folder, `root.crt` what
        # kube-service-bindings hands node-postgres. The uri alone verifies too (libpq's default
        # root certificate, or the application's).
        tls = {"ca.crt": ca, "root.crt": ca, "sslrootcert": "ca.crt", "sslmode": "verify-full"} if ca else {}
        return {
            **tls,
            "type": "postgresql",
            "provider": "statefleet",
            "host": host,
            "port": "5432",
            "username": username,
            "password": password,
            "database": database,
            "uri": f"postgresql://{quote(username)}:{quote(password, safe='')}@{host}:5432/{quote(database)}"
            + ("?sslmode=verify-full" if ca else ""),
        }


class PostgresRotation(Rotation):
    """The superuser's and the replication role's passwords (`spec.rotateCredentials`)."""

    secrets = (SUPERUSER, REPLICATION)

    def waiting(self, observed: Observed) -> str | None:
        restoring = observed.status.get(in_place.STATUS_FIELD)
        if in_place.request_of(observed.annotations) or in_place.under_way(restoring):
            return "a restore in place is under way"
        if observed.status.get("targetPrimary"):
            return "a change of primary is under way"
        primary = current_primary(observed.name, observed)
        if primary not in ready_pods(observed):
            return f"the primary {primary} is not ready"
        return None

    def apply(self, observed: Observed) -> ApplyCredentials:
        pods = tuple(pod["metadata"]["name"] for pod in observed.pods)
        return ApplyCredentials(current_primary(observed.name, observed), pods)


async def staged_passwords(client: AsyncClient, namespace: str, name: str) -> list[tuple[str, str]]:
    """(role, password) the servers should take, replication first (the passfile's order): each
    Secret's `next-password` while one is staged, else its `password` (swapped already)."""
    entries = []
    for secret in (REPLICATION, SUPERUSER):
        data = decoded((await client.get(Secret, secret.name(name), namespace=namespace)).to_dict())
        entries.append((data["username"], data.get(NEXT_PASSWORD) or data[PASSWORD]))
    return entries


class PostgresBackups(Backups):
    driver = "services.postgres.backup_driver"
    methods = ("physical", "logical")
    bootstrap_methods = ("physical",)
    replaces_online = ("logical",)
    restores_in_place = True
    point_in_time = "services.postgres.point_in_time"
    # A restore test's instance: one server, archiving nothing.
    throwaway_spec: ClassVar[dict[str, Any]] = {"instances": 1, "walArchive": None}

    def restored_spec(self, recorded: dict[str, Any], version: str, method: str) -> dict[str, Any]:
        if method != "physical":
            return recorded  # pg_restore loads into any newer major version too
        # A physical copy starts only on its own major version.
        wanted = major(version)
        if recorded.get("version") and major(str(recorded["version"])) != wanted:
            raise ValueError(
                f"version {recorded['version']}: a physical backup of PostgreSQL {version} "
                f"runs on {wanted} only"
            )
        return {**recorded, "version": wanted}

    def job_env(self, name: str) -> list[dict[str, Any]]:
        return [
            {"name": "PGHOST", "value": f"{name}-rw"},
            {"name": "PGPORT", "value": "5432"},
            {"name": "PGSSLMODE", "value": "require"},
            {"name": "PGCONNECT_TIMEOUT", "value": "10"},
            SUPERUSER.env("PGUSER", name, "username"),
            SUPERUSER.env("PGPASSWORD", name, "password"),
            REPLICATION.env("REPLICATION_USER", name, "username"),
            REPLICATION.env("REPLICATION_PASSWORD", name, "password"),
        ]


class PostgresPlugin(ServicePlugin):
    kind = "Postgres"
    plural = "postgreses"
    short_names = ("pg",)
    service = "postgres"
    spec_model = PostgresSpec
    generated_secrets = (SUPERUSER, REPLICATION)
    commands = postgres_commands
    # The StatefulSet is left to a StatefulsetRollout: replicas first, the primary last.
    child_kinds = ("ConfigMap", "Service", "PodDisruptionBudget", "StatefulsetRollout")
    # A new primary is promoted once <name>-rw lets go of the old.
    rbac_rules = ({"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},)
    actions = (Promote, RestartPod, Repoint, Reclone, ReloadConfiguration, ApplyCredentials)
    tls = PostgresTls()
    status_model = PostgresStatus
    decisive_status = ("currentPrimary", "targetPrimary", "failover")
    bindings = PostgresBindings()
    backups = PostgresBackups()
    rotation = PostgresRotation()
    one_shot = ("switchover",)

    def in_service_kinds(self) -> list[Any]:
        return [USERS]

    def references(self, spec: dict[str, Any]) -> dict[str, Reference]:
        storage = (spec.get("walArchive") or {}).get("storage")
        return {WAL_STORAGE: Reference(BackupStorageKind.resource(), storage)} if storage else {}

    def plan(
        self, spec: PostgresSpec, version: ResolvedVersion, observed: Observed, now: float
    ) -> ServicePlan:
        operations = self.operations(spec, observed, now)
        refusal = self.refusal(spec, observed)
        if refusal:
            return ServicePlan(None, operations, refusal=Refusal(CHANGE_REFUSED, refusal))
        # The templates render from the status as read; the reading is of what was decided.
        return ServicePlan(
            self.reading(spec, decided(observed, operations)),
            operations,
            self.template_context(spec, version, observed),
        )

    def refusal(self, spec: PostgresSpec, observed: Observed) -> str | None:
        hazard = template_hazards(spec)
        if hazard:
            return hazard
        running = observed.status.get("version")
        if running and spec.version and major(spec.version) != major(running) and observed.statefulset:
            # The data directory of one major version does not start under another.
            return (
                f"spec.version: upgrading the data from PostgreSQL {running} to {spec.version} needs a "
                f"major upgrade (pg_upgrade), which is not supported yet; set it back to {running}"
            )
        return refuse_storage_change(spec.storage, observed)

    def template_context(
        self, spec: PostgresSpec, version: ResolvedVersion, observed: Observed
    ) -> dict[str, Any]:
        configuration = {
            "parameters": spec.parameters,
            "pg_hba": spec.pg_hba,
            "version": version.version,
            "synchronous": spec.synchronous.number if spec.synchronous else 0,
            "walArchive": spec.wal_archive.archive_timeout_seconds if spec.wal_archive else None,
        }
        # Never fewer pods than the primary's ordinal needs: scaling down takes the highest
        # ordinals, so a primary among them is switched over first (see primary.py).
        keep = [current_primary(observed.name, observed), observed.status.get("targetPrimary")]
        replicas = max([spec.instances] + [ordinal(pod) + 1 for pod in keep if pod])
        restoring = in_place_step(observed)
        return {
            "replicas": 0 if restoring.stopped else replicas,
            "in_place": restoring.init_env,
            # A pod that takes a physical backup may then replay WAL from an archive (a point in
            # time, or a backup that left its WAL there): the wal-restore sidecar serves it.
            "replays_archive": bool(spec.bootstrap and spec.bootstrap.point_in_time)
            or bool(restoring.init_env),
            # Which restore step the pod template is for: read back from the StatefulSet.
            "in_place_annotations": {POD_ANNOTATION: pod_annotation(restoring.init_env)}
            if restoring.init_env
            else {},
            "bootstrap_primary": f"{observed.name}-0",
            "role_label": ROLE_LABEL,
            "cluster_state": "initialized" if observed.status.get("initialized") else "new",
            "superuser_secret": SUPERUSER.name(observed.name),
            "replication_secret": REPLICATION.name(observed.name),
            "replication_user": REPLICATION.fixed["username"],
            "wal_archive": archiver_context(
                spec.wal_archive,
                observed.references.get(WAL_STORAGE),
                observed.namespace,
                observed.name,
                archive_hold(in_place.request_of(observed.annotations), restoring.record),
            ),
            # Pods restart when their configuration changes: it is part of the template.
            "config_hash": content_hash(configuration),
            **claim_context(spec.storage, observed),
        }

    def operations(self, spec: PostgresSpec, observed: Observed, now: float) -> Operations:
        inspection = observed.inspection
        if inspection is not None and inspection.facts.change != change_mark(observed.status):
            # Asked before the primary changed, or before a change started or ended (another
            # operator's pass, or ours): what the servers said then decides nothing now (a
            # server promoted since was a standby then, and a restarted one had replayed less).
            # Asked again at once.
            return Operations(inspect_in=0.0)
        found = inspection.facts if inspection else ServerFacts(NO_ANSWERS, None, {}, {}, None, frozenset())
        members = {
            pod: replace(
                member,
                not_streaming_since=found.not_streaming_since.get(pod),
                silent_since=found.silent_since.get(pod) if member.probed_at else None,
                confirmed_primary=bool(member.probed_at) and pod in found.confirmed,
            )
            for pod, member in members_of(
                observed, found.servers, inspection.at if inspection else 0.0
            ).items()
        }
        restoring = in_place_step(
            observed, frozenset(pod for pod, m in members.items() if m.confirmed_primary), now
        )
        if restoring.held:  # pods down on purpose, or taking a backup: nothing to fail over
            return Operations(
                status={in_place.STATUS_FIELD: restoring.record},
                events=list(restoring.events),
                inspect_in=None if restoring.stopped else 5.0,
            )
        switchover = spec.switchover
        switchovers = observed.status.get("switchover") or {}
        planned = plan_primary(
            PrimaryInput(
                name=observed.name,
                instances=spec.instances,
                status=observed.status,
                members=members,
                rw_endpoints=found.rw_endpoints,
                now=now,
                monotonic=observed.clock,
                synchronous=spec.synchronous.number if spec.synchronous else 0,
                switchover_to=switchover.to if switchover else None,
                switchover_request=f"{switchover.to}@{switchover.requested_at or ''}" if switchover else None,
                rollout_switchover=switchovers.get("rollout"),
            )
        )
        primary = members.get(planned.primary)
        status: dict[str, Any] = {
            # Once a primary has answered, an instance without data never creates a cluster.
            "initialized": observed.status.get("initialized") or bool(primary and primary.answers_as_primary),
            "currentPrimary": planned.primary,
            "targetPrimary": planned.target,
            "failover": planned.failover,
        }
        if restoring.record:
            status[in_place.STATUS_FIELD] = restoring.record
        if planned.rejoins is not None:
            status["rejoins"] = planned.rejoins or None
        if planned.switchover_done or planned.rollout_switchover_done:
            served = {"served": planned.switchover_done, "rolloutServed": planned.rollout_switchover_done}
            status["switchover"] = {**switchovers, **{k: v for k, v in served.items() if v}}
        actions: list[Any] = list(planned.actions)
        reload = tls_reload_due(observed.status, now)
        if reload:
            actions.append(ReloadConfiguration(tuple(p["metadata"]["name"] for p in observed.pods)))
            status["tlsReloadedAtSeconds"] = now
        again = next_inspection(planned.probe_again, reload, bool(spec.wal_archive))
        labels: dict[str, dict[str, str]] = {pod: {ROLE_LABEL: role} for pod, role in planned.labels.items()}
        if spec.wal_archive:
            # A change of the pod makes its kubelet update the mounted ConfigMap at once, not at its
            # next periodic pass (a minute): a lifted hold reaches the archivers within seconds.
            hold = archive_hold(in_place.request_of(observed.annotations), restoring.record)
            for pod in observed.pods:
                labels.setdefault(pod["metadata"]["name"], {})[WAL_HOLD_LABEL] = (
                    "held" if hold else "archiving"
                )
        return Operations(
            pod_labels=labels,
            actions=actions,
            status=status,
            events=[*restoring.events, *(EventNote(*event) for event in planned.events)],
            inspect_in=again,
        )

    async def inspect(
        self, client: AsyncClient, observed: Observed, previous: Inspection | None
    ) -> Inspection | None:
        answers = await ask_servers(observed, lambda _, ip: SERVERS.probe(client, observed, ip))
        at = asyncio.get_running_loop().time()  # the answers are at most a probe's timeout older
        servers = answers.by_pod

        def same_life(pod: str) -> bool:
            """The previous inspection saw this life of the pod, under the same primary."""
            return (
                previous is not None
                and previous.facts.servers.lives.get(pod) == answers.lives[pod]
                and previous.facts.primary == observed.status.get("currentPrimary")
            )

        def since(earlier: dict[str, float], pod: str) -> float:
            """When a condition seen now began: carried over within the same life of the pod."""
            return earlier.get(pod, at) if same_life(pod) else at

        before = previous.facts if previous else None
        not_streaming = {
            pod: since(before.not_streaming_since if before else {}, pod)
            for pod, facts in servers.items()
            if facts is not None and facts.in_recovery and not facts.streaming
        }
        silent = {
            pod: since(before.silent_since if before else {}, pod)
            for pod, facts in servers.items()
            if facts is None
        }
        # Answered as a primary in this life of the pod: now, or before and silent since.
        confirmed = frozenset(
            pod
            for pod, facts in servers.items()
            if (facts is not None and not facts.in_recovery)
            or (facts is None and before is not None and pod in before.confirmed and same_life(pod))
        )
        changing = bool(observed.status.get("targetPrimary"))
        endpoints = await rw_endpoints(client, observed.namespace, observed.name) if changing else None
        archivers = {}
        if observed.spec.get("walArchive"):
            async with httpx2.AsyncClient(timeout=2.0) as http:
                reports = await ask_servers(observed, lambda _, ip: archiver_report(http, ip))
            archivers = reports.current(observed)
        return Inspection(
            at=at,
            facts=ServerFacts(
                answers,
                endpoints,
                not_streaming,
                silent,
                observed.status.get("currentPrimary"),
                confirmed,
                archivers,
                change_mark(observed.status),
            ),
            answered=answers.answered,
        )

    async def perform(self, client: AsyncClient, observed: Observed, action: Action) -> None:
        ips = {pod["metadata"]["name"]: pod_ip(pod) for pod in observed.pods}
        if isinstance(action, Promote):
            ip = ips.get(action.pod)
            if ip is None:
                raise RuntimeError(f"cannot promote {action.pod}: its pod has no IP")
            await SERVERS.promote(client, observed, ip)
        elif isinstance(action, Reclone):
            ip = ips.get(action.pod)
            if ip is not None:
                await SERVERS.mark_for_reclone(client, observed, ip, action.reason)
            await self.perform(client, observed, RestartPod(action.pod, action.reason))
        elif isinstance(action, RestartPod):
            try:
                await client.delete(Pod, action.pod, namespace=observed.namespace, grace_period=action.grace)
            except ApiError as error:
                if error.status.code != 404:
                    raise
        elif isinstance(action, ReloadConfiguration):
            await asyncio.gather(
                *(SERVERS.reload(client, observed, ips[p]) for p in action.pods if ips.get(p))
            )
        elif isinstance(action, ApplyCredentials):
            await self.apply_credentials(client, observed, action, ips)
        elif isinstance(action, Repoint):
            host = f"{action.primary}.{observed.name}.{observed.namespace}.svc"  # follows the pod's IP
            await asyncio.gather(
                *(SERVERS.repoint(client, observed, ips[p], host) for p in action.pods if ips.get(p))
            )
        else:
            raise UnknownAction(self, action)

    async def apply_credentials(
        self, client: AsyncClient, observed: Observed, action: ApplyCredentials, ips: dict[str, str | None]
    ) -> None:
        """On the primary (replication carries them to the standbys; the running WAL receivers are
        not asked again), then every pod's passfile, then read back from every standby that
        answers: a failover after this cannot promote a server without them."""
        primary = ips.get(action.primary)
        if primary is None:
            raise RuntimeError(f"cannot set the new passwords: the primary {action.primary} has no IP")
        entries = await staged_passwords(client, observed.namespace, observed.name)
        verifiers = await SERVERS.set_passwords(client, observed, primary, dict(entries))
        others = {pod: ips[pod] for pod in action.pods if ips.get(pod) and pod != action.primary}
        await asyncio.gather(
            *(
                SERVERS.write_passfile(client, observed, ip, entries)
                for ip in [primary, *others.values()]
                if ip
            )
        )
        held = await asyncio.gather(
            *(SERVERS.holds(client, observed, ip, verifiers) for ip in others.values() if ip)
        )
        behind = [pod for pod, holds in zip(others, held, strict=True) if holds is False]
        if behind:
            raise RuntimeError(
                f"{', '.join(behind)} did not replay the new passwords within {APPLY_TIMEOUT:.0f} s"
            )

    def reading(self, spec: PostgresSpec, observed: Observed) -> ServiceStatus:
        primary = current_primary(observed.name, observed)
        ready = ready_of(observed, spec.instances)
        primary_ready = primary in ready_pods(observed)
        if primary_ready and ready == spec.instances:
            message = f"{ready} of {spec.instances} instances ready; primary {primary}"
        elif primary_ready:
            message = f"primary {primary} ready; {ready} of {spec.instances} instances ready"
        else:
            message = f"waiting for primary {primary}; {ready} of {spec.instances} instances ready"
        restoring = observed.status.get(in_place.STATUS_FIELD)
        if in_place.under_way(restoring):
            message = f"restoring in place ({restoring['phase']}): {restoring.get('message', '')}; {message}"
        host = f"{observed.name}-rw.{observed.namespace}.svc"
        archiving: tuple[Any, ...] = ()
        report = None
        if spec.wal_archive:
            facts = observed.inspection.facts if observed.inspection else None
            report = facts.archivers.get(primary) if facts else None
            archiving = (archiving_condition(primary, report, primary_ready),)
        return ServiceStatus(
            ready_instances=ready,
            instances=spec.instances,
            ready=primary_ready,
            degraded=primary_ready and ready < spec.instances,
            message=message,
            fields={
                "currentPrimary": primary,
                "endpoints": {
                    "rw": f"{host}:5432",
                    "ro": f"{observed.name}-ro.{observed.namespace}.svc:5432",
                },
                "superuserSecret": SUPERUSER.name(observed.name),
                # Kept while the primary's archiver does not answer: its last word stays visible.
                "walArchive": (report.to_api() if report else observed.status.get("walArchive"))
                if spec.wal_archive
                else None,
            },
            conditions=archiving,
            withdrawn_conditions=() if spec.wal_archive else (CONDITION,),
        )

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns.insert(3, {"name": "Primary", "type": "string", "jsonPath": ".status.currentPrimary"})
        return columns


USERS = PostgresUserKind(SERVERS, PostgresPlugin.resource())


async def archiver_report(http: httpx2.AsyncClient, ip: str) -> ArchiverReport | None:
    """What a server's WAL archiver says of itself; None when it does not answer."""
    try:
        response = await http.get(f"http://{ip}:{ARCHIVER_PORT}/status")
        response.raise_for_status()
        return ArchiverReport.model_validate(response.json())
    except (httpx2.HTTPError, ValueError):
        return None
