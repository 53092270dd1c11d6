"""One reconcile at a time per object, driven by re-queuing.

Every controller hands its work function to a `WorkQueue`. Events ask for a pass (`process`
now, or `soon` to fold a burst into one); a pass asked for during another one makes it go
round once more rather than run beside it; a pass that fails is retried after 2, 4, 8 ...
60 s, never hot and never forgotten; a pass may ask to be run again after some seconds (a
pause that ends, a pod that becomes available), and only the earliest such wake-up is kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

log = logging.getLogger("statefleet")

# (key, thorough) -> seconds until the next pass is wanted, or None
Work = Callable[[Any, bool], Awaitable[float | None]]


class WorkQueue:
    def __init__(self, work: Work, describe: Callable[[Any], dict[str, Any]], workers: int = 16) -> None:
        self._work = work
        self._describe = describe  # log `extra` naming the key's object
        # Passes in flight at once: a burst of hundreds of new objects would otherwise hold
        # hundreds of bodies and responses at the same moment, for no gain (the API server
        # is the bottleneck) and at a lasting cost (freed memory does not go back to the OS).
        self._workers = asyncio.Semaphore(workers)
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self._dirty: dict[Hashable, bool] = {}  # key -> a thorough pass was asked for
        self._failures: dict[Hashable, int] = {}
        self._scheduled: set[Hashable] = set()
        self._wakeups: dict[Hashable, asyncio.TimerHandle] = {}
        self._background: set[asyncio.Future[None]] = set()

    async def process(self, key: Hashable, thorough: bool = False) -> None:
        lock = self._locks.setdefault(key, asyncio.Lock())
        if lock.locked():
            self._dirty[key] = self._dirty.get(key, False) or thorough  # the running pass goes round again
            return
        async with lock:
            while True:
                thorough = self._dirty.pop(key, False) or thorough
                try:
                    async with self._workers:
                        again = await self._work(key, thorough)
                except Exception:
                    self._retry_later(key)
                    return
                self._failures.pop(key, None)
                if again is not None:
                    self.after(key, again)
                if key not in self._dirty:
                    return
                thorough = False

    def soon(self, key: Hashable, delay: float = 0.5) -> None:
        """One pass for a burst of events: the first schedules it, the others within `delay` join it."""
        if key in self._scheduled:
            return
        self._scheduled.add(key)

        async def later() -> None:
            await asyncio.sleep(delay)
            self._scheduled.discard(key)
            await self.process(key)

        self._keep(asyncio.ensure_future(later()))

    def after(self, key: Hashable, seconds: float) -> None:
        """A pass in `seconds`, unless one is already due earlier."""
        loop = asyncio.get_running_loop()
        due = loop.time() + seconds
        existing = self._wakeups.get(key)
        if existing is not None and not existing.cancelled() and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()

        def wake() -> None:
            self._wakeups.pop(key, None)
            self._keep(asyncio.ensure_future(self.process(key)))

        self._wakeups[key] = loop.call_at(due, wake)

    def forget(self, key: Hashable) -> None:
        self._locks.pop(key, None)
        self._failures.pop(key, None)
        wakeup = self._wakeups.pop(key, None)
        if wakeup is not None:
            wakeup.cancel()

    def _keep(self, task: asyncio.Future[None]) -> None:
        self._background.add(task)  # a task nobody references may be collected mid-flight
        task.add_done_callback(self._background.discard)

    def _retry_later(self, key: Hashable) -> None:
        attempt = self._failures.get(key, 0) + 1
        self._failures[key] = attempt
        delay = min(60, 2**attempt)
        log.exception(
            "reconcile failed (attempt %d); retry in %ss", attempt, delay, extra=self._describe(key)
        )
        self.after(key, delay)
