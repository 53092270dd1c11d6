"""Point-in-time recovery, the service-neutral half: what a Restore with `spec.pointInTime`
needs of a service's continuous archive (`Archive`), and what it decides from it before
anything is created: the base backup (the newest one before the target) and whether the
archive reaches the target at all (before the oldest backup, after the newest archived WAL,
across a gap: refused, naming the field and the reachable range).

A plugin offers it by naming a module (`Backups.point_in_time`) that exposes `ARCHIVE`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from backup.sealing import Keyring
from backup.storage import S3Spec
from framework.kube.model import StatusModel
from framework.spec import RecoveryTarget


@dataclass(frozen=True)
class BaseBackup:
    """A completed physical Backup of the archived instance, in the archive's storage."""

    name: str
    completed_at: float  # seconds since the epoch: its data is consistent from then on
    timeline: int
    start_lsn: str
    end_lsn: str


class Reach(StatusModel):
    """What a point-in-time Restore chose and how far the archive reaches (`status.pointInTime`)."""

    backup: str | None = Field(
        default=None, description="the base backup, chosen as the newest before the target"
    )
    archive: str | None = Field(default=None, description="s3://bucket/key of the archive")
    reachable_from: str | None = Field(
        default=None, description="the oldest point reachable: the oldest backup's end"
    )
    reachable_to: str | None = Field(
        default=None, description="the newest point the archive holds without a gap"
    )
    target: str | None = Field(default=None, description="the point asked for")


@dataclass(frozen=True)
class Unreachable:
    """A target the archive cannot reach: the field to change and why, with the range."""

    field: str
    message: str


class Archive(ABC):
    """A service's continuous archive, as a Restore reads it."""

    @abstractmethod
    def prefix(self, storage_prefix: str, namespace: str, instance: str) -> str:
        """The key prefix of an instance's archive in its storage."""

    @abstractmethod
    def storage_of(self, instance_spec: dict[str, Any]) -> str | None:
        """The BackupStorage an instance's spec archives to (None: it does not archive)."""

    @abstractmethod
    def not_archiving(self, instance: dict[str, Any]) -> str | None:
        """Why the instance (its whole object) is not known to archive now, from its status;
        None when its status says it does."""

    @abstractmethod
    def observe(self, s3_api: Any, s3: S3Spec, prefix: str, keyring: Keyring | None = None) -> Any:
        """What `reach` needs of the archive (a listing, timeline histories; `keyring`: the
        storage's keys, when it encrypts). Blocking: the operator calls it in a thread."""

    @abstractmethod
    def reach(self, observed: Any, backups: list[BaseBackup], target: RecoveryTarget) -> Reach | Unreachable:
        """The base backup to recover `target` from, and the reachable range; or why not."""

    @abstractmethod
    def prune(self, s3_api: Any, s3: S3Spec, prefix: str, kept: list[BaseBackup]) -> int:
        """Deletes from the archive what no recovery from the `kept` base backups reads (never a
        timeline's history); returns how many files went. Blocking, as `observe`."""


def load_archive(module: str) -> Archive:
    return importlib.import_module(module).ARCHIVE
