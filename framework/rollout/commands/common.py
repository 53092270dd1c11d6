"""What the rollout verbs share: reading the rollout and patching its spec."""

from __future__ import annotations

import argparse
from typing import Any

from lightkube import Client
from lightkube.types import PatchType

from framework.rollout.controller import Rollout


def read(kube: Client, args: argparse.Namespace) -> dict[str, Any]:
    return kube.get(Rollout, args.name, namespace=args.namespace).to_dict()


def patch_spec(kube: Client, args: argparse.Namespace, change: dict[str, Any]) -> None:
    kube.patch(Rollout, args.name, {"spec": change}, namespace=args.namespace, patch_type=PatchType.MERGE)


def rolling_template(body: dict[str, Any]) -> str:
    """The template hash a promote or abort is about; refuses when nothing is rolling out."""
    status = body.get("status") or {}
    wanted = status.get("updateTemplateHash")
    if not wanted or wanted == status.get("stableTemplateHash"):
        raise SystemExit(f"{body['metadata']['name']}: no rollout in progress (phase {status.get('phase')})")
    return wanted
