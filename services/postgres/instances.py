"""Talking to the PostgreSQL servers of one `Postgres`: probes, promotion, repointing.

The operator reaches every server on its pod IP as the superuser (whose Secret it made). A
server that does not answer within a second or two counts as not answering: a frozen
server must not hold the operator up.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.discovery_v1 import EndpointSlice
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from framework.kube.pods import pod_ready, unready_since, waiting_out_backoff
from framework.kube.secrets import Passwords
from framework.kube.times import parse_time
from framework.plugin import Observed
from framework.servers import Answers
from services.postgres import scram
from services.postgres.primary import Facts, Member, parse_lsn

log = logging.getLogger("statefleet")

# Seconds a probe waits for a connection and an answer: the servers are on the pod network,
# and a frozen one must not hold the operator up. (libpq's own connect_timeout is 2 s at least.)
PROBE_TIMEOUT = 1.0
CHECKPOINT_TIMEOUT = 120.0  # a rollout's hook waits this long at most; the shutdown does the rest
PROMOTE_TIMEOUT = 35.0  # pg_promote waits up to 30 s for the end of recovery
RECLONE_MARK = "/var/lib/postgresql/data/statefleet-reclone"  # in the volume, beside PGDATA
# The passfile start.sh writes (the standby's replication connection, pg_rewind, clones): in the
# pod's socket directory, a volume that outlives a restart of the server's container.
PASSFILE = "/var/run/postgresql/statefleet.pgpass"
APPLY_TIMEOUT = 10.0  # setting passwords on the primary (a synchronous commit), reading them back
# What keeps a statement's text out of the server's log and out of pg_stat_activity (the passfile
# holds passwords in plain): the superuser's session only.
QUIET = (
    "set log_statement = 'none'",
    "set log_min_error_statement = 'panic'",
    "set log_min_duration_statement = -1",
    "set track_activities = off",
)
PROBE = """
select pg_is_in_recovery(),
       case when pg_is_in_recovery()
            then greatest(coalesce(pg_last_wal_receive_lsn(), '0/0'),
                          coalesce(pg_last_wal_replay_lsn(), '0/0'))
            else pg_current_wal_lsn() end::text,
       case when pg_is_in_recovery()
            then coalesce((select received_tli from pg_stat_wal_receiver),
                          (select timeline_id from pg_control_checkpoint()))
            else ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int end,
       coalesce((select status = 'streaming' from pg_stat_wal_receiver), false),
       case when pg_is_in_recovery()
            then coalesce((select conninfo from pg_stat_wal_receiver where conninfo <> ''),
                          current_setting('primary_conninfo')) end
