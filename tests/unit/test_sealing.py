"""Client-side encryption of backups (`backup.sealing`): sealed pieces and WAL, authenticated
manifests, keyrings and their rotation, against an in-memory bucket."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
import zstandard
from botocore.exceptions import ClientError

from backup import resources, run
from backup import restore as restore_kind
from backup.driver import Driver, Sink, Taken, WalArchive
from backup.job import build_job
from backup.manifest import Manifest, manifest_key, read_manifest
from backup.restore_plan import WriteBootstrapSecret
from backup.sealing import (
    CIPHER,
    ENV_PREFIX,
    MAGIC,
    OVERHEAD,
    REQUEST_FIELD,
    Keyring,
    SealError,
    key_id,
    keyring_of,
    open_sealed,
    seal,
)
from backup.storage import MiB, S3Spec, StorageError
from services.postgres import PLUGIN as POSTGRES
from services.postgres import wal_archiver
from services.postgres.point_in_time import read_wal
from services.postgres.wal_archive import wal_key

pytestmark = pytest.mark.unit

OLD, NEW = bytes(range(32)), bytes(range(100, 132))
B64 = {"old": base64.b64encode(OLD).decode(), "new": base64.b64encode(NEW).decode()}
PLAIN = S3Spec.model_validate({"bucket": "backups", "credentialsSecret": "s3", "pieceSizeMiB": 1})
SEALED = S3Spec.model_validate({**PLAIN.to_api(), "encryption": {"keysSecret": "backup-keys", "key": "new"}})
SECRET_ROW = b"the-customer-row-4242 "
CONTENT = SECRET_ROW * (2 * MiB // len(SECRET_ROW) + 5)  # three pieces of 1 MiB


def keyring(current: str = "new", **entries: bytes) -> Keyring:
    return Keyring(entries or {"old": OLD, "new": NEW}, current, "Secret backup-keys")


class Body(io.BytesIO):
    pass


class MemoryBucket:
    """put/get/head/delete of objects by key, with their metadata."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        self.lock = threading.Lock()

    def put_object(self, Bucket: str, Key: str, Body: bytes, Metadata: dict | None = None, **_: Any) -> None:
        with self.lock:
            self.objects[Key] = bytes(Body)
            self.metadata[Key] = Metadata or {}

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "no"}}, "GetObject")
        return {"Body": Body(self.objects[Key]), "Metadata": self.metadata.get(Key, {})}

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "404", "Message": "no"}}, "HeadObject")
        return {"Metadata": self.metadata.get(Key, {})}

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> None:
        for entry in Delete["Objects"]:
            self.objects.pop(entry["Key"], None)


class EchoDriver(Driver):
    """Backs up CONTENT as one object; restores it into `restored`."""

    methods = ("logical",)
    restored: ClassVar[list[bytes]] = []

    def backup(self, method: str, sink: Sink, archive: WalArchive | None = None) -> Taken:
        sink.write_object("data.bin", iter(CONTENT[i : i + 300_000] for i in range(0, len(CONTENT), 300_000)))
        return Taken("1.0")

    def restore(self, manifest: Manifest, source: Any) -> dict[str, Any]:
        data = b"".join(source("data.bin"))
        self.restored.append(data)
        return {"restored": len(data)}

    def check(self, manifest: Manifest, query: str | None, database: str | None) -> dict[str, Any]:
        return {}


DRIVER = EchoDriver()


def request(location: str = "apps/shop/echo/demo/nightly-0a1b2c3d") -> dict[str, Any]:
    return {
        "driver": __name__,
        "method": "logical",
        "location": location,
        "backup": {"namespace": "shop", "name": "nightly", "uid": "0a1b2c3d-9"},
        "service": {"kind": "Echo", "name": "demo"},
    }


def backed_up(bucket: MemoryBucket, spec: S3Spec, ring: Keyring | None, location: str | None = None) -> str:
    wanted = request(location) if location else request()
    run.take_backup(wanted, bucket, spec, ring)
    return wanted["location"]


def restored(bucket: MemoryBucket, spec: S3Spec, ring: Keyring | None, location: str) -> bytes:
    EchoDriver.restored.clear()
    run.restore({**request(location), "action": "restore"}, bucket, spec, ring)
    return EchoDriver.restored[-1]


# -- sealing one object ----------------------------------------------------------------------


