"""A client that commits numbered rows through `<name>-rw` while the tests disturb the
primary: what it saw acknowledged is what must survive."""

from __future__ import annotations

import itertools
import threading
import time

import psycopg
from lightkube import Client

from e2e.test_postgres import connect

INSERT = (
    "insert into ticks values (%s) returning inet_server_addr()::text || '@' || pg_postmaster_start_time()"
)


class Writer:
    """Commits 1, 2, 3 ... into `ticks`, one row per transaction, through `demo-rw`, as a
    client that reconnects at once would; remembers when each was acknowledged."""

    def __init__(self, kube: Client, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.acknowledged: list[tuple[int, float]] = []
        self.servers: list[str] = []  # beside each acknowledged commit: the server life that took it
        self.lost: set[int] = set()  # acknowledged commits found missing (a benchmark's tally)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def first_after(self, moment: float, not_by: str | None = None) -> float | None:
        """When the first commit after `moment` was acknowledged, by a server life other than
        `not_by` (a killed server's backends may still acknowledge a commit or two)."""
        if not self._thread.is_alive():
            raise RuntimeError("the writer stopped (see the traceback above)")
        pairs = zip(self.acknowledged, self.servers, strict=False)
        return next((at for (_, at), server in pairs if at > moment and server != not_by), None)

    def last_server(self) -> str | None:
        return self.servers[-1] if self.servers else None

    def _run(self) -> None:
        # Where and who, read once: the writer thread makes no API request of its own.
        with connect(self.kube, self.namespace, "demo-rw", "demo-superuser") as first:
            where = {
                **first.info.get_parameters(),
                "password": first.info.password,
                "connect_timeout": "3",
                # A server that vanished (its pod deleted without grace) sends no reset: without
                # this, a commit waits on the dead connection for as long as TCP retries (minutes).
                "tcp_user_timeout": "3000",
            }
        value = 1
        while not self._stop.is_set():
            try:
                with psycopg.connect(**where, autocommit=True) as conn:
                    conn.execute("set statement_timeout = '5s'")
                    while not self._stop.is_set():
                        # Which server acknowledged it: its address and the start of its life.
                        try:
                            row = conn.execute(INSERT, (value,)).fetchone()
                        except psycopg.errors.UniqueViolation:
                            # Committed, but the server died before saying so: the next one
                            # (unacknowledged, so never counted as lost either).
                            value += 1
                            continue
                        self.acknowledged.append((value, time.monotonic()))
                        self.servers.append(row[0] if row else "")
                        value += 1
            except psycopg.Error:
                time.sleep(0.05)  # a client's quick retry

    def longest_pause(self, since: float) -> float:
        """The longest time without an acknowledged commit, from `since` until now."""
        moments = [since] + [at for _, at in self.acknowledged if at > since] + [time.monotonic()]
        return max(later - earlier for earlier, later in itertools.pairwise(moments))
