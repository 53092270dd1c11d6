"""Rollout notifications: Slack (Block Kit, through an incoming webhook) and generic webhooks.

A notice is made from a pass's Events and the status that pass wrote (fresh state, never a
stale copy), once per rollout, template and step: its key is recorded in `status.notified`
before it is sent, so a restarted controller does not send it again. Sending happens in the
background, at most one message a second per destination, and a destination that fails is
retried a few times and then logged; a rollout never waits for a notification.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from framework.kube.api import EventNote
from framework.rollout.outbound import IN_CLUSTER, DestinationRefused, guarded_client

log = logging.getLogger("statefleet")

# Event reason -> what a release system hears.
KINDS = {
    "RolloutStarted": "started",
    "StepCompleted": "step",
    "Paused": "paused",
    "RolloutCompleted": "succeeded",
    "RolloutAborted": "failed",
    "RolledBack": "rolled-back",
    "RollbackStarted": "rolling-back",
}
ICONS = {"started": "🚀", "step": "➡️", "paused": "⏸️", "succeeded": "✅", "failed": "❌", "rolled-back": "↩️"}
KEEP_KEYS = 64  # status.notified keeps the most recent keys
PER_SECOND = 1.0


@dataclass(frozen=True)
class Notice:
    key: str  # one message per rollout, template, kind and step
    kind: str
    rollout: str  # namespace/name
    stable: str
    update: str
    step: int | None
    steps: int
    message: str
    pods: str
    replicas: int
    updated: int


def notices(namespace: str, name: str, events: list[EventNote], status: dict[str, Any]) -> list[Notice]:
    """The notices a pass's Events call for, built from the status the pass wrote."""
    found = []
    history = status.get("history") or []
    for event in events:
        kind = KINDS.get(event.reason)
        if kind is None:
            continue
        step = status.get("currentStepIndex")
        pods = ""
        if kind == "step" and history:
            step, pods = history[-1]["step"], history[-1].get("pods", "")
        update = status.get("updateTemplateHash", "")
        found.append(
            Notice(
                key=f"{update}:{kind}:{'' if step is None else step}",
                kind=kind,
                rollout=f"{namespace}/{name}",
                stable=status.get("stableTemplateHash", ""),
                update=update,
                step=step,
                steps=status.get("steps", 0),
                message=event.message,
                pods=pods,
                replicas=status.get("replicas", 0),
                updated=status.get("updatedReplicas", 0),
            )
        )
    return found


def unsent(found: list[Notice], status: dict[str, Any]) -> list[Notice]:
    sent = set(status.get("notified") or [])
    return [n for n in found if n.key not in sent]


def record(status: dict[str, Any], sending: list[Notice]) -> None:
    if sending:
        status["notified"] = [*(status.get("notified") or []), *(n.key for n in sending)][-KEEP_KEYS:]


def slack_message(notice: Notice, channel: str | None) -> dict[str, Any]:
    """A Block Kit message: a header, the facts as fields, the pods in a context line."""
    title = f"{ICONS.get(notice.kind, '')} {notice.rollout}: rollout {notice.kind}".strip()
    step = "-" if notice.step is None else f"{notice.step + 1} of {notice.steps}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": notice.message[:3000]}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*StatefulsetRollout*\n{notice.rollout}"},
                {"type": "mrkdwn", "text": f"*Template*\n{notice.stable} → {notice.update}"},
                {"type": "mrkdwn", "text": f"*Step*\n{step}"},
                {"type": "mrkdwn", "text": f"*Updated*\n{notice.updated} of {notice.replicas}"},
            ],
        },
    ]
    if notice.pods:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"Pods: {notice.pods}"}]})
    message: dict[str, Any] = {"text": f"{title}: {notice.message}", "blocks": blocks}
    if channel:
        message["channel"] = channel
    return message


def webhook_payload(notice: Notice) -> dict[str, Any]:
    facts = {k: v for k, v in asdict(notice).items() if k not in ("key", "kind")}
    return {"kind": "StatefulsetRollout", "event": notice.kind, **facts}


class Sender:
    """One background queue per destination URL, drained at most once a second."""

    def __init__(self, destinations: Sequence[str] = IN_CLUSTER, per_second: float = PER_SECOND) -> None:
        self._interval = 1.0 / per_second
        self._queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.http = guarded_client(destinations, timeout=10)  # shared with the hooks and analyses

    def send(self, url: str, payload: dict[str, Any]) -> None:
        if url not in self._queues:
            self._queues[url] = asyncio.Queue()
            self._tasks[url] = asyncio.create_task(self._drain(url, self._queues[url]))
        self._queues[url].put_nowait(payload)

    async def _drain(self, url: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            payload = await queue.get()
            for attempt in range(1, 4):
                try:
                    response = await self.http.post(url, json=payload)
                    response.raise_for_status()
                    break
                except DestinationRefused as error:  # a URL from a Secret: no retry will change it
                    log.warning("notification to %s refused: %s", redact(url), error)
                    break
                except Exception as error:  # a notification must never stop a rollout
                    log.warning("notification to %s failed (attempt %d): %s", redact(url), attempt, error)
                    await asyncio.sleep(2**attempt)
            await asyncio.sleep(self._interval)


def redact(url: str) -> str:
    """A webhook URL is a credential: logs show its host only."""
    return url.split("/", 3)[2] if "://" in url else "(webhook)"
