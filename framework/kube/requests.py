"""A one-shot request to the operator (a spec field with a fresh token), then its outcome read
from status until it settles: what verbs such as `statefleet pg promote` share."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from lightkube import Client
from lightkube.types import PatchType

# What a request's status says: None while it is not settled; else whether it succeeded, and a line.
Outcome = tuple[bool, str] | None


def request_token(now: datetime | None = None) -> str:
    """A token for a new request: the time it is asked (RFC 3339, to the microsecond)."""
    return (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def request_and_wait(
    kube: Client,
    resource: Any,
    name: str,
    namespace: str | None,
    change: dict[str, Any],
    asked: str,
    outcome: Callable[[dict[str, Any]], Outcome],
    timeout: float,
    progress: Callable[[dict[str, Any]], str | None] = lambda _: None,
    late: str = "not done",
    interval: float = 0.5,
) -> int:
    """Merge-patches `change` into the resource, says `asked`, then reads its status until
    `outcome` settles (exit code 0 or 1) or `timeout` seconds pass (1, saying `late`; 0 seconds:
    not waited for, 0). Each new line `progress` gives is printed on the way."""
    prefix = f"{resource._api_info.resource.kind.lower()}/{name}"  # e.g. <kind>/<name>
    kube.patch(resource, name, change, namespace=namespace, patch_type=PatchType.MERGE)
    print(f"{prefix}: {asked}", flush=True)
    deadline = time.monotonic() + timeout
    said = None
    while time.monotonic() < deadline:
        status = kube.get(resource, name, namespace=namespace).to_dict().get("status") or {}
        settled = outcome(status)
        if settled is not None:
            succeeded, message = settled
            print(f"{prefix}: {message}", flush=True)
            return 0 if succeeded else 1
        line = progress(status)
        if line and line != said:
            print(f"{prefix}: {line}", flush=True)
            said = line
        time.sleep(interval)
    if timeout:
        print(f"{prefix}: {late} after {timeout:.0f} s", flush=True)
        return 1
    return 0
