"""Rotating a RabbitMQ's default user's and a MongoDB's root user's passwords
(`spec.rotateCredentials`, `framework/credentials.py`): the plan step by step, why it waits,
the password hash the operator gives RabbitMQ, the logins that try the staged password, and
`statefleet rabbitmq|mongodb rotate-credentials`."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from argparse import Namespace
from typing import Any, ClassVar

import httpx2
import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret
from pymongo.errors import OperationFailure

from framework import credentials_command
from framework.catalog import Catalog
from framework.credentials import StageCredentials, SwapCredentials
from framework.instance_plan import plan
from framework.plugin import Inspection, Observed
from framework.servers import Answers
from services.mongodb import PLUGIN as MONGODB
from services.mongodb import servers as mongodb_servers
from services.mongodb.plugin import SetFacts, SetRootPassword
from services.mongodb.replicaset import parse_hello
from services.rabbitmq import PLUGIN as RABBITMQ
from services.rabbitmq import management
from services.rabbitmq.cluster import NodeAnswer, node_name
from services.rabbitmq.plugin import NodeFacts, SetDefaultUserPassword
from statefleet import cli

pytestmark = pytest.mark.unit

REQUEST = "2026-03-01T10:00:00.000001Z"
NOW = 1_800_000_000.0
RABBITMQ_CATALOG = Catalog.from_yaml('rabbitmq: {default: "3", versions: {"3": {image: rmq:3}}}')
MONGODB_CATALOG = Catalog.from_yaml(
    'mongodb: {default: "7", versions: {"7": {image: f:1, flavor: ferretdb}, "7.0": {image: m:7}}}'
)


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def secret(password: str, staged: str | None = None, username: str = "admin") -> dict[str, Any]:
    data = {"username": username, "password": password, **({"next-password": staged} if staged else {})}
    return {"data": {k: b64(v) for k, v in data.items()}}


def pod(name: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"u-{name}", "labels": {}},
        "status": {
            "podIP": f"10.0.0.{name[-1]}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"restartCount": 0}],
        },
    }


def lives(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: f"{p['metadata']['uid']}/0" for p in pods}


def rotation_actions(planned: Any, apply: type) -> list[Any]:
    kinds = (StageCredentials, apply, SwapCredentials)
    return [action for action in planned.operations.actions if isinstance(action, kinds)]


def rotation_of(planned: Any) -> dict[str, Any]:
    return planned.status.get("credentialsRotation") or planned.operations.status["credentialsRotation"]


# RabbitMQ


def rabbitmq(
    status: dict[str, Any],
    staged: bool,
    answering: tuple[int, ...] = (0, 1, 2),
    pods: list[dict[str, Any]] | None = None,
    replicas: int = 3,
) -> Observed:
    pods = pods if pods is not None else [pod(f"events-{i}") for i in range(3)]
    nodes = frozenset(node_name(f"events-{i}", "events", "apps") for i in answering)
    answer = NodeAnswer(nodes, frozenset(), frozenset())
    facts = NodeFacts(Answers({f"events-{i}": answer for i in answering}, lives(pods)))
    spec = {"replicas": replicas, "storage": {"size": "1Gi"}, "rotateCredentials": REQUEST}
    return Observed(
        name="events",
        namespace="apps",
        generation=2,
        spec=spec,
        status={"childrenHash": "h", "initialized": True, **status},
        pods=pods,
        secrets={"default-user": secret("old", "new" if staged else None), "erlang-cookie": {}},
        inspection=Inspection(at=1.0, facts=facts, answered=True),
    )


def test_rabbitmq_stages_then_sets_the_default_user_s_password_on_a_node_that_answers_then_swaps() -> None:
    first = plan(RABBITMQ, rabbitmq({}, staged=False), RABBITMQ_CATALOG, "uid", now=NOW)
    assert rotation_actions(first, SetDefaultUserPassword) == [StageCredentials(("events-default-user",))]
    rotation = rotation_of(first)
    assert (rotation["requested"], rotation["phase"]) == (REQUEST, "Staged")

    second = plan(
        RABBITMQ, rabbitmq({"credentialsRotation": rotation}, staged=True), RABBITMQ_CATALOG, "uid", now=NOW
    )
    everyone = ("events-0", "events-1", "events-2")
    assert rotation_actions(second, SetDefaultUserPassword) == [SetDefaultUserPassword(everyone)]
    rotation = rotation_of(second)
    assert rotation["phase"] == "Applied"

    third = plan(
        RABBITMQ,
        rabbitmq({"credentialsRotation": rotation}, staged=True, answering=(1, 2)),
        RABBITMQ_CATALOG,
        "uid",
        now=NOW,
    )
    assert rotation_actions(third, SetDefaultUserPassword) == [
        SetDefaultUserPassword(("events-1", "events-2")),  # again, on the nodes that answer
        SwapCredentials(("events-default-user",)),
    ]
    assert rotation_of(third)["phase"] == "Rotated"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"replicas": 1}, "a scale-down is under way"),
        ({"answering": ()}, "no ready node answers its management API"),
        (
            {
                "pods": [
                    pod("events-0", ready=False),
                    pod("events-1", ready=False),
                    pod("events-2", ready=False),
                ]
            },
            "no ready node answers its management API",
        ),
    ],
)
def test_rabbitmq_sets_no_password_while_scaling_down_or_when_no_node_answers(
    change: dict[str, Any], why: str
) -> None:
    staged = {"requested": REQUEST, "phase": "Staged", "startedAt": "x"}
    observed = rabbitmq({"credentialsRotation": staged}, staged=True, **change)
    if "replicas" in change:  # the StatefulSet still runs 3
        observed = Observed(**{**observed.__dict__, "statefulset": {"spec": {"replicas": 3}}})
    planned = plan(RABBITMQ, observed, RABBITMQ_CATALOG, "uid", now=NOW)
    assert rotation_actions(planned, SetDefaultUserPassword) == []
    assert rotation_of(planned)["phase"] == "Staged"
    assert rotation_of(planned)["message"].endswith(f"waiting: {why}")


def test_the_password_hash_is_rabbitmq_s_salted_sha256() -> None:
    # RabbitMQ's documented example (docs: Credentials and Passwords, "Computing Password Hash").
    assert management.password_hash("test12", bytes.fromhex("908dc60a")) == (
        "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"
    )
    hashed = base64.b64decode(management.password_hash("pässwörd"))
    salt, digest = hashed[:4], hashed[4:]
    assert digest == hashlib.sha256(salt + "pässwörd".encode()).digest()
    assert management.password_hash("pässwörd") != management.password_hash("pässwörd")  # fresh salts


class FakeSecrets:
    def __init__(self, **secrets: dict[str, str]) -> None:
        self.data = {name: {k: b64(v) for k, v in values.items()} for name, values in secrets.items()}

    async def get(self, _: Any, name: str, namespace: str) -> Secret:
        return Secret(metadata=ObjectMeta(name=name, namespace=namespace), data=dict(self.data[name]))


class FakeRabbitMQ:
    """A node's management API: one user, its tags, its password hash."""

    def __init__(self, password: str) -> None:
        self.user = {"name": "admin", "tags": ["administrator", "monitoring"]}
        self.hash = management.password_hash(password)
        self.requests: list[tuple[str, str, str, Any]] = []

    def takes(self, password: str) -> bool:
        raw = base64.b64decode(self.hash)
        return hashlib.sha256(raw[:4] + password.encode()).digest() == raw[4:]

    async def send(self, namespace: str, name: str, ip: str, method: str, path: str, body: Any, *rest: Any):
        auth = rest[1]
        self.requests.append((method, path, auth[1], body))
        request = httpx2.Request(method, f"https://{ip}/api/{path}")
        if auth[0] != "admin" or not self.takes(auth[1]):
            return httpx2.Response(401, json={"reason": "Not_Authorized"}, request=request)
        if method == "PUT":
            assert body["hashing_algorithm"] == "rabbit_password_hashing_sha256"
            self.hash, self.user["tags"] = body["password_hash"], body["tags"].split(",")
            return httpx2.Response(204, request=request)
        return httpx2.Response(
            200, json=self.user if path.startswith("users/") else {"name": "admin"}, request=request
        )


