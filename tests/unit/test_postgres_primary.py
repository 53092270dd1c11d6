"""Choosing and changing the primary: every decision of `plan_primary` from observed state."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from framework.plugin import Observed
from framework.servers import NO_ANSWERS
from services.postgres.instances import members_of, server_life, upstream_of
from services.postgres.primary import (
    FENCE_GRACE,
    FENCE_MARGIN,
    PRIMARY,
    REJOIN_AFTER,
    REPLICA,
    SILENT_LIMIT,
    UNREADY_LIMIT,
    Facts,
    Member,
    PrimaryInput,
    Promote,
    Reclone,
    Repoint,
    RestartPod,
    format_lsn,
    parse_lsn,
    plan_primary,
)

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0
CLOCK = 5000.0


def primary(lsn: int = 100, timeline: int = 1) -> Facts:
    return Facts(in_recovery=False, lsn=lsn, timeline=timeline)


def standby(lsn: int = 100, streaming: bool = True) -> Facts:
    return Facts(in_recovery=True, lsn=lsn, timeline=1, streaming=streaming)


def member(pod: str, facts: Facts | None, ready: bool = True, **extra: Any) -> Member:
    extra.setdefault("confirmed_primary", facts is not None and not facts.in_recovery)
    return Member(pod=pod, ready=ready, facts=facts, probed_at=CLOCK - 0.5, **extra)


def observe(*members: Member, status: dict[str, Any] | None = None, **extra: Any) -> PrimaryInput:
    fields: dict[str, Any] = {
        "name": "demo",
        "instances": len(members),
        # An initialized cluster (its first primary answered once) unless the test says not.
        "status": {"initialized": True, **(status if status is not None else {"currentPrimary": "demo-0"})},
        "members": {m.pod: m for m in members},
        "rw_endpoints": frozenset(),
        "now": NOW,
        "monotonic": CLOCK,
    }
    fields.update(extra)
    return PrimaryInput(**fields)


def test_a_healthy_primary_keeps_the_label_and_nothing_is_done() -> None:
    plan = plan_primary(observe(member("demo-0", primary()), member("demo-1", standby())))
    assert plan.primary == "demo-0"
    assert plan.target is None
    assert plan.labels == {"demo-0": PRIMARY, "demo-1": REPLICA}
    assert plan.actions == []
    assert plan.events == []


def test_the_label_waits_until_the_server_answered_as_a_primary() -> None:
    plan = plan_primary(observe(Member("demo-0"), status={}))
    assert plan.labels == {"demo-0": REPLICA}
    assert plan.probe_again is not None
    plan = plan_primary(observe(member("demo-0", primary()), status={}))
    assert plan.labels == {"demo-0": PRIMARY}


def test_a_restarted_primary_loses_the_label_until_it_is_promoted_again() -> None:
    restarted = Member("demo-0", ready=True, facts=None, probed_at=0.0)  # a new life, not asked yet
    plan = plan_primary(observe(restarted, member("demo-1", standby())))
    assert plan.labels["demo-0"] == REPLICA
    # A probe that times out once does not take the label from a confirmed primary.
    blip = member("demo-0", None, ready=True, silent_since=CLOCK - 1, confirmed_primary=True)
    assert plan_primary(observe(blip, member("demo-1", standby()))).labels["demo-0"] == PRIMARY


def test_a_second_server_answering_as_primary_is_fenced() -> None:
    plan = plan_primary(observe(member("demo-0", primary()), member("demo-1", primary(lsn=90))))
    assert plan.labels["demo-1"] == REPLICA
    assert plan.actions == [RestartPod("demo-1", "it answers as a primary beside demo-0")]
    assert [e[1] for e in plan.events] == ["Fenced"]


def test_failover_goes_to_the_most_advanced_standby_and_takes_the_label_away_first() -> None:
    plan = plan_primary(
        observe(
            member("demo-0", None, ready=False),
            member("demo-1", standby(lsn=200)),
            member("demo-2", standby(lsn=300)),
        )
    )
    assert plan.target == "demo-2"
    assert plan.primary == "demo-0"  # not yet: nothing is promoted before the Service lets go
    assert set(plan.labels.values()) == {REPLICA}
    # Down and not ready: it serves nobody, nothing to fence.
    assert plan.actions == []
    assert plan.failover is not None
    assert plan.failover["from"] == "demo-0"
    assert plan.failover["to"] == "demo-2"
    assert plan.events[0][:2] == ("Warning", "FailoverStarted")


def test_a_primary_not_ready_is_probed_again_before_anything_is_decided() -> None:
    stale = Member("demo-0", ready=False, facts=primary(), probed_at=CLOCK - 10, confirmed_primary=True)
    plan = plan_primary(observe(stale, member("demo-1", standby())))
    assert plan.target is None
    assert plan.actions == []
    assert plan.labels["demo-0"] == PRIMARY
    assert plan.probe_again is not None
    assert plan.probe_again <= 0.5


def test_failover_waits_for_fresh_answers_from_every_standby() -> None:
    old_probe = Member("demo-2", ready=True, facts=standby(lsn=900), probed_at=CLOCK - 30)
    plan = plan_primary(observe(member("demo-0", None, ready=False), member("demo-1", standby()), old_probe))
    assert plan.target is None
    assert plan.probe_again is not None
    assert plan.probe_again <= 0.5


def test_a_deleted_primary_pod_fails_over_even_if_its_server_still_answers() -> None:
    plan = plan_primary(
        observe(member("demo-0", primary(), terminating=True), member("demo-1", standby(lsn=100)))
    )
    assert plan.target == "demo-1"


def test_synchronous_failover_waits_until_enough_standbys_answer() -> None:
    members = (member("demo-0", None, ready=False), member("demo-1", standby()), member("demo-2", None))
    plan = plan_primary(observe(*members, synchronous=1))
    assert plan.target is None
    assert plan.events[0][1] == "FailoverWaiting"
    # Said once, not at every pass.
    again = plan_primary(
        observe(*members, synchronous=1, status={"currentPrimary": "demo-0", "failover": plan.failover})
    )
    assert again.events == []
    # Both standbys answer: the most advanced holds every acknowledged commit.
    plan = plan_primary(
        observe(
            member("demo-0", None, ready=False),
            member("demo-1", standby(lsn=5)),
            member("demo-2", standby(lsn=7)),
            synchronous=1,
        )
    )
    assert plan.target == "demo-2"


def test_a_single_instance_has_no_failover_and_waits_for_its_server() -> None:
    plan = plan_primary(observe(member("demo-0", None, ready=False)))
    assert plan.target is None
    assert plan.actions == []
    assert plan.labels == {"demo-0": REPLICA}  # nothing behind <name>-rw until it answers


def test_a_restarted_primary_comes_back_as_a_standby_and_is_promoted_in_place_as_a_recorded_change() -> None:
    # Recorded first (a decisive status write): a second operator that saw it down cannot
    # start a failover beside this promotion.
    members = (member("demo-0", standby(lsn=500)), member("demo-1", standby(lsn=500)))
    plan = plan_primary(observe(*members))
    assert (plan.primary, plan.target) == ("demo-0", "demo-0")
    assert plan.failover is not None
    assert plan.failover["kind"] == "Restart"
    assert plan.actions == []
    assert plan.labels["demo-0"] == REPLICA  # labelled once it answers as the primary again
    assert plan.events[0][1] == "RestartStarted"
    status = {"currentPrimary": "demo-0", "targetPrimary": "demo-0", "failover": plan.failover}
    assert promotion(observe(*members, status=status)) == [Promote("demo-0")]
    done = plan_primary(observe(member("demo-0", primary(timeline=2)), members[1], status=status))
    assert (done.primary, done.target, done.labels["demo-0"]) == ("demo-0", None, PRIMARY)
    assert done.events == [("Normal", "RestartCompleted", "demo-0 is the primary again after 0.0 s")]


def test_a_new_clusters_first_primary_is_promoted_without_a_recorded_change() -> None:
    plan = plan_primary(observe(member("demo-0", standby()), status={"initialized": False}))
    assert plan.actions == [Promote("demo-0")]
    assert plan.target is None


def test_a_restart_whose_server_goes_down_again_is_dropped_for_a_failover() -> None:
    status = {
        "currentPrimary": "demo-0",
        "targetPrimary": "demo-0",
        "failover": {"kind": "Restart", "from": "demo-0", "to": "demo-0", "startedAtSeconds": NOW},
    }
    gone = member("demo-0", None, ready=False)
    plan = plan_primary(observe(gone, member("demo-1", standby()), status=status))
    assert plan.target is None  # the next pass sees a primary down, as any other
    # Its promotion asked already: it may be promoted, and a failover now would be a second
    # promotion. A fresh container not ready yet that lost one answer is asked again ...
    asked = {**status, "failover": {**status["failover"], "promoting": "demo-0"}}
    assert plan_primary(observe(gone, member("demo-1", standby()), status=asked)).target == "demo-0"
    lost = member("demo-0", None, silent_since=CLOCK - 1)
    assert plan_primary(observe(lost, member("demo-1", standby()), status=asked)).target == "demo-0"
    # ... and dropped for a failover, as any primary down, once its pod goes or its server is
    # silent for as long as declares a primary down.
    for down in (
        replace(gone, exists=False),
        replace(gone, terminating=True),
        replace(gone, silent_since=CLOCK - SILENT_LIMIT),
    ):
        assert plan_primary(observe(down, member("demo-1", standby()), status=asked)).target is None


def test_a_restarted_primary_behind_a_standby_fails_over_to_it() -> None:
    plan = plan_primary(observe(member("demo-0", standby(lsn=400)), member("demo-1", standby(lsn=500))))
    assert plan.target == "demo-1"
    assert plan.actions == []


CHANGING = {
    "currentPrimary": "demo-0",
    "targetPrimary": "demo-1",
    "failover": {"kind": "Failover", "from": "demo-0", "to": "demo-1", "startedAtSeconds": NOW - 3},
}


def promotion(observed: PrimaryInput) -> list:
    """What the planner asks once it recorded whom it promotes: that comes first, in a pass of
    its own, so a promotion whose call failed is never followed by another pod's."""
    first = plan_primary(observed)
    assert first.actions == []
    assert first.failover is not None
    assert first.failover["promoting"] == first.target
    again = plan_primary(replace(observed, status={**observed.status, "failover": first.failover}))
    assert set(again.labels.values()) == {REPLICA}
    return again.actions


