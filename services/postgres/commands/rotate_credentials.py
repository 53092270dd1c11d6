"""`pg rotate-credentials NAME`: new passwords for the instance's superuser and replication role
(spec.rotateCredentials, see framework/credentials.py), then waits until the Secrets hold them."""

from __future__ import annotations

import argparse
from typing import Any

from lightkube import Client

from framework.credentials import ROTATED, SPEC_FIELD, STATUS_FIELD
from framework.kube.requests import Outcome, request_and_wait, request_token
from services.postgres.commands.resource import POSTGRES


def add(verbs: Any) -> argparse.ArgumentParser:
    parser = verbs.add_parser(
        "rotate-credentials",
        help="new passwords for the superuser and the replication role, without downtime",
    )
    parser.add_argument("name", help="the Postgres")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait (0: do not wait)")
    return parser


def request(token: str) -> dict[str, Any]:
    """The change that asks for a rotation: a new token (a token served already asks nothing)."""
    return {"spec": {SPEC_FIELD: token}}


def outcome(token: str, status: dict[str, Any]) -> Outcome:
    """Settled once the rotation of `token` is Rotated (a rotation under way for an earlier
    request finishes first, then this one starts)."""
    rotation = status.get(STATUS_FIELD) or {}
    if rotation.get("requested") == token and rotation.get("phase") == ROTATED:
        return True, f"rotated: {rotation.get('message') or 'the Secrets hold the new passwords'}"
    return None


def progress(token: str, status: dict[str, Any]) -> str | None:
    rotation = status.get(STATUS_FIELD) or {}
    if not rotation.get("phase"):
        return None
    requested = rotation.get("requested")
    whose = "" if requested == token else f" (an earlier request, {requested})"
    return f"{rotation['phase']}{whose}: {rotation.get('message', '')}"


def run(args: argparse.Namespace, kube: Client) -> int:
    token = request_token()
    return request_and_wait(
        kube,
        POSTGRES,
        args.name,
        args.namespace,
        request(token),
        f"credentials rotation requested ({token})",
        lambda status: outcome(token, status),
        args.timeout,
        progress=lambda status: progress(token, status),
        late="the credentials are not rotated",
    )
