"""The PostgreSQL service plugin."""

from services.postgres.plugin import PostgresPlugin

PLUGIN = PostgresPlugin()