def test_a_sealed_object_opens_only_as_itself_and_hides_its_content() -> None:
    sealed = seal(NEW, "apps/x/data.bin.000001", SECRET_ROW * 10)
    assert sealed.startswith(MAGIC + key_id(NEW).encode())
    assert len(sealed) == len(SECRET_ROW) * 10 + OVERHEAD
    assert SECRET_ROW not in sealed
    assert seal(NEW, "k", b"same") != seal(NEW, "k", b"same")  # a fresh nonce each time
    assert open_sealed(keyring(), "apps/x/data.bin.000001", sealed) == SECRET_ROW * 10
    assert key_id(NEW) != key_id(OLD)
    assert len(key_id(NEW)) == 16
    assert NEW.hex()[:16] not in key_id(NEW)


@pytest.mark.parametrize("where", [len(MAGIC) + 16, len(MAGIC) + 16 + 12, -1, -20])
def test_a_flipped_byte_is_refused_naming_the_object(where: int) -> None:
    sealed = bytearray(seal(NEW, "apps/x/data.bin.000001", b"a piece of a backup"))
    sealed[where] ^= 0x01
    with pytest.raises(SealError, match=r"apps/x/data.bin.000001 fails authentication") as refused:
        open_sealed(keyring(), "apps/x/data.bin.000001", bytes(sealed))
    assert refused.value.reason == "SealBroken"


def test_a_piece_moved_to_another_key_is_refused() -> None:
    sealed = seal(NEW, "apps/a/data.bin.000002", b"second piece")
    for elsewhere in ("apps/a/data.bin.000001", "apps/b/data.bin.000002"):
        with pytest.raises(SealError, match=f"{elsewhere} fails authentication: tampered with or moved"):
            open_sealed(keyring(), elsewhere, sealed)


def test_a_key_the_keyring_lacks_is_named_by_its_id() -> None:
    sealed = seal(OLD, "apps/x/data.bin.000001", b"old")
    with pytest.raises(SealError, match=f"sealed with key id {key_id(OLD)}, which the keyring does not hold"):
        open_sealed(keyring(new=NEW), "apps/x/data.bin.000001", sealed)


def test_an_unsealed_object_is_refused_where_the_storage_encrypts() -> None:
    with pytest.raises(SealError, match=r"apps/x/data.bin.000001 is not sealed") as refused:
        open_sealed(keyring(), "apps/x/data.bin.000001", b"plain text put there by someone")
    assert refused.value.reason == "NotSealed"


# -- keyrings --------------------------------------------------------------------------------


def test_the_keyring_comes_from_the_prefixed_variables_and_the_request() -> None:
    environ = {f"{ENV_PREFIX}old": B64["old"], "AWS_ACCESS_KEY_ID": "AKIA", "PATH": "/bin"}
    ring = keyring_of(SEALED, environ, {"new": B64["new"] + "\n"})
    assert ring is not None
    assert ring.entries == {"old": OLD, "new": NEW}
    assert ring.current_id() == key_id(NEW)
    assert "backup-keys" in ring.source
    assert keyring_of(PLAIN, environ) is None  # a storage that does not encrypt needs none


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("not base64!", "entry new is not base64"),
        (base64.b64encode(b"short").decode(), "entry new holds 5 bytes"),
    ],
)
def test_a_malformed_key_is_refused_naming_the_secret_and_its_entry(value: str, said: str) -> None:
    with pytest.raises(SealError, match=said) as refused:
        keyring_of(SEALED, {f"{ENV_PREFIX}new": value})
    assert refused.value.reason == "KeyInvalid"
    assert "Secret backup-keys" in str(refused.value)


def test_a_missing_current_key_fails_a_backup_before_anything_is_sent_naming_secret_and_entry() -> None:
    ring = keyring_of(SEALED, {f"{ENV_PREFIX}old": B64["old"]})
    assert ring is not None
    bucket = MemoryBucket()
    with pytest.raises(
        SealError, match=r"spec.s3.encryption.key: Secret backup-keys .* has no entry new"
    ) as e:
        backed_up(bucket, SEALED, ring)
    assert e.value.reason == "KeyMissing"
    assert bucket.objects == {}


def test_a_keys_volume_is_read_without_the_kubelets_own_links(tmp_path: Path) -> None:
    (tmp_path / "..data").mkdir()
    (tmp_path / "new").write_text(B64["new"])
    (tmp_path / "old").write_text(B64["old"])
    ring = Keyring.from_directory(tmp_path, "new")
    assert ring.entries == {"old": OLD, "new": NEW}
    with pytest.raises(SealError, match=r"has no entry new .*missing or empty"):
        Keyring.from_directory(tmp_path / "absent", "new").sealing_key()


