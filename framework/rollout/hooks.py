"""Rollout hooks: calls before a pod is released for its update and after it is back.

HTTP hooks reach anything with an endpoint (Consul's maintenance mode, a load balancer's
drain API); in-process hooks are Python functions a service plugin offers by name (a database
plugin checkpoints before its primary goes down), handed to the controller when it is made. A
hook that fails keeps its pod where it is: the rollout tries again on its next pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx2

from framework.rollout.plan import PodView
from framework.rollout.spec import Hook


@dataclass(frozen=True)
class HookCall:
    moment: str  # beforeTakeDown or afterReady
    namespace: str
    rollout: str
    pod: str
    pod_ip: str
    revision: str  # the revision the pod is going to, or runs now
    client: Any = None  # the operator's Kubernetes client, for in-process hooks
    pods: tuple[PodView, ...] = ()  # every pod of the StatefulSet, as this pass saw them

    @property
    def ordinal(self) -> int:
        return int(self.pod.rsplit("-", 1)[1])


InProcess = Callable[[HookCall], Awaitable[None]]  # raises to say "not now"


def expand(url: str, call: HookCall) -> str:
    values = {
        "POD": call.pod,
        "NAMESPACE": call.namespace,
        "POD_IP": call.pod_ip,
        "ORDINAL": str(call.ordinal),
        "ROLLOUT": call.rollout,
        "REVISION": call.revision,
    }
    for name, value in values.items():
        url = url.replace(f"$({name})", quote(value, safe=""))
    return url


async def run(
    hooks: list[Hook], call: HookCall, http: httpx2.AsyncClient, in_process: Mapping[str, InProcess]
) -> str | None:
    """Runs `hooks` in order (`in_process`: the functions in-process hooks name); the first
    failure, as a message, or None when all passed."""
    for hook in hooks:
        try:
            if hook.http is not None:
                url = expand(hook.http.url, call)
                response = await http.request(hook.http.method, url, timeout=hook.http.timeout_seconds)
                if response.status_code // 100 != 2:
                    where = f"{hook.http.method} {url.split('?')[0]}"
                    return f"{call.moment} hook {where}: HTTP {response.status_code}"
            elif hook.in_process is not None:
                function = in_process.get(hook.in_process.name)
                if function is None:
                    return f"{call.moment} hook {hook.in_process.name!r}: no such in-process hook"
                await function(call)
        except Exception as error:  # the hook's failure holds the pod, never the operator
            return f"{call.moment} hook on {call.pod}: {error}"
    return None
