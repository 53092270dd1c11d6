"""The work queue: one pass at a time per object, bursts folded, a bounded number in flight."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from framework.kube.queue import WorkQueue

pytestmark = pytest.mark.unit


def describe(key: Any) -> dict[str, Any]:
    return {}


def test_passes_of_one_key_never_overlap_and_a_burst_folds_into_one_rerun() -> None:
    passes: list[str] = []
    running: set[str] = set()

    async def work(key: str, thorough: bool) -> None:
        assert key not in running, "two passes of one key at once"
        running.add(key)
        passes.append(key)
        await asyncio.sleep(0.05)
        running.discard(key)

    async def scenario() -> None:
        queue = WorkQueue(work, describe)
        # The first starts; the four that arrive during it fold into a single rerun.
        await asyncio.gather(*(queue.process("a") for _ in range(5)))

    asyncio.run(scenario())
    assert passes == ["a", "a"]


def test_no_more_passes_in_flight_than_workers() -> None:
    in_flight = 0
    most = 0

    async def work(key: int, thorough: bool) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1

    async def scenario() -> None:
        queue = WorkQueue(work, describe, workers=4)
        await asyncio.gather(*(queue.process(key) for key in range(40)))

    asyncio.run(scenario())
    assert most == 4


def test_a_failed_pass_is_retried_later_not_at_once() -> None:
    attempts: list[float] = []

    async def work(key: str, thorough: bool) -> None:
        attempts.append(asyncio.get_running_loop().time())
        if len(attempts) == 1:
            raise RuntimeError("the API server said no")

    async def scenario() -> None:
        queue = WorkQueue(work, describe)
        await queue.process("a")
        await asyncio.sleep(2.3)

    asyncio.run(scenario())
    assert len(attempts) == 2
    assert 1.9 <= attempts[1] - attempts[0] <= 2.5  # the first retry waits 2 s


def test_a_thorough_request_during_a_pass_makes_the_rerun_thorough() -> None:
    seen: list[bool] = []

    async def work(key: str, thorough: bool) -> None:
        seen.append(thorough)
        await asyncio.sleep(0.05)

    async def scenario() -> None:
        queue = WorkQueue(work, describe)
        first = asyncio.ensure_future(queue.process("a"))
        await asyncio.sleep(0.01)
        await queue.process("a", thorough=True)
        await first

    asyncio.run(scenario())
    assert seen == [False, True]
