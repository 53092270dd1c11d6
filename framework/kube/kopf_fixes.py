"""A correction to kopf, applied before the operator starts (kopf 1.45, read from its code).

kopf keeps the set of namespaces it watches from a watch on Namespaces. That watch begins, as
every kopf watch does, with a listing whose objects it hands on as events of type None, and
its namespace observer drops those: it has read the namespaces once already, just before. A
namespace created between that first reading and the watch's own listing (an operator just
started, a busy API server), or while the watch starts again after a "410 Gone", is then
never watched: none of its objects reaches a handler, its StatefulSets and pods are missing
from the indexes, until the namespace itself changes. Seen on the test bed: a namespace made
a second after the operator started was ignored until it was deleted.

The correction: listed namespaces count as seen, as the first reading counts them."""

from __future__ import annotations

from typing import Any

from kopf._core.reactor import observation


async def process_namespace_event(*, raw_event: Any, namespaces: Any, insights: Any, **_: Any) -> None:
    """kopf's `process_discovered_namespace_event`, listed namespaces (type None) included."""
    async with insights.revised:
        observation.revise_namespaces(raw_events=[raw_event], insights=insights, namespaces=namespaces)
        insights.revised.notify_all()


def apply() -> None:
    # The observer builds its processor from the module's name when it starts: replaced here,
    # before kopf runs, it is the one used.
    observation.process_discovered_namespace_event = process_namespace_event
