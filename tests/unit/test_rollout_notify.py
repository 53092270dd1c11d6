"""Rollout notifications: what is sent, once, and how fast, against a local HTTP server."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from e2e.receiver import receiving
from framework.kube.api import EventNote
from framework.rollout import notify

pytestmark = pytest.mark.unit

STATUS = {
    "updateTemplateHash": "new1",
    "stableTemplateHash": "old1",
    "steps": 5,
    "replicas": 1000,
    "updatedReplicas": 100,
    "currentStepIndex": 2,
    "history": [
        {"step": 0, "description": "setPercent 1", "pods": "web-990..web-999 (10 pods)"},
        {"step": 1, "description": "setPercent 10", "pods": "web-900..web-989 (90 pods)"},
    ],
}


def test_a_step_notice_names_the_step_and_summarises_its_pods() -> None:
    events = [
        EventNote("Normal", "StepCompleted", "step 1 (setPercent 10) done"),
        EventNote("Normal", "Other", "x"),
    ]
    [notice] = notify.notices("apps", "web", events, STATUS)
    assert notice.kind == "step"
    assert notice.step == 1
    assert notice.pods == "web-900..web-989 (90 pods)"
    assert notice.key == "new1:step:1"
    message = notify.slack_message(notice, "#deploys")
    assert message["channel"] == "#deploys"
    assert message["blocks"][0] == {
        "type": "header",
        "text": {"type": "plain_text", "text": "➡️ apps/web: rollout step"},
    }
    fields = [f["text"] for f in message["blocks"][2]["fields"]]
    assert fields == [
        "*StatefulsetRollout*\napps/web",
        "*Template*\nold1 → new1",
        "*Step*\n2 of 5",
        "*Updated*\n100 of 1000",
    ]
    assert message["blocks"][3]["elements"][0]["text"] == "Pods: web-900..web-989 (90 pods)"
    payload = notify.webhook_payload(notice)
    assert payload["kind"] == "StatefulsetRollout"
    assert payload["event"] == "step"
    assert payload["rollout"] == "apps/web"
    assert "key" not in payload


def test_a_notice_is_sent_once_per_template_kind_and_step() -> None:
    events = [EventNote("Normal", "RolloutStarted", "rolling out")]
    found = notify.notices("apps", "web", events, STATUS)
    status: dict = {}
    assert notify.unsent(found, status) == found
    notify.record(status, found)
    assert notify.unsent(notify.notices("apps", "web", events, STATUS), status) == []
    assert notify.redact("https://hooks.slack.invalid/services/T0/B0/secret") == "hooks.slack.invalid"


def test_the_sender_delivers_in_order_at_most_once_a_second() -> None:
    with receiving() as (base, received):

        async def send() -> None:
            sender = notify.Sender(["127.0.0.1"])  # the receiver, on loopback
            for index in range(3):
                sender.send(f"{base}/hook", {"n": index})
            for _ in range(200):  # the receiver is another thread: poll it
                if len(received) == 3:
                    return
                await asyncio.sleep(0.05)

        asyncio.run(send())
    assert [r.body["n"] for r in received] == [0, 1, 2]
    assert {r.path for r in received} == {"/hook"}
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(received)]
    assert all(gap >= 0.9 for gap in gaps), gaps
