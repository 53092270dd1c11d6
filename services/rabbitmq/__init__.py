"""The RabbitMQ service plugin."""

from services.rabbitmq import hooks  # noqa: F401  (registers the plugin's rollout hook)
from services.rabbitmq.plugin import RabbitMQPlugin

PLUGIN = RabbitMQPlugin()