def test_the_promotion_waits_until_the_rw_service_has_no_endpoint() -> None:
    members = (member("demo-0", None, ready=False), member("demo-1", standby()))
    plan = plan_primary(observe(*members, status=CHANGING, rw_endpoints=frozenset({"demo-0"})))
    assert plan.actions == []
    assert set(plan.labels.values()) == {REPLICA}
    assert promotion(observe(*members, status=CHANGING)) == [Promote("demo-1")]


def test_a_promotion_asked_is_never_followed_by_another_pod_s() -> None:
    # demo-1 was asked (its call timed out on a busy machine) and is silent for now; demo-2
    # answers and is as advanced: promoting it too would make two primaries.
    status = {**CHANGING, "failover": {**CHANGING["failover"], "promoting": "demo-1"}}
    silent = member("demo-1", None, ready=False, silent_since=CLOCK - 60)
    plan = plan_primary(
        observe(member("demo-0", None, ready=False), silent, member("demo-2", standby()), status=status)
    )
    assert plan.actions == []
    assert plan.target == "demo-1"


def test_once_promoted_the_new_primary_gets_the_label_and_the_standbys_are_repointed() -> None:
    plan = plan_primary(
        observe(
            member("demo-0", None, ready=False),
            member("demo-1", primary(timeline=2)),
            member("demo-2", standby()),
            status=CHANGING,
        )
    )
    assert plan.primary == "demo-1"
    assert plan.target is None
    assert plan.labels == {"demo-0": REPLICA, "demo-1": PRIMARY, "demo-2": REPLICA}
    assert plan.actions == [Repoint(("demo-0", "demo-2"), "demo-1")]
    assert plan.failover is not None
    assert plan.failover["seconds"] == 3.0
    assert plan.events == [("Normal", "FailoverCompleted", "demo-1 is the primary (was demo-0) after 3.0 s")]


