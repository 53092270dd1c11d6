"""Status writes: what changed, and the merge patch that writes it. kopf keeps its own progress
under `status.kopf`; it is never ours to compare or write."""

from __future__ import annotations

from typing import Any


def without_kopf(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k != "kopf"}


def status_changed(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    return without_kopf(current) != without_kopf(desired)


def status_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """A merge patch from `current` to `desired`: fields no longer wanted are set to null, in
    nested objects too (a merge patch would keep them)."""
    return {"status": _merge_patch(without_kopf(current), without_kopf(desired))}


def _merge_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """Only what changed: a field resent unchanged would put back what another writer (a second
    operator) changed since `current` was read."""
    patch: dict[str, Any] = {k: None for k in current if k not in desired and current[k] is not None}
    for key, value in desired.items():
        before = current.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            nested = _merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif value != before:
            patch[key] = value
    return patch


def decides(fields: tuple[str, ...], current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Whether a status write changes any of `fields` (a plugin's `decisive_status`)."""
    return any(current.get(field) != desired.get(field) for field in fields)
