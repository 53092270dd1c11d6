"""A credentials rotation, service-neutral (`framework/credentials.py`): every step from the
status and the Secrets alone, so an operator restarted anywhere goes on; the instance
controller's own actions (stage, swap) on Secrets; the operator's logins that try the current
password, then the next."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace
from typing import Any

import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret

from framework import credentials
from framework.credentials import (
    APPLIED,
    ROTATED,
    STAGED,
    StageCredentials,
    SwapCredentials,
    pending,
    plan_rotation,
    staged_in,
    under_way,
)
from framework.instance_controller import InstanceController, rotation_moved
from framework.kube.secrets import Passwords

pytestmark = pytest.mark.unit

NOW, LATER = "2026-03-01T10:00:00Z", "2026-03-01T10:00:05Z"
BOTH = {"superuser": True, "replication": True}
NEITHER = {"superuser": False, "replication": False}


def walk(requested: str | None, status: dict[str, Any] | None, staged: dict[str, bool], **more: Any) -> Any:
    return plan_rotation(requested, status, staged, LATER, **more)


def test_a_fresh_request_stages_then_applies_then_swaps_recording_each_step() -> None:
    step = walk("r1", None, NEITHER)
    assert (step.stage, step.apply, step.swap) == (True, False, False)
    assert step.status == {
        "requested": "r1",
        "phase": STAGED,
        "startedAt": LATER,
        "completedAt": None,
        "message": "new passwords staged in the Secrets (next-password)",
    }
    assert [e.reason for e in step.events] == ["CredentialsRotationStarted"]

    step = walk("r1", step.status, BOTH)  # the next pass: both Secrets hold a next password
    assert (step.stage, step.apply, step.swap) == (False, True, False)
    assert step.status["phase"] == APPLIED

    step = walk("r1", step.status, BOTH)  # applied again just before the swap, then swapped
    assert (step.stage, step.apply, step.swap) == (False, True, True)
    assert step.status["phase"] == ROTATED
    assert step.status["completedAt"] == LATER
    assert [e.reason for e in step.events] == ["CredentialsRotated"]

    done = walk("r1", step.status, NEITHER)  # served: nothing more, nothing written
    assert done.status is None
    assert not done.stage
    assert not done.apply
    assert not done.swap


def test_nothing_is_asked_without_a_request_nor_before_the_secrets_are_read() -> None:
    assert walk(None, None, NEITHER).status is None
    assert plan_rotation("r1", None, None, NOW).status is None  # read on the next pass
    assert plan_rotation("r1", {"requested": "r1", "phase": STAGED}, None, NOW).status is None


def test_a_new_instance_made_with_a_request_has_new_passwords_already() -> None:
    step = walk("r1", None, NEITHER, fresh=True)
    assert step.status is not None
    assert step.status["phase"] == ROTATED
    assert not step.stage
    assert not step.apply
    assert not step.swap


@pytest.mark.parametrize(
    ("recorded", "staged", "then"),
    [
        # stopped after staging, before recording it: staged again (the executor keeps a staged
        # password: the servers may have it) and recorded
        (None, BOTH, (True, False, False, STAGED)),
        ({"requested": "r0", "phase": ROTATED}, BOTH, (True, False, False, STAGED)),
        # stopped after applying, before recording it: applied again (idempotent)
        ({"requested": "r1", "phase": STAGED}, BOTH, (False, True, False, APPLIED)),
        # staged in one Secret only (a failed pass): the other is staged first
        (
            {"requested": "r1", "phase": STAGED},
            {"superuser": True, "replication": False},
            (True, False, False, STAGED),
        ),
        # stopped half way through the swap: applied again, the rest swapped
        (
            {"requested": "r1", "phase": APPLIED},
            {"superuser": False, "replication": True},
            (False, True, True, ROTATED),
        ),
        # stopped after the swap, before recording it: nothing left to do but record it
        ({"requested": "r1", "phase": APPLIED}, NEITHER, (False, False, False, ROTATED)),
    ],
)
def test_an_operator_restarted_at_any_step_goes_on_from_the_status_and_the_secrets(
    recorded: dict[str, Any] | None, staged: dict[str, bool], then: tuple[bool, bool, bool, str]
) -> None:
    step = walk("r1", recorded, staged)
    assert step.status is not None
    assert (step.stage, step.apply, step.swap, step.status["phase"]) == then
    assert step.status["requested"] == "r1"


def test_a_second_request_after_one_is_done_starts_a_new_rotation() -> None:
    done = {"requested": "r1", "phase": ROTATED, "startedAt": NOW, "completedAt": NOW}
    step = walk("r2", done, NEITHER)
    assert step.stage
    assert step.status is not None
    assert (step.status["requested"], step.status["phase"], step.status["completedAt"]) == (
        "r2",
        STAGED,
        None,
    )


@pytest.mark.parametrize("phase", [STAGED, APPLIED])
def test_a_request_changed_mid_way_waits_for_the_rotation_under_way(phase: str) -> None:
    """Never abandoned half way: the servers may take the new passwords already."""
    step = walk("r2", {"requested": "r1", "phase": phase, "startedAt": NOW}, BOTH)
    assert step.status is not None
    assert step.status["requested"] == "r1"
    assert step.apply
    assert not step.stage
    if phase == STAGED:
        assert "the request r2 follows once this one is done" in step.status["message"]
        step = walk("r2", step.status, BOTH)
    assert step.status is not None
    assert step.status["phase"] == ROTATED
    assert step.status["requested"] == "r1"
    following = walk("r2", step.status, NEITHER)  # then the newer request starts
    assert following.stage
    assert following.status is not None
    assert following.status["requested"] == "r2"


def test_a_request_withdrawn_mid_way_is_finished_all_the_same() -> None:
    step = walk(None, {"requested": "r1", "phase": APPLIED}, BOTH)
    assert step.swap
    assert step.status is not None
    assert step.status["phase"] == ROTATED


def test_the_servers_are_given_nothing_while_the_plugin_says_they_cannot_take_it() -> None:
    staged = {"requested": "r1", "phase": STAGED, "message": "x"}
    step = walk("r1", staged, BOTH, waiting="a change of primary is under way")
    assert not step.apply
    assert not step.swap
    assert step.status is not None
    assert step.status["phase"] == STAGED
    assert step.status["message"].endswith("waiting: a change of primary is under way")
    assert walk("r1", step.status, BOTH, waiting="a change of primary is under way").status is None  # said
    applied = walk("r1", {"requested": "r1", "phase": APPLIED}, BOTH, waiting="the primary is not ready")
    assert not applied.apply
    assert not applied.swap
    assert applied.status is not None
    assert applied.status["phase"] == APPLIED
    # Staging touches no server: it goes on meanwhile.
    assert walk("r1", None, NEITHER, waiting="the primary is not ready").stage


def test_the_secrets_are_read_while_a_rotation_is_asked_for_or_under_way() -> None:
    assert pending({"rotateCredentials": "r1"}, {})
    assert pending(
        {"rotateCredentials": "r2"}, {"credentialsRotation": {"requested": "r1", "phase": ROTATED}}
    )
    assert pending({}, {"credentialsRotation": {"requested": "r1", "phase": APPLIED}})
    assert not pending(
        {"rotateCredentials": "r1"}, {"credentialsRotation": {"requested": "r1", "phase": ROTATED}}
    )
    assert not pending({}, {})
    assert under_way({"phase": STAGED})
    assert not under_way({"phase": ROTATED})
    assert not under_way(None)


def test_staged_reads_the_next_password_of_each_secret_and_nothing_when_not_read() -> None:
    with_next = {"data": {"password": "eA==", "next-password": "eQ=="}}
    assert staged_in(
        {"superuser": with_next, "replication": {"data": {"password": "eA=="}}}, ("superuser", "replication")
    ) == {
        "superuser": True,
        "replication": False,
    }
    assert staged_in({"superuser": with_next, "replication": {}}, ("superuser", "replication")) is None
    assert staged_in({"superuser": with_next}, ("superuser", "replication")) == {
        "superuser": True,
        "replication": False,  # missing: the pass creates it first
    }


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class FakeSecrets:
    """Secrets by name, read and merge-patched as the API server would (with its precondition)."""

    def __init__(self, **data: dict[str, str]) -> None:
        self.data = {name: {k: b64(v) for k, v in values.items()} for name, values in data.items()}
        self.versions = dict.fromkeys(data, 1)
        self.gets = 0

    async def get(self, _: Any, name: str, namespace: str) -> Secret:
        self.gets += 1
        meta = ObjectMeta(name=name, namespace=namespace, resourceVersion=str(self.versions[name]))
        return Secret(metadata=meta, data=dict(self.data[name]))

    async def patch(self, _: Any, name: str, change: dict[str, Any], namespace: str, patch_type: Any) -> None:
        assert change["metadata"]["resourceVersion"] == str(self.versions[name])
        for key, value in change["data"].items():
            if value is None:
                self.data[name].pop(key, None)
            else:
                self.data[name][key] = value
        self.versions[name] += 1

    def plain(self, name: str) -> dict[str, str]:
        return {k: base64.b64decode(v).decode() for k, v in self.data[name].items()}


def test_staging_keeps_a_password_staged_already_and_the_swap_leaves_a_swapped_secret_alone() -> None:
    secrets = FakeSecrets(
        **{"demo-superuser": {"password": "old-su"}, "demo-replication": {"password": "old-r"}}
    )
    controller: Any = SimpleNamespace(client=secrets)
    names = ("demo-superuser", "demo-replication")

    asyncio.run(InstanceController._stage_credentials(controller, "apps", StageCredentials(names)))
    staged = secrets.plain("demo-superuser")["next-password"]
    assert len(staged) == 32
    assert staged.isalnum()
    assert staged != "old-su"
    asyncio.run(InstanceController._stage_credentials(controller, "apps", StageCredentials(names)))
    assert secrets.plain("demo-superuser")["next-password"] == staged  # kept: the servers may have it

    asyncio.run(InstanceController._swap_credentials(controller, "apps", SwapCredentials(names[:1])))
    assert secrets.plain("demo-superuser") == {"password": staged}
    replication_next = secrets.plain("demo-replication")["next-password"]
    asyncio.run(InstanceController._swap_credentials(controller, "apps", SwapCredentials(names)))
    assert secrets.plain("demo-superuser") == {"password": staged}  # swapped already: untouched
    assert secrets.plain("demo-replication") == {"password": replication_next}


class Refused(Exception):
    pass


def test_logins_try_the_current_password_then_the_next_and_read_the_secret_again_when_both_fail() -> None:
    secrets = FakeSecrets(**{"demo-superuser": {"password": "old"}})
    passwords = Passwords("{name}-superuser")
    server = {"takes": "old"}
    tried: list[str] = []

    async def attempt(password: str) -> str:
        tried.append(password)
        if password != server["takes"]:
            raise Refused(password)
        return password

    def login() -> str:
        return asyncio.run(
            passwords.first_taken(secrets, "apps", "demo", attempt, lambda e: isinstance(e, Refused))
        )

    assert login() == "old"
    assert secrets.gets == 1
    assert login() == "old"
    assert secrets.gets == 1
    # A rotation staged the next password, and the server took it.
    secrets.data["demo-superuser"]["next-password"] = b64("new")
    server["takes"] = "new"
    tried.clear()
    assert login() == "new"
    assert tried == ["old", "new"]  # the cache, then the Secret read again (old is not tried twice)
    tried.clear()
    assert login() == "new"
    assert tried == ["new"]
    # Swapped: still taken at once.
    secrets.data["demo-superuser"] = {"password": b64("new")}
    tried.clear()
    assert login() == "new"
    assert tried == ["new"]
    # Neither taken: the last refusal is raised.
    server["takes"] = "other"
    with pytest.raises(Refused):
        login()

    async def broken(password: str) -> str:
        raise OSError("no route to host")

    with pytest.raises(OSError, match="no route"):  # not a refused login: raised at once
        asyncio.run(passwords.first_taken(secrets, "apps", "demo", broken, lambda e: isinstance(e, Refused)))


def test_the_framework_names_its_fields_for_every_service() -> None:
    assert (credentials.SPEC_FIELD, credentials.STATUS_FIELD) == ("rotateCredentials", "credentialsRotation")


def test_a_pass_that_moved_the_rotation_on_is_followed_at_once_by_the_next() -> None:
    """The window in which the servers take only the new passwords while the Secrets still say
    the old ones is one pass long, not one probe interval."""
    staged = {"credentialsRotation": {"requested": "r1", "phase": STAGED}}
    applied = {"credentialsRotation": {"requested": "r1", "phase": APPLIED}}
    rotated = {"credentialsRotation": {"requested": "r1", "phase": ROTATED}}
    assert rotation_moved({}, staged)
    assert rotation_moved(staged, applied)
    assert not rotation_moved(applied, rotated)  # done
    assert not rotation_moved(staged, staged)  # waiting: on the plugin's own cadence
    assert not rotation_moved({}, {})