def test_a_chosen_standby_that_goes_away_mid_failover_is_replaced() -> None:
    plan = plan_primary(
        observe(
            member("demo-0", None, ready=False),
            member("demo-1", None, ready=False),
            member("demo-2", standby()),
            status=CHANGING,
        )
    )
    assert plan.target == "demo-2"
    assert plan.actions == []


def test_a_chosen_standby_that_missed_one_answer_is_asked_again_then_replaced_once_silent() -> None:
    # A busy machine lost one answer of the chosen, still Ready: it stays the choice.
    lost = member("demo-1", None, ready=True, silent_since=CLOCK - 1)
    plan = plan_primary(
        observe(member("demo-0", None, ready=False), lost, member("demo-2", standby(90)), status=CHANGING)
    )
    assert plan.target == "demo-1"
    assert plan.actions == []
    assert plan.probe_again is not None
    assert plan.probe_again < 1
    # Silent as long as declares a server down: another is chosen.
    silent = member("demo-1", None, ready=True, silent_since=CLOCK - SILENT_LIMIT)
    plan = plan_primary(
        observe(member("demo-0", None, ready=False), silent, member("demo-2", standby(90)), status=CHANGING)
    )
    assert plan.target == "demo-2"


def test_a_switchover_stops_the_old_primary_cleanly_then_promotes() -> None:
    request = {"switchover_to": "demo-1", "switchover_request": "demo-1@t1"}
    plan = plan_primary(observe(member("demo-0", primary()), member("demo-1", standby()), **request))
    assert plan.target == "demo-1"
    assert plan.switchover_done == "demo-1@t1"
    assert plan.failover is not None
    assert plan.failover["kind"] == "Switchover"
    status = {
        "currentPrimary": "demo-0",
        "targetPrimary": "demo-1",
        "failover": plan.failover,
        "switchover": {"served": "demo-1@t1"},
    }
    plan = plan_primary(
        observe(member("demo-0", primary()), member("demo-1", standby()), status=status, **request)
    )
    assert plan.actions == [RestartPod("demo-0", "switchover: it stops so the new primary has all its WAL")]
    # Stopping: still answering as a primary, so no promotion yet, and no second delete.
    plan = plan_primary(
        observe(
            member("demo-0", primary(), terminating=True),
            member("demo-1", standby()),
            status=status,
            **request,
        )
    )
    assert plan.actions == []
    stopped = observe(
        member("demo-0", None, ready=False), member("demo-1", standby()), status=status, **request
    )
    assert promotion(stopped) == [Promote("demo-1")]


