"""Prometheus metrics, all prefixed `statefleet_`, served on their own port."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter(
    "statefleet_reconcile_total", "Reconciles of a resource, by kind and result", ["kind", "result"]
)
RECONCILE_SECONDS = Histogram(
    "statefleet_reconcile_duration_seconds",
    "Time of one reconcile, from observing to writing status",
    ["kind"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CHILD_APPLIES = Counter(
    "statefleet_child_applies_total", "Children applied (server-side apply)", ["kind", "child"]
)
API_REQUESTS = Counter(
    "statefleet_api_requests_total", "Requests to the Kubernetes API (watches excepted), by verb", ["verb"]
)
ROLLOUT_PODS_TAKEN_DOWN = Counter(
    "statefleet_rollout_pods_taken_down_total",
    "Pods a StatefulsetRollout took down to update or roll them back, by how (evicted, deleted)",
    ["how"],
)
ROLLOUT_EVENTS = Counter(
    "statefleet_rollout_events_total", "StatefulsetRollout transitions (Events posted), by reason", ["reason"]
)
READY = Gauge("statefleet_resources_ready", "Resources whose Ready condition is True, by kind", ["kind"])
NOT_READY = Gauge(
    "statefleet_resources_not_ready", "Resources whose Ready condition is not True, by kind", ["kind"]
)


@contextmanager
def timed_reconcile(kind: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    except BaseException:
        RECONCILES.labels(kind, "error").inc()
        raise
    else:
        RECONCILES.labels(kind, "ok").inc()
    finally:
        RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - started)


def count_api_requests(client: Any) -> None:
    """Counts every request a lightkube client sends, through its HTTP client's event hooks."""
    http = getattr(getattr(client, "_client", None), "_client", None)
    hooks = getattr(http, "event_hooks", None)
    if hooks is None:
        return  # another lightkube layout: the metric stays at zero rather than breaking the operator

    async def count(request: Any) -> None:
        API_REQUESTS.labels(request.method).inc()

    hooks["request"] = [*hooks.get("request", []), count]


def serve(port: int) -> None:
    """Serves /metrics from a thread of its own: nothing runs on the operator's event loop."""
    start_http_server(port)
