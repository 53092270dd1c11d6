"""S3 storage for backups: any S3-compatible store through boto3.

Objects are streamed: an upload holds at most `IN_FLIGHT + 1` pieces in memory whatever the
size of the backup, and a download reads fixed-size chunks. Every object's sha256 is computed
on the way, so the manifest can name it and a restore can check it before applying anything.
boto3 blocks: the operator calls it through `asyncio.to_thread`, the backup jobs directly.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError
from pydantic import Field

from framework.kube.model import ApiModel

BUCKET_PATTERN = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
MiB = 1024 * 1024
PIECE_SIZE = 16 * MiB  # an object is written as pieces of this size (`Upload`)
IN_FLIGHT = 3  # pieces uploading while the next one fills
CHUNK = 1 * MiB


KEY_NAME_PATTERN = r"^[-._a-zA-Z0-9]+$"  # a Secret's key


class EncryptionSpec(ApiModel):
    keys_secret: str = Field(
        min_length=1,
        max_length=253,
        description="A Secret in the same namespace whose entries are base64 32-byte keys (e.g. "
        "`openssl rand -base64 32`). Every piece of a backup and every archived WAL file is sealed "
        "(AES-256-GCM) with the entry named by `key` before it leaves the pod, and each manifest is "
        "authenticated; the other entries still open the backups they sealed. The keys never leave "
        "the namespace: without them no backup of this storage can be restored.",
    )
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=KEY_NAME_PATTERN,
        description="The entry of keysSecret that seals new backups and WAL. To rotate: add a new entry, "
        "name it here, and keep the older entries as long as backups sealed with them are kept.",
    )


class S3Spec(ApiModel):
    endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+(/.*)?$",
        description="The S3 endpoint URL, e.g. http://minio.storage:9000; AWS's own when empty.",
    )
    region: str = Field(default="us-east-1", min_length=1)
    bucket: str = Field(pattern=BUCKET_PATTERN, description="The bucket; it must exist.")
    prefix: str = Field(default="", max_length=512, description="Key prefix of every object, e.g. apps.")
    path_style: bool = Field(default=True, description="Path-style addressing (most S3 servers but AWS).")
    server_side_encryption: Literal["AES256", "aws:kms"] | None = Field(
        default=None, description="Server-side encryption of every object written."
    )
    kms_key_id: str | None = Field(default=None, description="The KMS key, with aws:kms.")
    credentials_secret: str = Field(
        min_length=1,
        description="A Secret in the same namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.",
    )
    piece_size_mib: int = Field(
        default=PIECE_SIZE // MiB,
        alias="pieceSizeMiB",
        ge=1,
        le=64,
        description="Objects are stored as pieces of this many MiB (fewer objects with bigger ones; "
        "a backup Job holds up to four in memory).",
    )
    encryption: EncryptionSpec | None = Field(
        default=None,
        description="Client-side encryption: backups and WAL sealed with a key of a Secret before they "
        "are sent, manifests authenticated; a backup tampered with, moved or swapped is refused before "
        "anything is restored. Empty: stored as they are (serverSideEncryption aside).",
    )


class BackupStorageSpec(ApiModel):
    """The spec of a `BackupStorage` (`backup.resources.BackupStorageKind`)."""

    s3: S3Spec


CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


class StorageError(Exception):
    """A storage failure a user can act on; `reason` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def explain(error: Exception, bucket: str) -> StorageError:
    """A boto3 error as a reason and message a user understands."""
    if isinstance(error, StorageError):
        return error
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchBucket",) or (code in ("404", "NotFound") and "Bucket" in error.operation_name):
            return StorageError("BucketNotFound", f"bucket {bucket} does not exist")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403") or status == 403:
            return StorageError("AccessDenied", f"the S3 server refused the credentials: {code}")
        if code in ("XMinioStorageFull", "InsufficientStorage") or status == 507:
            return StorageError(
                "StorageFull", f"the S3 server is out of space: {error.operation_name}: {code}"
            )
        if code in ("NoSuchKey", "404"):
            return StorageError("ObjectNotFound", f"{error.operation_name}: object not found")
        return StorageError("S3Error", f"{error.operation_name}: {code}: {error}")
    if isinstance(error, EndpointConnectionError):
        return StorageError("Unreachable", f"the S3 server does not answer: {error}")
    if isinstance(error, BotoCoreError):
        return StorageError("Unreachable", f"{type(error).__name__}: {error}")
    return StorageError("S3Error", f"{type(error).__name__}: {error}")


