"""Rotating a Postgres's superuser and replication passwords (`spec.rotateCredentials`): the
instance's pass step by step, the SCRAM verifiers the operator sets, what a restarted container
uses, and `statefleet pg rotate-credentials`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import subprocess
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
from psycopg import pq

from framework import credentials_command
from framework.catalog import Catalog
from framework.credentials import StageCredentials, SwapCredentials
from framework.instance_plan import plan
from framework.plugin import Observed
from services.postgres import PLUGIN, scram
from services.postgres.plugin import ApplyCredentials
from statefleet import cli

pytestmark = pytest.mark.unit

CATALOG = Catalog.from_yaml('postgres: {default: "17", versions: {"17": {image: pg:17}}}')
NOW = 1_800_000_000.0
SPEC = {"instances": 3, "storage": {"size": "1Gi"}, "rotateCredentials": "2026-03-01T10:00:00.000001Z"}


def pod(name: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {}},
        "status": {
            "podIP": f"10.0.0.{name[-1]}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def secret(password: str, staged: str | None = None) -> dict[str, Any]:
    data = {"password": password, **({"next-password": staged} if staged else {})}
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def observed(status: dict[str, Any], staged: bool, spec: dict[str, Any] = SPEC, **more: Any) -> Observed:
    secrets = {
        "superuser": secret("a", "b" if staged else None),
        "replication": secret("c", "d" if staged else None),
        "ca": {},
        "tls": {},
    }
    base = {"currentPrimary": "demo-0", "childrenHash": "h", "initialized": True}
    return Observed(
        name="demo",
        namespace="apps",
        generation=2,
        spec=spec,
        status={**base, **status},
        pods=more.pop("pods", [pod("demo-0"), pod("demo-1"), pod("demo-2")]),
        secrets=secrets,
        **more,
    )


def rotation_actions(planned: Any) -> list[Any]:
    kinds = (StageCredentials, ApplyCredentials, SwapCredentials)
    return [action for action in planned.operations.actions if isinstance(action, kinds)]


def test_a_pass_per_step_recorded_in_status_until_the_secrets_hold_the_new_passwords() -> None:
    first = plan(PLUGIN, observed({}, staged=False), CATALOG, "uid", now=NOW)
    assert rotation_actions(first) == [StageCredentials(("demo-superuser", "demo-replication"))]
    rotation = first.status["credentialsRotation"]
    assert (rotation["requested"], rotation["phase"]) == (SPEC["rotateCredentials"], "Staged")
    assert "CredentialsRotationStarted" in [e.reason for e in first.events]

    second = plan(PLUGIN, observed({"credentialsRotation": rotation}, staged=True), CATALOG, "uid", now=NOW)
    everyone = ("demo-0", "demo-1", "demo-2")
    assert rotation_actions(second) == [ApplyCredentials("demo-0", everyone)]
    rotation = second.status["credentialsRotation"]
    assert rotation["phase"] == "Applied"

    third = plan(PLUGIN, observed({"credentialsRotation": rotation}, staged=True), CATALOG, "uid", now=NOW)
    assert rotation_actions(third) == [
        ApplyCredentials("demo-0", everyone),  # again, just before the swap
        SwapCredentials(("demo-superuser", "demo-replication")),
    ]
    assert third.status["credentialsRotation"]["phase"] == "Rotated"

    done = plan(PLUGIN, observed(third.status, staged=False), CATALOG, "uid", now=NOW)
    assert rotation_actions(done) == []
    assert done.status["credentialsRotation"] == third.status["credentialsRotation"]


@pytest.mark.parametrize(
    ("status", "pods", "why"),
    [
        ({"targetPrimary": "demo-1"}, None, "a change of primary is under way"),
        ({}, [pod("demo-0", ready=False), pod("demo-1")], "the primary demo-0 is not ready"),
        (
            {
                "inPlaceRestore": {
                    "token": "t",
                    "restore": "r",
                    "mode": "restore",
                    "phase": "Stopping",
                    "pod": "demo-0",
                }
            },
            None,
            "a restore in place is under way",
        ),
    ],
)
def test_the_servers_get_no_new_password_while_the_primary_changes_or_is_not_ready(
    status: dict[str, Any], pods: list[dict[str, Any]] | None, why: str
) -> None:
    staged = {"requested": SPEC["rotateCredentials"], "phase": "Staged", "startedAt": "x"}
    more = {"pods": pods} if pods else {}
    planned = plan(
        PLUGIN,
        observed({**status, "credentialsRotation": staged}, staged=True, **more),
        CATALOG,
        "uid",
        now=NOW,
    )
    assert rotation_actions(planned) == []
    rotation = planned.status.get("credentialsRotation") or planned.operations.status["credentialsRotation"]
    assert rotation["phase"] == "Staged"
    assert rotation["message"].endswith(f"waiting: {why}")


def test_the_pods_get_the_next_passwords_optionally_and_restored_specs_drop_the_request() -> None:
    planned = plan(PLUGIN, observed({}, staged=False), CATALOG, "uid", now=NOW)
    rollout = next(c for c in planned.children if c["kind"] == "StatefulsetRollout")
    env = {e["name"]: e for e in rollout["spec"]["statefulSet"]["template"]["spec"]["containers"][0]["env"]}
    for variable, name in (
        ("POSTGRES_NEXT_PASSWORD", "superuser"),
        ("REPLICATION_NEXT_PASSWORD", "replication"),
    ):
        # optional: without a rotation under way the key is missing, and the container must start
        assert env[variable]["valueFrom"]["secretKeyRef"] == {
            "name": f"demo-{name}",
            "key": "next-password",
            "optional": True,
        }
    assert PLUGIN.one_shot_fields() == ("switchover", "rotateCredentials")


# RFC 7677's example exchange (SCRAM-SHA-256, user "user", password "pencil").
RFC_SALT = "W22ZaJ0SNY7soEsUEjb6gQ=="
RFC_AUTH_MESSAGE = (
    b"n=user,r=rOprNGfwEbeRWgbNEkqO,"
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
)
RFC_CLIENT_PROOF = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
RFC_SERVER_SIGNATURE = "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_a_verifier_authenticates_the_rfc_7677_client_as_the_server_checks_it() -> None:
    stored = scram.verifier("pencil", base64.b64decode(RFC_SALT))
    assert re.fullmatch(
        r"SCRAM-SHA-256\$4096:[A-Za-z0-9+/=]{24}\$[A-Za-z0-9+/=]{44}:[A-Za-z0-9+/=]{44}", stored
    )
    iterations, salt, stored_key, server_key = scram.parse(stored)
    assert (iterations, base64.b64encode(salt).decode()) == (4096, RFC_SALT)
    # The server's check of the client's proof: ClientKey = proof XOR HMAC(StoredKey, AuthMessage),
    # and H(ClientKey) must be StoredKey.
    signature = hmac.new(stored_key, RFC_AUTH_MESSAGE, hashlib.sha256).digest()
    client_key = bytes(a ^ b for a, b in zip(base64.b64decode(RFC_CLIENT_PROOF), signature, strict=True))
    assert hashlib.sha256(client_key).digest() == stored_key
    # And the server proves itself with ServerKey as the RFC's server did.
    proof = base64.b64encode(hmac.new(server_key, RFC_AUTH_MESSAGE, hashlib.sha256).digest()).decode()
    assert proof == RFC_SERVER_SIGNATURE
    assert not scram.verifies(stored, "pencil2")


def test_a_verifier_is_libpq_s_for_the_same_salt_and_a_fresh_salt_each_time() -> None:
    connection = pq.PGconn.connect_start(b"host=/nonexistent port=1")  # libpq computes it locally
    theirs = connection.encrypt_password(b"Kq8zT1fz0aQ", b"postgres", b"scram-sha-256").decode()
    _, salt, _, _ = scram.parse(theirs)
    assert scram.verifier("Kq8zT1fz0aQ", salt) == theirs
    assert scram.verifies(theirs, "Kq8zT1fz0aQ")
    assert scram.verifier("x") != scram.verifier("x")
    with pytest.raises(ValueError, match="printable ASCII"):
        scram.verifier("pässword")  # SASLprep would change it: not computed here
    with pytest.raises(ValueError, match="not a SCRAM-SHA-256 verifier"):
        scram.parse("md5abcdef")


def start_script_choice(tmp_path: Path, takes: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """What start.sh's choice of passwords leaves, run with a psql that takes `takes` (user ->
    password) at <name>-rw and refuses anything else."""
    planned = plan(PLUGIN, observed({}, staged=False), CATALOG, "uid", now=NOW)
    config = next(c for c in planned.children if c["kind"] == "ConfigMap")["data"]["start.sh"]
    start = config.index("taken() {")
    chunk = config[start : config.index("export PGPASSFILE", start)]
    fake = tmp_path / "psql"
    accepted = " ".join(f"{user}={password}" for user, password in takes.items())
    fake.write_text(
        '#!/usr/bin/env bash\nuser=$(sed -n "s/.*user=\\([^ ]*\\).*/\\1/p" <<<"$2")\n'
        f'for pair in {accepted}; do [[ $pair == "$user=$PGPASSWORD" ]] && exit 0; done\nexit 2\n'
    )
    fake.chmod(0o755)
    script = f'set -euo pipefail\n{chunk}\necho "$POSTGRES_PASSWORD $REPLICATION_PASSWORD"\n'
    base = {"PATH": f"{tmp_path}:/usr/bin:/bin", "RW_HOST": "demo-rw", "POSTGRES_USER": "postgres"}
    base["REPLICATION_USER"] = "streaming_replica"
    done = subprocess.run(
        ["bash", "-c", script], env={**base, **env}, capture_output=True, text=True, check=True
    )
    superuser, replication = done.stdout.split()
    return {"postgres": superuser, "streaming_replica": replication}


def test_a_container_started_during_a_rotation_uses_the_passwords_the_primary_takes(tmp_path: Path) -> None:
    current = {"POSTGRES_PASSWORD": "su-old", "REPLICATION_PASSWORD": "r-old"}
    staged = {**current, "POSTGRES_NEXT_PASSWORD": "su-new", "REPLICATION_NEXT_PASSWORD": "r-new"}
    old = {"postgres": "su-old", "streaming_replica": "r-old"}
    new = {"postgres": "su-new", "streaming_replica": "r-new"}
    assert start_script_choice(tmp_path, old, current) == old  # no rotation
    assert start_script_choice(tmp_path, old, staged) == old  # staged: the servers take the old
    assert start_script_choice(tmp_path, new, staged) == new  # applied, not swapped yet
    assert start_script_choice(tmp_path, {}, staged) == old  # the primary does not answer


class FakeKube:
    def __init__(self, statuses: list[dict[str, Any]]) -> None:
        self.statuses = statuses
        self.patches: list[dict[str, Any]] = []

    def patch(self, _: Any, name: str, change: dict[str, Any], namespace: str, patch_type: Any) -> None:
        self.patches.append(change)

    def get(self, _: Any, name: str, namespace: str) -> Any:
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return Namespace(to_dict=lambda: {"status": status})


def run_cli(monkeypatch: pytest.MonkeyPatch, kube: FakeKube, *argv: str) -> int:
    """`statefleet ARGV` as a user runs it, against `kube`."""
    monkeypatch.setattr(cli, "Client", lambda **_: kube)
    return cli.main(list(argv))


def test_the_verb_asks_with_a_new_token_and_waits_for_that_one_to_be_rotated(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(credentials_command, "request_token", lambda: "T2")
    monkeypatch.setattr("framework.kube.requests.time.sleep", lambda _: None)
    earlier = {"requested": "T1", "phase": "Applied", "message": "the servers take them"}
    kube = FakeKube(
        [
            {"credentialsRotation": {"requested": "T1", "phase": "Rotated"}},  # the last one, served
            {"credentialsRotation": earlier},  # an earlier one still under way
            {"credentialsRotation": {"requested": "T1", "phase": "Rotated"}},
            {"credentialsRotation": {"requested": "T2", "phase": "Staged", "message": "staged"}},
            {"credentialsRotation": {"requested": "T2", "phase": "Rotated", "message": "done"}},
        ]
    )
    assert (
        run_cli(monkeypatch, kube, "pg", "rotate-credentials", "demo", "-n", "apps", "--timeout", "60") == 0
    )
    assert kube.patches == [{"spec": {"rotateCredentials": "T2"}}]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "postgres/demo: credentials rotation requested (T2)"
    assert "postgres/demo: Applied (an earlier request, T1): the servers take them" in lines
    assert "postgres/demo: Staged: staged" in lines
    assert lines[-1] == "postgres/demo: rotated: done"


def test_the_verb_fails_when_its_rotation_is_not_done_in_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("framework.kube.requests.time.sleep", lambda _: None)
    ticks = iter(range(0, 1000, 10))
    monkeypatch.setattr("framework.kube.requests.time.monotonic", lambda: next(ticks))
    kube = FakeKube([{"credentialsRotation": {"requested": "old", "phase": "Rotated"}}])
    assert (
        run_cli(monkeypatch, kube, "pg", "rotate-credentials", "demo", "-n", "apps", "--timeout", "30") == 1
    )
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == "postgres/demo: the credentials are not rotated after 30 s"
    )
    assert (
        credentials_command.outcome("t", {"credentialsRotation": {"requested": "t", "phase": "Applied"}})
        is None
    )
