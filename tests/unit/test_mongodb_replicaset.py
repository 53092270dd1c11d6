"""The replica set planner against reply shapes from MongoDB's documentation (`hello`,
`replSetGetConfig`, `replSetGetStatus`), with the hosts of a `MongoDB` named catalog."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.mongodb.replicaset import (
    Initiate,
    Reconfigure,
    StepDown,
    member_host,
    parse_config,
    parse_hello,
    parse_status,
    plan_replica_set,
)

pytestmark = pytest.mark.unit


def host(i: int) -> str:
    return member_host(f"catalog-{i}", "catalog", "apps")


# A mongod started with --replSet before replSetInitiate (the hello page's "not initiated").
AWAITING = {
    "topologyVersion": {"processId": {"$oid": "64d0c0ad1b7d0e37d1e0e8a1"}, "counter": 0},
    "isWritablePrimary": False,
    "secondary": False,
    "info": "Does not have a valid replica set config",
    "isreplicaset": True,
    "maxBsonObjectSize": 16777216,
    "maxMessageSizeBytes": 48000000,
    "maxWriteBatchSize": 100000,
    "localTime": {"$date": "2024-08-15T23:06:13.978Z"},
    "logicalSessionTimeoutMinutes": 30,
    "connectionId": 7,
    "minWireVersion": 0,
    "maxWireVersion": 21,
    "readOnly": False,
    "ok": 1,
}


def member_hello(i: int, primary: int, members: int) -> dict[str, Any]:
    """The hello page's replica set member reply."""
    return {
        "topologyVersion": {"processId": {"$oid": "64d0c0ad1b7d0e37d1e0e8a1"}, "counter": 6},
        "hosts": [host(m) for m in range(members)],
        "setName": "catalog",
        "setVersion": 3,
        "isWritablePrimary": i == primary,
        "secondary": i != primary,
        "primary": host(primary),
        "me": host(i),
        "electionId": {"$oid": "7fffffff0000000000000003"},
        "lastWrite": {"opTime": {"ts": {"$timestamp": {"t": 1723763173, "i": 1}}, "t": 3}},
        "maxBsonObjectSize": 16777216,
        "maxMessageSizeBytes": 48000000,
        "maxWriteBatchSize": 100000,
        "logicalSessionTimeoutMinutes": 30,
        "minWireVersion": 0,
        "maxWireVersion": 21,
        "readOnly": False,
        "ok": 1,
    }


def config_reply(members: list[int], version: int = 3, priorities: dict[int, float] | None = None) -> dict:
    """replSetGetConfig's example output (MongoDB 7)."""
    return {
        "config": {
            "_id": "catalog",
            "version": version,
            "term": 3,
            "members": [
                {
                    "_id": i,
                    "host": host(i),
                    "arbiterOnly": False,
                    "buildIndexes": True,
                    "hidden": False,
                    "priority": (priorities or {}).get(i, 1),
                    "tags": {},
                    "secondaryDelaySecs": 0,
                    "votes": 1,
                }
                for i in members
            ],
            "protocolVersion": 1,
            "writeConcernMajorityJournalDefault": True,
            "settings": {
                "chainingAllowed": True,
                "heartbeatIntervalMillis": 2000,
                "heartbeatTimeoutSecs": 10,
                "electionTimeoutMillis": 10000,
                "catchUpTimeoutMillis": -1,
                "getLastErrorModes": {},
                "getLastErrorDefaults": {"w": 1, "wtimeout": 0},
                "replicaSetId": {"$oid": "5f6fb0a2f1e4f3b2c8e4a1d2"},
            },
        },
        "ok": 1,
    }


NOW = datetime(2024, 8, 15, 23, 6, 13, tzinfo=UTC)


def status_reply(states: dict[int, tuple[int, str]], behind: dict[int, float] | None = None) -> dict:
    """replSetGetStatus's example output, trimmed to the fields the planner reads and a few more."""
    return {
        "set": "catalog",
        "date": NOW,
        "myState": 1,
        "term": 3,
        "heartbeatIntervalMillis": 2000,
        "majorityVoteCount": 2,
        "members": [
            {
                "_id": i,
                "name": host(i),
                "health": 1 if state != 8 else 0,
                "state": state,
                "stateStr": state_str,
                "uptime": 1000,
                "optimeDate": NOW - timedelta(seconds=(behind or {}).get(i, 0)),
                "syncSourceHost": "" if state == 1 else host(0),
                "configVersion": 3,
                "configTerm": 3,
            }
            for i, (state, state_str) in states.items()
        ],
        "ok": 1,
    }


def plan(wanted: int, answers: dict[int, dict | None], **given: Any) -> Any:
    config, status = given.pop("config", None), given.pop("status", None)
    return plan_replica_set(
        name="catalog",
        namespace="apps",
        wanted=wanted,
        answers={f"catalog-{i}": parse_hello(reply) if reply else None for i, reply in answers.items()},
        config=parse_config(config) if config else None,
        states=parse_status(status) if status else None,
        **given,
    )


HEALTHY = {0: (1, "PRIMARY"), 1: (2, "SECONDARY"), 2: (2, "SECONDARY")}


