"""The MongoDB service plugin."""

from services.mongodb import hooks  # noqa: F401  (registers the plugin's rollout hook)
from services.mongodb.plugin import MongoDBPlugin

PLUGIN = MongoDBPlugin()