def test_the_default_user_gets_the_staged_password_with_its_tags_and_the_operator_logs_in_with_either(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secrets = FakeSecrets(**{"events-default-user": {"username": "admin", "password": "old"}})
    server = FakeRabbitMQ("old")
    api = management.Management("{name}-default-user", "{name}-tls")

    async def verify(*_: Any) -> None:
        return None

    monkeypatch.setattr(api, "_verify", verify)
    monkeypatch.setattr(api, "_send", server.send)

    def get(path: str) -> int:
        return asyncio.run(api.request(secrets, "apps", "events", "10.0.0.1", "GET", path)).status_code

    assert get("overview") == 200
    secrets.data["events-default-user"]["next-password"] = b64("new")  # staged
    assert get("overview") == 200  # the cached password, still the server's
    asyncio.run(api.set_password(secrets, "apps", "events", "10.0.0.1", "admin", "new"))
    assert server.takes("new")
    assert not server.takes("old")
    assert server.user["tags"] == ["administrator", "monitoring"]  # kept
    assert ("GET", "whoami", "new", None) in server.requests  # checked with the new one
    server.requests.clear()
    assert get("overview") == 200  # old refused, new taken: a 401 is a refused login
    assert [(r[1], r[2]) for r in server.requests] == [("overview", "old"), ("overview", "new")]
    server.requests.clear()
    assert get("overview") == 200
    assert [r[2] for r in server.requests] == ["new"]  # the one that worked, first
    server.hash = management.password_hash("neither")
    assert get("overview") == 401  # neither taken: the refusal is the answer


# MongoDB


def ferretdb(status: dict[str, Any], staged: bool, answers: bool = True) -> Observed:
    pods = [pod("catalog-0")]
    hello = parse_hello({"isWritablePrimary": True, "me": "catalog-0"})
    facts = SetFacts(Answers({"catalog-0": hello if answers else None}, lives(pods)), None, None)
    return Observed(
        name="catalog",
        namespace="apps",
        generation=2,
        spec={"version": "7", "members": 1, "storage": {"size": "1Gi"}, "rotateCredentials": REQUEST},
        status={"childrenHash": "h", "initialized": True, "flavor": "ferretdb", **status},
        pods=pods,
        secrets={"root": secret("old", "new" if staged else None, "root"), "keyfile": {}},
        inspection=Inspection(at=1.0, facts=facts, answered=answers),
    )


def test_ferretdb_stages_then_updates_the_root_user_then_swaps() -> None:
    first = plan(MONGODB, ferretdb({}, staged=False), MONGODB_CATALOG, "uid", now=NOW)
    assert rotation_actions(first, SetRootPassword) == [StageCredentials(("catalog-root",))]
    rotation = rotation_of(first)
    second = plan(MONGODB, ferretdb({"credentialsRotation": rotation}, True), MONGODB_CATALOG, "uid", now=NOW)
    assert rotation_actions(second, SetRootPassword) == [SetRootPassword("catalog-0")]
    rotation = rotation_of(second)
    third = plan(MONGODB, ferretdb({"credentialsRotation": rotation}, True), MONGODB_CATALOG, "uid", now=NOW)
    assert rotation_actions(third, SetRootPassword) == [
        SetRootPassword("catalog-0"),
        SwapCredentials(("catalog-root",)),
    ]
    assert rotation_of(third)["phase"] == "Rotated"


def test_mongodb_sets_no_password_without_a_primary() -> None:
    staged = {"credentialsRotation": {"requested": REQUEST, "phase": "Staged", "startedAt": "x"}}
    silent = plan(MONGODB, ferretdb(staged, True, answers=False), MONGODB_CATALOG, "uid", now=NOW)
    assert rotation_actions(silent, SetRootPassword) == []
    assert rotation_of(silent)["message"].endswith("waiting: no primary answers")
    # mongod: the primary the status names
    replica_set = {"flavor": "mongod", "replicaSet": {"primary": "catalog-2"}}
    rotation = MONGODB.rotation
    assert rotation is not None
    pods = [pod("catalog-0"), pod("catalog-1"), pod("catalog-2", ready=False)]
    member = Observed(name="catalog", namespace="apps", generation=1, spec={}, status=replica_set, pods=pods)
    assert rotation.waiting(member) == "the primary catalog-2 is not ready"
    assert rotation.apply(member) == SetRootPassword("catalog-2")
    no_primary = Observed(
        name="catalog", namespace="apps", generation=1, spec={}, status={"flavor": "mongod"}
    )
    assert rotation.waiting(no_primary) == "no primary answers"


class FakeMongo:
    takes = "old"
    tried: ClassVar[list[str]] = []

    def __init__(self, password: str) -> None:
        self.password = password
        self.admin = self

    async def command(self, command: Any) -> dict[str, Any]:
        FakeMongo.tried.append(self.password)
        if self.password != FakeMongo.takes:
            raise OperationFailure("Authentication failed.", code=18)
        return {"ok": 1}

    async def close(self) -> None:
        pass


def test_the_operator_logs_in_to_mongodb_with_the_staged_password_once_the_server_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mongodb_servers, "client_of", lambda host, timeout, ca, **c: FakeMongo(c["password"]))
    secrets = FakeSecrets(
        **{
            "catalog-root": {"username": "root", "password": "old", "next-password": "new"},
            "catalog-tls": {"ca.crt": "the CA"},
        }
    )
    servers = mongodb_servers.Servers("{name}-root", "{name}-tls")

    def ping() -> dict[str, Any]:
        return asyncio.run(servers.command(secrets, "apps", "catalog", "10.0.0.0:27018", {"ping": 1}))

    FakeMongo.tried = []
    assert ping() == {"ok": 1}
    assert FakeMongo.tried == ["old", "old"]  # the login's ping, then the command
    FakeMongo.takes, FakeMongo.tried = "new", []
    assert ping() == {"ok": 1}
    assert FakeMongo.tried == ["old", "new", "new"]  # old refused (code 18), new taken
    FakeMongo.takes = "other"
    with pytest.raises(OperationFailure):
        ping()


