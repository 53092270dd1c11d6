"""Which of a plan's backups to keep: the last N, and the newest of each of the last days,
weeks and months (grandfather-father-son). Pure. The newest verified backup is always kept,
and so is anything not yet ended."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime

from pydantic import Field

from framework.kube.model import ApiModel

FAILED_KEPT = 3  # the latest failures stay, to read why


class RetentionSpec(ApiModel):
    keep_last: int = Field(
        default=3, ge=1, le=1000, description="The newest backups kept, whatever their age."
    )
    daily: int = Field(default=0, ge=0, le=1000, description="The newest backup of each of the last N days.")
    weekly: int = Field(default=0, ge=0, le=1000, description="The newest of each of the last N ISO weeks.")
    monthly: int = Field(default=0, ge=0, le=1000, description="The newest of each of the last N months.")


@dataclass(frozen=True)
class Candidate:
    name: str
    phase: str  # Pending, Running, Completed, Failed
    at: datetime  # when it completed (or was created, while it runs)
    verified: bool = False


def _newest_per_bucket(
    completed: list[Candidate], count: int, bucket: Callable[[datetime], Hashable]
) -> set[str]:
    kept: dict[Hashable, str] = {}
    for backup in completed:  # newest first
        key = bucket(backup.at)
        if key not in kept and len(kept) < count:
            kept[key] = backup.name
    return set(kept.values())


def to_prune(backups: list[Candidate], retention: RetentionSpec) -> list[str]:
    """The names to delete, oldest first."""
    newest_first = sorted(backups, key=lambda b: b.at, reverse=True)
    completed = [b for b in newest_first if b.phase == "Completed"]
    keep = {b.name for b in newest_first if b.phase not in ("Completed", "Failed")}
    keep |= {b.name for b in completed[: retention.keep_last]}
    keep |= _newest_per_bucket(completed, retention.daily, lambda t: t.date())
    keep |= _newest_per_bucket(completed, retention.weekly, lambda t: t.isocalendar()[:2])
    keep |= _newest_per_bucket(completed, retention.monthly, lambda t: (t.year, t.month))
    verified = next((b for b in completed if b.verified), None)
    if verified:
        keep.add(verified.name)
    keep |= {b.name for b in [b for b in newest_first if b.phase == "Failed"][:FAILED_KEPT]}
    return [b.name for b in reversed(newest_first) if b.name not in keep]
