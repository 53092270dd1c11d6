"""`statefleet rollout status|pause|resume|promote|abort|undo NAME`."""

from __future__ import annotations

import argparse
from typing import Any

from lightkube import Client

from framework.rollout.commands import abort, pause, promote, resume, status, undo

VERBS = (status, pause, resume, promote, abort, undo)


def add(commands: Any) -> None:
    parser = commands.add_parser("rollout", help="watch and steer StatefulsetRollouts")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        sub = verb.add(verbs)
        sub.add_argument("name", help="the StatefulsetRollout")
        sub.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig's)")
        sub.set_defaults(run=verb.run)


def run(args: argparse.Namespace) -> int:
    kube = Client(field_manager="statefleet-cli")
    return int(args.run(args, kube))
