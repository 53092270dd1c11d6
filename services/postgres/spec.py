"""The `Postgres` resource's spec."""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator, model_validator

from backup.in_place import InPlaceRecord
from framework.kube.model import ApiModel, StatusModel
from framework.spec import BootstrapSpec, DeletionPolicy, PodTemplateOverrides, ResourcesSpec, StorageSpec
from services.postgres.wal_archive import ArchiverReport, WalArchiveSpec

# Set by the operator: a user's value would break replication, probes or the Services.
MANAGED_PARAMETERS = frozenset(
    {
        "listen_addresses",
        "port",
        "hba_file",
        "ident_file",
        "data_directory",
        "config_file",
        "hot_standby",
        "primary_conninfo",
        "primary_slot_name",
        "synchronous_standby_names",
        "wal_log_hints",
        "recovery_target_timeline",
        "unix_socket_directories",
        # continuous archiving (spec.walArchive)
        "archive_mode",
        "archive_command",
        "archive_library",
        "archive_timeout",
        "restore_command",
    }
)


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
    parameters: dict[str, str] = Field(
        default_factory=dict,
        max_length=200,  # a bound the API server's CEL cost estimate needs
        description="postgresql.conf parameters, e.g. {max_connections: '200'}.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(k, !(k in " + str(sorted(MANAGED_PARAMETERS)).replace("'", '"') + "))",
                    "message": "parameters may not set what the operator manages: "
                    + ", ".join(sorted(MANAGED_PARAMETERS)),
                }
            ]
        },
    )
    pg_hba: list[str] = Field(
        default_factory=list, description="Extra pg_hba.conf lines, placed before the operator's own."
    )
    synchronous: SynchronousSpec | None = Field(
        default=None, description="Synchronous replication; asynchronous when absent."
    )
    switchover: SwitchoverSpec | None = Field(
        default=None, description="Make another instance the primary, once per request."
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

    @field_validator("parameters")
    @classmethod
    def no_managed_parameters(cls, parameters: dict[str, str]) -> dict[str, str]:
        managed = sorted(set(parameters) & MANAGED_PARAMETERS)
        if managed:
            raise ValueError(f"{', '.join(managed)} managed by the operator")
        return parameters


class FailoverStatus(StatusModel):
    kind: str | None = None  # Failover or Switchover
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
