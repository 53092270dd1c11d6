"""The PostgreSQL service plugin."""

from services.postgres.hooks import HOOKS
from services.postgres.plugin import PostgresPlugin

PLUGIN = PostgresPlugin(rollout_hooks=HOOKS)