def s3_client(spec: S3Spec, access_key: str, secret_key: str) -> Any:
    config = Config(
        region_name=spec.region,
        # No sha256 of each body for the signature: every body we send carries its sha256 in
        # x-amz-checksum-sha256, a signed header the server checks the body against (`put_bytes`).
        s3={"addressing_style": "path" if spec.path_style else "virtual", "payload_signing_enabled": False},
        # Reads are checked against the manifest's sha256s: not hashed a second time by botocore.
        response_checksum_validation="when_required",
        connect_timeout=5,
        read_timeout=60,
        retries={"max_attempts": 4, "mode": "standard"},
        max_pool_connections=IN_FLIGHT + 4,
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=spec.endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=config,
    )


def object_key(*parts: str) -> str:
    """Parts joined by single slashes, empty parts left out."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def encryption_args(spec: S3Spec) -> dict[str, str]:
    if not spec.server_side_encryption:
        return {}
    args = {"ServerSideEncryption": spec.server_side_encryption}
    if spec.kms_key_id:
        args["SSEKMSKeyId"] = spec.kms_key_id
    return args


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    sha256: str
    pieces: tuple[StoredObject, ...] = ()  # what it was written as, in order (`Upload`)


def piece_key(key: str, number: int) -> str:
    return f"{key}.{number:06d}"


# (the piece's S3 key, its content) -> what is stored: `backup.sealing.Keyring.seal`
Sealer = Callable[[str, bytes], bytes]


class Upload:
    """One object written as a stream of pieces: `write` as the bytes come, `finish` once,
    `abort` on failure. Each piece of `piece_size` bytes is a plain object of its own
    (`<key>.000001`, ...), up to IN_FLIGHT of them uploading while the next one fills: at most
    IN_FLIGHT + 1 pieces in memory whatever the size. Not a multipart upload: completing one
    makes some S3 servers (file-system backed ones, the test bed's among them) copy every part
    into the final object, all of it at the very end of the backup; and an object is not
    limited to 10,000 parts. The whole stream's sha256 and each piece's are kept for the
    manifest. A piece that failed stops the upload at the next piece, not at the end. With a
    `sealer` each piece is sealed on its way: the pieces' sizes and sha256s are then the stored
    ones', the whole object's those of its content."""

    def __init__(self, client: Any, spec: S3Spec, key: str, sealer: Sealer | None = None) -> None:
        self.client, self.spec, self.key, self.sealer = client, spec, key, sealer
        self.piece_size = spec.piece_size_mib * MiB
        self.buffer = bytearray()
        self.digest = hashlib.sha256()
        self.size = 0
        self.pieces: list[Future[StoredObject]] = []
        self.in_flight: collections.deque[Future[StoredObject]] = collections.deque()
        self.pool = ThreadPoolExecutor(max_workers=IN_FLIGHT, thread_name_prefix="upload")

    def write(self, data: bytes) -> None:
        self.digest.update(data)
        self.size += len(data)
        self.buffer += data
        while len(self.buffer) >= self.piece_size:
            self._make_room()  # before the copy: memory stays at IN_FLIGHT + 1 pieces
            with memoryview(self.buffer) as view:
                self._submit(bytes(view[: self.piece_size]))  # no name left holding it
            del self.buffer[: self.piece_size]

    def _make_room(self) -> None:
        """Waits for the oldest piece while IN_FLIGHT are on their way; raises the failure of
        any piece that ended."""
        while self.in_flight and (len(self.in_flight) >= IN_FLIGHT or self.in_flight[0].done()):
            self.in_flight.popleft().result()
        for piece in self.in_flight:
            if piece.done() and piece.exception():
                piece.result()

    def _submit(self, piece: bytes) -> None:
        key = piece_key(self.key, len(self.pieces) + 1)
        if self.sealer is None:
            future = self.pool.submit(put_bytes, self.client, self.spec, key, piece)
        else:
            future = self.pool.submit(self._put_sealed, key, [piece])
            del piece
        self.pieces.append(future)
        self.in_flight.append(future)

    def _put_sealed(self, key: str, box: list[bytes]) -> StoredObject:
        """Sealed in the upload's thread; its content is let go once sealed (`box` holds the only
        reference), so a piece is in memory twice only while it is being sealed."""
        assert self.sealer is not None
        sealed = self.sealer(key, box.pop())
        return put_bytes(self.client, self.spec, key, sealed)

    def finish(self) -> StoredObject:
        try:
            if self.buffer or not self.pieces:  # an empty stream is one empty piece
                self._make_room()
                self._submit(bytes(self.buffer))
            pieces = tuple(p.result() for p in self.pieces)
        except BaseException:
            self.abort()
            raise
        self.pool.shutdown()
        self.buffer.clear()
        return StoredObject(self.key, self.size, self.digest.hexdigest(), pieces)

    def abort(self) -> None:
        """Deletes the pieces written so far (a failed Backup's cleanup removes them too)."""
        self.pool.shutdown(cancel_futures=True)
        done = [p for p in self.pieces if p.done() and not p.cancelled()]
        written = [p.result().key for p in done if not p.exception()]
        with contextlib.suppress(BotoCoreError, ClientError):
            for start in range(0, len(written), 1000):
                batch = [{"Key": key} for key in written[start : start + 1000]]
                self.client.delete_objects(Bucket=self.spec.bucket, Delete={"Objects": batch})


def put_bytes(
    client: Any, spec: S3Spec, key: str, data: bytes, metadata: dict[str, str] | None = None
) -> StoredObject:
    """One object; its sha256, computed once, is the manifest's and the one the server checks
    the body against (the header is signed: a body changed on the way is refused, BadDigest)."""
    digest = hashlib.sha256(data).digest()
    checksum = base64.b64encode(digest).decode()
    extra = {"Metadata": metadata} if metadata else {}
    client.put_object(
        Bucket=spec.bucket, Key=key, Body=data, ChecksumSHA256=checksum, **extra, **encryption_args(spec)
    )
    return StoredObject(key, len(data), digest.hex())


def read_chunks(client: Any, spec: S3Spec, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
    body = client.get_object(Bucket=spec.bucket, Key=key)["Body"]
    try:
        while data := body.read(chunk):
            yield data
    finally:
        body.close()


class ChecksumMismatch(StorageError):
    def __init__(self, key: str, expected: str, actual: str, size: int) -> None:
        super().__init__(
            "ChecksumMismatch",
            f"object {key} is corrupted: sha256 {actual} ({size} bytes), the manifest says {expected}",
        )


def verify(client: Any, spec: S3Spec, key: str, sha256: str, size: int) -> None:
    """Reads the whole object and raises `ChecksumMismatch` unless it is what the manifest says."""
    digest, seen = hashlib.sha256(), 0
    for data in read_chunks(client, spec, key):
        digest.update(data)
        seen += len(data)
    if digest.hexdigest() != sha256 or seen != size:
        raise ChecksumMismatch(key, sha256, digest.hexdigest(), seen)


def delete_keys(client: Any, spec: S3Spec, keys: list[str]) -> int:
    """Deletes these objects, a thousand per request (the most S3 takes). Returns how many."""
    for start in range(0, len(keys), 1000):
        batch = [{"Key": key} for key in keys[start : start + 1000]]
        client.delete_objects(Bucket=spec.bucket, Delete={"Objects": batch, "Quiet": True})
    return len(keys)


def delete_prefix(client: Any, spec: S3Spec, prefix: str, first: str | None = None) -> int:
    """Deletes every object under `prefix/` (the key `first` before the others, so a backup stops
    existing before its parts go) and aborts unfinished uploads there. Returns objects deleted."""
    prefix = prefix.rstrip("/") + "/"
    deleted = 0
    if first:
        client.delete_object(Bucket=spec.bucket, Key=first)
        deleted += 1
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=spec.bucket, Prefix=prefix):
        deleted += delete_keys(
            client, spec, [o["Key"] for o in page.get("Contents", []) if o["Key"] != first]
        )
    uploads = client.list_multipart_uploads(Bucket=spec.bucket, Prefix=prefix).get("Uploads", [])
    for upload in uploads:
        client.abort_multipart_upload(Bucket=spec.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    return deleted
