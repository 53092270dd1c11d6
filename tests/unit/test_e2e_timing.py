"""The budget `make test` is held to: warm, or fresh when the test bed was built in the same run."""

import pytest

from e2e.timing import FRESH_MAKE_TEST_BUDGET_SECONDS, MAKE_TEST_BUDGET_SECONDS, make_test_budget

pytestmark = pytest.mark.unit

STARTED = 1_000_000.0


def test_a_warm_machine_has_the_warm_budget() -> None:
    budget, why = make_test_budget(STARTED, {"seconds": 4, "finished_at": STARTED + 30})
    assert budget == MAKE_TEST_BUDGET_SECONDS
    assert why == "warm machine"


def test_a_test_bed_built_from_source_in_this_run_has_the_fresh_budget() -> None:
    budget, why = make_test_budget(STARTED, {"seconds": 1623, "finished_at": STARTED + 1700})
    assert budget == FRESH_MAKE_TEST_BUDGET_SECONDS
    assert "27.1 min" in why


def test_a_build_from_an_earlier_run_does_not_count() -> None:
    budget, _ = make_test_budget(STARTED, {"seconds": 1623, "finished_at": STARTED - 60})
    assert budget == MAKE_TEST_BUDGET_SECONDS


def test_one_image_rebuilt_is_still_a_warm_machine() -> None:
    budget, _ = make_test_budget(STARTED, {"seconds": 240, "finished_at": STARTED + 300})
    assert budget == MAKE_TEST_BUDGET_SECONDS


def test_no_record_means_the_warm_budget() -> None:
    assert make_test_budget(STARTED, None)[0] == MAKE_TEST_BUDGET_SECONDS
