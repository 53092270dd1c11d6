"""Who acts, from what a Lease says and how long it has said it."""

import pytest

from framework.kube.leader import Record, Timing, Verdict, verdict

pytestmark = pytest.mark.unit


def held(by: str, duration: float = 8.0) -> Record:
    return Record(holder=by, renewed="2026-12-05T09:00:00.000000+00:00", duration=duration)


def test_a_missing_or_released_lease_is_taken() -> None:
    assert verdict(None, "b", 0.0) is Verdict.TAKE
    assert verdict(held(""), "b", 0.0) is Verdict.TAKE


def test_the_holder_renews_its_own_lease_however_old() -> None:
    assert verdict(held("a"), "a", 0.0) is Verdict.RENEW
    assert verdict(held("a"), "a", 60.0) is Verdict.RENEW


def test_another_holder_is_waited_for_until_its_record_stood_still_for_the_duration() -> None:
    assert verdict(held("a"), "b", 0.0) is Verdict.WAIT
    assert verdict(held("a"), "b", 8.0) is Verdict.WAIT  # expired only after the whole duration
    assert verdict(held("a"), "b", 8.01) is Verdict.TAKE
    assert verdict(held("a", duration=15), "b", 10.0) is Verdict.WAIT  # the Lease's own duration counts


def test_a_leader_stops_before_a_standby_may_take_over() -> None:
    timing = Timing()
    assert timing.renew_deadline < timing.duration
    with pytest.raises(ValueError, match="renew deadline"):
        Timing(duration=5, renew_deadline=5, retry=1)
    with pytest.raises(ValueError, match="retry"):
        Timing(duration=8, renew_deadline=5, retry=0)
