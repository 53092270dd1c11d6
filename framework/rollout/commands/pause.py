"""`rollout pause NAME`: hold the rollout where it is (spec.paused)."""

from __future__ import annotations

import argparse
from typing import Any

from lightkube import Client

from framework.rollout.commands.common import patch_spec


def add(verbs: Any) -> argparse.ArgumentParser:
    return verbs.add_parser("pause", help="hold the rollout where it is")


def run(args: argparse.Namespace, kube: Client) -> int:
    patch_spec(kube, args, {"paused": True})
    print(f"statefulsetrollout/{args.name} paused")
    return 0