def test_a_switchover_request_is_served_once() -> None:
    status = {"currentPrimary": "demo-1", "switchover": {"served": "demo-1@t1"}}
    plan = plan_primary(
        observe(
            member("demo-0", standby()),
            member("demo-1", primary()),
            status=status,
            switchover_to="demo-0",
            switchover_request="demo-1@t1",
        )
    )
    assert plan.target is None


def test_a_switchover_to_a_pod_that_is_no_ready_standby_is_refused_with_the_field() -> None:
    plan = plan_primary(
        observe(
            member("demo-0", primary()),
            member("demo-1", standby()),
            switchover_to="demo-7",
            switchover_request="demo-7@t",
        )
    )
    assert plan.target is None
    assert plan.events[0][1] == "SwitchoverRefused"
    assert "spec.switchover.to: demo-7" in plan.events[0][2]


def test_scaling_down_moves_the_primary_off_the_ordinals_that_go() -> None:
    plan = plan_primary(
        observe(
            member("demo-0", standby(lsn=10)),
            member("demo-1", standby(lsn=20)),
            member("demo-2", primary()),
            status={"currentPrimary": "demo-2"},
            instances=2,
        )
    )
    assert plan.target == "demo-1"
    assert plan.failover is not None
    assert plan.failover["kind"] == "Switchover"


def test_a_standby_that_stopped_following_is_restarted_to_rejoin() -> None:
    lagging = member("demo-1", standby(streaming=False), not_streaming_since=CLOCK - REJOIN_AFTER - 1)
    plan = plan_primary(observe(member("demo-0", primary()), lagging))
    assert plan.actions == [RestartPod("demo-1", "it stopped following the primary")]
    recent = member("demo-1", standby(streaming=False), not_streaming_since=CLOCK - 2)
    assert plan_primary(observe(member("demo-0", primary()), recent)).actions == []


def backoff_pod(ran_for: int, reason: str = "CrashLoopBackOff") -> dict[str, Any]:
    """A pod whose server container was killed after running `ran_for` seconds."""
    last = {
        "exitCode": 137,
        "startedAt": "2026-12-05T10:00:00Z",
        "finishedAt": f"2026-12-05T10:00:{ran_for:02d}Z",
    }
    server = {"name": "postgres", "restartCount": 4, "state": {"waiting": {"reason": reason}}}
    server["lastState"] = {"terminated": last}
    return {"metadata": {"name": "demo-1", "uid": "u1"}, "status": {"containerStatuses": [server]}}


def test_a_standby_held_back_by_the_kubelet_after_a_kill_is_made_again_at_once() -> None:
    """Killed again and again, a server's container waits out the kubelet's back-off (up to
    5 min): its pod is made again, and starts now. One that fails at its start keeps it."""
    observed = Observed(
        name="demo", namespace="apps", generation=1, spec={}, status={}, pods=[backoff_pod(39)]
    )
    (killed,) = members_of(observed, NO_ANSWERS, CLOCK).values()
    assert killed.backing_off
    plan = plan_primary(observe(member("demo-0", primary()), replace(killed, ready=False)))
    assert plan.actions == [RestartPod("demo-1", "its server waits out the kubelet's back-off")]
    assert [reason for _, reason, _ in plan.events] == ["BackOffSkipped"]
    for pod in (backoff_pod(3), backoff_pod(39, reason="ContainerCreating")):
        observed = replace(observed, pods=[pod])
        (member_,) = members_of(observed, NO_ANSWERS, CLOCK).values()
        assert not member_.backing_off
    deleted = replace(killed, ready=False, terminating=True)
    assert plan_primary(observe(member("demo-0", primary()), deleted)).actions == []


