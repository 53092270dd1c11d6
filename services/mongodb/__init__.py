"""The MongoDB service plugin."""

from services.mongodb.hooks import HOOKS
from services.mongodb.plugin import MongoDBPlugin

PLUGIN = MongoDBPlugin(rollout_hooks=HOOKS)