# -- backups: pieces and manifests -----------------------------------------------------------


def test_an_encrypted_backup_stores_no_plaintext_and_restores() -> None:
    bucket = MemoryBucket()
    location = backed_up(bucket, SEALED, keyring())
    assert len(bucket.objects) == 4  # three pieces and the manifest
    pieces = {k: v for k, v in bucket.objects.items() if not k.endswith("manifest.json")}
    assert all(SECRET_ROW not in v and v.startswith(MAGIC) for v in pieces.values())
    manifest = json.loads(bucket.objects[manifest_key(location)])
    assert manifest["sealing"] == {"keyId": key_id(NEW), "cipher": CIPHER}
    assert manifest["authentication"].startswith("hmac-sha256:")
    entry = manifest["objects"][0]
    assert entry["size"] == len(CONTENT)  # the content's; the pieces' are as stored
    assert sum(p["size"] for p in entry["pieces"]) == len(CONTENT) + 3 * OVERHEAD
    assert restored(bucket, SEALED, keyring(), location) == CONTENT


def test_a_tampered_piece_is_refused_before_anything_is_restored_naming_it() -> None:
    bucket = MemoryBucket()
    location = backed_up(bucket, SEALED, keyring())
    piece = f"{location}/data.bin.000002"
    bucket.objects[piece] = bucket.objects[piece][:-1] + bytes([bucket.objects[piece][-1] ^ 1])
    EchoDriver.restored.clear()
    with pytest.raises(StorageError, match=f"object {piece} is corrupted"):
        run.restore({**request(location), "action": "restore"}, bucket, SEALED, keyring())
    assert EchoDriver.restored == []


def test_a_piece_with_its_manifest_entry_rewritten_still_fails_the_manifests_authentication() -> None:
    bucket = MemoryBucket()
    location = backed_up(bucket, SEALED, keyring())
    key = manifest_key(location)
    document = json.loads(bucket.objects[key])
    document["objects"][0]["pieces"][0]["size"] += 1
    bucket.objects[key] = json.dumps(document).encode()
    with pytest.raises(SealError, match=f"{key} fails authentication") as refused:
        read_manifest(bucket, SEALED, location, keyring())
    assert refused.value.reason == "ManifestForged"


def test_a_manifest_swapped_for_another_backups_is_refused() -> None:
    bucket = MemoryBucket()
    first = backed_up(bucket, SEALED, keyring(), "apps/shop/echo/demo/first-00000001")
    second = backed_up(bucket, SEALED, keyring(), "apps/shop/echo/demo/second-00000002")
    bucket.objects[manifest_key(second)] = bucket.objects[manifest_key(first)]
    EchoDriver.restored.clear()
    with pytest.raises(SealError, match=f"{manifest_key(second)} fails authentication"):
        run.restore({**request(second), "action": "restore"}, bucket, SEALED, keyring())
    assert EchoDriver.restored == []


def test_an_unsigned_manifest_is_refused_by_a_storage_that_encrypts() -> None:
    bucket = MemoryBucket()
    location = backed_up(bucket, PLAIN, None)  # someone without the keys wrote it
    with pytest.raises(SealError, match="is not signed, yet its storage encrypts") as refused:
        read_manifest(bucket, SEALED, location, keyring())
    assert refused.value.reason == "ManifestUnsigned"


def test_a_sealed_backup_read_through_a_storage_without_encryption_says_so() -> None:
    bucket = MemoryBucket()
    location = backed_up(bucket, SEALED, keyring())
    with pytest.raises(SealError, match=f"sealed with key id {key_id(NEW)}, but its storage has no"):
        read_manifest(bucket, PLAIN, location)


def test_rotation_seals_new_backups_with_the_new_key_and_still_opens_the_old_ones() -> None:
    bucket = MemoryBucket()
    before = backed_up(bucket, SEALED, keyring("old", old=OLD), "apps/shop/echo/demo/before-00000001")
    rotated = keyring("new")  # a new entry added and named; the old one kept
    after = backed_up(bucket, SEALED, rotated, "apps/shop/echo/demo/after-00000002")
    assert read_manifest(bucket, SEALED, before, rotated).sealing.key_id == key_id(OLD)  # type: ignore[union-attr]
    assert read_manifest(bucket, SEALED, after, rotated).sealing.key_id == key_id(NEW)  # type: ignore[union-attr]
    assert restored(bucket, SEALED, rotated, before) == CONTENT
    assert restored(bucket, SEALED, rotated, after) == CONTENT
    with pytest.raises(SealError, match=f"key id {key_id(OLD)}, which the keyring does not hold"):
        restored(bucket, SEALED, keyring("new", new=NEW), before)  # the old entry dropped too soon


