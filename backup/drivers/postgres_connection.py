"""How a backup Job reaches its instance: through `<name>-rw`, from the environment (PGHOST,
PGUSER, PGPASSWORD...), retried while nothing answers yet. An instance that just became ready
may not be behind its Service for a few seconds (the endpoints follow the pod's role label,
then kube-proxy follows the endpoints): a Job runs once, so it waits for them rather than
failing the backup or restore."""

from __future__ import annotations

import time

import psycopg

SETTLE_SECONDS = 90.0


def connect(dbname: str = "postgres", application_name: str = "statefleet-backup") -> psycopg.Connection:
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        try:
            return psycopg.connect(
                dbname=dbname, autocommit=True, connect_timeout=10, application_name=application_name
            )
        except psycopg.OperationalError as error:
            unreachable = "Connection refused" in str(error) or "timeout expired" in str(error)
            if not unreachable or time.monotonic() > deadline:
                raise
            time.sleep(1)
