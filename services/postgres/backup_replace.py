"""A logical restore over an instance's own databases, and its way back.

The databases the backup holds are renamed aside (`<name>__before_<token>`) and the backup's
are restored under their names; only once the restore and its check succeeded are the
set-aside copies dropped. What the restore did is recorded on the instance before it does it
(the setting `statefleet.restore` of the postgres database, JSON): which databases it set aside,
which it creates. So a rollback, in the same process or in a later Job after this one was
killed at any step, decides from the server alone, and drops only a database whose original is
still aside or one that did not exist before the restore. One replacing restore or rollback
runs at a time per instance (an advisory lock, held until the process ends).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field

import psycopg
from psycopg import sql

from services.postgres.backup_connection import connect as connect_to

STATE_SETTING = "statefleet.restore"
LOCK_KEY = 0x53_46_52_53  # "SFRS": the advisory lock a replacing restore holds
LOCK_WAIT = 600.0  # seconds: an earlier Job of the same restore may still be ending
MAX_NAME = 63  # bytes, PostgreSQL's NAMEDATALEN - 1

RESTORING, COMMITTING, COMMITTED = "restoring", "committing", "committed"


class ReplaceRefused(Exception):
    pass


@dataclass
class ReplaceState:
    token: str
    phase: str
    originals: list[str] = field(default_factory=list)  # set aside, by their own names
    created: list[str] = field(default_factory=list)  # the restore's, absent before it

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def aside_name(database: str, token: str) -> str:
    """Where a replacing restore keeps `database` until it succeeded: the name itself when it
    fits, else its head and a hash of all of it (two long names never meet)."""
    suffix = f"__before_{token}"
    if len(database.encode()) + len(suffix) <= MAX_NAME:
        return database + suffix
    digest = hashlib.sha1(database.encode()).hexdigest()[:8]
    room = MAX_NAME - len(suffix) - len(digest) - 1
    head = database.encode()[:room].decode(errors="ignore")
    return f"{head}_{digest}{suffix}"


def parse_state(setconfig: list[str] | None) -> ReplaceState | None:
    for item in setconfig or []:
        key, _, value = item.partition("=")
        if key == STATE_SETTING and value:
            try:
                return ReplaceState(**json.loads(value))
            except (ValueError, TypeError):
                return None
    return None


def connect() -> psycopg.Connection:
    return connect_to("postgres", application_name="statefleet-restore")


_lock: psycopg.Connection | None = None


def hold_lock() -> None:
    """This process's turn on the instance, kept until it ends (its session ends with it)."""
    global _lock
    if _lock is not None and not _lock.closed:
        return
    conn = connect()
    deadline = time.monotonic() + LOCK_WAIT
    while not conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()[0]:
        if time.monotonic() > deadline:
            conn.close()
            raise ReplaceRefused(f"another restore held the instance for {LOCK_WAIT:.0f} s: try again")
        time.sleep(1)
    _lock = conn


STATE_QUERY = (
    "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase"
    " WHERE d.datname = 'postgres' AND s.setrole = 0"
)


def read_state(conn: psycopg.Connection) -> ReplaceState | None:
    row = conn.execute(STATE_QUERY).fetchone()
    return parse_state(row[0] if row else None)


def under_way(state: ReplaceState | None) -> bool:
    """A replacing restore holds the instance's databases (some may be aside, under other names)."""
    return state is not None and state.phase in (RESTORING, COMMITTING)


def write_state(conn: psycopg.Connection, state: ReplaceState) -> None:
    conn.execute(
        sql.SQL("ALTER DATABASE postgres SET {} TO {}").format(
            sql.SQL(STATE_SETTING), sql.Literal(state.to_json())
        )
    )


def exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def statement(template: str, *names: str) -> sql.Composed:
    return sql.SQL(template).format(*(sql.Identifier(name) for name in names))


def begin(token: str, wanted: list[str]) -> ReplaceState:
    """Records what the restore is about to do, then sets the databases it replaces aside:
    closed to new sessions, their sessions ended, renamed."""
    hold_lock()
    with connect() as conn:
        state = read_state(conn)
        if state and state.token != token and state.phase in (RESTORING, COMMITTING):
            raise ReplaceRefused(
                f"a replacing restore ({state.token}) has not ended on this instance: its rollback "
                "puts the data back first"
            )
        present = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
        targets = [name for name in wanted if name != "postgres"]
        state = ReplaceState(
            token,
            RESTORING,
            originals=[name for name in targets if name in present],
            created=[name for name in targets if name not in present],
        )
        write_state(conn, state)  # first: a rollback knows what to undo from here on
        for name in state.originals:
            conn.execute(statement("ALTER DATABASE {} ALLOW_CONNECTIONS false", name))
            for attempt in range(40):
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
                try:
                    conn.execute(statement("ALTER DATABASE {} RENAME TO {}", name, aside_name(name, token)))
                    break
                except psycopg.errors.ObjectInUse:
                    if attempt == 39:
                        raise
                    time.sleep(0.5)
    return state


def roll_back(token: str) -> dict[str, object]:
    """Undoes the restore `token` from what the instance recorded: each original back under its
    name (the restore's copy dropped first) and open again; the databases it created dropped.
    Run again, it changes nothing more. A restore that had committed is finished instead."""
    hold_lock()
    with connect() as conn:
        state = read_state(conn)
        if state is None or state.token != token:
            return {"putBack": []}
        if state.phase in (COMMITTING, COMMITTED):
            return {**commit(token), "committed": True}
        put_back = []
        for name in state.originals:
            aside = aside_name(name, token)
            if exists(conn, aside):
                if exists(conn, name):  # the original is aside: this one is the restore's
                    conn.execute(statement("DROP DATABASE {} WITH (FORCE)", name))
                conn.execute(statement("ALTER DATABASE {} RENAME TO {}", aside, name))
                put_back.append(name)
            if exists(conn, name):
                conn.execute(statement("ALTER DATABASE {} ALLOW_CONNECTIONS true", name))
        dropped = []
        for name in state.created:
            if exists(conn, name):
                conn.execute(statement("DROP DATABASE {} WITH (FORCE)", name))
                dropped.append(name)
        conn.execute(sql.SQL("ALTER DATABASE postgres RESET {}").format(sql.SQL(STATE_SETTING)))
    return {"putBack": put_back, "droppedRestored": dropped}


def commit(token: str) -> dict[str, object]:
    """The restore succeeded (and its check passed): what was set aside goes. The record stays,
    as `committed`, so a rollback that comes after a lost report finishes nothing twice."""
    hold_lock()
    with connect() as conn:
        state = read_state(conn)
        if state is None or state.token != token:
            raise ReplaceRefused(f"the instance has no record of the restore {token}")
        if state.phase == COMMITTED:
            return {"droppedAside": []}
        state.phase = COMMITTING
        write_state(conn, state)
        dropped = []
        for name in state.originals:
            aside = aside_name(name, token)
            if exists(conn, aside):
                conn.execute(statement("DROP DATABASE {} WITH (FORCE)", aside))
                dropped.append(aside)
        state.phase = COMMITTED
        write_state(conn, state)
    return {"droppedAside": dropped}
