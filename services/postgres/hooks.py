"""The Postgres plugin's rollout hooks (in-process, registered by name), run before each pod
is released for its update.

A rollout updates the highest ordinals first and ordinal 0 last. The primary must be the
last pod updated, after its standbys: when it is elsewhere (a failover moved it), the
`postgres-primary-last` hook holds the rollout and asks for a switchover to ordinal 0 first.
When the primary's own turn comes, its eviction is its switchover: the server stops cleanly
(after the `postgres-checkpoint` hook made that quick), its last WAL reaches the standbys, and
the operator promotes the most advanced, all of them already updated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from lightkube.types import PatchType

from framework.kube.api import about
from framework.rollout.hooks import HookCall, InProcess
from framework.rollout.plan import PodView
from services.postgres.plugin import SERVERS, PostgresPlugin
from services.postgres.primary import ordinal

log = logging.getLogger("statefleet")
POSTGRES = PostgresPlugin.resource()


class NotNow(Exception):
    """Holds the pod: the rollout asks again on its next pass."""


@dataclass(frozen=True)
class Hold:
    message: str
    request: str | None  # a switchover request to record (status.switchover.rollout)


def primary_last(name: str, status: dict[str, Any], pods: tuple[PodView, ...], revision: str) -> Hold | None:
    """Whether a rollout to `revision` must wait, and the switchover that lets it go on.

    Holds while the primary changes, and while the primary is a ready pod above ordinal 0 not
    yet updated: then ordinal 0, if it is ready, is asked to take over. Never holds for ever:
    a refused request (status.switchover.rolloutServed) or a primary that is down lets the
    rollout go on, the primary then updated in its ordinal's turn."""
    primary = status.get("currentPrimary") or f"{name}-0"
    target = status.get("targetPrimary")
    if target and target != primary:
        return Hold(f"the primary is moving from {primary} to {target}", None)
    if ordinal(primary) == 0:
        return None
    by_name = {pod.name: pod for pod in pods}
    current, last = by_name.get(primary), by_name.get(f"{name}-0")
    if current is None or current.ready_since is None or current.terminating or current.revision == revision:
        return None
    if last is None or last.ready_since is None or last.terminating:
        return None
    request = f"{name}-0@{revision}"
    switchover = status.get("switchover") or {}
    if switchover.get("rolloutServed") == request:
        return None  # served: refused if the primary is still elsewhere
    message = f"switching the primary over from {primary} to {name}-0, the pod updated last"
    return Hold(message, None if switchover.get("rollout") == request else request)


async def switch_over_to_the_last_pod_first(call: HookCall) -> None:
    postgres = await call.client.get(POSTGRES, call.rollout, namespace=call.namespace)
    hold = primary_last(call.rollout, postgres.status or {}, call.pods, call.revision)
    if hold is None:
        return
    if hold.request:
        await call.client.patch(
            POSTGRES.Status,
            call.rollout,
            {"status": {"switchover": {"rollout": hold.request}}},
            namespace=call.namespace,
            patch_type=PatchType.MERGE,
        )
        log.info("%s", hold.message, extra=about("Postgres", call.namespace, call.rollout))
    raise NotNow(hold.message)


async def checkpoint_before_the_primary_goes_down(call: HookCall) -> None:
    """A primary's shutdown writes a checkpoint of everything dirty since the last one; doing
    it now, while it still serves, makes the stop (and so the switchover) short. Replicas are
    left alone. Never holds a pod back: a server that cannot be reached has nothing to
    checkpoint."""
    if not call.pod_ip:
        return
    try:
        if await SERVERS.checkpoint(call.client, call.namespace, call.rollout, call.pod_ip):
            log.info(
                "checkpoint on the primary %s before its update",
                call.pod,
                extra=about("Postgres", call.namespace, call.rollout),
            )
    except (OSError, TimeoutError, psycopg.Error) as error:
        log.info(
            "no checkpoint on %s: %s", call.pod, error, extra=about("Postgres", call.namespace, call.rollout)
        )


# By the names the templates give them.
HOOKS: dict[str, InProcess] = {
    "postgres-primary-last": switch_over_to_the_last_pod_first,
    "postgres-checkpoint": checkpoint_before_the_primary_goes_down,
}
