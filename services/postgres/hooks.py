"""The Postgres plugin's rollout hooks (in-process, registered by name)."""

from __future__ import annotations

import base64
import logging

import psycopg
from lightkube.resources.core_v1 import Secret

from framework.api import about
from framework.rollout.hooks import HookCall, register
from services.postgres.plugin import SUPERUSER

log = logging.getLogger("statefleet")


@register("postgres-checkpoint")
async def checkpoint_before_the_primary_goes_down(call: HookCall) -> None:
    """A primary's shutdown writes a checkpoint of everything dirty since the last one; doing
    it now, while it still serves, makes the restart short. Replicas are left alone. Never
    holds a pod back: a server that cannot be reached has nothing to checkpoint."""
    if not call.pod_ip:
        return
    secret = await call.client.get(Secret, SUPERUSER.name(call.rollout), namespace=call.namespace)
    password = base64.b64decode(secret.data["password"]).decode()
    try:
        async with await psycopg.AsyncConnection.connect(
            host=call.pod_ip,
            user="postgres",
            password=password,
            dbname="postgres",
            connect_timeout=5,
            autocommit=True,
        ) as connection:
            in_recovery = (await (await connection.execute("select pg_is_in_recovery()")).fetchone())[0]
            if not in_recovery:
                await connection.execute("checkpoint")
                log.info(
                    "checkpoint on the primary %s before its update",
                    call.pod,
                    extra=about("Postgres", call.namespace, call.rollout),
                )
    except psycopg.OperationalError as error:
        log.info(
            "no checkpoint on %s: %s", call.pod, error, extra=about("Postgres", call.namespace, call.rollout)
        )
