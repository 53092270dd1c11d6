"""`Upload`: how a stream becomes pieces, against an in-memory bucket (the S3 server itself is
the e2e tests' business)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from backup.run import Progress, S3Sink
from backup.storage import MiB, S3Spec, Upload

pytestmark = pytest.mark.unit
SPEC = S3Spec.model_validate({"bucket": "backups", "credentialsSecret": "s", "pieceSizeMiB": 1})


class MemoryBucket:
    """What put_object stored, by key; a piece whose key ends with `failing` is refused."""

    def __init__(self, failing: str | None = None) -> None:
        self.objects: dict[str, bytes] = {}
        self.attempts = 0
        self.failing = failing
        self.lock = threading.Lock()

    def put_object(self, Bucket: str, Key: str, Body: bytes, **_: Any) -> None:
        with self.lock:
            self.attempts += 1
        if self.failing and Key.endswith(self.failing):
            raise ClientError({"Error": {"Code": "InternalError", "Message": "disk"}}, "PutObject")
        with self.lock:
            self.objects[Key] = bytes(Body)

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> None:
        with self.lock:
            for entry in Delete["Objects"]:
                self.objects.pop(entry["Key"], None)


def stream(data: bytes, chunk: int = 300_000) -> list[bytes]:
    return [data[i : i + chunk] for i in range(0, len(data), chunk)]


@pytest.mark.parametrize("size", [3 * MiB, 2 * MiB + 12345, 1, 0])
def test_a_stream_is_stored_as_pieces_that_join_into_it(size: int) -> None:
    data = hashlib.sha256(b"seed").digest() * (size // 32 + 1)
    data = data[:size]
    bucket = MemoryBucket()
    upload = Upload(bucket, SPEC, "k/base.tar")
    for chunk in stream(data):
        upload.write(chunk)
    stored = upload.finish()
    assert (stored.size, stored.sha256) == (size, hashlib.sha256(data).hexdigest())
    expected = max(1, -(-size // MiB))  # an empty stream is one empty piece
    assert [p.key for p in stored.pieces] == [f"k/base.tar.{n:06d}" for n in range(1, expected + 1)]
    assert all(p.size <= MiB for p in stored.pieces)
    assert b"".join(bucket.objects[p.key] for p in stored.pieces) == data
    for piece in stored.pieces:
        assert hashlib.sha256(bucket.objects[piece.key]).hexdigest() == piece.sha256
    assert set(bucket.objects) == {p.key for p in stored.pieces}


def test_a_failed_piece_stops_the_upload_early_and_nothing_is_left() -> None:
    bucket = MemoryBucket(failing=".000002")
    sink = S3Sink(bucket, SPEC, "k", Progress())
    consumed: list[int] = []

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            consumed.append(MiB)
            yield b"x" * MiB

    with pytest.raises(ClientError):
        sink.write_object("db.dump", chunks())
    assert sum(consumed) < 10 * MiB  # within a few pieces, not at the end of the stream
    assert bucket.attempts < 10
    assert bucket.objects == {}  # the pieces written before it are deleted
    assert sink.written == []
