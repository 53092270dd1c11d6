"""How a backup Job reaches its instance: through `<name>-rw`, from the environment (PGHOST,
PGUSER, PGPASSWORD...), retried while nothing answers yet. An instance that just became ready
may not be behind its Service for a few seconds (the endpoints follow the pod's role label,
then kube-proxy follows the endpoints): a Job runs once, so it waits for them rather than
failing the backup or restore. The same goes for the client programs (pg_dump, pg_dumpall,
pg_basebackup): one that could not connect is started again (`CommandOutput`)."""

from __future__ import annotations

import time

import psycopg

SETTLE_SECONDS = 90.0


def unreachable(message: str) -> bool:
    """Nothing behind the Service answered (yet): worth trying again, unlike a refused login."""
    return "Connection refused" in message or "timeout expired" in message


def connect(dbname: str = "postgres", application_name: str = "statefleet-backup") -> psycopg.Connection:
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        try:
            return psycopg.connect(
                dbname=dbname, autocommit=True, connect_timeout=10, application_name=application_name
            )
        except psycopg.OperationalError as error:
            if not unreachable(str(error)) or time.monotonic() > deadline:
                raise
            time.sleep(1)