def test_without_encryption_a_backup_is_stored_as_before() -> None:
    bucket = MemoryBucket()
    location = backed_up(bucket, PLAIN, None)
    pieces = sorted(k for k in bucket.objects if not k.endswith("manifest.json"))
    assert b"".join(bucket.objects[k] for k in pieces) == CONTENT  # byte for byte
    manifest = json.loads(bucket.objects[manifest_key(location)])
    assert "sealing" not in manifest
    assert "authentication" not in manifest
    assert restored(bucket, PLAIN, None, location) == CONTENT


# -- the Job ---------------------------------------------------------------------------------


def job_container(storage: S3Spec) -> dict[str, Any]:
    owner = {"metadata": {"name": "nightly", "namespace": "shop", "uid": "u-1"}}
    job = build_job(
        owner_kind="Backup",
        owner=owner,
        action="backup",
        request={},
        storage=storage,
        service_env=[],
        image="i",
    )
    return job["spec"]["template"]["spec"]["containers"][0]


def test_a_job_gets_every_entry_of_the_keys_secret_only_where_the_storage_encrypts() -> None:
    assert job_container(SEALED)["envFrom"] == [
        {"secretRef": {"name": "backup-keys", "optional": True}, "prefix": ENV_PREFIX}
    ]
    assert "envFrom" not in job_container(PLAIN)


def test_a_pod_reading_the_bootstrap_request_gets_its_keys_from_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bucket = MemoryBucket()
    location = backed_up(bucket, SEALED, keyring())
    wanted = {**request(location), "action": "restore", "storage": SEALED.to_api(), REQUEST_FIELD: B64}
    monkeypatch.setenv("STATEFLEET_BACKUP_REQUEST", json.dumps(wanted))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setattr(run, "s3_client", lambda *_: bucket)
    monkeypatch.setattr(run.signal, "signal", lambda *_: None)
    monkeypatch.setattr(run, "TERMINATION_LOG", tmp_path / "termination-log")
    EchoDriver.restored.clear()
    assert run.main() == 0
    assert EchoDriver.restored == [CONTENT]
    monkeypatch.setenv(
        "STATEFLEET_BACKUP_REQUEST", json.dumps({**wanted, REQUEST_FIELD: {"old": B64["old"]}})
    )
    assert run.main() == 1
    error = json.loads((tmp_path / "termination-log").read_text())["error"]
    assert error["reason"] == "KeyMissing"
    assert key_id(NEW) in error["message"]


# -- WAL -------------------------------------------------------------------------------------


def archiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bucket: MemoryBucket) -> wal_archiver.Archiver:
    pgdata = tmp_path / "pgdata"
    (pgdata / "global").mkdir(parents=True)
    (pgdata / "global" / "pg_control").write_bytes((7).to_bytes(8, "little"))
    (pgdata / "pg_wal").mkdir()
    credentials, keys = tmp_path / "credentials", tmp_path / "keys"
    credentials.mkdir()
    keys.mkdir()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        (credentials / name).write_text("x")
    monkeypatch.setattr(wal_archiver, "CREDENTIALS", credentials)
    monkeypatch.setattr(wal_archiver, "KEYS", keys)
    monkeypatch.setattr(wal_archiver, "s3_client", lambda *_: bucket)
    settings = {"s3": SEALED.to_api(), "prefix": "apps/shop/postgres/demo/wal", "parallel": 1}
    return wal_archiver.Archiver(pgdata, tmp_path / "spool", "demo-0", settings, None)


def test_archived_wal_is_sealed_with_the_key_the_secret_holds_now_and_opened_on_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = MemoryBucket()
    worker = archiver(tmp_path, monkeypatch, bucket)
    segment = "000000010000000000000003"
    (worker.pgdata / "pg_wal" / segment).write_bytes(SECRET_ROW * 1000)
    with pytest.raises(SealError, match=r"Secret backup-keys .* has no entry new"):
        worker._store(segment)  # the Secret not there (yet): the archiver's reported error
    (tmp_path / "keys" / "new").write_text(B64["new"])  # the kubelet updated the volume
    worker._store(segment)
    key = wal_key(worker.prefix, segment)
    assert bucket.objects[key].startswith(MAGIC + key_id(NEW).encode())
    assert SECRET_ROW not in bucket.objects[key]
    assert bucket.objects[wal_key(worker.prefix, segment).rsplit("/", 2)[0] + "/SYSTEM"] == b"7\n"
    assert read_wal(bucket, "backups", key, keyring()) == SECRET_ROW * 1000
    with pytest.raises(SealError, match=r"but its storage has no spec.s3.encryption"):
        read_wal(bucket, "backups", key)
    bucket.objects[wal_key(worker.prefix, "000000010000000000000004")] = bucket.objects[key]
    with pytest.raises(SealError, match=r"000000010000000000000004.zst fails authentication"):
        read_wal(bucket, "backups", wal_key(worker.prefix, "000000010000000000000004"), keyring())


