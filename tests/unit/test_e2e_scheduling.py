"""The order in which parallel e2e workers take their tests: longest first."""

from __future__ import annotations

import pytest

from e2e.scheduling import longest_first, strip_group
from e2e.timing import phase_of

pytestmark = pytest.mark.unit


def test_the_longest_units_go_first_groups_counted_as_a_whole() -> None:
    units = {
        "e2e/a.py::quick": ["e2e/a.py::quick"],
        "failover": ["e2e/b.py::one@failover", "e2e/b.py::two@failover"],
        "e2e/c.py::long": ["e2e/c.py::long"],
    }
    durations = {"e2e/a.py::quick": 10, "e2e/b.py::one": 100, "e2e/b.py::two": 150, "e2e/c.py::long": 200}
    assert longest_first(units, durations) == ["failover", "e2e/c.py::long", "e2e/a.py::quick"]


def test_a_test_never_measured_counts_as_a_median_one_and_ties_keep_their_order() -> None:
    units = {name: [name] for name in ("e2e/new.py::x", "e2e/a.py::t", "e2e/b.py::t", "e2e/c.py::t")}
    durations = {"e2e/a.py::t": 10, "e2e/b.py::t": 50, "e2e/c.py::t": 90}
    assert longest_first(units, durations) == ["e2e/c.py::t", "e2e/new.py::x", "e2e/b.py::t", "e2e/a.py::t"]
    assert longest_first({"u": ["u"], "v": ["v"]}, {}) == ["u", "v"]


def test_the_group_suffix_is_not_part_of_a_tests_name() -> None:
    assert strip_group("e2e/b.py::one@failover") == "e2e/b.py::one"
    assert strip_group("e2e/b.py::p[a@b]") == "e2e/b.py::p[a@b]"  # an @ inside a parameter stays


@pytest.mark.parametrize(
    ("label", "phase"),
    [
        ("namespace t0-x deleted", "namespace deletion"),
        ("Postgres t0-x/demo Ready with 3 instances", "instance ready"),
        ("a primary other than demo-0", "failover and switchover"),
        ("nightly-1 Completed", "backup and restore Jobs"),
        ("rollout phase Paused {'currentStepIndex': 1}", "rollout steps"),
        ("something else", "other conditions"),
    ],
)
def test_a_wait_is_counted_under_the_phase_its_label_names(label: str, phase: str) -> None:
    assert phase_of(label) == phase
