"""A backup's manifest: written last, so a backup without one does not exist.

Layout of a backup in its bucket:
  <prefix>/<namespace>/<kind>/<instance>/<backup>-<uid8>/<object>.000001...  the data, streamed
                                                                  as pieces
  <prefix>/<namespace>/<kind>/<instance>/<backup>-<uid8>/manifest.json  what they are
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from backup.storage import object_key

MANIFEST = "manifest.json"
FORMAT = 2  # 2: objects stored as pieces; 1: each object one key (still read)


class Piece(BaseModel):
    key: str
    size: int
    sha256: str


class ManifestObject(BaseModel):
    name: str  # the driver's name for it, e.g. base.tar, db/orders.dump
    key: str  # its pieces' keys start with it
    size: int
    sha256: str  # of the whole stream
    pieces: list[Piece] | None = None  # in order; None: the object is the key itself (format 1)

    def stored_pieces(self) -> list[Piece]:
        if self.pieces is not None:
            return self.pieces
        return [Piece(key=self.key, size=self.size, sha256=self.sha256)]


class PhysicalPosition(BaseModel):
    """Where a physical backup sits in its server's history (e.g. write-ahead log positions)."""

    timeline: int
    start_lsn: str = Field(alias="startLsn")
    end_lsn: str = Field(alias="endLsn")

    model_config = {"populate_by_name": True}


class Manifest(BaseModel):
    format: int = FORMAT
    namespace: str
    backup: str
    uid: str
    kind: str  # the service's kind
    instance: str
    version: str  # the server's version when it was taken, e.g. 17.2
    method: str  # logical or physical
    started_at: str = Field(alias="startedAt")
    finished_at: str = Field(alias="finishedAt")
    objects: list[ManifestObject]
    physical: PhysicalPosition | None = None
    details: dict[str, Any] = Field(default_factory=dict)  # the driver's own (databases, sizes)

    model_config = {"populate_by_name": True}

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=1).encode()


def location(prefix: str, namespace: str, kind: str, instance: str, backup: str, uid: str) -> str:
    """The key prefix of one backup: unique per Backup object, stable across operator restarts."""
    return object_key(prefix, namespace, kind.lower(), instance, f"{backup}-{uid[:8]}")


def manifest_key(backup_location: str) -> str:
    return object_key(backup_location, MANIFEST)
