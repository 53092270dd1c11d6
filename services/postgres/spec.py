"""The `Postgres` resource's spec."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from backup.in_place import InPlaceRecord
from framework.credentials import rotate_credentials_field
from framework.kube.model import ApiModel, StatusModel
from framework.spec import (
    CEL_CONTROL,
    CONTROL,
    BootstrapSpec,
    DeletionPolicy,
    PodTemplateOverrides,
    ResourcesSpec,
    StorageSpec,
    entries_hazard,
)
from services.postgres.wal_archive import ArchiverReport, WalArchiveSpec

# Set by the operator, matched as PostgreSQL matches names (case-insensitively): a user's value
# would break replication, probes, failover, TLS, archiving, recovery or the Services.
MANAGED_PARAMETERS = frozenset(
    {
        "listen_addresses",
        "port",
        "hba_file",
        "ident_file",
        "data_directory",
        "config_file",
        "external_pid_file",
        "unix_socket_directories",
        "hot_standby",
        "synchronous_standby_names",
        "wal_log_hints",
        "wal_receiver_timeout",
        "wal_sender_timeout",
        "wal_retrieve_retry_interval",
        "restore_command",
    }
)
# Whole families: archive_* (spec.walArchive), ssl* (the operator's certificates), include*
# (another file could set any of these), recovery_* and primary_* (replication, restores).
MANAGED_PREFIXES = ("archive_", "ssl", "include", "recovery_", "primary_")
# A name as postgresql.conf reads it: a word, or a custom class's `prefix.word`.
PARAMETER_NAME = "^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)?$"  # RE2 and Python alike
PARAMETER_NAME_LENGTH = 63  # NAMEDATALEN - 1
VALUE_LENGTH = 4096


def managed_parameter(name: str) -> bool:
    lowered = name.lower()
    return lowered in MANAGED_PARAMETERS or lowered.startswith(MANAGED_PREFIXES)


def _cel_list(values: frozenset[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in sorted(values)) + "]"


class SynchronousSpec(ApiModel):
    number: int = Field(
        ge=1,
        le=8,
        description="Standbys that must have a commit before it is acknowledged (ANY n): no "
        "acknowledged commit is lost in a failover while that many standbys answer.",
    )


class SwitchoverSpec(ApiModel):
    to: str = Field(description="The standby's pod to make the primary, e.g. demo-1.")
    requested_at: str | None = Field(
        default=None,
        description="When it was asked for (`statefleet pg promote` sets it): a new value asks again.",
    )


class PostgresSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.synchronous) || self.synchronous.number < self.instances",
                    "message": "synchronous.number must be below instances (it counts standbys)",
                }
            ]
        },
    )
    version: str | None = Field(
        default=None,
        description="PostgreSQL major version, from the version catalog (its default when empty).",
    )
    instances: int = Field(
        default=1, ge=1, le=9, description="One primary and instances-1 streaming replicas."
    )
    storage: StorageSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    parameters: dict[str, Annotated[str, Field(max_length=VALUE_LENGTH)]] = Field(
        default_factory=dict,
        max_length=200,  # a bound the API server's CEL cost estimate needs
        description="postgresql.conf parameters, e.g. {max_connections: '200'}.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, size(k) <= {PARAMETER_NAME_LENGTH} "
                    f"&& k.matches('{PARAMETER_NAME}'))",
                    "message": "parameter names are PostgreSQL's: letters, digits and underscores "
                    "(a custom one: prefix.name), at most 63 characters",
                },
                {
                    "rule": f"self.all(k, !(k.lowerAscii() in {_cel_list(MANAGED_PARAMETERS)})"
                    + "".join(f" && !k.lowerAscii().startsWith('{prefix}')" for prefix in MANAGED_PREFIXES)
                    + ")",
                    "message": "parameters may not set what the operator manages: "
                    + ", ".join(sorted(MANAGED_PARAMETERS))
                    + ", and every "
                    + ", ".join(f"{prefix}*" for prefix in MANAGED_PREFIXES),
                },
                {
                    "rule": f"self.all(k, !self[k].matches('{CEL_CONTROL}'))",
                    "message": "parameter values may not hold control characters (a newline, a tab)",
                },
            ]
        },
    )
    pg_hba: list[Annotated[str, Field(max_length=VALUE_LENGTH)]] = Field(
        default_factory=list,
        max_length=100,
        description="Extra pg_hba.conf lines, placed before the operator's own.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(line, !line.matches('{CEL_CONTROL}'))",
                    "message": "pgHba lines may not hold control characters: one line per item",
                }
            ]
        },
    )
    synchronous: SynchronousSpec | None = Field(
        default=None, description="Synchronous replication; asynchronous when absent."
    )
    switchover: SwitchoverSpec | None = Field(
        default=None, description="Make another instance the primary, once per request."
    )
    rotate_credentials: str | None = rotate_credentials_field(
        "the superuser's and the replication role's passwords", "statefleet pg rotate-credentials NAME"
    )
    bootstrap: BootstrapSpec | None = Field(default=None, description="How a new instance gets its data.")
    wal_archive: WalArchiveSpec | None = Field(
        default=None,
        description="Continuous WAL archiving to a BackupStorage (compressed, with sha256s), from every "
        "server: none when absent.",
    )
    pod_template: PodTemplateOverrides = Field(default_factory=PodTemplateOverrides)
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN, description="What happens to the volumes when the Postgres is deleted."
    )

    @model_validator(mode="after")
    def enough_standbys(self) -> PostgresSpec:
        if self.synchronous and self.synchronous.number > self.instances - 1:
            raise ValueError(
                f"synchronous.number: {self.synchronous.number} synchronous standbys need at least "
                f"{self.synchronous.number + 1} instances, not {self.instances}"
            )
        return self


class FailoverStatus(StatusModel):
    kind: str | None = None  # Failover, Switchover, or Restart (promoted again in place)
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    reason: str | None = None
    started_at: str | None = None
    started_at_seconds: float | None = None
    completed_at: str | None = None
    seconds: float | None = None
    waiting: str | None = None
    promoting: str | None = Field(
        default=None, description="the pod asked to promote, recorded before it is asked"
    )
    stuck: str | None = Field(
        default=None,
        description="why a switchover went on while the old primary's pod was still being deleted",
    )
    fenced: str | None = Field(
        default=None,
        description="the fenced server (<pod uid>/<restarts>): nothing is promoted while it runs",
    )
    unconfirmed: str | None = Field(
        default=None, description="when the fenced server was taken for stopped without being seen to stop"
    )


class SwitchoverStatus(StatusModel):
    served: str | None = Field(default=None, description="the last request (spec.switchover) served")
    rollout: str | None = Field(
        default=None, description="a rollout's request (<pod>@<revision>): the primary is updated last"
    )
    rollout_served: str | None = Field(default=None, description="the last rollout request served")


class PostgresEndpoints(StatusModel):
    rw: str | None = None
    ro: str | None = None


class PostgresStatus(StatusModel):
    """The status fields the Postgres plugin owns."""

    current_primary: str | None = Field(default=None, description="the pod <name>-rw sends clients to")
    target_primary: str | None = Field(default=None, description="set while a failover or switchover runs")
    initialized: bool | None = Field(default=None, description="a primary has answered once")
    failover: FailoverStatus | None = Field(
        default=None, description="the failover or switchover under way, or the last one"
    )
    switchover: SwitchoverStatus | None = None
    superuser_secret: str | None = None
    rejoins: dict[str, int] | None = Field(
        default=None, description="standbys restarted because they stopped following: restarts so far"
    )
    in_place_restore: InPlaceRecord | None = Field(
        default=None, description="the last physical backup restored over this instance (a Restore's)"
    )
    tls_reloaded_at_seconds: float | None = Field(
        default=None, description="servers reloaded for a new certificate"
    )
    endpoints: PostgresEndpoints | None = None
    wal_archive: ArchiverReport | None = Field(
        default=None, description="continuous archiving, as the primary's WAL archiver last reported it"
    )


def template_hazards(spec: PostgresSpec) -> str | None:
    """What in the spec the templates cannot take safely, naming the field (None: nothing).
    Admission refuses all of it; this also covers an object stored before a rule existed, whose
    change is then refused while the instance stays operated (probes, labels, failover)."""
    hazard = entries_hazard(
        "spec.parameters",
        spec.parameters,
        PARAMETER_NAME,
        PARAMETER_NAME_LENGTH,
        "PostgreSQL parameter name",
        managed_parameter,
    )
    if hazard:
        return hazard
    for index, line in enumerate(spec.pg_hba):
        if re.search(CONTROL, line):
            return f"spec.pgHba[{index}]: {line!r} holds control characters: one line per item"
    return None
