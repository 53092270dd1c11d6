"""`rollout undo NAME [--to-revision N]`: roll out an earlier revision's pod template again."""

from __future__ import annotations

import argparse
from typing import Any

from lightkube import Client
from lightkube.resources.apps_v1 import ControllerRevision

from framework.rollout.commands.common import patch_spec, read
from framework.rollout.controller import revision_template
from framework.rollout.plan import ROLLOUT_LABEL


def add(verbs: Any) -> argparse.ArgumentParser:
    parser = verbs.add_parser("undo", help="roll out an earlier revision again (default: the previous one)")
    parser.add_argument("--to-revision", type=int, help="the StatefulSet revision number to go back to")
    return parser


def earlier_revision(revisions: list[dict[str, Any]], current: str, wanted: int | None) -> dict[str, Any]:
    """The revision to go back to: number `wanted`, else the newest before `current`."""
    ordered = sorted(revisions, key=lambda r: r["revision"])
    if wanted is not None:
        found = [r for r in ordered if r["revision"] == wanted]
        if not found:
            numbers = ", ".join(str(r["revision"]) for r in ordered)
            raise SystemExit(f"--to-revision: no revision {wanted}; there are {numbers}")
        return found[0]
    older = [r for r in ordered if r["metadata"]["name"] != current]
    if not older:
        raise SystemExit("no earlier revision to go back to")
    return older[-1]


def run(args: argparse.Namespace, kube: Client) -> int:
    body = read(kube, args)
    current = (body.get("status") or {}).get("updateRevision", "")
    revisions = [
        r.to_dict()
        for r in kube.list(ControllerRevision, namespace=args.namespace or body["metadata"]["namespace"])
        if any(o.kind == "StatefulSet" and o.name == args.name for o in r.metadata.ownerReferences or [])
    ]
    target = earlier_revision(revisions, current, args.to_revision)
    template = revision_template(target)
    template["metadata"]["labels"].pop(ROLLOUT_LABEL, None)
    patch_spec(kube, args, {"statefulSet": {"template": template}})
    print(f"statefulsetrollout/{args.name} rolling back to revision {target['revision']}")
    return 0
