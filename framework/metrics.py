"""Prometheus metrics, all prefixed `statefleet_`, served on their own port."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

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


def serve(port: int) -> None:
    """Serves /metrics from a thread of its own: nothing runs on the operator's event loop."""
    start_http_server(port)
