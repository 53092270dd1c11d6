"""The Postgres rollout hook that keeps the primary for last: its decision from observed state."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from framework.rollout.plan import PodView
from services.postgres.hooks import Hold, primary_last

pytestmark = pytest.mark.unit

OLD, NEW = "rev1", "rev2"
SINCE = datetime(2026, 1, 1, tzinfo=UTC)


def pods(*revisions: str, not_ready: tuple[int, ...] = ()) -> tuple[PodView, ...]:
    return tuple(
        PodView(f"demo-{i}", i, revision, None if i in not_ready else SINCE, False, "")
        for i, revision in enumerate(revisions)
    )


def test_a_primary_at_ordinal_0_is_updated_last_without_holding_anything() -> None:
    assert primary_last("demo", {"currentPrimary": "demo-0"}, pods(OLD, OLD, OLD), NEW) is None


def test_a_primary_elsewhere_is_first_switched_over_to_ordinal_0() -> None:
    hold = primary_last("demo", {"currentPrimary": "demo-1"}, pods(OLD, OLD, OLD), NEW)
    assert hold == Hold(
        "switching the primary over from demo-1 to demo-0, the pod updated last", "demo-0@rev2"
    )
    # Asked already: it waits without asking again.
    status = {"currentPrimary": "demo-1", "switchover": {"rollout": "demo-0@rev2"}}
    hold = primary_last("demo", status, pods(OLD, OLD, OLD), NEW)
    assert hold is not None
    assert hold.request is None
    # While the primary moves, every pod waits.
    moving = {**status, "targetPrimary": "demo-0"}
    assert primary_last("demo", moving, pods(OLD, OLD, OLD), NEW) == Hold(
        "the primary is moving from demo-1 to demo-0", None
    )
    # Done: demo-0 is the primary.
    done = {
        "currentPrimary": "demo-0",
        "switchover": {"rollout": "demo-0@rev2", "rolloutServed": "demo-0@rev2"},
    }
    assert primary_last("demo", done, pods(OLD, OLD, OLD), NEW) is None


def test_never_held_for_ever() -> None:
    # The request was refused (demo-0 was no ready standby): the primary goes in its turn.
    refused = {
        "currentPrimary": "demo-1",
        "switchover": {"rollout": "demo-0@rev2", "rolloutServed": "demo-0@rev2"},
    }
    assert primary_last("demo", refused, pods(OLD, OLD, OLD), NEW) is None
    # A primary that is down is not protected: the update may be what brings it back.
    assert (
        primary_last("demo", {"currentPrimary": "demo-1"}, pods(OLD, OLD, OLD, not_ready=(1,)), NEW) is None
    )
    # Nobody to take over at ordinal 0.
    assert (
        primary_last("demo", {"currentPrimary": "demo-1"}, pods(OLD, OLD, OLD, not_ready=(0,)), NEW) is None
    )
    # A primary updated already (a failover to an updated pod) stays where it is.
    assert primary_last("demo", {"currentPrimary": "demo-2"}, pods(OLD, OLD, NEW), NEW) is None


def test_a_new_rollout_asks_again() -> None:
    status = {
        "currentPrimary": "demo-1",
        "switchover": {"rollout": "demo-0@rev2", "rolloutServed": "demo-0@rev2"},
    }
    hold = primary_last("demo", status, pods(NEW, NEW, NEW), "rev3")
    assert hold is not None
    assert hold.request == "demo-0@rev3"
