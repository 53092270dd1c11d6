"""`rollout status NAME [--watch]`: where the rollout is, with a progress bar."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from lightkube import Client

from framework.rollout.commands.common import read

SETTLED = {"Healthy", "Aborted", "Degraded", "InvalidSpec"}


def add(verbs: Any) -> argparse.ArgumentParser:
    parser = verbs.add_parser("status", help="where the rollout is")
    parser.add_argument("-w", "--watch", action="store_true", help="follow it until it settles or pauses")
    parser.add_argument(
        "--timeout", type=float, default=0, help="with --watch: give up after this many seconds"
    )
    return parser


def bar(done: int, total: int, width: int = 30) -> str:
    filled = width if total == 0 else round(width * done / total)
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def render(body: dict[str, Any]) -> str:
    status = body.get("status") or {}
    replicas = status.get("replicas", 0)
    steps = status.get("steps", 0)
    step = status.get("currentStepIndex")
    meta = body["metadata"]
    lines = [
        f"StatefulsetRollout {meta['namespace']}/{meta['name']}: {status.get('phase', 'Pending')}",
        f"  {status.get('message', '')}",
        f"  step       {'-' if step is None else f'{step + 1}/{steps}'}",
        f"  updated    {bar(status.get('updatedReplicas', 0), replicas)}",
        f"  available  {bar(status.get('availableReplicas', 0), replicas)}",
        f"  templates  stable {status.get('stableTemplateHash', '-')}"
        f" -> update {status.get('updateTemplateHash', '-')}",
    ]
    for entry in status.get("history") or []:
        lines.append(
            f"  done       step {entry['step'] + 1}: {entry['description']} at {entry['finishedAt']}"
        )
    return "\n".join(lines)


def settled(body: dict[str, Any]) -> bool:
    status = body.get("status") or {}
    generation_seen = status.get("observedGeneration") == body["metadata"].get("generation")
    phase = status.get("phase")
    whole = phase != "Healthy" or status.get("availableReplicas") == status.get("replicas")
    return generation_seen and ((phase in SETTLED and whole) or phase == "Paused")


def run(args: argparse.Namespace, kube: Client) -> int:
    body = read(kube, args)
    if not args.watch:
        print(render(body))
        return 0
    deadline = time.monotonic() + args.timeout if args.timeout else None
    shown = ""
    tty = sys.stdout.isatty()
    while True:
        text = render(body)
        if text != shown:
            if tty and shown:
                sys.stdout.write(f"\x1b[{shown.count(chr(10)) + 1}F\x1b[J")  # redraw in place
            print(text, flush=True)
            shown = text
        if settled(body):
            phase = (body.get("status") or {}).get("phase")
            return 0 if phase in ("Healthy", "Paused") else 1
        if deadline and time.monotonic() > deadline:
            print("timed out", file=sys.stderr)
            return 2
        time.sleep(1)
        body = read(kube, args)
