"""Where a rollout may make the operator send requests (analysis, hooks, notifications): hosts
that match the operator's allow-list (`--allowed-destination`, the chart's
`outbound.allowedDestinations`; by default the cluster's own Services). Whoever may create a
rollout may otherwise point the operator at any address it reaches (a cloud's metadata
service, a database's admin port).

The same list is checked three times: at admission (the chart's ValidatingAdmissionPolicy,
for the URLs written in a spec), by the plan (a spec whose URL is not allowed is InvalidSpec,
naming the field, for an operator installed without the chart's policy), and before every
request (URLs read from Secrets; redirects are never followed)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx2

# In-cluster Services by their DNS names (service.namespace.svc[.cluster.local]).
IN_CLUSTER = ("*.svc", "*.svc.cluster.local")


class DestinationRefused(Exception):
    """A request to a host the allow-list does not name (raised before any connection)."""


def host_of(url: str) -> str:
    return (urlsplit(url).hostname or "").lower().rstrip(".")


def allowed(url: str, patterns: Iterable[str]) -> bool:
    """Whether `url`'s host matches one of `patterns` (shell globs on the host name or
    address, `*` alone: anywhere)."""
    host = host_of(url)
    return bool(host) and any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in patterns)


def refusal(field: str, url: str, patterns: Sequence[str]) -> str | None:
    """The message that refuses `url` in `field`, or None when it may be reached. A host still
    to be filled in (`$(POD_IP)`) is known only when the request is made, and checked then."""
    if allowed(url, patterns) or "$(" in (urlsplit(url).netloc or ""):
        return None
    host = host_of(url) or "(no host)"
    return f"{field}: {host} is not an allowed destination (allowed: {', '.join(patterns)})"


def refused_destinations(spec: dict[str, Any], patterns: Sequence[str]) -> list[str]:
    """Pure: why the URLs written in a rollout's spec (as stored: camelCase) may not be
    reached, each naming its field."""
    found: list[tuple[str, str]] = []
    strategy = spec.get("strategy") or {}
    for index, step in enumerate(strategy.get("steps") or []):
        analysis = (step or {}).get("analysis") or {}
        if (analysis.get("http") or {}).get("url"):
            found.append((f"spec.strategy.steps[{index}].analysis.http.url", analysis["http"]["url"]))
        if (analysis.get("prometheus") or {}).get("address"):
            found.append(
                (
                    f"spec.strategy.steps[{index}].analysis.prometheus.address",
                    analysis["prometheus"]["address"],
                )
            )
    for moment, hooks in (strategy.get("hooks") or {}).items():
        for index, hook in enumerate(hooks or []):
            if ((hook or {}).get("http") or {}).get("url"):
                found.append((f"spec.strategy.hooks.{moment}[{index}].http.url", hook["http"]["url"]))
    for index, webhook in enumerate((spec.get("notifications") or {}).get("webhooks") or []):
        if (webhook or {}).get("url"):
            found.append((f"spec.notifications.webhooks[{index}].url", webhook["url"]))
    return [message for field, url in found if (message := refusal(field, url, patterns))]


def guarded_client(patterns: Sequence[str], **options: Any) -> httpx2.AsyncClient:
    """An HTTP client that refuses, before connecting, every request to a host the allow-list
    does not name, and follows no redirect (which could lead anywhere)."""

    async def check(request: httpx2.Request) -> None:
        url = str(request.url)
        if not allowed(url, patterns):
            raise DestinationRefused(
                f"{host_of(url)} is not an allowed destination (allowed: {', '.join(patterns)})"
            )

    return httpx2.AsyncClient(event_hooks={"request": [check]}, follow_redirects=False, **options)
