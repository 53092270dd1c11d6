"""`statefleet backups found`: the backup engine's verbs (one module per verb)."""

from __future__ import annotations

from typing import Any

from backup.commands import found

VERBS = (found,)


def add(commands: Any) -> None:
    parser = commands.add_parser("backups", help="backups in a storage")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        sub = verb.add(verbs)
        sub.add_argument("-n", "--namespace", help="the namespace (default: the kubeconfig's)")
        sub.set_defaults(handler=verb.run)
