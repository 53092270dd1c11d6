"""The `MongoDB` resource's spec."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from framework.credentials import rotate_credentials_field
from framework.kube.model import ApiModel, StatusModel
from framework.spec import BootstrapSpec, DeletionPolicy, PodTemplateOverrides, ResourcesSpec, StorageSpec

MAX_MEMBERS = 7  # MongoDB allows at most 7 voting members
EVEN = "an even number of members cannot keep a majority when half are lost: use 1, 3, 5 or 7"


class MongoDBTlsSpec(ApiModel):
    required: bool = Field(
        default=False,
        description="Only TLS: the servers refuse connections in clear (mongod: --tlsMode requireTLS, "
        "the members speaking TLS to each other too; FerretDB: its plaintext listener, 27017, is off). "
        "TLS is always on for clients: mongod on 27017 (allowTLS), FerretDB on 27018. On mongod it is "
        "chosen when the replica set is made: a rolling change would leave members unable to reach "
        "each other.",
    )


class MongoDBSpec(ApiModel):
    version: str | None = Field(
        default=None,
        description="MongoDB version, from the version catalog (its default when empty).",
    )
    members: int = Field(
        default=1,
        ge=1,
        le=MAX_MEMBERS,
        description="Members of the replica set (1, 3, 5 or 7). Three or more keep the set writable when a "
        "member is lost.",
        json_schema_extra={"x-kubernetes-validations": [{"rule": "self % 2 == 1", "message": EVEN}]},
    )
    priorities: dict[str, float] = Field(
        default_factory=dict,
        description="Election priority by member ordinal ('0', '1' ...), 0 to 1000; others have 1. A "
        "member with priority 0 never becomes primary.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(k, k.matches('^[0-9]$'))",
                    "message": "priorities are keyed by member ordinal: '0' to '6'",
                },
                {
                    "rule": "self.all(k, self[k] >= 0.0 && self[k] <= 1000.0)",
                    "message": "a priority is 0 to 1000",
                },
            ]
        },
    )
    storage: StorageSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    bootstrap: BootstrapSpec | None = Field(
        default=None, description="Made from a backup: its databases are restored once the instance runs."
    )
    tls: MongoDBTlsSpec = Field(
        default_factory=MongoDBTlsSpec,
        description="TLS in transit with the instance's certificate (clients verify it with the CA "
        "in the binding's ca.crt).",
    )
    rotate_credentials: str | None = rotate_credentials_field(
        "the root user's password", "statefleet mongodb rotate-credentials NAME"
    )
    pod_template: PodTemplateOverrides = Field(default_factory=PodTemplateOverrides)
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN, description="What happens to the volumes when the MongoDB is deleted."
    )

    @field_validator("members")
    @classmethod
    def odd(cls, members: int) -> int:
        if members % 2 == 0:
            raise ValueError(EVEN)
        return members

    @model_validator(mode="after")
    def priorities_of_members(self) -> MongoDBSpec:
        for key, priority in self.priorities.items():
            if not key.isdigit() or int(key) >= self.members:
                raise ValueError(
                    f"spec.priorities: {key!r} is not a member ordinal (0 to {self.members - 1})"
                )
            if not 0 <= priority <= 1000:
                raise ValueError(f"spec.priorities: {key}: {priority} is not 0 to 1000")
        if all(self.priorities.get(str(i), 1) == 0 for i in range(self.members)):
            raise ValueError("spec.priorities: at least one member must be able to become primary")
        return self

    def priority_by_pod(self, name: str) -> dict[str, float]:
        return {f"{name}-{key}": value for key, value in self.priorities.items()}


class ReplicaSetStatus(StatusModel):
    name: str | None = None
    primary: str | None = None
    members: list[str] | None = None
    healthy: int | None = None
    syncing: list[str] | None = None
    message: str | None = None


class MongoDBEndpoints(StatusModel):
    uri: str | None = Field(default=None, description="in clear; none when spec.tls.required")
    tls_uri: str | None = Field(default=None, description="over TLS (tls=true): verify with the instance CA")


class MongoDBStatus(StatusModel):
    """The status fields the MongoDB plugin owns."""

    tls_required: bool | None = Field(
        default=None, description="spec.tls.required as the servers were made with it (mongod keeps it)"
    )

    initialized: bool | None = Field(
        default=None, description="the replica set was initiated (or FerretDB answered)"
    )
    flavor: str | None = Field(default=None, description="the server: mongod or ferretdb")
    root_secret: str | None = None
    hosts: list[str] | None = Field(default=None, description="host:port of the TLS listeners")
    endpoints: MongoDBEndpoints | None = None
    replica_set: ReplicaSetStatus | None = Field(
        default=None, description="the replica set as its primary last described it"
    )
