"""`statefleet pg promote NAME POD`: the Postgres plugin's own verbs (one module per verb);
`statefleet pg rotate-credentials NAME` is the framework's (`framework.credentials_command`)."""

from __future__ import annotations

from typing import Any

from services.postgres.commands import promote

VERBS = (promote,)


def add(commands: Any) -> Any:
    """The `pg` group with its verbs; returned, for the framework's verbs to join."""
    parser = commands.add_parser("pg", help="operate Postgres instances")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        sub = verb.add(verbs)
        sub.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig's)")
        sub.set_defaults(handler=verb.run)
    return verbs
