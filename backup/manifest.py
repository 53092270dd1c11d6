"""A backup's manifest: written last, so a backup without one does not exist.

Layout of a backup in its bucket:
  <prefix>/<namespace>/<kind>/<instance>/<backup>-<uid8>/<object>.000001...  the data, streamed
                                                                  as pieces
  <prefix>/<namespace>/<kind>/<instance>/<backup>-<uid8>/manifest.json  what they are

In a storage that encrypts (`backup.sealing`), the pieces are sealed (their sizes and sha256s
in the manifest are the stored ones'; an object's own are its content's) and the manifest, in
clear, says by which key (`sealing`) and carries its HMAC (`authentication`), checked before
anything it lists is read.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, Field

from backup.sealing import Keyring, check_manifest, sealing_record, sign_manifest
from backup.storage import S3Spec, StorageError, explain, object_key, read_chunks

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
    # s3://bucket/prefix of the continuous archive that holds the WAL from start to end; None:
    # the backup holds it itself.
    archive: str | None = None

    model_config = {"populate_by_name": True}


class Sealing(BaseModel):
    """How a backup's pieces were sealed: the key's id (a fingerprint) and the cipher."""

    key_id: str = Field(alias="keyId")
    cipher: str

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
    # The instance's spec when taken: a new instance restored from the bucket alone (a new
    # cluster after a disaster, without the Backup objects) starts from it. Older ones lack it.
    instance_spec: dict[str, Any] | None = Field(default=None, alias="instanceSpec")
    sealing: Sealing | None = None  # None: stored as they are
    authentication: str | None = None  # hmac-sha256:<hex> of the rest (`backup.sealing`)

    model_config = {"populate_by_name": True}

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    def to_json(self, keyring: Keyring | None = None, key: str = "") -> bytes:
        """As stored; with a `keyring`, sealed by its current key and signed for its own `key`."""
        if keyring is None:
            return self.model_dump_json(by_alias=True, exclude_none=True, indent=1).encode()
        document = self.model_copy(update={"sealing": Sealing.model_validate(sealing_record(keyring))})
        dumped = document.model_dump(mode="json", by_alias=True, exclude_none=True)
        signed = sign_manifest(keyring, key, dumped)
        return json.dumps(signed, indent=1).encode()


def location(prefix: str, namespace: str, kind: str, instance: str, backup: str, uid: str) -> str:
    """The key prefix of one backup: unique per Backup object, stable across operator restarts."""
    return object_key(prefix, namespace, kind.lower(), instance, f"{backup}-{uid[:8]}")


def manifest_key(backup_location: str) -> str:
    return object_key(backup_location, MANIFEST)


def read_manifest(client: Any, spec: S3Spec, location: str, keyring: Keyring | None = None) -> Manifest:
    """The manifest of the backup at `location`; `StorageError` ManifestMissing when there is
    none (the backup never completed, or the location is wrong). In a storage that encrypts, a
    manifest not signed by a key of `keyring` is refused (`backup.sealing.check_manifest`)."""
    key = manifest_key(location)
    try:
        raw = b"".join(read_chunks(client, spec, key))
    except (BotoCoreError, ClientError) as error:
        found = explain(error, spec.bucket)
        if found.reason == "ObjectNotFound":
            raise StorageError(
                "ManifestMissing", f"{key} does not exist: the backup never completed"
            ) from error
        raise found from error
    return parse_manifest(spec, keyring, key, raw)


def parse_manifest(spec: S3Spec, keyring: Keyring | None, key: str, raw: bytes) -> Manifest:
    """The manifest stored at `key`, checked against the storage's encryption first."""
    document = json.loads(raw)
    if not isinstance(document, dict):
        raise ValueError(f"{key}: not a JSON object")
    check_manifest(spec, keyring, key, document)
    return Manifest.model_validate(document)


def found_locations(client: Any, spec: S3Spec) -> list[str]:
    """The location of every backup under the storage's prefix (each has its manifest)."""
    suffix = "/" + MANIFEST
    locations = []
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=spec.bucket, Prefix=object_key(spec.prefix, "")
    )
    for page in pages:
        for item in page.get("Contents") or []:
            if item["Key"].endswith(suffix):
                locations.append(item["Key"][: -len(suffix)])
    return sorted(locations)
