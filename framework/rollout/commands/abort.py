"""`rollout abort NAME [--withdraw]`: back to the stable revision, every updated pod at once."""

from __future__ import annotations

import argparse
from typing import Any

from lightkube import Client

from framework.rollout.commands.common import patch_spec, read, rolling_template


def add(verbs: Any) -> argparse.ArgumentParser:
    parser = verbs.add_parser("abort", help="go back to the stable revision")
    parser.add_argument("--withdraw", action="store_true", help="take the abort back: roll out again")
    return parser


def run(args: argparse.Namespace, kube: Client) -> int:
    if args.withdraw:
        patch_spec(kube, args, {"abort": None})
        print(f"statefulsetrollout/{args.name}: abort withdrawn, rolling out again from the first step")
        return 0
    template = rolling_template(read(kube, args))
    patch_spec(kube, args, {"abort": {"template": template}})
    print(f"statefulsetrollout/{args.name} aborted: rolling back to the stable revision")
    return 0
