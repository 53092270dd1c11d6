"""What every controller of ours does the same way: write status only when it changed, know the
echo of its own write when the watch brings it back, and list everything again now and then."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.types import PatchType

from framework.kube.status import status_changed, status_patch

log = logging.getLogger("statefleet")

Key = TypeVar("Key", bound=Hashable)


class StaleStatus(Exception):
    """The object changed since the status being replaced was read: the decision is stale."""


class StatusWriter(Generic[Key]):
    """Writes objects' status as merge patches, and remembers the resourceVersion each write
    made: the watch event that carries it back is our own echo, not news."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self._written: dict[Key, str] = {}

    def is_echo(self, key: Key, body: dict[str, Any]) -> bool:
        return self._written.get(key) == body["metadata"].get("resourceVersion")

    def forget(self, key: Key) -> None:
        self._written.pop(key, None)

    async def write(
        self,
        key: Key,
        resource: Any,
        body: dict[str, Any],
        current: dict[str, Any],
        desired: dict[str, Any],
        gone_ok: bool = False,
        precondition: bool = False,
    ) -> None:
        """`desired` over `current` (the status `body` was read with), if anything changed.
        `gone_ok`: an object deleted meanwhile is no error. `precondition`: only over `body`'s
        resourceVersion, else `StaleStatus`."""
        if not status_changed(current, desired):
            return
        meta = body["metadata"]
        patch = status_patch(current, desired)
        if precondition:
            patch["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        try:
            written = await self.client.patch(
                resource.Status, meta["name"], patch, namespace=meta["namespace"], patch_type=PatchType.MERGE
            )
        except ApiError as error:
            if gone_ok and error.status.code == 404:
                return
            if precondition and error.status.code == 409:
                raise StaleStatus(
                    f"{meta['name']} changed since resourceVersion {meta['resourceVersion']}"
                ) from error
            raise
        self._written[key] = written.metadata.resourceVersion


def watched(namespace: str, patterns: Iterable[str]) -> bool:
    """Whether an operator told to watch `patterns` (none: all) watches `namespace`."""
    patterns = list(patterns)
    return not patterns or any(fnmatch.fnmatchcase(namespace, pattern) for pattern in patterns)


def listed_namespaces(patterns: Iterable[str]) -> list[str]:
    """Where to list what an operator told to watch `patterns` watches: each namespace when
    every pattern names one (an operator granted namespaced Roles only may list nothing
    cluster-wide), else the whole cluster (`*`), filtered afterwards with `watched`."""
    patterns = list(patterns)
    if patterns and not any(char in pattern for pattern in patterns for char in "*?[!"):
        return patterns
    return ["*"]


async def resync_forever(
    client: AsyncClient,
    resources: dict[str, Any],
    namespaces: list[str],
    interval: float,
    again: Callable[[str, str, str], Awaitable[None] | None],
    ready: Callable[[], bool] = lambda: True,
) -> None:
    """Every `interval` seconds, `again(what, namespace, name)` for every object of `resources`
    (what -> lightkube class) in the watched namespaces: it retries what failed and repairs what
    no event announced (a child edited by hand). Ours rather than kopf's timers, which would put
    a finalizer on every object. Skipped while not `ready()`."""
    while True:
        await asyncio.sleep(interval)
        if not ready():
            continue
        for what, resource in resources.items():
            for listed in listed_namespaces(namespaces):
                try:
                    async for item in client.list(resource, namespace=listed):
                        if watched(item.metadata.namespace, namespaces):
                            result = again(what, item.metadata.namespace, item.metadata.name)
                            if result is not None:
                                await result
                except Exception:
                    log.exception("resync of %s in %s failed; next in %ss", what, listed, interval)
