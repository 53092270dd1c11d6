"""The management API requests that make a cluster's users, vhosts and permissions agree
with their resources (pure)."""

import pytest

from services.rabbitmq import PLUGIN
from services.rabbitmq.access import (
    Permissions,
    Request,
    WantedUser,
    plan_permission,
    plan_user,
    plan_vhost,
    tags_of,
)
from services.rabbitmq.users import own_vhost_clash

pytestmark = pytest.mark.unit

MARK = "statefleet:apps/orders"


def wanted(**change: object) -> WantedUser:
    fields = {
        "username": "orders",
        "marker": MARK,
        "tags": frozenset(),
        "password": "secret",
        "password_changed": False,
        "own_vhost": None,
    }
    return WantedUser(**{**fields, **change})


def user(tags: object = (MARK,)) -> dict:
    return {
        "name": "orders",
        "password_hash": "h4sh",
        "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": tags,
    }


def test_a_new_user_is_created_marked_with_its_resource() -> None:
    plan = plan_user(wanted(password_changed=True, tags=frozenset({"monitoring"})), None, None, None)
    assert plan.refusal is None
    assert plan.requests == [
        Request("PUT", "users/orders", {"password": "secret", "tags": f"monitoring,{MARK}"})
    ]
    assert [e.reason for e in plan.events] == ["UserCreated"]


def test_a_user_in_agreement_needs_nothing() -> None:
    assert plan_user(wanted(), user(), None, None).requests == []
    assert plan_user(wanted(), user(MARK), None, None).requests == []  # tags as one string (older servers)


def test_a_changed_password_is_sent_and_changed_tags_keep_the_password_hash() -> None:
    plan = plan_user(wanted(password_changed=True), user(), None, None)
    assert plan.requests == [Request("PUT", "users/orders", {"password": "secret", "tags": MARK})]
    assert [e.reason for e in plan.events] == ["PasswordChanged"]
    plan = plan_user(wanted(tags=frozenset({"management"})), user(), None, None)
    assert plan.requests == [
        Request(
            "PUT",
            "users/orders",
            {
                "password_hash": "h4sh",
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": f"management,{MARK}",
            },
        )
    ]


def test_a_user_someone_else_made_is_never_taken_over() -> None:
    plan = plan_user(wanted(password_changed=True), user(["administrator"]), None, None)
    assert plan.requests == []
    assert plan.refusal is not None
    assert "the user orders exists and was not created for this resource" in plan.refusal


def test_an_own_vhost_is_made_with_every_permission() -> None:
    plan = plan_user(wanted(own_vhost="orders", password_changed=True), None, None, None)
    assert plan.requests[1:] == [
        Request("PUT", "vhosts/orders", {"tags": MARK}),
        Request("PUT", "permissions/orders/orders", {"configure": ".*", "write": ".*", "read": ".*"}),
    ]
    kept = plan_user(wanted(own_vhost="orders"), user(), {"name": "orders", "tags": [MARK]}, Permissions())
    assert kept.requests == []
    narrowed = Permissions(read="^$")
    again = plan_user(wanted(own_vhost="orders"), user(), {"name": "orders", "tags": [MARK]}, narrowed)
    assert again.requests == [
        Request("PUT", "permissions/orders/orders", {"configure": ".*", "write": ".*", "read": ".*"})
    ]
    refused = plan_user(wanted(own_vhost="orders"), None, {"name": "orders", "tags": []}, None)
    assert refused.refusal is not None
    assert refused.refusal.startswith("spec.ownVhost: the vhost orders exists and was not created")
    assert refused.requests == []


def test_names_are_escaped_in_paths() -> None:
    plan = plan_user(wanted(username="a/b", own_vhost="a/b", password_changed=True), None, None, None)
    assert [r.path for r in plan.requests] == ["users/a%2Fb", "vhosts/a%2Fb", "permissions/a%2Fb/a%2Fb"]


def test_vhosts() -> None:
    made = plan_vhost("jobs", MARK, "batch jobs", None)
    assert made.requests == [Request("PUT", "vhosts/jobs", {"description": "batch jobs", "tags": MARK})]
    assert (
        plan_vhost("jobs", MARK, "batch jobs", {"description": "batch jobs", "tags": [MARK]}).requests == []
    )
    described = plan_vhost("jobs", MARK, "nightly", {"description": "batch jobs", "tags": [MARK]})
    assert described.requests == [Request("PUT", "vhosts/jobs", {"description": "nightly", "tags": MARK})]
    theirs = plan_vhost("/", MARK, "", {"description": "Default virtual host", "tags": []})
    assert theirs.refusal is not None
    assert theirs.requests == []


def test_permissions() -> None:
    wanted_permissions = Permissions(configure="^$", write=".*", read=".*")
    assert plan_permission("jobs", "app", wanted_permissions, wanted_permissions).requests == []
    plan = plan_permission("jobs", "app", wanted_permissions, None)
    assert plan.requests == [
        Request("PUT", "permissions/jobs/app", {"configure": "^$", "write": ".*", "read": ".*"})
    ]
    assert Permissions.found(
        {"user": "app", "vhost": "jobs", "configure": "^$", "write": ".*", "read": ".*"}
    ) == (wanted_permissions)


def test_tags_of_both_shapes() -> None:
    assert tags_of({"tags": ["a", "b"]}) == {"a", "b"}
    assert tags_of({"tags": "a, b"}) == {"a", "b"}
    assert tags_of({"tags": ""}) == frozenset()
    assert tags_of(None) == frozenset()


def test_binding_data_is_a_servicebinding_io_rabbitmq_secret() -> None:
    service = {"metadata": {"name": "events", "namespace": "apps"}}
    user_body = {"status": {"username": "orders", "vhost": "orders"}}
    data = PLUGIN.bindings.secret_data(service, user_body, {"password": "p@ss/word"}, "CA PEM")
    assert data == {
        "type": "rabbitmq",
        "provider": "statefleet",
        "host": "events.apps.svc",
        "port": "5671",
        "ssl": "true",
        "ca.crt": "CA PEM",
        "username": "orders",
        "password": "p@ss/word",
        "virtual-host": "orders",
        "uri": "amqps://orders:p%40ss%2Fword@events.apps.svc:5671/orders",
        "addresses": "amqps://events.apps.svc:5671",
    }
    assert PLUGIN.bindings.user_spec("orders", "events") == {"instance": "events", "ownVhost": True}


def test_a_permission_resource_never_takes_over_an_own_vhosts_grant() -> None:
    mine = {"tags": [MARK]}
    message = own_vhost_clash("orders", "orders", mine, mine)
    assert message == (
        "spec.vhost: orders is the own vhost of user orders, whose permissions RabbitMQUser apps/orders keeps"
    )
    assert own_vhost_clash("worker", "orders", {"tags": []}, mine) is None
    assert own_vhost_clash("orders", "orders", {"tags": ["statefleet:apps/other"]}, mine) is None
