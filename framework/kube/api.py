"""Small helpers over the Kubernetes API that every controller uses, Events among them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

from framework.kube.meta import API_VERSION, MANAGER

log = logging.getLogger("statefleet")


@dataclass(frozen=True)
class EventNote:
    """An Event to post about the object a controller handles."""

    type: str  # Normal or Warning
    reason: str
    message: str


async def bounded(calls: list[Awaitable[Any]], at_once: int) -> None:
    """Runs `calls` with at most `at_once` in flight."""
    gate = asyncio.Semaphore(at_once)

    async def one(call: Awaitable[Any]) -> None:
        async with gate:
            await call

    await asyncio.gather(*(one(call) for call in calls))


def about(kind: str, namespace: str, name: str, api_version: str = API_VERSION) -> dict[str, Any]:
    """`extra` for a log line about one object: JSON logs carry it as `object`, as kopf's do."""
    return {"k8s_ref": {"apiVersion": api_version, "kind": kind, "namespace": namespace, "name": name}}


def not_found(error: Exception) -> bool:
    """A 404: the object does not exist, or its API is not served (a CRD not installed, which
    the client raises as a plain HTTP error, with no Status to read)."""
    if isinstance(error, ApiError):
        return error.status.code == 404
    return getattr(getattr(error, "response", None), "status_code", None) == 404


async def get_or_none(client: AsyncClient, resource: Any, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        return (await client.get(resource, name, namespace=namespace)).to_dict()
    except Exception as error:
        if not_found(error):
            return None
        raise


async def post_event(client: AsyncClient, kind: str, body: dict[str, Any], note: EventNote) -> None:
    """A core v1 Event about `body`, logged too (the log line names the object)."""
    meta = body["metadata"]
    log.log(
        logging.WARNING if note.type == "Warning" else logging.INFO,
        "%s: %s",
        note.reason,
        note.message,
        extra=about(kind, meta["namespace"], meta["name"]),
    )
    now = datetime.now(UTC)
    event = Event(
        metadata=ObjectMeta(generateName=f"{meta['name']}.", namespace=meta["namespace"]),
        involvedObject=ObjectReference(
            apiVersion=API_VERSION, kind=kind, name=meta["name"], namespace=meta["namespace"], uid=meta["uid"]
        ),
        reason=note.reason,
        message=note.message,
        type=note.type,
        source=EventSource(component=MANAGER),
        reportingComponent=MANAGER,
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
    )
    try:
        await client.create(event)
    except ApiError as error:
        # A namespace being deleted takes no new objects: nobody would read the Event anyway.
        if error.status.code != 403 or "being terminated" not in (error.status.message or ""):
            raise


def _moment(text: str | None) -> datetime | None:
    """An Event's time: seconds (lastTimestamp) or microseconds (eventTime) in RFC 3339."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def refusal(events: list[dict[str, Any]], since: str | None) -> str | None:
    """Pure: the message of the newest FailedCreate Event among `events` (a controller's, about
    the pods it could not create) seen after `since` (when its newest pod was made; None: it
    has none), or None."""
    after = _moment(since)
    newest: tuple[datetime, str] | None = None
    for event in events:
        if event.get("reason") != "FailedCreate":
            continue
        seen = _moment(
            (event.get("series") or {}).get("lastObservedTime")
            or event.get("lastTimestamp")
            or event.get("eventTime")
            or event.get("firstTimestamp")
        )
        if seen is None or (after is not None and seen < after):
            continue
        if newest is None or seen >= newest[0]:
            newest = (seen, event.get("message") or "")
    return newest[1] if newest else None


async def pods_refused(
    client: AsyncClient, namespace: str, kind: str, name: str, since: str | None
) -> str | None:
    """Why the API refuses to create the pods of a StatefulSet or Job (admission, a quota), as
    its controller's newest FailedCreate Event after `since` says; None when nothing does."""
    fields = {"involvedObject.kind": kind, "involvedObject.name": name, "reason": "FailedCreate"}
    events = [event.to_dict() async for event in client.list(Event, namespace=namespace, fields=fields)]
    return refusal(events, since)
