"""The RabbitMQ service plugin."""

from services.rabbitmq.hooks import HOOKS
from services.rabbitmq.plugin import RabbitMQPlugin

PLUGIN = RabbitMQPlugin(rollout_hooks=HOOKS)
