"""The PostgreSQL service plugin."""

from services.postgres import hooks  # noqa: F401  (registers the plugin's rollout hooks)
from services.postgres.plugin import PostgresPlugin

PLUGIN = PostgresPlugin()
