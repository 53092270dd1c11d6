"""A history of list appends and reads through `<name>-rw`, recorded by clients that go on
through failovers, and its check by a linearizability checker no one here wrote (porcupine,
under the list model of testbed/gomod/linearizability).

Every client appends numbers to a set of its own (a key) and reads any set of the current or
the previous epoch; a new epoch (one per disruption) starts new keys, so that each set's
history stays short to check, while the writes made before a disruption are read after it.
At the end, every set is read once more. Reads wait for a synchronous standby as appends do
(see READ). An append whose answer was lost (a broken
connection, a commit whose wait for a synchronous standby ended without one, which the server
reports with a warning) has an unknown outcome: it may or may not be in the set, at any time
after its call.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from e2e.kube import REPO

CHECKER = REPO / ".testbed" / "bin" / "linearizability"
SCHEMA = "create table if not exists history (key text, value int, primary key (key, value))"
APPEND = "insert into history values (%s, %s)"
# A read takes a transaction ID, so that its commit, and so its answer, waits for a synchronous
# standby like an append's: PostgreSQL makes a commit visible on the primary before its own wait
# for a standby ends, and a plain read could see a value that a failover then undoes (CI run
# 50's history: an append whose answer was lost, seen by a read, gone after a kill -9). A read
# answered has seen only what a synchronous standby has too.
READ = "select coalesce(array_agg(value order by value), '{}'), txid_current() from history where key = %s"
# A synchronous commit whose wait for a standby ends without one (the backend cancelled or
# terminated, the server shutting down) is committed locally and reported with this warning
# (in its detail): its durability is not known. (statement_timeout does not end that wait.)
UNREPLICATED = "might not have been replicated"
# Each client waits this long between operations it got an answer to: a read returns its whole
# set, which grows with every append of the epoch, so an unpaced history grows quadratically
# (CI run 51: 234,550 operations, 1 GB to write and check, the chaos test 11 min). Paced, the
# four clients still run through every disruption, hundreds of operations around each.
PACE = 0.02


@dataclass
class Operation:
    client: int
    key: str
    kind: str  # "append" or "read"
    call: int  # monotonic nanoseconds
    value: int = 0
    values: list[int] | None = None
    ret: int | None = None  # None: outcome unknown

    def record(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "key": self.key,
            "kind": self.kind,
            "value": self.value,
            "values": self.values or [],
            "call": self.call,
            "return": self.ret,
        }


def _note(warned: list[str], notice: psycopg.errors.Diagnostic) -> None:
    warned.append(f"{notice.message_primary or ''} {notice.message_detail or ''}")


class History:
    def __init__(self, where: dict[str, Any], clients: int = 4, keys_per_epoch: int = 4) -> None:
        self.where = {
            **where,
            "connect_timeout": "3",
            "autocommit": True,
            # A server that vanished sends no reset: give up on a dead connection in seconds.
            "tcp_user_timeout": "3000",
            "options": "-c statement_timeout=5000",
        }
        self.clients = clients
        self.keys_per_epoch = keys_per_epoch
        self.epoch = 0
        self.operations: list[Operation] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), name=f"history-{n}", daemon=True)
            for n in range(clients)
        ]

    def start(self) -> None:
        with psycopg.connect(**self.where) as connection:
            connection.execute(SCHEMA)
        for thread in self._threads:
            thread.start()

    def stop(self, read_all: bool = True) -> None:
        """Stops the clients; then (`read_all`) reads every set once more, so that a write
        lost in the last disruption is seen missing."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            raise RuntimeError(f"history clients did not stop within 30 s: {stuck}")
        if not read_all:
            return
        with self._lock:
            keys = sorted({op.key for op in self.operations})
        with psycopg.connect(**self.where) as connection:
            for key in keys:
                op = Operation(self.clients, key, "read", time.monotonic_ns())
                row = connection.execute(READ, (key,)).fetchone()
                op.ret = time.monotonic_ns()
                op.values = list(row[0]) if row else []
                self._add(op)

    def next_epoch(self) -> None:
        self.epoch += 1

    def acknowledged(self) -> int:
        """Appends acknowledged so far."""
        with self._lock:
            return sum(1 for op in self.operations if op.kind == "append" and op.ret is not None)

    def longest_pause(self, moment: float) -> float:
        """The longest time without an acknowledged append since `moment` (monotonic), in
        seconds: how long writes stopped."""
        since = int(moment * 1e9)
        with self._lock:
            returns = sorted(
                op.ret for op in self.operations if op.kind == "append" and op.ret and op.ret > since
            )
        moments = [since, *returns]
        return max((b - a for a, b in itertools.pairwise(moments)), default=0) / 1e9

    def _key(self, client: int) -> str:
        return f"e{self.epoch}-c{client % self.keys_per_epoch}"

    def _run(self, client: int) -> None:
        chance = random.Random(client)
        value = 0
        while not self._stop.is_set():
            try:
                connection = psycopg.connect(**self.where)
            except psycopg.Error:
                time.sleep(0.05)  # a client's quick retry
                continue
            warned: list[str] = []
            connection.add_notice_handler(partial(_note, warned))
            with connection:
                while not self._stop.is_set():
                    if chance.random() < 0.5 and client < self.keys_per_epoch:
                        value += 1
                        op = Operation(client, self._key(client), "append", time.monotonic_ns(), value=value)
                        statement: tuple[str, tuple[Any, ...]] = (APPEND, (op.key, value))
                    else:
                        epoch = max(0, self.epoch - chance.randrange(2))  # this one or the one before
                        key = f"e{epoch}-c{chance.randrange(self.keys_per_epoch)}"
                        op = Operation(client, key, "read", time.monotonic_ns())
                        statement = (READ, (key,))
                    warned.clear()
                    try:
                        cursor = connection.execute(*statement)
                        row = cursor.fetchone() if op.kind == "read" else None
                    except (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.QueryCanceled) as error:
                        # Refused before anything was written (a standby behind the Service for
                        # a moment; cancelled before the commit): no effect.
                        if op.kind == "append" and isinstance(error, psycopg.errors.QueryCanceled):
                            self._add(op)  # cancelled while waiting: outcome unknown
                        break
                    except psycopg.Error:
                        if op.kind == "append":
                            self._add(op)  # the answer was lost: outcome unknown
                        break
                    if any(UNREPLICATED in w for w in warned):
                        if op.kind == "append":
                            self._add(op)  # committed here, not known to be anywhere else
                        continue  # a read's: what it saw is not known to be durable
                    op.ret = time.monotonic_ns()
                    if op.kind == "read":
                        op.values = list(row[0]) if row else []
                    self._add(op)
                    self._stop.wait(PACE)

    def _add(self, op: Operation) -> None:
        with self._lock:
            self.operations.append(op)

    def check(self, saved: Path) -> str:
        """Writes the history to `saved` and checks it; the checker's verdict line (raises
        AssertionError with it when the history is not linearizable)."""
        with self._lock:
            lines = "".join(json.dumps(op.record()) + "\n" for op in self.operations)
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(lines)
        return check_file(saved)


def check_file(saved: Path) -> str:
    if not CHECKER.exists():
        raise RuntimeError(f"{CHECKER} is missing: `make testbed-up` builds it")
    with saved.open() as history:
        result = subprocess.run([str(CHECKER)], stdin=history, capture_output=True, text=True, timeout=300)
    verdict = (result.stdout.strip() or result.stderr.strip()).splitlines()[-1:]
    if result.returncode != 0:
        raise AssertionError(f"the history in {saved} is not linearizable: {result.stdout}{result.stderr}")
    return verdict[0] if verdict else ""
