"""Spec pieces every data service shares. Field names are camelCase in the API."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, ConfigDict, Field

from framework.kube.model import QUANTITY_PATTERN, ApiModel, immutable

# Control characters (a newline above all) would leave their line in the configuration file a
# template writes, and their place in the ConfigMap the operator applies.
CONTROL = r"[\x00-\x1f\x7f]"
CEL_CONTROL = "[[:cntrl:]]"  # the same class in RE2's words (CEL has no escapes in it then)


def entries_hazard(
    field: str,
    entries: Mapping[str, str],
    name_pattern: str,
    name_length: int,
    kind: str,
    managed: Callable[[str], bool],
    per_line: str = "",
) -> str | None:
    """The first entry of a name -> value map (a configuration file's settings) that its
    template cannot take safely, naming it (None: none). Admission refuses them all; this
    covers objects stored before a rule existed, whose change is then refused while the
    instance stays operated."""
    for name, value in entries.items():
        if len(name) > name_length or not re.match(name_pattern, name):
            return f"{field}.{name}: not a {kind}"
        if managed(name):
            return f"{field}.{name}: managed by the operator"
        if re.search(CONTROL, value):
            return f"{field}.{name}: {value!r} holds control characters{per_line}"
    return None


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
    topology_spread_constraints: list[dict[str, Any]] | None = Field(
        default=None,
        description="The pods' topologySpreadConstraints. Absent: spread over nodes and zones as far as "
        "the cluster allows (maxSkew 1, ScheduleAnyway); [] for none; DoNotSchedule to require it.",
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )


class BackupRef(ApiModel):
    name: str = Field(min_length=1, description="A Completed Backup in the same namespace.")


ONE_TARGET = {
    "x-kubernetes-validations": [
        {
            "rule": "(has(self.time) ? 1 : 0) + (has(self.lsn) ? 1 : 0) + (has(self.name) ? 1 : 0)"
            " + (has(self.xid) ? 1 : 0) + (has(self.immediate) && self.immediate ? 1 : 0) <= 1",
            "message": "at most one of time, lsn, name, xid and immediate: none is the newest point archived",
        }
    ]
}


class RecoveryTarget(ApiModel):
    """A point in the past of an instance that archives continuously: at most one of `time`,
    `lsn`, `name`, `xid`, `immediate`; none is the newest point its archive holds."""

    model_config = ConfigDict(json_schema_extra=ONE_TARGET)
    time: AwareDatetime | None = Field(
        default=None, description="A time with its zone (RFC 3339), e.g. 2026-12-04T18:00:00Z."
    )
    lsn: str | None = Field(
        default=None,
        pattern=r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        description="A WAL position, e.g. 0/5000060.",
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=r"^[^\\[:cntrl:]]+$",
        description="A restore point the service named (no backslash, no control character).",
    )
    xid: int | None = Field(
        default=None, ge=3, description="A transaction id.", json_schema_extra={"format": "int64"}
    )
    immediate: bool | None = Field(
        default=None,
        description="true: the end of the base backup, the first point where its data is consistent.",
    )
    inclusive: bool = Field(
        default=True, description="Stop just after the target (true) or just before it (false)."
    )

    def describe(self) -> str:
        if self.time is not None:
            return f"time {self.time_text()}"
        for field in ("lsn", "name", "xid"):
            if getattr(self, field) is not None:
                return f"{field} {getattr(self, field)}"
        if self.immediate:
            return "the end of the base backup"
        return "the newest point archived"

    def time_text(self) -> str:
        assert self.time is not None
        return self.time.isoformat()

    @property
    def timestamp(self) -> float | None:
        return None if self.time is None else datetime.timestamp(self.time)


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
    point_in_time: RecoveryTarget | None = Field(
        default=None,
        description="Then recover to this point from the archive the Restore named (a physical backup only).",
    )
