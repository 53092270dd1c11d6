"""PostgresUser: the role's name, and the statements that make a server agree with the spec."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.postgres import PLUGIN
from services.postgres.users import (
    DatabaseFound,
    Grantable,
    PostgresUserSpec,
    RoleFound,
    Wanted,
    database_name,
    plan_role,
    role_name,
)

pytestmark = pytest.mark.unit

MARK = "statefleet:apps/reporting"
WANTED = Wanted(
    role="reporting",
    marker=MARK,
    database="reporting",
    own_database=True,
    member_of=frozenset(),
    connection_limit=-1,
    password="s3cret'; drop table x; --",
    password_changed=True,
)
SAFE = Grantable(privileged=False, comment=None)
OURS = RoleFound(login=True, connection_limit=-1, comment=MARK, member_of=frozenset())


def text(plan_statements: list) -> list[str]:
    return [s.as_string(None) for s in plan_statements]


def test_the_issue_example_creates_the_role_and_its_own_database() -> None:
    spec = PostgresUserSpec.model_validate({"instance": "demo", "database": "reporting", "ownDatabase": True})
    assert role_name("reporting", spec) == "reporting"
    assert database_name("reporting", spec) == "reporting"
    plan = plan_role(WANTED, None, None, {})
    assert plan.refusal is None
    assert text(plan.statements) == [
        "CREATE ROLE \"reporting\" WITH LOGIN CONNECTION LIMIT  -1 PASSWORD 's3cret''; drop table x; --'",
        "COMMENT ON ROLE \"reporting\" IS 'statefleet:apps/reporting'",
    ]
    assert text(plan.database_statements) == [
        'CREATE DATABASE "reporting" OWNER "reporting"',
        "COMMENT ON DATABASE \"reporting\" IS 'statefleet:apps/reporting'",
    ]
    assert [e.reason for e in plan.events] == ["RoleCreated", "DatabaseCreated"]


def test_reconciling_again_creates_nothing_twice() -> None:
    same = replace(WANTED, password_changed=False)
    plan = plan_role(same, OURS, DatabaseFound(owner="reporting", comment=MARK), {})
    assert plan.statements == []
    assert plan.database_statements == []
    assert plan.events == []


def test_a_password_edited_in_its_secret_is_applied() -> None:
    plan = plan_role(WANTED, OURS, DatabaseFound(owner="reporting", comment=MARK), {})
    assert text(plan.statements) == ["ALTER ROLE \"reporting\" WITH PASSWORD 's3cret''; drop table x; --'"]


def test_memberships_follow_the_spec_and_only_ours_are_revoked() -> None:
    wanted = replace(
        WANTED,
        password_changed=False,
        member_of=frozenset({"pg_read_all_data"}),
        granted_before=frozenset({"pg_write_all_data"}),
    )
    role = replace(OURS, member_of=frozenset({"pg_write_all_data", "pg_monitor"}))  # pg_monitor: by hand
    plan = plan_role(wanted, role, DatabaseFound("reporting", MARK), {"pg_read_all_data": SAFE})
    assert text(plan.statements) == [
        'GRANT "pg_read_all_data" TO "reporting"',
        'REVOKE "pg_write_all_data" FROM "reporting"',
    ]


def test_what_is_not_ours_is_refused_naming_the_field() -> None:
    foreign = replace(OURS, comment=None)
    assert "choose another spec.role" in (plan_role(WANTED, foreign, None, {}).refusal or "")
    plan = plan_role(WANTED, None, DatabaseFound(owner="someone", comment=None), {})
    assert (plan.refusal or "").startswith("spec.database: the database reporting exists, owned by someone")
    missing = replace(WANTED, member_of=frozenset({"nosuchrole"}))
    assert plan_role(missing, None, None, {}).refusal == "spec.memberOf: no role nosuchrole in this instance"
    shared = replace(WANTED, own_database=False, database="analytics")
    assert (
        plan_role(shared, None, None, {}).refusal == "spec.database: no database analytics in this instance"
    )


def test_a_role_that_exists_in_a_shared_database_gets_connect() -> None:
    shared = replace(WANTED, own_database=False, database="analytics", password_changed=False)
    plan = plan_role(shared, OURS, DatabaseFound("postgres", None), {})
    assert text(plan.statements) == ['GRANT CONNECT ON DATABASE "analytics" TO "reporting"']


def test_bad_role_names_are_refused_naming_the_field() -> None:
    spec = PostgresUserSpec.model_validate({"instance": "demo"})
    with pytest.raises(ValueError, match=r"metadata.name .*'postgres' is the server's own role"):
        role_name("postgres", spec)
    with pytest.raises(ValueError, match=r"metadata.name .*'my.user' is not a role name"):
        role_name("my.user", spec)
    with pytest.raises(ValueError, match=r"is the server's own role"):
        role_name("x", PostgresUserSpec.model_validate({"instance": "demo", "role": "pg_monitor"}))


def test_the_binding_secret_is_laid_out_as_servicebinding_io_expects() -> None:
    service = {"metadata": {"name": "demo", "namespace": "apps"}}
    user = {"status": {"role": "orders-db", "database": "orders-db"}}
    data = PLUGIN.bindings.secret_data(service, user, {"password": "p@ss/word"}, None)
    assert data == {
        "type": "postgresql",
        "provider": "statefleet",
        "host": "demo-rw.apps.svc",
        "port": "5432",
        "username": "orders-db",
        "password": "p@ss/word",
        "database": "orders-db",
        "uri": "postgresql://orders-db:p%40ss%2Fword@demo-rw.apps.svc:5432/orders-db",
    }
    with_tls = PLUGIN.bindings.secret_data(service, user, {"password": "p@ss/word"}, "PEM")
    # Spring Cloud Bindings joins `sslrootcert` to the binding's folder; kube-service-bindings
    # hands `root.crt` to node-postgres.
    assert with_tls == {
        **data,
        "ca.crt": "PEM",
        "root.crt": "PEM",
        "sslrootcert": "ca.crt",
        "sslmode": "verify-full",
        "uri": "postgresql://orders-db:p%40ss%2Fword@demo-rw.apps.svc:5432/orders-db?sslmode=verify-full",
    }


def test_memberships_that_would_hand_out_a_superusers_powers_are_refused() -> None:
    for name, found in [
        ("postgres", Grantable(privileged=True, comment=None)),
        ("pg_read_server_files", SAFE),
        ("admins", Grantable(privileged=True, comment=None)),  # a superuser made by hand
        ("orders-db", Grantable(privileged=False, comment="statefleet:apps/orders-db")),  # another user
    ]:
        wanted = replace(WANTED, member_of=frozenset({name}))
        refusal = plan_role(wanted, None, None, {name: found}).refusal or ""
        assert refusal.startswith(f"spec.memberOf: {name} would give this role powers"), name
