"""The order in which parallel workers take the e2e tests: longest first.

A worker that draws a five-minute test last keeps the whole run waiting for it, so the work
units (a test, or the tests of one `xdist_group` that share an instance) go out by their
expected duration, longest first, one unit at a time to whichever worker is free. The
expected durations are the ones measured last (`e2e/durations.json`, written by
`python -m e2e.timing --save-durations`); a test not measured yet counts as a median one.

The groups are read from the `xdist_group` marks by the workers, which collect the tests, and
handed to this scheduler in a file: xdist's own way, a suffix on each test's id, is lost under
pytest 9's structured ids (pytest-xdist issue 1386), and every test would go its own way."""

from __future__ import annotations

import json
import os
import statistics
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import pytest
from xdist.scheduler import LoadGroupScheduling

DURATIONS = Path(__file__).resolve().parent / "durations.json"
GROUPS_FILE = "STATEFLEET_XDIST_GROUPS"  # the variable naming the file the groups go through


def group_of(item: pytest.Item) -> str | None:
    marks = item.iter_markers("xdist_group")
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks})
    return "_".join(names) or None


def write_groups(items: Iterable[pytest.Item]) -> None:
    """In a worker, once it collected: each grouped test's group (every worker writes the
    same; each replaces the file whole)."""
    path = os.environ.get(GROUPS_FILE)
    if not path:
        return
    groups = {strip_group(item.nodeid): group for item in items if (group := group_of(item))}
    partial = Path(f"{path}.{os.getpid()}")
    partial.write_text(json.dumps(groups))
    partial.replace(path)


def read_groups() -> dict[str, str]:
    path = os.environ.get(GROUPS_FILE)
    try:
        return json.loads(Path(path).read_text()) if path else {}
    except FileNotFoundError:
        return {}


def strip_group(nodeid: str) -> str:
    """The nodeid without the `@group` xdist appends under --dist loadgroup."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[0]
    return nodeid


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (FileNotFoundError, ValueError):
        return {}


def longest_first(units: dict[str, list[str]], durations: dict[str, float]) -> list[str]:
    """The units' names, the one expected to take longest first (ties: as collected)."""
    default = statistics.median(durations.values()) if durations else 60.0

    def expected(unit: str) -> float:
        return sum(durations.get(strip_group(nodeid), default) for nodeid in units[unit])

    order = {unit: index for index, unit in enumerate(units)}
    return sorted(units, key=lambda unit: (-expected(unit), order[unit]))


class LongestFirstScheduling(LoadGroupScheduling):
    """xdist's loadgroup (the tests of a group on one worker, in order), with the units sent
    longest first and no more queued on a worker than it needs to keep running."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self.groups: dict[str, str] = {}  # nodeid -> group, read once every worker has collected

    def _split_scope(self, nodeid: str) -> str:
        return self.groups.get(strip_group(nodeid)) or super()._split_scope(nodeid)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        self.groups = read_groups()
        units: dict[str, list[str]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), []).append(nodeid)
        self.workqueue = OrderedDict(
            (unit, dict.fromkeys(units[unit], False)) for unit in longest_first(units, read_durations())
        )
        for _ in range(len(self.nodes) - len(self.workqueue)):  # more workers than work
            unused, _assigned = self.assigned_work.popitem()
            unused.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)

    def _reschedule(self, node) -> None:  # type: ignore[no-untyped-def]
        """A worker runs a test once it knows the next (or that none comes): it gets a new
        unit when it is down to its last pending test, not before."""
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) >= 2:
            return
        self._assign_work_unit(node)
