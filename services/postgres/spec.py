"""The `Postgres` resource's spec."""

from __future__ import annotations

from pydantic import Field, field_validator

from framework.spec import ApiModel, DeletionPolicy, PodTemplateOverrides, ResourcesSpec, StorageSpec

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
        "unix_socket_directories",
    }
)


class PostgresSpec(ApiModel):
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
    pod_template: PodTemplateOverrides = Field(default_factory=PodTemplateOverrides)
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN, description="What happens to the volumes when the Postgres is deleted."
    )

    @field_validator("parameters")
    @classmethod
    def no_managed_parameters(cls, parameters: dict[str, str]) -> dict[str, str]:
        managed = sorted(set(parameters) & MANAGED_PARAMETERS)
        if managed:
            raise ValueError(f"{', '.join(managed)} managed by the operator")
        return parameters
