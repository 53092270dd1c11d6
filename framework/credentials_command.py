"""`statefleet <service> rotate-credentials NAME`: the one verb of every plugin with the
`Rotation` capability (`framework.credentials`): asks for a rotation (spec.rotateCredentials, a
new token), then waits until the Secrets hold the new passwords. In the plugin's own group of
verbs when it has one, else in one named after its service"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

from lightkube import Client

from framework.credentials import ROTATED, SPEC_FIELD, STATUS_FIELD
from framework.kube.requests import Outcome, request_and_wait, request_token

VERB = "rotate-credentials"


def group(commands: Any, plugin: Any) -> Any:
    """The plugin's group of verbs, for a plugin that has no verbs of its own."""
    parser = commands.add_parser(plugin.service, help=f"operate {plugin.kind} instances")
    return parser.add_subparsers(dest="verb", required=True)


def add(verbs: Any, plugin: Any) -> argparse.ArgumentParser:
    """The verb in a plugin's group (`plugin.rotation` says which Secrets rotate)."""
    secrets = ", ".join(f"<name>-{secret.suffix}" for secret in plugin.rotation.secrets)
    parser = verbs.add_parser(
        VERB, help=f"new passwords for the instance's own users ({secrets}), without downtime"
    )
    parser.add_argument("name", help=f"the {plugin.kind}")
    parser.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig's)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait (0: do not wait)")
    parser.set_defaults(handler=partial(run, plugin.resource()))
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


def run(resource: Any, args: argparse.Namespace, kube: Client) -> int:
    token = request_token()
    return request_and_wait(
        kube,
        resource,
        args.name,
        args.namespace,
        request(token),
        f"credentials rotation requested ({token})",
        lambda status: outcome(token, status),
        args.timeout,
        progress=lambda status: progress(token, status),
        late="the credentials are not rotated",
    )
