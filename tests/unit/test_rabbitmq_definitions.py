"""The RabbitMQ backup driver's pure parts: what is backed up, and what a restore must find."""

import pytest

from services.rabbitmq.backup_driver import counts, missing, without_user

pytestmark = pytest.mark.unit

DEFINITIONS = {
    "rabbit_version": "3.10.8",
    "users": [{"name": "admin-x", "tags": ["administrator"]}, {"name": "app", "tags": []}],
    "vhosts": [{"name": "/"}, {"name": "orders"}],
    "permissions": [
        {"user": "admin-x", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "app", "vhost": "orders", "configure": ".*", "write": ".*", "read": ".*"},
    ],
    "topic_permissions": [{"user": "admin-x", "vhost": "/", "exchange": "", "write": ".*", "read": ".*"}],
    "queues": [{"name": "work", "vhost": "orders", "durable": True, "arguments": {"x-queue-type": "quorum"}}],
    "exchanges": [{"name": "events", "vhost": "orders", "type": "topic"}],
    "bindings": [
        {
            "source": "events",
            "vhost": "orders",
            "destination": "work",
            "destination_type": "queue",
            "routing_key": "a.#",
        }
    ],
    "policies": [{"vhost": "orders", "name": "ttl", "pattern": ".*", "definition": {"message-ttl": 60000}}],
}


def test_the_clusters_own_administrator_is_left_out() -> None:
    kept = without_user(DEFINITIONS, "admin-x")
    assert [u["name"] for u in kept["users"]] == ["app"]
    assert [p["user"] for p in kept["permissions"]] == ["app"]
    assert kept["topic_permissions"] == []
    assert kept["queues"] == DEFINITIONS["queues"]
    assert DEFINITIONS["users"][0]["name"] == "admin-x"  # the input is left as it was
    assert counts(kept) == {
        "vhosts": 2,
        "users": 1,
        "permissions": 1,
        "policies": 1,
        "queues": 1,
        "exchanges": 1,
        "bindings": 1,
    }


def test_a_restore_must_find_each_definition_by_name() -> None:
    assert missing(DEFINITIONS, DEFINITIONS) == {}
    cluster = {
        **DEFINITIONS,
        "queues": [],
        "bindings": [{**DEFINITIONS["bindings"][0], "routing_key": "b.#"}],
    }
    assert missing(DEFINITIONS, cluster) == {
        "queues": ["orders/work"],
        "bindings": ["orders/events/work/queue/a.#"],
    }
    assert missing({"vhosts": [{"name": "x"}]}, {}) == {"vhosts": ["x"]}