def test_lsn_text_round_trips() -> None:
    assert parse_lsn("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert format_lsn(parse_lsn("16/B374D848")) == "16/B374D848"
    assert parse_lsn(None) == 0


def test_a_frozen_primary_whose_pod_stays_ready_is_down_after_its_silence() -> None:
    """A frozen container keeps its pod Ready (the kubelet's probes hang with it): the
    operator's own probes decide."""
    briefly = member("demo-0", None, ready=True, silent_since=CLOCK - 1)
    plan = plan_primary(observe(briefly, member("demo-1", standby())))
    assert plan.target is None
    assert plan.probe_again == 1.0
    long_enough = member("demo-0", None, ready=True, silent_since=CLOCK - SILENT_LIMIT)
    plan = plan_primary(observe(long_enough, member("demo-1", standby())))
    assert plan.target == "demo-1"
    assert plan.failover is not None
    assert plan.failover["reason"] == "its server has not answered for 3 s"
    # Ready but silent to us: clients may still reach it. Fenced.
    assert plan.actions == [RestartPod("demo-0", "fenced: a failover replaces it", grace=FENCE_GRACE)]
    # The life of its server is recorded with the decision: nothing is promoted while it goes on.
    running = replace(long_enough, server_life="uid-0/0")
    plan = plan_primary(observe(running, member("demo-1", standby())))
    assert plan.failover is not None
    assert plan.failover["fenced"] == "uid-0/0"


def test_an_old_primary_that_answers_again_mid_failover_is_fenced_not_kept() -> None:
    # It may have lost the answers to commits, and a second operator may have seen it down:
    # keeping it would be a second decision. It stops; then the chosen one is promoted.
    plan = plan_primary(observe(member("demo-0", primary()), member("demo-1", standby()), status=CHANGING))
    assert plan.target == "demo-1"
    assert set(plan.labels.values()) == {REPLICA}
    assert plan.actions == [RestartPod("demo-0", "fenced: a failover replaces it", grace=FENCE_GRACE)]
    stopping = member("demo-0", primary(), terminating=True)
    assert plan_primary(observe(stopping, member("demo-1", standby()), status=CHANGING)).actions == []


FENCED = {**CHANGING, "failover": {**CHANGING["failover"], "fenced": "uid-0/0", "startedAtSeconds": NOW - 1}}


def test_nothing_is_promoted_while_the_fenced_servers_life_goes_on() -> None:
    # Cut off from us, not from its clients: it answers nobody here, and its container runs.
    running = member("demo-0", None, terminating=True, server_life="uid-0/0")
    plan = plan_primary(observe(running, member("demo-1", standby()), status=FENCED))
    assert plan.actions == []
    assert plan.failover is not None
    assert "promoting" not in plan.failover
    # Its deletion, recorded with the decision, was not seen to happen: asked again.
    undeleted = replace(running, terminating=False)
    plan = plan_primary(observe(undeleted, member("demo-1", standby()), status=FENCED))
    assert plan.actions == [RestartPod("demo-0", "fenced: a failover replaces it", grace=FENCE_GRACE)]
    # Its container stopped, restarted, or its pod went: that life is over.
    for over in (
        member("demo-0", None, terminating=True, server_life=None),
        member("demo-0", None, server_life="uid-0/1"),
    ):
        assert promotion(observe(over, member("demo-1", standby()), status=FENCED)) == [Promote("demo-1")]
    assert promotion(observe(member("demo-1", standby()), status=FENCED)) == [Promote("demo-1")]


def test_a_fenced_server_not_seen_to_stop_is_taken_for_stopped_past_its_grace_and_an_event_says_so() -> None:
    started = NOW - FENCE_GRACE - FENCE_MARGIN
    late = {**FENCED, "failover": {**FENCED["failover"], "startedAtSeconds": started}}
    within = member("demo-0", None, terminating=True, server_life="uid-0/0", grace_ends=NOW - 1)
    assert "unconfirmed" not in (
        plan_primary(observe(within, member("demo-1", standby()), status=late)).failover or {}
    )
    frozen = member("demo-0", None, terminating=True, server_life="uid-0/0", grace_ends=NOW - FENCE_MARGIN)
    plan = plan_primary(observe(frozen, member("demo-1", standby()), status=late))
    assert plan.failover is not None
    assert plan.failover["unconfirmed"]
    assert plan.failover["promoting"] == "demo-1"
    assert [e[1] for e in plan.events] == ["FenceUnconfirmed"]


def test_before_a_promotion_no_other_standby_follows_the_old_primary() -> None:
    down = member("demo-0", None, ready=False)
    following = member("demo-2", replace(standby(), upstream="demo-rw"))
    plan = plan_primary(observe(down, member("demo-1", standby()), following, status=CHANGING))
    assert plan.actions == [Repoint(("demo-2",), "demo-1")]
    assert plan.failover is not None
    assert "promoting" not in plan.failover
    detached = member("demo-2", replace(standby(), upstream="demo-1"))
    assert promotion(observe(down, member("demo-1", standby()), detached, status=CHANGING)) == [
        Promote("demo-1")
    ]


def test_synchronous_commit_a_silent_standby_that_may_follow_the_old_primary_holds_the_promotion() -> None:
    down = member("demo-0", None, ready=False)
    silent = member("demo-2", None, silent_since=CLOCK - 1, server_life="uid-2/0")  # its server runs
    plan = plan_primary(observe(down, member("demo-1", standby()), silent, status=CHANGING, synchronous=1))
    assert plan.actions == []
    assert plan.failover is not None
    assert "promoting" not in plan.failover
    # A server that is not running acknowledges nothing.
    stopped = replace(silent, server_life=None)
    assert promotion(observe(down, member("demo-1", standby()), stopped, status=CHANGING, synchronous=1)) == [
        Promote("demo-1")
    ]
    # Without synchronous commit nothing was promised: it goes on.
    promoted = promotion(observe(down, member("demo-1", standby()), silent, status=CHANGING))
    assert promoted == [Promote("demo-1")]


def test_a_detached_standby_that_went_further_than_the_chosen_one_is_promoted_instead() -> None:
    down = member("demo-0", None, ready=False)
    further = member("demo-2", replace(standby(lsn=200), upstream="demo-1"))
    plan = plan_primary(observe(down, member("demo-1", standby(lsn=100)), further, status=CHANGING))
    assert plan.target == "demo-2"
    assert plan.failover is not None
    assert plan.failover["to"] == "demo-2"
    assert [e[1] for e in plan.events] == ["FailoverRetargeted"]


def test_a_pods_server_life_and_a_standbys_upstream() -> None:
    def pod(state: dict[str, Any], restarts: int) -> dict[str, Any]:
        status = {"name": "postgres", "state": state, "restartCount": restarts}
        return {"metadata": {"name": "demo-0", "uid": "u1"}, "status": {"containerStatuses": [status]}}

    assert server_life(pod({"running": {}}, 2)) == "u1/2"
    assert server_life(pod({"terminated": {"exitCode": 0}}, 2)) is None
    assert server_life({"metadata": {"name": "demo-0", "uid": "u1"}}) is None
    assert upstream_of("host=demo-1.demo.apps.svc port=5432 user=streaming_replica") == "demo-1"
    assert upstream_of("user=x host=demo-rw") == "demo-rw"
    assert upstream_of("") is None
    assert upstream_of(None) is None


def test_a_primary_deleted_on_purpose_hands_over_only_once_its_server_stopped() -> None:
    status = {**CHANGING, "failover": {**CHANGING["failover"], "kind": "Switchover"}}
    stopping = member("demo-0", primary(), terminating=True)
    assert plan_primary(observe(stopping, member("demo-1", standby()), status=status)).actions == []
    # Refusing connections already, but maybe still sending its last WAL: its pod is not gone.
    stopped = member("demo-0", None, terminating=True)
    assert plan_primary(observe(stopped, member("demo-1", standby()), status=status)).actions == []
    gone = observe(member("demo-1", standby()), status=status)
    assert promotion(gone) == [Promote("demo-1")]


def test_a_primary_whose_pod_stays_terminating_holds_the_switchover_only_while_it_may_send_wal() -> None:
    """The issue's case: a finalizer on the primary's pod, then `kubectl delete pod`: its server
    stopped at once, and before this no write succeeded until the finalizer was removed."""
    status = {**CHANGING, "failover": {**CHANGING["failover"], "kind": "Switchover"}}
    within_grace = member("demo-0", None, terminating=True, grace_ends=NOW + 20)
    assert plan_primary(observe(within_grace, member("demo-1", standby()), status=status)).actions == []
    # Its server's container stopped: everything it had went to the standbys.
    stopped = member("demo-0", None, terminating=True, server_stopped=True, grace_ends=NOW + 20)
    plan = plan_primary(observe(stopped, member("demo-1", standby()), status=status))
    assert [e[1] for e in plan.events] == ["PrimaryStuckTerminating"]
    assert "demo-0's server stopped but its pod is still being deleted: promoting demo-1" in plan.events[0][2]
    assert promotion(observe(stopped, member("demo-1", standby()), status=status)) == [Promote("demo-1")]
    # Said once: the next pass posts nothing again.
    again = plan_primary(
        observe(stopped, member("demo-1", standby()), status={**status, "failover": plan.failover})
    )
    assert again.events == []
    # A kubelet that is gone says nothing of the container: the grace period's end does.
    overdue = member("demo-0", None, terminating=True, grace_ends=NOW - 6)
    assert promotion(observe(overdue, member("demo-1", standby()), status=status)) == [Promote("demo-1")]
    # Still answering as a primary: never promote beside it, however long it takes.
    answering = member("demo-0", primary(), terminating=True, server_stopped=True, grace_ends=NOW - 60)
    assert plan_primary(observe(answering, member("demo-1", standby()), status=status)).actions == []


def test_a_switchover_to_a_ready_pod_not_probed_yet_waits_for_its_answer() -> None:
    fresh_pod = Member("demo-1", ready=True)
    plan = plan_primary(
        observe(member("demo-0", primary()), fresh_pod, switchover_to="demo-1", switchover_request="demo-1@t")
    )
    assert plan.target is None
    assert plan.switchover_done is None  # still to be served
    assert plan.events == []
    assert plan.probe_again == 1.0


def test_a_rollouts_request_moves_the_primary_to_ordinal_0_once_beside_a_users_request() -> None:
    # The user's request was served long ago; the rollout's is served on its own.
    status = {"currentPrimary": "demo-1", "switchover": {"served": "demo-2@t1", "rollout": "demo-0@rev2"}}
    members = (member("demo-0", standby()), member("demo-1", primary()), member("demo-2", standby()))
    plan = plan_primary(
        observe(
            *members,
            status=status,
            switchover_to="demo-2",
            switchover_request="demo-2@t1",
            rollout_switchover="demo-0@rev2",
        )
    )
    assert plan.target == "demo-0"
    assert plan.rollout_switchover_done == "demo-0@rev2"
    assert plan.switchover_done is None
    assert plan.failover is not None
    assert plan.failover["reason"] == "a rollout updates this pod last"
    served = {**status, "switchover": {**status["switchover"], "rolloutServed": "demo-0@rev2"}}
    plan = plan_primary(observe(*members, status=served, rollout_switchover="demo-0@rev2"))
    assert plan.target is None


def test_a_rollouts_request_for_a_pod_that_is_no_ready_standby_is_refused_and_marked_served() -> None:
    status = {"currentPrimary": "demo-1", "switchover": {"rollout": "demo-0@rev2"}}
    members = (member("demo-0", None, ready=False), member("demo-1", primary()))
    plan = plan_primary(observe(*members, status=status, rollout_switchover="demo-0@rev2"))
    assert plan.target is None
    assert plan.rollout_switchover_done == "demo-0@rev2"  # the rollout's hook lets it go on
    assert plan.events[0][1] == "SwitchoverRefused"


def test_a_standby_still_not_following_after_its_restart_is_cloned_again() -> None:
    lagging = member("demo-1", standby(streaming=False), not_streaming_since=CLOCK - REJOIN_AFTER - 1)
    first = plan_primary(observe(member("demo-0", primary()), lagging))
    assert first.rejoins == {"demo-1": 1}
    # Its new life does not stream either (the WAL it needs is gone from the primary).
    again = plan_primary(observe(member("demo-0", primary()), lagging, status={"rejoins": first.rejoins}))
    assert again.actions == [Reclone("demo-1", "it did not follow the primary after a restart")]
    assert again.events[0][1] == "Recloning"
    assert again.rejoins == {"demo-1": 2}
    # Streaming again: forgotten.
    following = member("demo-1", standby(streaming=True))
    # Replaced, it is missing for a moment: still counted.
    gone = plan_primary(observe(member("demo-0", primary()), status={"rejoins": again.rejoins}, instances=2))
    assert gone.rejoins == {"demo-1": 2}
    done = plan_primary(observe(member("demo-0", primary()), following, status={"rejoins": again.rejoins}))
    assert done.rejoins == {}
    assert done.actions == []


def test_a_switchover_to_a_pod_that_stays_silent_is_refused_not_awaited_for_ever() -> None:
    frozen = member("demo-0", None, ready=True, silent_since=CLOCK - SILENT_LIMIT - 1)
    plan = plan_primary(
        observe(
            frozen,
            member("demo-1", primary()),
            status={"currentPrimary": "demo-1"},
            rollout_switchover="demo-0@rev2",
        )
    )
    assert plan.target is None
    assert plan.rollout_switchover_done == "demo-0@rev2"  # the rollout goes on
    assert plan.events[0][1] == "SwitchoverRefused"


def test_a_new_clusters_first_primary_is_starting_not_down() -> None:
    starting = Member("demo-0", exists=False)
    plan = plan_primary(observe(starting, member("demo-1", None, ready=False), status={"initialized": False}))
    assert plan.target is None
    assert plan.events == []  # no FailoverWaiting before there was anything to fail over


def test_what_a_change_records_is_kept_by_the_api_server() -> None:
    # The API server drops status fields its schema does not name: a "promoting" mark it
    # dropped once let a second pod be promoted in the same change.
    from framework.kube.crd import dropped_fields
    from services.postgres import PLUGIN

    schema = PLUGIN.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    members = (member("demo-0", None, ready=False), member("demo-1", standby()))
    recorded = plan_primary(observe(*members, status=CHANGING))
    status = {**CHANGING, "targetPrimary": recorded.target, "failover": recorded.failover}
    assert recorded.failover is not None
    assert "promoting" in recorded.failover
    assert dropped_fields(status, schema) == []
    # Why a switchover went on past a pod that stays (else its Event would be posted every pass).
    switchover = {**CHANGING, "failover": {**CHANGING["failover"], "kind": "Switchover"}}
    stopped = member("demo-0", None, terminating=True, server_stopped=True, grace_ends=NOW + 20)
    stuck = plan_primary(observe(stopped, member("demo-1", standby()), status=switchover))
    assert stuck.failover is not None
    assert "stuck" in stuck.failover
    assert dropped_fields({"failover": stuck.failover}, schema) == []
    fence = {"fenced": "uid/0", "unconfirmed": "2026-12-05T09:00:00Z", "kind": "Restart"}
    assert dropped_fields({"failover": fence}, schema) == []
    assert dropped_fields({"failover": {"kind": "Failover", "unheard": 1}}, schema) == [
        "status.failover.unheard"
    ]


def test_a_pod_being_deleted_says_when_its_grace_ends_and_whether_its_server_stopped() -> None:
    def pod(name: str, state: dict[str, Any], deleted: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
        if deleted:
            meta["deletionTimestamp"] = deleted
        return {"metadata": meta, "status": {"containerStatuses": [{"name": "postgres", "state": state}]}}

    pods = [
        pod("demo-0", {"terminated": {"exitCode": 0}}, "2027-01-15T08:00:30Z"),
        pod("demo-1", {"running": {}}, "2027-01-15T08:00:30Z"),
        pod("demo-2", {"terminated": {"exitCode": 1}}, None),  # not being deleted: a restart's
    ]
    seen = Observed(name="demo", namespace="apps", generation=1, spec={}, status={}, pods=pods)
    members = members_of(seen, NO_ANSWERS, 0.0)
    assert (members["demo-0"].server_stopped, members["demo-0"].grace_ends) == (True, 1_800_000_030.0)
    assert (members["demo-1"].server_stopped, members["demo-1"].terminating) == (False, True)
    assert (members["demo-2"].server_stopped, members["demo-2"].grace_ends) == (False, None)


def test_a_pod_not_ready_says_since_when() -> None:
    def pod(name: str, ready: str, since: str) -> dict[str, Any]:
        condition = {"type": "Ready", "status": ready, "lastTransitionTime": since}
        return {"metadata": {"name": name, "uid": f"uid-{name}"}, "status": {"conditions": [condition]}}

    pods = [pod("demo-0", "False", "2027-01-15T08:00:10Z"), pod("demo-1", "True", "2027-01-15T08:00:10Z")]
    members = members_of(
        Observed(name="demo", namespace="apps", generation=1, spec={}, status={}, pods=pods), NO_ANSWERS, 0.0
    )
    assert members["demo-0"].unready_since == 1_800_000_010.0
    assert members["demo-1"].unready_since is None


def test_a_primary_that_answers_from_a_pod_not_ready_is_fenced_then_replaced() -> None:
    """Not ready: `<name>-rw` sends it no client, whatever its server says to us. A moment of
    failed readiness probes (a busy machine) moves nothing; past UNREADY_LIMIT the old server
    is stopped first (its pod deleted: a clean stop sends its last WAL) and a standby is
    promoted only once it no longer answers as a primary."""
    moment = member("demo-0", primary(), ready=False, unready_since=NOW - 3)
    plan = plan_primary(observe(moment, member("demo-1", standby())))
    assert plan.target is None
    assert plan.actions == []
    unready = member("demo-0", primary(), ready=False, unready_since=NOW - UNREADY_LIMIT - 1)
    plan = plan_primary(observe(unready, member("demo-1", standby())))
    assert plan.target == "demo-1"
    assert plan.actions == [RestartPod("demo-0", "fenced: a failover replaces it", grace=FENCE_GRACE)]
    assert plan.events[0][1] == "FailoverStarted"
    assert (
        "its pod has not been ready for 16 s (no client reaches it) while its server answers"
        in plan.events[0][2]
    )
    changing = {"currentPrimary": "demo-0", "targetPrimary": "demo-1", "failover": plan.failover}
    # Still answering as a primary: it is stopped again, nothing is promoted beside it.
    waiting = plan_primary(observe(unready, member("demo-1", standby()), status=changing))
    assert not any(isinstance(action, Promote) for action in waiting.actions)
    stopped = member("demo-0", None, ready=False, terminating=True, unready_since=NOW - UNREADY_LIMIT - 1)
    assert promotion(observe(stopped, member("demo-1", standby()), status=changing)) == [Promote("demo-1")]


def test_a_primary_not_ready_with_no_standby_to_take_over_keeps_its_place() -> None:
    unready = member("demo-0", primary(), ready=False, unready_since=NOW - 60)
    behind = member("demo-1", standby(), ready=False)
    assert plan_primary(observe(unready, behind)).target is None
    assert plan_primary(observe(unready)).target is None  # one instance: nobody to promote