def test_a_new_set_is_initiated_on_the_first_pod_alone() -> None:
    view = plan(3, {0: AWAITING, 1: AWAITING, 2: None})
    (initiate,) = view.actions
    assert initiate == Initiate(
        "catalog-0",
        {"_id": "catalog", "version": 1, "members": [{"_id": 0, "host": host(0), "priority": 1.0}]},
    )
    assert host(0) == "catalog-0.catalog-nodes.apps.svc:27017"
    assert plan(3, {0: None, 1: AWAITING}).actions == ()


def test_a_set_initiated_once_is_never_initiated_again() -> None:
    # catalog-0 lost its disk and came back empty: it must join, not start a second set.
    view = plan(3, {0: AWAITING, 1: None, 2: None}, initiated_before=True)
    assert view.actions == ()
    assert view.message == "no primary: waiting for an election"


def test_pods_join_one_at_a_time_once_none_is_syncing() -> None:
    answers = {0: member_hello(0, 0, 1), 1: AWAITING, 2: AWAITING}
    view = plan(3, answers, config=config_reply([0], version=1), status=status_reply({0: (1, "PRIMARY")}))
    (add,) = view.actions
    assert isinstance(add, Reconfigure)
    assert add.pod == "catalog-0"
    assert add.config["version"] == 2
    assert add.config["settings"]["electionTimeoutMillis"] == 10000  # the rest is kept
    assert [m["host"] for m in add.config["members"]] == [host(0), host(1)]
    assert add.config["members"][1] == {"_id": 1, "host": host(1), "priority": 1.0, "votes": 1}

    syncing = plan(
        3,
        {0: member_hello(0, 0, 2), 1: member_hello(1, 0, 2), 2: AWAITING},
        config=config_reply([0, 1]),
        status=status_reply({0: (1, "PRIMARY"), 1: (5, "STARTUP2")}),
    )
    assert syncing.actions == ()
    assert syncing.syncing == ("catalog-1",)
    assert syncing.message.endswith("waiting for catalog-2 (a member is syncing)")


def test_a_formed_set_needs_nothing() -> None:
    view = plan(
        3,
        {i: member_hello(i, 1, 3) for i in range(3)},
        config=config_reply([0, 1, 2]),
        status=status_reply({0: (2, "SECONDARY"), 1: (1, "PRIMARY"), 2: (2, "SECONDARY")}),
    )
    assert view.actions == ()
    assert view.primary == "catalog-1"
    assert view.healthy == 3
    assert view.keep_replicas == 3
    assert view.message == "3 of 3 members healthy, primary catalog-1"


def test_scaling_down_removes_the_highest_member_first_and_keeps_its_pod_until_then() -> None:
    answers = {i: member_hello(i, 0, 5) for i in range(5)}
    states = {**HEALTHY, 3: (2, "SECONDARY"), 4: (2, "SECONDARY")}
    view = plan(3, answers, config=config_reply([0, 1, 2, 3, 4]), status=status_reply(states))
    (remove,) = view.actions
    assert [m["host"] for m in remove.config["members"]] == [host(i) for i in range(4)]
    assert view.keep_replicas == 5
    after = plan(3, answers, config=config_reply([0, 1, 2, 3]), status=status_reply(states))
    assert [m["host"] for m in after.actions[0].config["members"]] == [host(i) for i in range(3)]
    assert after.keep_replicas == 4


def test_a_leaving_primary_steps_down_first() -> None:
    answers = {i: member_hello(i, 3, 4) for i in range(4)}
    states = {0: (2, "SECONDARY"), 1: (2, "SECONDARY"), 2: (2, "SECONDARY"), 3: (1, "PRIMARY")}
    view = plan(3, answers, config=config_reply([0, 1, 2, 3]), status=status_reply(states))
    assert view.actions == (StepDown("catalog-3", "catalog-3 leaves the replica set"),)


def test_priorities_are_set_in_one_reconfiguration() -> None:
    view = plan(
        3,
        {i: member_hello(i, 0, 3) for i in range(3)},
        config=config_reply([0, 1, 2]),
        status=status_reply(HEALTHY),
        priorities={"catalog-0": 2, "catalog-2": 0.5},
    )
    (change,) = view.actions
    assert [m["priority"] for m in change.config["members"]] == [2, 1, 0.5]
    assert change.why == "setting member priorities"


def test_two_primaries_or_none_wait_for_an_election() -> None:
    split = {0: member_hello(0, 0, 3), 1: member_hello(1, 1, 3), 2: None}
    assert plan(3, split, config=config_reply([0, 1, 2])).message.startswith("2 members claim to be primary")
    none = {i: {**member_hello(i, 0, 3), "isWritablePrimary": False, "secondary": True} for i in range(3)}
    assert plan(3, none).actions == ()


def test_status_reads_health_and_lag() -> None:
    states = parse_status(
        status_reply({0: (1, "PRIMARY"), 1: (2, "SECONDARY"), 2: (8, "(not reachable/healthy)")}, {1: 4.0})
    )
    assert [(s.host, s.healthy) for s in states] == [(host(0), True), (host(1), True), (host(2), False)]
    assert states[1].lag_seconds == 4.0
