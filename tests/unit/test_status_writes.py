"""Which status writes carry a precondition, and what a status patch removes."""

from __future__ import annotations

import pytest

from framework.kube.status import decides, status_patch
from services.postgres import PLUGIN

pytestmark = pytest.mark.unit


def test_only_a_change_of_who_serves_is_decisive() -> None:
    fields = PLUGIN.decisive_status
    serving = {"currentPrimary": "demo-0", "readyInstances": 3}
    assert not decides(fields, serving, {**serving, "readyInstances": 2})
    assert decides(fields, serving, {**serving, "targetPrimary": "demo-1"})
    assert decides(fields, serving, {**serving, "failover": {"promoting": "demo-1"}})
    assert not decides((), serving, {"currentPrimary": "demo-1"})  # a plugin that names none


def test_a_patch_removes_what_is_no_longer_wanted_in_nested_objects_too() -> None:
    patch = status_patch(
        {"failover": {"waiting": "x", "to": "demo-1"}, "old": 1}, {"failover": {"to": "demo-1"}}
    )
    assert patch == {"status": {"failover": {"waiting": None}, "old": None}}


def test_a_patch_sends_only_what_changed_so_it_cannot_undo_another_writers_change() -> None:
    # Read before another operator completed a failover: resending currentPrimary or the
    # failover's other fields would put the old primary back.
    read = {"currentPrimary": "demo-0", "failover": {"to": "demo-1", "from": "demo-0"}, "readyInstances": 3}
    patch = status_patch(read, {**read, "readyInstances": 2})
    assert patch == {"status": {"readyInstances": 2}}
    assert status_patch(read, read) == {"status": {}}
