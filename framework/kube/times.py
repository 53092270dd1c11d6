"""Times as the Kubernetes API writes them, in every status field and condition of ours: RFC 3339
in UTC, to the second (`2026-12-03T16:21:10Z`)."""

from __future__ import annotations

from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(moment: datetime | float) -> str:
    """A datetime (any zone) or epoch seconds, as the API writes times."""
    when = datetime.fromtimestamp(moment, UTC) if isinstance(moment, int | float) else moment.astimezone(UTC)
    return when.strftime(FORMAT)


def now_text() -> str:
    return format_time(datetime.now(UTC))


def parse_time(text: str | None) -> datetime | None:
    """A time the API wrote (None for none)."""
    return datetime.strptime(text, FORMAT).replace(tzinfo=UTC) if text else None


def seconds_between(start: str | None, end: str | None) -> float | None:
    first, last = parse_time(start), parse_time(end)
    return (last - first).total_seconds() if first and last else None
