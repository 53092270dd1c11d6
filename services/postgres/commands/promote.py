"""`pg promote NAME POD`: a switchover to the standby POD (spec.switchover), then waits."""

from __future__ import annotations

import argparse
from typing import Any

from lightkube import Client

from framework.kube.requests import Outcome, request_and_wait, request_token
from services.postgres.commands.resource import POSTGRES


def add(verbs: Any) -> argparse.ArgumentParser:
    parser = verbs.add_parser("promote", help="make a standby the primary (a switchover)")
    parser.add_argument("name", help="the Postgres")
    parser.add_argument("pod", help="the standby's pod, e.g. demo-1")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait (0: do not wait)")
    return parser


def run(args: argparse.Namespace, kube: Client) -> int:
    requested = request_token()
    change = {"spec": {"switchover": {"to": args.pod, "requestedAt": requested}}}

    def outcome(status: dict[str, Any]) -> Outcome:
        served = (status.get("switchover") or {}).get("served") or ""
        if not served.endswith(f"@{requested}") or status.get("targetPrimary"):
            return None
        if status.get("currentPrimary") == args.pod:
            return True, f"{args.pod} is the primary"
        return False, f"refused; see `kubectl describe postgres {args.name}`"

    return request_and_wait(
        kube,
        POSTGRES,
        args.name,
        args.namespace,
        change,
        f"switchover to {args.pod} requested",
        outcome,
        args.timeout,
        late=f"{args.pod} is not the primary",
    )