def test_an_unsealed_wal_file_is_refused_where_the_storage_encrypts() -> None:
    bucket = MemoryBucket()
    key = "apps/shop/postgres/demo/wal/0000000100000000/000000010000000000000003.zst"
    bucket.put_object("backups", key, zstandard.ZstdCompressor().compress(b"forged WAL"))
    with pytest.raises(SealError, match="is not sealed"):
        read_wal(bucket, "backups", key, keyring())
    assert read_wal(bucket, "backups", key) == b"forged WAL"  # a storage without encryption: as before


# -- the BackupStorage's status --------------------------------------------------------------


def storage_outcome(monkeypatch: pytest.MonkeyPatch, secret: dict[str, str] | None) -> Any:
    class Answers:
        def head_bucket(self, Bucket: str) -> None:
            pass

    async def storage_client(*_: Any) -> tuple[S3Spec, Any]:
        return SEALED, Answers()

    async def get_or_none(client: Any, kind: Any, name: str, namespace: str) -> Any:
        assert name == "backup-keys"
        if secret is None:
            return None
        return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in secret.items()}}

    monkeypatch.setattr(resources, "storage_client", storage_client)
    monkeypatch.setattr(resources, "get_or_none", get_or_none)
    body = {"metadata": {"name": "s3", "namespace": "shop"}, "spec": {"s3": SEALED.to_api()}}
    spec = resources.BackupStorageSpec.model_validate(body["spec"])
    return asyncio.run(resources.BackupStorageKind().reconcile(None, body, spec))  # type: ignore[arg-type]


def test_a_storage_that_encrypts_says_with_which_key_or_which_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ready = storage_outcome(monkeypatch, B64)
    assert ready.ready
    assert ready.message == f"s3://backups answers; sealing with key new ({key_id(NEW)})"
    missing = storage_outcome(monkeypatch, None)
    assert (missing.ready, missing.reason) == (False, "KeyMissing")
    assert missing.message == "Secret backup-keys (spec.s3.encryption.keysSecret) does not exist"
    no_entry = storage_outcome(monkeypatch, {"old": B64["old"]})
    assert (no_entry.ready, no_entry.reason) == (False, "KeyMissing")
    assert "spec.s3.encryption.key" in no_entry.message
    assert "has no entry new (it holds: old)" in no_entry.message
    malformed = storage_outcome(monkeypatch, {"new": "c2hvcnQ="})
    assert (malformed.ready, malformed.reason) == (False, "KeyInvalid")
    assert "entry new holds 5 bytes" in malformed.message


def test_an_instances_bootstrap_secret_carries_the_keys_its_pods_open_the_backup_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secrets = {
        "s3": {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "hush"},
        "backup-keys": B64,
    }

    async def get_or_none(client: Any, kind: Any, name: str, namespace: str) -> Any:
        found = secrets.get(name)
        return found and {"data": {k: base64.b64encode(v.encode()).decode() for k, v in found.items()}}

    created: list[Any] = []

    class Client:
        async def create(self, body: Any) -> None:
            created.append(body)

    monkeypatch.setattr(restore_kind, "get_or_none", get_or_none)
    target = {"metadata": {"name": "copy", "namespace": "shop", "uid": "u-2"}}
    action = WriteBootstrapSecret({"action": "bootstrap", "storage": SEALED.to_api(), "location": "x"})
    kind = restore_kind.RestoreKind([POSTGRES], "image")
    asyncio.run(kind.write_bootstrap_secret(Client(), POSTGRES, target, SEALED, action))  # type: ignore[arg-type]
    data = created[0].stringData
    assert data["AWS_SECRET_ACCESS_KEY"] == "hush"
    assert json.loads(data["request"])[REQUEST_FIELD] == B64
    assert REQUEST_FIELD not in action.request  # the plan's request (and so the status) never holds keys
