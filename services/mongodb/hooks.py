"""The MongoDB plugin's rollout hook: the primary's pod is taken down for its update only
once another member is primary (it is asked to step down, and the rollout waits), so writes
stop for an election of a few seconds, never for a pod's restart."""

from __future__ import annotations

from contextlib import suppress

from pymongo.errors import AutoReconnect

from framework.rollout.hooks import HookCall, InProcess
from services.mongodb.plugin import SERVERS
from services.mongodb.servers import MONGOD, tls_address


class StillPrimary(Exception):
    """The pod's server is still the primary: not now."""


async def step_down_the_primary(call: HookCall) -> None:
    if not call.pod_ip or len(call.pods) < 2:
        return  # alone: nobody to hand over to (FerretDB always is)
    address = tls_address(call.pod_ip, MONGOD)
    hello = await SERVERS.hello(call.client, call.namespace, call.rollout, address)
    if hello is None or not hello.writable_primary or not hello.set_name:
        return  # not answering, or not a primary: nothing to hand over
    with suppress(AutoReconnect):  # a primary stepping down closes its connections
        await SERVERS.command(
            call.client,
            call.namespace,
            call.rollout,
            address,
            {"replSetStepDown": 60, "secondaryCatchUpPeriodSecs": 15},
            timeout_ms=30000,
        )
    raise StillPrimary(f"{call.pod} was asked to step down; waiting for another primary")


# By the names the templates give them.
HOOKS: dict[str, InProcess] = {
    "mongodb-step-down": step_down_the_primary,
}