"""


def refused_login(error: Exception) -> bool:
    return isinstance(error, psycopg.OperationalError) and "password authentication failed" in str(error)


class Servers:
    """The servers of the `Postgres` resources, reached with each one's superuser password (its
    `password`, and while a credentials rotation is under way its `next-password`)."""

    def __init__(self, superuser_secret: str) -> None:
        self.passwords = Passwords(superuser_secret)  # the Secret's name with {name} in it
        self._background: set[asyncio.Task[None]] = set()  # kept referenced until they finish

    def forget(self, namespace: str, name: str) -> None:
        self.passwords.forget(namespace, name)

    async def connect(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        ip: str,
        dbname: str = "postgres",
        statement_timeout: float = PROBE_TIMEOUT,
    ) -> psycopg.AsyncConnection[Any]:
        """A superuser's connection; a refused login is tried with the other password of a rotation
        under way, then with the Secret read again (a rotation that moved on, a resource made anew)."""

        async def attempt(password: str) -> psycopg.AsyncConnection[Any]:
            return await psycopg.AsyncConnection.connect(
                host=ip,
                user="postgres",
                password=password,
                dbname=dbname,
                connect_timeout=2,
                autocommit=True,
                options=f"-c statement_timeout={int(statement_timeout * 1000)}",
                # A frozen peer's kernel still acknowledges TCP: give up on unacknowledged data.
                tcp_user_timeout=int(PROBE_TIMEOUT * 3000),
            )

        return await self.passwords.first_taken(client, namespace, name, attempt, refused_login)

    async def probe(self, client: AsyncClient, observed: Observed, ip: str) -> Facts | None:
        """The server's role and WAL position; None when it does not answer (in time)."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):  # the connection and the query together
                async with await self.connect(client, observed.namespace, observed.name, ip) as connection:
                    row = await (await connection.execute(PROBE)).fetchone()
        except (OSError, TimeoutError, psycopg.Error, ApiError):
            return None
        assert row is not None
        in_recovery, lsn, timeline, streaming, conninfo = row
        return Facts(
            in_recovery=in_recovery,
            lsn=parse_lsn(lsn),
            timeline=int(timeline),
            streaming=streaming,
            upstream=upstream_of(conninfo),
        )

    async def promote(self, client: AsyncClient, observed: Observed, ip: str) -> None:
        async with (
            asyncio.timeout(PROMOTE_TIMEOUT),
            await self.connect(client, observed.namespace, observed.name, ip) as connection,
        ):
            await connection.execute("set statement_timeout = 0")
            if not (await (await connection.execute("select pg_is_in_recovery()")).fetchone() or [True])[0]:
                return  # promoted by an earlier pass whose answer we have not seen yet
            promoted = (
                await (await connection.execute("select pg_promote(true, 30)")).fetchone() or [False]
            )[0]
        if not promoted:
            raise RuntimeError(f"pg_promote on {ip} did not finish within 30 s")
        # Until its first checkpoint, the new primary's control file still names the timeline
        # it left: a standby rewound against it meanwhile would be told its timeline is not a
        # child of the primary's. The end-of-recovery checkpoint is skipped by a fast promote.
        task = asyncio.get_running_loop().create_task(
            self._checkpoint_after_promotion(client, observed.namespace, observed.name, ip)
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _checkpoint_after_promotion(
        self, client: AsyncClient, namespace: str, name: str, ip: str
    ) -> None:
        try:
            await self.checkpoint(client, namespace, name, ip)
        except (OSError, TimeoutError, psycopg.Error, ApiError) as error:
            log.info("no checkpoint after the promotion at %s: %s", ip, error or type(error).__name__)

    async def repoint(self, client: AsyncClient, observed: Observed, ip: str, primary_host: str) -> None:
        """The standby at `ip` streams from `primary_host` from now on: its primary_conninfo
        changes and, reloaded, its WAL receiver restarts (even one stuck connecting)."""
        try:
            async with (
                asyncio.timeout(PROBE_TIMEOUT * 3),
                await self.connect(client, observed.namespace, observed.name, ip) as connection,
            ):
                row = await (
                    await connection.execute("select current_setting('primary_conninfo')")
                ).fetchone()
                conninfo = {**conninfo_to_dict(row[0] if row else ""), "host": primary_host}
                await connection.execute(
                    sql.SQL("alter system set primary_conninfo = {}").format(
                        sql.Literal(make_conninfo(**conninfo))
                    )
                )
                await connection.execute("select pg_reload_conf()")
        except (OSError, TimeoutError, psycopg.Error) as error:
            log.info("could not repoint the standby at %s: %s", ip, error or type(error).__name__)

    async def reload(self, client: AsyncClient, observed: Observed, ip: str) -> None:
        try:
            async with (
                asyncio.timeout(PROBE_TIMEOUT * 3),
                await self.connect(client, observed.namespace, observed.name, ip) as connection,
            ):
                await connection.execute("select pg_reload_conf()")
        except (OSError, TimeoutError, psycopg.Error) as error:
            log.info("could not reload the server at %s: %s", ip, error or type(error).__name__)

    async def mark_for_reclone(self, client: AsyncClient, observed: Observed, ip: str, reason: str) -> None:
        """The start script's cue (see the ConfigMap): written by the server itself, which may
        write files where its data lives; COPY TO is allowed on a standby."""
        try:
            async with (
                asyncio.timeout(PROBE_TIMEOUT * 3),
                await self.connect(client, observed.namespace, observed.name, ip) as connection,
            ):
                await connection.execute(
                    sql.SQL("copy (select {}) to {}").format(sql.Literal(reason), sql.Literal(RECLONE_MARK))
                )
        except (OSError, TimeoutError, psycopg.Error) as error:
            log.info("could not mark the standby at %s for a clone: %s", ip, error or type(error).__name__)

    async def set_passwords(
        self, client: AsyncClient, observed: Observed, ip: str, passwords: dict[str, str]
    ) -> dict[str, str]:
        """The roles' passwords set on the primary at `ip`, in one transaction, as SCRAM verifiers
        computed here (the plaintext never reaches the server); the verifiers by role. The
        standbys have them once they replayed it."""
        verifiers = {role: scram.verifier(password) for role, password in passwords.items()}
        async with (
            asyncio.timeout(APPLY_TIMEOUT),
            await self.connect(
                client, observed.namespace, observed.name, ip, statement_timeout=APPLY_TIMEOUT
            ) as connection,
        ):
            if (await (await connection.execute("select pg_is_in_recovery()")).fetchone() or [True])[0]:
                raise RuntimeError(f"the server at {ip} is no longer the primary: passwords not set")
            async with connection.transaction():
                for role, verifier in sorted(verifiers.items()):
                    await connection.execute(
                        sql.SQL("alter role {} password {}").format(
                            sql.Identifier(role), sql.Literal(verifier)
                        )
                    )
        return verifiers

    async def write_passfile(
        self, client: AsyncClient, observed: Observed, ip: str, entries: list[tuple[str, str]]
    ) -> bool:
        """The pod's passfile (`PASSFILE`) rewritten in place by its server (COPY TO, allowed on a
        standby; the file keeps its 0600), with these (user, password) entries: a standby whose
        WAL receiver connects again takes the new password. Whether its server answered."""
        lines = []
        for user, password in entries:
            if any(c in password for c in ":\\") or not password.isprintable():
                raise ValueError(f"the password of {user} cannot be written in a passfile as it is")
            lines.append(f"*:*:*:{user}:{password}")
        rows = sql.SQL(", ").join(sql.SQL("({})").format(sql.Literal(line)) for line in lines)
        try:
            async with (
                asyncio.timeout(PROBE_TIMEOUT * 3),
                await self.connect(client, observed.namespace, observed.name, ip) as connection,
            ):
                for setting in QUIET:
                    await connection.execute(setting)
                await connection.execute(
                    sql.SQL("copy (values {}) to {}").format(rows, sql.Literal(PASSFILE))
                )
        except (OSError, TimeoutError, psycopg.OperationalError) as error:
            log.info("could not rewrite the passfile at %s: %s", ip, error or type(error).__name__)
            return False
        return True

    async def holds(
        self, client: AsyncClient, observed: Observed, ip: str, verifiers: dict[str, str]
    ) -> bool | None:
        """Whether the server at `ip` has these verifiers (a standby: once it replayed them), asked
        until APPLY_TIMEOUT; None when it does not answer."""
        deadline = asyncio.get_running_loop().time() + APPLY_TIMEOUT
        query = "select rolname, rolpassword from pg_authid where rolname = any(%s)"
        while True:
            try:
                async with (
                    asyncio.timeout(PROBE_TIMEOUT * 3),
                    await self.connect(client, observed.namespace, observed.name, ip) as connection,
                ):
                    rows = await (await connection.execute(query, [sorted(verifiers)])).fetchall()
            except (OSError, TimeoutError, psycopg.OperationalError):
                return None
            if dict(rows) == verifiers:
                return True
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.2)

    async def checkpoint(self, client: AsyncClient, namespace: str, name: str, ip: str) -> bool:
        """A checkpoint on the server at `ip` if it is a primary; whether there was one."""
        async with (
            asyncio.timeout(CHECKPOINT_TIMEOUT),
            await self.connect(client, namespace, name, ip) as connection,
        ):
            await connection.execute("set statement_timeout = 0")
            if (await (await connection.execute("select pg_is_in_recovery()")).fetchone() or [True])[0]:
                return False
            await connection.execute("checkpoint")
            return True


