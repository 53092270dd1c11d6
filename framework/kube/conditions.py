"""Status conditions as the Kubernetes API conventions define them.

Pure functions over plain lists of dicts, so a reconcile computes the whole status and
writes it once. `lastTransitionTime` moves only when a condition's status changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from framework.kube.times import now_text

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool | None  # None: Unknown (not known yet, or cannot be told)
    reason: str
    message: str = ""

    def as_status(self) -> str:
        return "Unknown" if self.status is None else "True" if self.status else "False"


def merge_conditions(
    current: list[dict[str, Any]] | None,
    updates: list[Condition],
    generation: int,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """The conditions after `updates`, keeping the others and each unchanged transition time."""
    stamp = now or now_text()
    by_type = {c["type"]: dict(c) for c in current or []}
    for update in updates:
        previous = by_type.get(update.type)
        changed = previous is None or previous.get("status") != update.as_status()
        by_type[update.type] = {
            "type": update.type,
            "status": update.as_status(),
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": stamp if changed else previous["lastTransitionTime"],
            "observedGeneration": generation,
        }
    order = {READY: 0, PROGRESSING: 1, DEGRADED: 2}
    return sorted(by_type.values(), key=lambda c: (order.get(c["type"], 9), c["type"]))


def find(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


# The OpenAPI schema of `status.conditions`, for every CRD.
SCHEMA: dict[str, Any] = {
    "type": "array",
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
    "items": {
        "type": "object",
        "required": ["type", "status", "lastTransitionTime", "reason", "message"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64"},
        },
    },
}
