"""`pg promote NAME POD`: a switchover to the standby POD (spec.switchover), then waits."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from framework.kube.meta import GROUP, VERSION


def add(verbs: Any) -> argparse.ArgumentParser:
    parser = verbs.add_parser("promote", help="make a standby the primary (a switchover)")
    parser.add_argument("name", help="the Postgres")
    parser.add_argument("pod", help="the standby's pod, e.g. demo-1")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait (0: do not wait)")
    return parser


def run(args: argparse.Namespace, kube: Client) -> int:
    postgres = create_namespaced_resource(GROUP, VERSION, "Postgres", "postgreses")
    requested = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    change = {"spec": {"switchover": {"to": args.pod, "requestedAt": requested}}}
    kube.patch(postgres, args.name, change, namespace=args.namespace, patch_type=PatchType.MERGE)
    print(f"postgres/{args.name}: switchover to {args.pod} requested")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        status = kube.get(postgres, args.name, namespace=args.namespace).to_dict().get("status") or {}
        if status.get("switchover", {}).get("served", "").endswith(f"@{requested}") and not status.get(
            "targetPrimary"
        ):
            if status.get("currentPrimary") == args.pod:
                print(f"postgres/{args.name}: {args.pod} is the primary")
                return 0
            print(f"postgres/{args.name}: refused; see `kubectl describe postgres {args.name}`")
            return 1
        time.sleep(0.5)
    if args.timeout:
        print(f"postgres/{args.name}: {args.pod} is not the primary after {args.timeout:.0f} s")
        return 1
    return 0
