"""The `RabbitMQ` resource's spec."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from framework.credentials import rotate_credentials_field
from framework.kube.model import ApiModel, StatusModel
from framework.spec import (
    CEL_CONTROL,
    BootstrapSpec,
    DeletionPolicy,
    PodTemplateOverrides,
    ResourcesSpec,
    StorageSpec,
    entries_hazard,
)

# rabbitmq.conf keys the operator sets: a user's value would break cluster formation, the
# Services, the default user or the management API the operator talks to.
MANAGED_CONFIG_PREFIXES = (
    "cluster_formation.",
    "cluster_name",
    "listeners.",
    "ssl_options.",
    "management.tcp",
    "management.ssl",
    "management.listener",
    "management.path_prefix",
    "prometheus.tcp",
    "default_user",
    "default_pass",
    "loopback_users",
)
PLUGIN_PATTERN = r"^[a-z][a-z0-9_]*$"
# Always on: the operator talks to the management API, Prometheus scrapes the nodes.
BUILT_IN_PLUGINS = ("rabbitmq_management", "rabbitmq_prometheus")


TWO_NODES = (
    "two nodes cannot keep a majority when one is lost (each pauses, and quorum queues stop): "
    "use 1, or 3 or more"
)


# A rabbitmq.conf key (dotted words; `$` and `-` appear in some plugins' keys); values without
# control characters, which would leave their line in rabbitmq.conf and the ConfigMap's YAML.
CONFIG_KEY = "^[A-Za-z0-9_$-]+([.][A-Za-z0-9_$-]+)*$"
CONFIG_KEY_LENGTH = 253
VALUE_LENGTH = 4096


def managed_key(key: str) -> bool:
    return key.startswith(MANAGED_CONFIG_PREFIXES)  # as the CEL rule checks it


def config_hazard(config: dict[str, str]) -> str | None:
    """What in spec.config rabbitmq.conf cannot take, naming the entry (None: nothing). Admission
    refuses it all; this covers an object stored before a rule existed: its change is refused
    while the cluster stays operated."""
    return entries_hazard(
        "spec.config",
        config,
        CONFIG_KEY,
        CONFIG_KEY_LENGTH,
        "rabbitmq.conf key",
        managed_key,
        per_line=": one rabbitmq.conf line each",
    )


class RabbitMQTlsSpec(ApiModel):
    required: bool = Field(
        default=False,
        description="Only TLS: AMQP over TLS (amqps, 5671) and the management API over HTTPS (15671); "
        "the plaintext listeners (5672, 15672) are off. Both TLS listeners are always on.",
    )
    inter_node: bool | None = Field(
        default=None,
        description="Erlang distribution (node to node, and RabbitMQ's CLI to a node) over mutual TLS with "
        "the instance's certificate, each end verifying the other's. Empty: on for a new cluster; a cluster "
        "made before keeps speaking plaintext until this is true. Changing what a running cluster speaks "
        "restarts every node at once (a node speaking TLS cannot reach one speaking plaintext): the cluster "
        "is down until they are back, and keeps its data. status.interNodeTls says what the nodes speak.",
    )


class RabbitMQSpec(ApiModel):
    version: str | None = Field(
        default=None,
        description="RabbitMQ version, from the version catalog (its default when empty).",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=9,
        description="Nodes of the cluster (not 2). Three or more keep quorum queues available when a node "
        "is lost.",
        json_schema_extra={"x-kubernetes-validations": [{"rule": "self != 2", "message": TWO_NODES}]},
    )
    storage: StorageSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    config: dict[str, Annotated[str, Field(max_length=VALUE_LENGTH)]] = Field(
        default_factory=dict,
        max_length=200,
        description="rabbitmq.conf entries, e.g. {vm_memory_high_watermark.relative: '0.6'}.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, size(k) <= {CONFIG_KEY_LENGTH} && k.matches('{CONFIG_KEY}'))",
                    "message": "config keys are rabbitmq.conf's: dotted words of letters, digits, _, - and $",
                },
                {
                    "rule": f"self.all(k, !self[k].matches('{CEL_CONTROL}'))",
                    "message": "config values may not hold control characters: one rabbitmq.conf line each",
                },
                {
                    "rule": "self.all(k, "
                    + " && ".join(f'!k.startsWith("{prefix}")' for prefix in MANAGED_CONFIG_PREFIXES)
                    + ")",
                    "message": "config may not set what the operator manages: "
                    + ", ".join(MANAGED_CONFIG_PREFIXES),
                },
            ]
        },
    )
    plugins: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="Plugins to enable besides rabbitmq_management and rabbitmq_prometheus, "
        "e.g. [rabbitmq_shovel, rabbitmq_federation].",
        json_schema_extra={"items": {"type": "string", "pattern": PLUGIN_PATTERN}},
    )
    bootstrap: BootstrapSpec | None = Field(
        default=None, description="Made from a backup: its definitions are imported once the cluster runs."
    )
    tls: RabbitMQTlsSpec = Field(
        default_factory=RabbitMQTlsSpec,
        description="TLS in transit: the nodes serve amqps and HTTPS with the instance's certificate.",
    )
    rotate_credentials: str | None = rotate_credentials_field(
        "the default user's password", "statefleet rabbitmq rotate-credentials NAME"
    )
    pod_template: PodTemplateOverrides = Field(default_factory=PodTemplateOverrides)
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN, description="What happens to the volumes when the RabbitMQ is deleted."
    )

    @field_validator("replicas")
    @classmethod
    def not_two(cls, replicas: int) -> int:
        if replicas == 2:
            raise ValueError(TWO_NODES)
        return replicas

    @field_validator("plugins")
    @classmethod
    def known_shape(cls, plugins: list[str]) -> list[str]:
        bad = [plugin for plugin in plugins if not re.match(PLUGIN_PATTERN, plugin)]
        if bad:
            raise ValueError(f"{', '.join(bad)}: not a plugin name")
        return plugins

    def enabled_plugins(self) -> list[str]:
        return sorted(set(BUILT_IN_PLUGINS) | set(self.plugins))


class ClusterStatus(StatusModel):
    nodes: list[str] | None = Field(default=None, description="pods running")
    members: int | None = Field(default=None, description="nodes the cluster knows")
    formed: bool | None = Field(default=None, description="every node runs in one cluster")
    partitions: list[str] | None = None
    message: str | None = None


class ScaleDownStatus(StatusModel):
    from_: int | None = Field(default=None, alias="from")
    to: int | None = None
    phase: Literal["MovingQueues", "StoppingNodes", "ForgettingNodes"] | None = None
    job: str | None = Field(default=None, description="the Job running RabbitMQ's CLI now")
    purpose: Literal["drain", "move", "forget", "revive"] | None = None
    drained: list[str] | None = Field(
        default=None, description="nodes in maintenance mode (rabbitmq-upgrade drain)"
    )
    cancelled: bool | None = Field(default=None, description="spec.replicas went back up")
    jobs: int | None = Field(default=None, description="Jobs started so far")
    failures: int | None = Field(default=None, description="Jobs failed in a row")
    retry_at: float | None = Field(default=None, description="when a failed step is tried again (Unix time)")
    message: str | None = None


class InterNodeChangeStatus(StatusModel):
    to: bool | None = Field(default=None, description="distribution over TLS (true) or plaintext (false)")
    phase: Literal["Waiting", "Restarting"] | None = None
    started_at: str | None = Field(default=None, description="when every node was restarted")
    message: str | None = None


class RabbitMQEndpoints(StatusModel):
    amqps: str | None = None
    amqp: str | None = Field(default=None, description="plaintext, unless spec.tls.required")
    management: str | None = None


class RabbitMQStatus(StatusModel):
    """The status fields the RabbitMQ plugin owns."""

    initialized: bool | None = Field(default=None, description="a node has answered once")
    cluster: ClusterStatus | None = Field(
        default=None, description="the cluster as its nodes last described it"
    )
    scale_down: ScaleDownStatus | None = Field(
        default=None, description="a scale-down in progress, kept here so that a restarted operator goes on"
    )
    default_user_secret: str | None = None
    endpoints: RabbitMQEndpoints | None = None
    inter_node_tls: bool | None = Field(
        default=None, description="the nodes' Erlang distribution runs over mutual TLS (false: plaintext)"
    )
    inter_node_change: InterNodeChangeStatus | None = Field(
        default=None, description="spec.tls.interNode changed: the full restart that moves the cluster"
    )
