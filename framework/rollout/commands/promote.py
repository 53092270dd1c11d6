"""`rollout promote NAME [--full]`: pass the current pause step, or skip every step left."""

from __future__ import annotations

import argparse
from typing import Any

from lightkube import Client

from framework.rollout.commands.common import patch_spec, read, rolling_template


def add(verbs: Any) -> argparse.ArgumentParser:
    parser = verbs.add_parser("promote", help="pass the current pause (--full: skip every step left)")
    parser.add_argument("--full", action="store_true", help="update every replica now, skipping the steps")
    return parser


def run(args: argparse.Namespace, kube: Client) -> int:
    body = read(kube, args)
    template = rolling_template(body)
    step = (body.get("status") or {}).get("currentStepIndex", 0)
    request: dict[str, Any] = (
        {"template": template, "full": True} if args.full else {"template": template, "step": step}
    )
    patch_spec(kube, args, {"promote": request})
    print(f"statefulsetrollout/{args.name} promoted" + (" fully" if args.full else f" past step {step}"))
    return 0