# The verb


class FakeKube:
    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status
        self.patched: list[tuple[str, dict[str, Any]]] = []

    def patch(
        self, resource: Any, name: str, change: dict[str, Any], namespace: str, patch_type: Any
    ) -> None:
        self.patched.append((resource._api_info.resource.kind, change))

    def get(self, _: Any, name: str, namespace: str) -> Any:
        return Namespace(to_dict=lambda: {"status": self.status})


@pytest.mark.parametrize(("group", "kind"), [("rabbitmq", "RabbitMQ"), ("mongodb", "MongoDB")])
def test_the_verb_asks_the_service_s_resource_for_a_rotation_and_waits_for_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], group: str, kind: str
) -> None:
    monkeypatch.setattr(credentials_command, "request_token", lambda: "T1")
    monkeypatch.setattr("framework.kube.requests.time.sleep", lambda _: None)
    kube = FakeKube({"credentialsRotation": {"requested": "T1", "phase": "Rotated", "message": "done"}})
    monkeypatch.setattr(cli, "Client", lambda **_: kube)
    assert cli.main([group, "rotate-credentials", "demo", "-n", "apps"]) == 0
    assert kube.patched == [(kind, {"spec": {"rotateCredentials": "T1"}})]
    assert capsys.readouterr().out.splitlines() == [
        f"{kind.lower()}/demo: credentials rotation requested (T1)",
        f"{kind.lower()}/demo: rotated: done",
    ]
