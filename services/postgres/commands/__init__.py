"""`statefleet pg promote NAME POD`, `statefleet pg rotate-credentials NAME`: the Postgres
plugin's verbs (one module per verb)."""

from __future__ import annotations

from typing import Any

from services.postgres.commands import promote, rotate_credentials

VERBS = (promote, rotate_credentials)


def add(commands: Any) -> None:
    parser = commands.add_parser("pg", help="operate Postgres instances")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        sub = verb.add(verbs)
        sub.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig's)")
        sub.set_defaults(handler=verb.run)
