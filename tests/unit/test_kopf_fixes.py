"""The correction to kopf's namespace observation (framework/kopf_fixes.py)."""

from __future__ import annotations

import pytest
from kopf._cogs.structs import references
from kopf._core.reactor import observation

from framework.kube import kopf_fixes

pytestmark = pytest.mark.unit

ORIGINAL = observation.process_discovered_namespace_event


def listed(name: str) -> dict:
    """A namespace as a watch's own listing hands it on: an event of type None."""
    return {"type": None, "object": {"metadata": {"name": name}}}


async def test_a_namespace_only_the_watch_listed_is_watched() -> None:
    insights = references.Insights()
    await kopf_fixes.process_namespace_event(
        raw_event=listed("c0-new"), namespaces=["c0-*"], insights=insights
    )
    await kopf_fixes.process_namespace_event(
        raw_event=listed("other"), namespaces=["c0-*"], insights=insights
    )
    assert insights.namespaces == {"c0-new"}


async def test_kopf_itself_still_drops_it() -> None:
    """When this fails, kopf counts listed namespaces itself: the correction can go."""
    insights = references.Insights()
    await ORIGINAL(raw_event=listed("c0-new"), namespaces=["c0-*"], insights=insights)
    assert insights.namespaces == set()


def test_the_correction_replaces_kopfs_processor() -> None:
    kopf_fixes.apply()
    try:
        assert observation.process_discovered_namespace_event is kopf_fixes.process_namespace_event
    finally:
        observation.process_discovered_namespace_event = ORIGINAL
