"""What every plugin reads of an instance's pods and asks of their servers: which pods are
Ready, which life of a pod an answer is from, and one question put to every server at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from framework.kube.pods import incarnation, pod_ip, pod_ready
from framework.plugin import Observed

Answer = TypeVar("Answer")


def lives(observed: Observed) -> dict[str, str]:
    """Pod -> the life of its server (a new pod, or a restarted container, is another life)."""
    return {pod["metadata"]["name"]: incarnation(pod) for pod in observed.pods}


def ready_pods(observed: Observed) -> set[str]:
    return {pod["metadata"]["name"] for pod in observed.pods if pod_ready(pod)}


def ready_of(observed: Observed, count: int) -> int:
    """How many of the pods the spec asks for (ordinals 0 to `count` - 1) are Ready: a pod on
    its way out after a scale-down does not count."""
    return len(ready_pods(observed) & {f"{observed.name}-{ordinal}" for ordinal in range(count)})


@dataclass(frozen=True)
class Answers(Generic[Answer]):
    """What each pod's server said when asked (None: it did not answer), and the life of the
    pod each answer is from."""

    by_pod: dict[str, Answer | None]
    lives: dict[str, str]

    @property
    def answered(self) -> bool:
        return any(answer is not None for answer in self.by_pod.values())

    def current(self, observed: Observed) -> dict[str, Answer | None]:
        """Only the answers from the pods' current lives: one from an earlier life says nothing
        of the server running now."""
        now = lives(observed)
        return {pod: answer for pod, answer in self.by_pod.items() if now.get(pod) == self.lives.get(pod)}


NO_ANSWERS: Answers = Answers({}, {})


async def ask_servers(
    observed: Observed, ask: Callable[[str, str], Awaitable[Answer | None]]
) -> Answers[Answer]:
    """`ask(pod, ip)` of every pod's server at once; a pod without an IP has not answered."""
    addressed = {pod["metadata"]["name"]: pod_ip(pod) for pod in observed.pods}
    asked = {pod: ask(pod, ip) for pod, ip in addressed.items() if ip is not None}
    replies = dict(zip(asked, await asyncio.gather(*asked.values()), strict=True))
    return Answers({pod: replies.get(pod) for pod in addressed}, lives(observed))
