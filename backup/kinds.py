"""The backup engine's kinds, for the composition root to register."""

from __future__ import annotations

from backup.plan import BackupPlanKind
from backup.resources import BackupStorageKind
from backup.restore import RestoreKind
from backup.take import BackupKind
from framework.object_controller import ObjectKind
from framework.plugin import ServicePlugin


def backup_kinds(plugins: list[ServicePlugin], job_image: str) -> list[ObjectKind]:
    """BackupStorage, Backup, BackupPlan and Restore. `job_image`: the image of backup Jobs."""
    return [
        BackupStorageKind(),
        BackupKind(plugins, job_image),
        BackupPlanKind(plugins),
        RestoreKind(plugins, job_image),
    ]
