"""Spec pieces every data service shares. Field names are camelCase in the API."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field

from framework.kube.model import QUANTITY_PATTERN, ApiModel, immutable


class DeletionPolicy(StrEnum):
    RETAIN = "Retain"
    DELETE = "Delete"


class StorageSpec(ApiModel):
    size: str = Field(
        pattern=QUANTITY_PATTERN, description="Volume size per instance, e.g. 1Gi. Can grow, never shrink."
    )
    storage_class: str | None = Field(
        default=None,
        description="StorageClass of the volumes (the cluster's default when empty). Immutable.",
        json_schema_extra=immutable("storageClass"),
    )


class ResourcesSpec(ApiModel):
    requests: dict[str, str] = Field(default_factory=dict, description="e.g. {cpu: 250m, memory: 256Mi}")
    limits: dict[str, str] = Field(default_factory=dict)


class PodTemplateOverrides(ApiModel):
    """What a platform team may set on the pods without forking the templates."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    affinity: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )


class BackupRef(ApiModel):
    name: str = Field(min_length=1, description="A Completed Backup in the same namespace.")


class BootstrapSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "bootstrap is immutable"}]
        }
    )
    from_backup: BackupRef = Field(
        description="Start from this backup (a Restore with a new target sets it): a physical "
        "backup becomes the first pod's data; other kinds are restored once the instance runs."
    )