def members_of(observed: Observed, answers: Answers[Facts], probed_at: float) -> dict[str, Member]:
    """Every pod, with what its server said at the probe made at `probed_at` (an answer from an
    earlier life of the pod says nothing)."""
    members = {}
    current_answers = answers.current(observed)
    for pod in observed.pods:
        name = pod["metadata"]["name"]
        current = name in current_answers
        deleted_at = pod["metadata"].get("deletionTimestamp")
        members[name] = Member(
            pod=name,
            ready=pod_ready(pod),
            terminating=bool(deleted_at),
            facts=current_answers.get(name),
            probed_at=probed_at if current else 0.0,
            server_stopped=bool(deleted_at) and server_stopped(pod),
            # deletionTimestamp is when the grace period ends (the request's time plus it)
            grace_ends=parsed.timestamp() if deleted_at and (parsed := parse_time(deleted_at)) else None,
            unready_since=since.timestamp() if (since := parse_time(unready_since(pod))) else None,
            server_life=server_life(pod),
            backing_off=waiting_out_backoff(pod, SERVER_CONTAINER),
        )
    return members


SERVER_CONTAINER = "postgres"  # the server's container in the pod template


def server_stopped(pod: dict[str, Any]) -> bool:
    """The server's container was seen and is not running now."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == SERVER_CONTAINER:
            return "running" not in (status.get("state") or {})
    return False


def server_life(pod: dict[str, Any]) -> str | None:
    """ "<pod uid>/<restarts>" of the server's container while it runs; None while it does not."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == SERVER_CONTAINER and "running" in (status.get("state") or {}):
            return f"{pod['metadata'].get('uid')}/{status.get('restartCount', 0)}"
    return None


def upstream_of(conninfo: str | None) -> str | None:
    """The first label of the host a standby's conninfo names (a pod, or `<name>-rw`)."""
    if not conninfo:
        return None
    try:
        host = conninfo_to_dict(conninfo).get("host")
    except psycopg.ProgrammingError:
        return None
    return str(host).split(".", 1)[0] if host else None


async def rw_endpoints(client: AsyncClient, namespace: str, name: str) -> frozenset[str]:
    """The pods `<name>-rw` sends connections to now (ready or not: kube-proxy may still have them)."""
    pods = set()
    async for slice_ in client.list(
        EndpointSlice, namespace=namespace, labels={"kubernetes.io/service-name": f"{name}-rw"}
    ):
        for endpoint in slice_.endpoints or []:
            if endpoint.targetRef is not None and endpoint.targetRef.name:
                pods.add(endpoint.targetRef.name)
    return frozenset(pods)
