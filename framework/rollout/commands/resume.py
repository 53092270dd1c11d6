"""`rollout resume NAME`: lift spec.paused, and pass the pause step the rollout waits at."""

from __future__ import annotations

import argparse
from typing import Any

from lightkube import Client

from framework.rollout.commands.common import patch_spec, read


def add(verbs: Any) -> argparse.ArgumentParser:
    return verbs.add_parser("resume", help="continue a paused rollout")


def run(args: argparse.Namespace, kube: Client) -> int:
    status = read(kube, args).get("status") or {}
    change: dict[str, Any] = {"paused": False}
    if status.get("phase") == "Paused" and status.get("currentStepIndex") is not None:
        change["promote"] = {"template": status["updateTemplateHash"], "step": status["currentStepIndex"]}
    patch_spec(kube, args, change)
    print(f"statefulsetrollout/{args.name} resumed")
    return 0
