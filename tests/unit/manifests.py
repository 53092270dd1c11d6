"""A physical backup's manifest for the unit tests that need one."""

from __future__ import annotations

from typing import Any

from backup.manifest import Manifest, ManifestObject


def physical_manifest(*objects: ManifestObject, **fields: Any) -> Manifest:
    return Manifest(
        namespace="apps",
        backup="demo-now",
        uid="u",
        kind="Postgres",
        instance="demo",
        version="17.2",
        method="physical",
        startedAt="2026-11-30T02:00:00Z",
        finishedAt="2026-11-30T02:01:00Z",
        objects=list(objects),
        **fields,
    )
