"""The PostgreSQL service plugin. `PLUGIN` is made on first use, so that a process that runs
one part of it (the WAL archiver beside each server) does not load the operator."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "PLUGIN":
        from services.postgres.hooks import HOOKS
        from services.postgres.plugin import PostgresPlugin

        plugin = PostgresPlugin(rollout_hooks=HOOKS)
        globals()["PLUGIN"] = plugin
        return plugin
    raise AttributeError(name)
