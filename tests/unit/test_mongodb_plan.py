"""The MongoDB plugin through the framework's pure plan: what it renders for each server
(FerretDB on the test bed, mongod elsewhere), what it refuses, its users and bindings."""

from typing import Any

import pytest

from framework.catalog import Catalog
from framework.instance_plan import plan
from framework.plugin import Inspection, Observed
from framework.servers import Answers
from services.mongodb import PLUGIN
from services.mongodb.access import WantedUser, plan_user
from services.mongodb.plugin import SetFacts
from services.mongodb.replicaset import Reconfigure, parse_config, parse_hello
from services.mongodb.spec import MongoDBSpec

pytestmark = pytest.mark.unit

CATALOG = Catalog.from_yaml(
    """
mongodb:
  default: "7"
  versions:
    "7": {image: ferretdb:1.24, flavor: ferretdb}
    "7.0": {image: mongo:7.0, flavor: mongod}
"""
)
SPEC = {"version": "7", "members": 1, "storage": {"size": "1Gi"}}


def observed(spec: dict[str, Any], **extra: Any) -> Observed:
    return Observed(
        name="catalog", namespace="apps", generation=1, spec=spec, status=extra.pop("status", {}), **extra
    )


def children(planned: Any) -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["metadata"]["name"]): c for c in planned.children}


def pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"catalog-{i}", "uid": f"u{i}", "labels": {}},
        "status": {"podIP": f"10.0.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_ferretdb_serves_one_member_over_sqlite_with_the_generated_root_user() -> None:
    planned = plan(PLUGIN, observed(SPEC), CATALOG, "uid-1")
    rendered = children(planned)
    sts = rendered[("StatefulsetRollout", "catalog")]["spec"]["statefulSet"]
    container = sts["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") or e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert container["image"] == "ferretdb:1.24"
    assert env["FERRETDB_HANDLER"] == "sqlite"
    assert env["FERRETDB_TEST_ENABLE_NEW_AUTH"] == "true"
    assert env["FERRETDB_SETUP_PASSWORD"] == {"name": "catalog-root", "key": "password"}
    assert "initContainers" not in sts["template"]["spec"]
    assert sts["replicas"] == 1
    # The client Service reaches the primary only; the headless one names every member.
    assert rendered[("Service", "catalog")]["spec"]["selector"]["statefleet.dev/role"] == "primary"
    assert rendered[("Service", "catalog-nodes")]["spec"]["clusterIP"] == "None"
    assert {s["metadata"]["name"] for s in planned.secrets_to_create} == {"catalog-root", "catalog-keyfile"}
    assert planned.status["flavor"] == "ferretdb"


def test_ferretdb_refuses_more_than_one_member_naming_the_field() -> None:
    planned = plan(PLUGIN, observed({**SPEC, "members": 3}), CATALOG, "uid-1")
    ready = next(c for c in planned.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec"
    assert ready["message"] == (
        "spec.members: version 7 is served here by FerretDB, which has no replication: it runs 1 member"
    )
    assert not planned.apply


def test_mongod_runs_a_replica_set_member_with_its_key_file() -> None:
    planned = plan(PLUGIN, observed({**SPEC, "version": "7.0", "members": 3}), CATALOG, "uid-1")
    spec = children(planned)[("StatefulsetRollout", "catalog")]["spec"]
    template = spec["statefulSet"]["template"]["spec"]
    args = template["containers"][0]["args"]
    assert args[:2] == ["mongod", "--replSet=catalog"]
    # TLS on its one port, in clear too unless required (the members speak in clear to each
    # other: one rolled onto TLS still reaches those not yet rolled); certificate and key in one file.
    assert "--tlsMode=allowTLS" in args
    assert "--tlsCertificateKeyFile=/keyfile/server.pem" in args
    assert (
        "cat /etc/statefleet-tls/tls.crt /etc/statefleet-tls/tls.key > /keyfile/server.pem"
        in (template["initContainers"][0]["command"][-1])
    )
    assert spec["strategy"]["hooks"]["beforeTakeDown"] == [{"inProcess": {"name": "mongodb-step-down"}}]
    # A read-only root: it writes its data and /tmp (socket) on volumes only.
    server = template["containers"][0]
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in server["volumeMounts"]
    tls_only = {**SPEC, "version": "7.0", "members": 3, "tls": {"required": True}}
    required = plan(PLUGIN, observed(tls_only), CATALOG, "uid-1")
    args = children(required)[("StatefulsetRollout", "catalog")]["spec"]["statefulSet"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--tlsMode=requireTLS" in args


def ferretdb_rendered(spec: dict) -> tuple[dict, dict, dict]:
    """The FerretDB container, its pod template and the client Service."""
    rendered = children(plan(PLUGIN, observed(spec), CATALOG, "uid-1", now=1.8e9))
    template = rendered[("StatefulsetRollout", "catalog")]["spec"]["statefulSet"]["template"]
    return template["spec"]["containers"][0], template, rendered[("Service", "catalog")]


def test_ferretdb_serves_tls_on_its_own_port_and_in_clear_unless_required() -> None:
    container, template, service = ferretdb_rendered(SPEC)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FERRETDB_LISTEN_TLS"] == ":27018"
    assert env["FERRETDB_LISTEN_TLS_CERT_FILE"] == "/etc/statefleet-tls/tls.crt"
    assert "FERRETDB_LISTEN_TLS_CA_FILE" not in env  # it would require client certificates
    assert env["FERRETDB_LISTEN_ADDR"] == ":27017"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"mongodb": 27017, "mongodb-tls": 27018}
    assert container["readinessProbe"]["tcpSocket"] == {"port": "mongodb-tls"}
    assert {p["port"] for p in service["spec"]["ports"]} == {27017, 27018}
    # It reads its certificate at start only: a new one rolls it.
    issued = template["metadata"]["annotations"]["statefleet.dev/certificate-not-after"]
    assert issued.startswith("2027-")  # 90 days after the plan's now, 2027-01-15

    container, _, service = ferretdb_rendered({**SPEC, "tls": {"required": True}})
    assert "FERRETDB_LISTEN_ADDR" not in {e["name"] for e in container["env"]}
    assert container["args"] == ["--listen-addr="]  # its default would listen on loopback
    assert [p["name"] for p in container["ports"]] == ["mongodb-tls"]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(27018, "mongodb-tls")]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"members": 2}, "an even number of members"),
        ({"members": 9}, "less than or equal to 7"),
        ({"members": 3, "priorities": {"5": 1}}, "spec.priorities: '5' is not a member ordinal"),
        ({"members": 3, "priorities": {"0": 0, "1": 0, "2": 0}}, "at least one member must be able"),
    ],
)
def test_bad_input_is_refused(change: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        MongoDBSpec.model_validate({**SPEC, **change})


def test_a_member_leaving_keeps_its_pod_until_the_set_has_removed_it() -> None:
    members = [0, 1, 2]
    config = {
        "config": {
            "_id": "catalog",
            "version": 4,
            "members": [
                {"_id": i, "host": f"catalog-{i}.catalog-nodes.apps.svc:27017", "priority": 1, "votes": 1}
                for i in members
            ],
        },
        "ok": 1,
    }
    hello = {
        i: parse_hello(
            {"setName": "catalog", "isWritablePrimary": i == 0, "secondary": i != 0, "hosts": [], "ok": 1}
        )
        for i in members
    }
    facts = SetFacts(
        Answers({f"catalog-{i}": hello[i] for i in members}, {f"catalog-{i}": f"u{i}/0" for i in members}),
        parse_config(config),
        (),
    )
    planned = plan(
        PLUGIN,
        observed(
            {**SPEC, "version": "7.0", "members": 1},
            pods=[pod(i) for i in members],
            status={"initialized": True, "flavor": "mongod"},
            inspection=Inspection(at=0.0, facts=facts, answered=True),
        ),
        CATALOG,
        "uid-1",
    )
    assert children(planned)[("StatefulsetRollout", "catalog")]["spec"]["statefulSet"]["replicas"] == 3
    (action,) = planned.operations.actions
    assert isinstance(action, Reconfigure)
    assert [m["_id"] for m in action.config["members"]] == [0, 1]
    assert planned.operations.pod_labels["catalog-0"] == {"statefleet.dev/role": "primary"}


def test_a_binding_gets_a_mongodb_uri_with_its_own_database_as_auth_source() -> None:
    service = {"metadata": {"name": "catalog", "namespace": "apps"}}
    user = {
        "status": {
            "username": "shop",
            "database": "shop",
            "hosts": ["catalog-0.catalog-nodes.apps.svc:27017", "catalog-1.catalog-nodes.apps.svc:27017"],
            "replicaSet": "catalog",
        }
    }
    data = PLUGIN.bindings.secret_data(service, user, {"password": "p@ss/word"}, "CA PEM")
    assert data["type"] == "mongodb"
    assert data["uri"] == (
        "mongodb://shop:p%40ss%2Fword@catalog-0.catalog-nodes.apps.svc:27017,"
        "catalog-1.catalog-nodes.apps.svc:27017/shop?authSource=shop&tls=true&replicaSet=catalog"
    )
    assert (data["host"], data["port"], data["tls"], data["ca.crt"]) == (
        "catalog-0.catalog-nodes.apps.svc",
        "27017",
        "true",
        "CA PEM",
    )
    # FerretDB's TLS listener has a port of its own.
    ferretdb = {"status": {"username": "shop", "database": "shop", "hosts": ["catalog.apps.svc:27018"]}}
    data = PLUGIN.bindings.secret_data(service, ferretdb, {"password": "pw"}, "CA PEM")
    assert data["uri"] == "mongodb://shop:pw@catalog.apps.svc:27018/shop?authSource=shop&tls=true"
    assert data["port"] == "27018"
    assert PLUGIN.bindings.user_spec("shop", "catalog") == {"instance": "catalog", "database": "shop"}


def wanted(**change: Any) -> WantedUser:
    fields = {
        "username": "shop",
        "database": "shop",
        "password": "secret",
        "password_changed": False,
        "roles": (("readWrite", "shop"),),
        "marker": "apps/shop",
        "custom_data": True,
    }
    return WantedUser(**{**fields, **change})


def test_a_user_is_created_once_marked_as_the_resources() -> None:
    planned = plan_user(wanted(password_changed=True), None, made_here=False)
    assert planned.commands == [
        {
            "createUser": "shop",
            "pwd": "secret",
            "roles": [{"role": "readWrite", "db": "shop"}],
            "customData": {"statefleet": "apps/shop"},
        }
    ]
    found = {
        "user": "shop",
        "db": "shop",
        "roles": [{"role": "readWrite", "db": "shop"}],
        "customData": {"statefleet": "apps/shop"},
    }
    assert plan_user(wanted(), found, made_here=False).commands == []


def test_a_changed_password_or_roles_update_the_user() -> None:
    found = {
        "user": "shop",
        "db": "shop",
        "roles": [{"role": "read", "db": "shop"}],
        "customData": {"statefleet": "apps/shop"},
    }
    planned = plan_user(wanted(password_changed=True), found, made_here=False)
    assert planned.commands == [
        {"updateUser": "shop", "pwd": "secret", "roles": [{"role": "readWrite", "db": "shop"}]}
    ]
    assert planned.events == [("Normal", "UserUpdated", "user shop: password and roles changed")]


def test_a_user_made_by_someone_else_is_refused() -> None:
    found = {"user": "shop", "db": "shop", "roles": []}
    planned = plan_user(wanted(), found, made_here=False)
    assert planned.commands == []
    assert planned.refusal.startswith(
        "user shop already exists in database shop and this resource did not make it"
    )


def test_on_ferretdb_the_status_remembers_whose_user_it_is() -> None:
    ferret = wanted(roles=(), custom_data=False)
    (create,) = plan_user(ferret, None, made_here=False).commands
    assert create == {"createUser": "shop", "pwd": "secret", "roles": []}
    found = {"user": "shop", "db": "shop", "roles": []}
    assert plan_user(ferret, found, made_here=True).refusal is None
    assert plan_user(ferret, found, made_here=False).refusal is not None


def test_without_a_primary_no_member_pod_goes() -> None:
    sts = {
        "spec": {
            "replicas": 3,
            "volumeClaimTemplates": [{"spec": {"resources": {"requests": {"storage": "1Gi"}}}}],
        }
    }
    planned = plan(
        PLUGIN,
        observed(
            {**SPEC, "version": "7.0", "members": 1},
            statefulset=sts,
            pods=[pod(i) for i in range(3)],
            status={"initialized": True, "flavor": "mongod"},
        ),
        CATALOG,
        "uid-1",
    )
    assert children(planned)[("StatefulsetRollout", "catalog")]["spec"]["statefulSet"]["replicas"] == 3


def test_the_server_cannot_change_under_the_data() -> None:
    planned = plan(
        PLUGIN, observed({**SPEC, "version": "7.0"}, status={"flavor": "ferretdb"}), CATALOG, "uid-1"
    )
    ready = next(c for c in planned.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith(
        "spec.version: 7.0 is served by mongod, and this instance's data is ferretdb's"
    )


def test_a_mongod_set_keeps_the_tls_mode_it_was_made_with_and_ferretdb_changes_it() -> None:
    made_before = {"initialized": True, "flavor": "mongod"}  # by an operator without TLS
    planned = plan(
        PLUGIN,
        observed({**SPEC, "version": "7.0", "members": 3, "tls": {"required": True}}, status=made_before),
        CATALOG,
        "uid-1",
    )
    ready = next(c for c in planned.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ChangeRefused"
    assert ready["message"].startswith("spec.tls.required: this mongod replica set was made with it false")
    # Made with it: kept, and its status says so; the endpoints then offer TLS only.
    made = plan(
        PLUGIN,
        observed(
            {**SPEC, "version": "7.0", "members": 3, "tls": {"required": True}},
            status={**made_before, "tlsRequired": True},
        ),
        CATALOG,
        "uid-1",
    )
    assert made.status["tlsRequired"] is True
    assert set(made.status["endpoints"]) == {"tlsUri"}
    # FerretDB (one member, restarted as a whole) may change it.
    ferretdb = plan(
        PLUGIN,
        observed({**SPEC, "tls": {"required": True}}, status={"initialized": True, "flavor": "ferretdb"}),
        CATALOG,
        "uid-1",
    )
    assert ferretdb.status["tlsRequired"] is True
