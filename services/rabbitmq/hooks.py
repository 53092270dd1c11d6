"""The RabbitMQ plugin's rollout hook: a node is taken down for its update only once no
quorum queue would lose its majority without it (the management API's
node-is-quorum-critical check), so a rollout never makes a queue unavailable."""

from __future__ import annotations

from framework.rollout.hooks import HookCall, InProcess
from services.rabbitmq.plugin import MANAGEMENT


async def wait_until_not_quorum_critical(call: HookCall) -> None:
    others = [pod for pod in call.pods if pod.name != call.pod]
    if not others or not call.pod_ip:
        return  # a single node, or one without an address: nothing more to lose
    this = next((pod for pod in call.pods if pod.name == call.pod), None)
    if this is not None and this.ready_since is None:
        return  # already out of service: taking it down makes no queue lose a member it has
    await MANAGEMENT.not_quorum_critical(call.client, call.namespace, call.rollout, call.pod_ip)


# By the names the templates give them.
HOOKS: dict[str, InProcess] = {
    "rabbitmq-not-quorum-critical": wait_until_not_quorum_critical,
}
