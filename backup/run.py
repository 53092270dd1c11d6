"""What a backup or restore Job runs (`python -m backup`): the service-neutral half of the work.

The request comes as JSON in STATEFLEET_BACKUP_REQUEST (see `backup.job`), the storage's keys
as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, the service's connection as its driver reads it.
Progress goes to stdout as JSON lines (the operator reads the last one); the outcome goes to
the pod's termination message, where the operator reads it when the Job ends.

Backup: the driver streams each object to S3 (as pieces, sha256 on the way), then the manifest
is written, last. Restore: the manifest is read, every object is read once and checked against
its sha256 before the driver applies anything, and checked again while it is applied. A restore
that replaces an instance's data keeps that data aside until the restore and its check
succeeded, and puts it back otherwise (or, if the Job was killed, in a `rollback` Job).

A storage that encrypts (`spec.s3.encryption`): the keys come as STATEFLEET_BACKUP_KEY_<entry>
(envFrom the keys Secret) or, in an instance's pods, in the bootstrap Secret's request; each
piece is sealed before it is sent and opened once its stored bytes matched the manifest, which
is authenticated before anything it lists is read (`backup.sealing`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from backup.driver import (
    BootstrapsPhysical,
    ReplacesInPlace,
    ReplacesOnline,
    Source,
    WalArchive,
    capability,
    load_driver,
)
from backup.manifest import Manifest, ManifestObject, Piece, manifest_key, read_manifest
from backup.sealing import REQUEST_FIELD, Keyring, keyring_of, open_sealed
from backup.storage import (
    ChecksumMismatch,
    S3Spec,
    StorageError,
    StoredObject,
    Upload,
    explain,
    object_key,
    put_bytes,
    read_chunks,
    s3_client,
    verify,
)
from framework.kube.times import now_text

TERMINATION_LOG = Path("/dev/termination-log")
PROGRESS_EVERY = 2.0  # seconds


def say(kind: str, payload: dict[str, Any]) -> None:
    print(json.dumps({kind: payload}), flush=True)


TERMINATION_LIMIT = 4000  # bytes: Kubernetes keeps 4 KiB of a termination message


def bounded(payload: dict[str, Any], limit: int = TERMINATION_LIMIT) -> str:
    """The payload as JSON within `limit` bytes: what does not fit of a result's details is
    dropped (and said so), never cut mid-way."""
    text = json.dumps(payload)
    if len(text.encode()) <= limit:
        return text
    result = payload.get("result")
    if isinstance(result, dict):
        text = json.dumps({"result": {**result, "details": {"truncated": True}}})
        return text if len(text.encode()) <= limit else json.dumps({"result": {"truncated": True}})
    error = payload.get("error") or {}
    return json.dumps({"error": {**error, "message": str(error.get("message", ""))[: limit // 4]}})


def conclude(payload: dict[str, Any]) -> None:
    """The outcome, as the last log line and the termination message."""
    print(json.dumps(payload), flush=True)
    with contextlib.suppress(OSError):  # not in a pod
        TERMINATION_LOG.write_text(bounded(payload))


class Progress:
    def __init__(self) -> None:
        self.bytes, self.objects, self.said = 0, 0, 0.0

    def add(self, size: int, name: str) -> None:
        self.bytes += size
        moment = time.monotonic()
        if moment - self.said >= PROGRESS_EVERY:
            self.said = moment
            say("progress", {"bytes": self.bytes, "objects": self.objects, "object": name})


class S3Sink:
    def __init__(
        self, client: Any, spec: S3Spec, location: str, progress: Progress, keyring: Keyring | None = None
    ) -> None:
        self.client, self.spec, self.location, self.progress = client, spec, location, progress
        self.keyring = keyring
        self.written: list[ManifestObject] = []

    def write_object(self, name: str, chunks: Iterator[bytes]) -> StoredObject:
        sealer = self.keyring.seal if self.keyring else None
        upload = Upload(self.client, self.spec, object_key(self.location, name), sealer)
        try:
            for data in chunks:
                upload.write(data)
                self.progress.add(len(data), name)
            stored = upload.finish()
        except BaseException:
            upload.abort()
            raise
        self.progress.objects += 1
        pieces = [Piece(key=p.key, size=p.size, sha256=p.sha256) for p in stored.pieces]
        self.written.append(
            ManifestObject(name=name, key=stored.key, size=stored.size, sha256=stored.sha256, pieces=pieces)
        )
        return stored


def take_backup(
    request: dict[str, Any], client: Any, spec: S3Spec, keyring: Keyring | None = None
) -> dict[str, Any]:
    started = now_text()
    if keyring is not None:
        keyring.sealing_key()  # a key missing fails the backup before anything is sent
    driver = load_driver(request["driver"])
    progress = Progress()
    sink = S3Sink(client, spec, request["location"], progress, keyring)
    archive = WalArchive(client, spec, request["archive"], keyring) if request.get("archive") else None
    taken = driver.backup(request["method"], sink, archive)
    manifest = Manifest(
        namespace=request["backup"]["namespace"],
        backup=request["backup"]["name"],
        uid=request["backup"]["uid"],
        kind=request["service"]["kind"],
        instance=request["service"]["name"],
        version=taken.version,
        method=request["method"],
        startedAt=started,
        finishedAt=now_text(),
        objects=sink.written,
        physical=taken.physical,
        details=taken.details,
        instanceSpec=request.get("instanceSpec"),
    )
    key = manifest_key(request["location"])
    put_bytes(client, spec, key, manifest.to_json(keyring, key))  # last: from now on the backup exists
    result: dict[str, Any] = {
        "manifest": key,
        "bytes": manifest.size,
        "objects": len(manifest.objects),
        "version": manifest.version,
        "startedAt": manifest.started_at,
        "finishedAt": manifest.finished_at,
    }
    if manifest.physical:
        result["physical"] = manifest.physical.model_dump(by_alias=True)
    return result


def checked_chunks(
    client: Any, spec: S3Spec, entry: ManifestObject, progress: Progress, keyring: Keyring | None = None
) -> Iterator[bytes]:
    """The object's bytes, its pieces in order, each checked against the manifest as it ends
    and the whole at the end. Sealed pieces (`keyring`) are read whole, checked, and only then
    opened: nothing unauthenticated is handed on."""
    whole, total = hashlib.sha256(), 0
    for piece in entry.stored_pieces():
        if keyring is not None:
            stored = b"".join(read_chunks(client, spec, piece.key))
            actual = hashlib.sha256(stored).hexdigest()
            if actual != piece.sha256 or len(stored) != piece.size:
                raise ChecksumMismatch(piece.key, piece.sha256, actual, len(stored))
            data = open_sealed(keyring, piece.key, stored)
            del stored
            whole.update(data)
            total += len(data)
            progress.add(len(data), entry.name)
            yield data
            continue
        digest, size = hashlib.sha256(), 0
        for data in read_chunks(client, spec, piece.key):
            digest.update(data)
            whole.update(data)
            size += len(data)
            progress.add(len(data), entry.name)
            yield data
        if digest.hexdigest() != piece.sha256 or size != piece.size:
            raise ChecksumMismatch(piece.key, piece.sha256, digest.hexdigest(), size)
        total += size
    if whole.hexdigest() != entry.sha256 or total != entry.size:
        raise ChecksumMismatch(entry.key, entry.sha256, whole.hexdigest(), total)


def restore(
    request: dict[str, Any], client: Any, spec: S3Spec, keyring: Keyring | None = None
) -> dict[str, Any]:
    driver = load_driver(request["driver"])
    replace = request.get("replace")
    replacing = capability(driver, ReplacesOnline, "a restore over the instance's data") if replace else None
    manifest = read_manifest(client, spec, request["location"], keyring)
    source = verified_source(client, spec, manifest, keyring)  # before anything is applied
    try:
        if replacing:
            details = replacing.restore(manifest, source, replace)
        else:
            details = driver.restore(manifest, source)
        if "check" in request:
            say("progress", {"checking": True})
            details["check"] = driver.check(
                manifest, request["check"].get("query"), request["check"].get("database")
            )
    except BaseException:
        if replacing:  # the instance's own data back before the failure is reported
            try:
                replacing.roll_back(replace)
            except Exception as error:  # the rollback Job the operator starts tries again
                say("progress", {"rollbackFailed": str(error)[:500]})
        raise
    if replacing:
        details.update(replacing.commit(replace))
    return {"bytes": manifest.size, "objects": len(manifest.objects), "details": details}


def roll_back(
    request: dict[str, Any], client: Any, spec: S3Spec, keyring: Keyring | None = None
) -> dict[str, Any]:
    """After a replacing restore's Job failed, perhaps without putting things back (killed):
    from what the instance recorded, not from the storage."""
    driver = capability(load_driver(request["driver"]), ReplacesOnline, "a rollback")
    details = driver.roll_back(request["replace"])
    return {"bytes": 0, "objects": 0, "details": details}


def check(
    request: dict[str, Any], client: Any, spec: S3Spec, keyring: Keyring | None = None
) -> dict[str, Any]:
    """An instance that started from a physical backup: is it that backup, does it read well."""
    driver = load_driver(request["driver"])
    in_place = (
        capability(driver, ReplacesInPlace, "the check of a restore in place")
        if request.get("replace")
        else None
    )
    manifest = read_manifest(client, spec, request["location"], keyring)
    wanted = request.get("check") or {}
    details = {"check": driver.check(manifest, wanted.get("query"), wanted.get("database"))}
    if in_place:  # restored in place: what was kept aside goes once checked
        details.update(in_place.commit_in_place(request["replace"]))
    return {"bytes": 0, "objects": len(manifest.objects), "details": details}


def verify_objects(client: Any, spec: S3Spec, manifest: Manifest) -> None:
    """Reads every object the manifest lists; raises `ChecksumMismatch` at the first that is
    not what it says. (Sealed pieces are checked as stored: the manifest that lists their
    sha256s was authenticated.)"""
    for entry in manifest.objects:
        for piece in entry.stored_pieces():
            verify(client, spec, piece.key, piece.sha256, piece.size)
        say("progress", {"verified": entry.name})


def streamed_source(client: Any, spec: S3Spec, manifest: Manifest, keyring: Keyring | None = None) -> Source:
    """The backup's objects' bytes, each checked against the manifest as it streams."""
    objects = {o.name: o for o in manifest.objects}
    progress = Progress()
    opening = keyring if manifest.sealing else None
    return lambda name: checked_chunks(client, spec, objects[name], progress, opening)


def verified_source(client: Any, spec: S3Spec, manifest: Manifest, keyring: Keyring | None = None) -> Source:
    """The backup's objects' bytes (checked again as they stream), once every object the
    manifest lists was read and matched its sha256."""
    verify_objects(client, spec, manifest)
    return streamed_source(client, spec, manifest, keyring)


def verify_backup(
    request: dict[str, Any], client: Any, spec: S3Spec, keyring: Keyring | None = None
) -> dict[str, Any]:
    """Before an instance stops for a restore in place: is every object what the manifest says."""
    manifest = read_manifest(client, spec, request["location"], keyring)
    verify_objects(client, spec, manifest)
    details = {"method": manifest.method, "location": request["location"]}
    return {"bytes": manifest.size, "objects": len(manifest.objects), "details": details}


def bootstrap(
    request: dict[str, Any], client: Any, spec: S3Spec, keyring: Keyring | None = None
) -> dict[str, Any]:
    """In a new instance's first pod (an init container): a physical backup becomes its data."""
    driver = load_driver(request["driver"])
    token = os.environ.get("RESTORE_TOKEN")
    if token:  # a physical backup restored over a running instance (`backup.in_place`)
        in_place = capability(driver, ReplacesInPlace, "a restore in place")

        def fetch() -> tuple[Manifest, Source]:
            if request.get("replace") != token:
                raise StorageError(
                    "RequestMismatch",
                    f"the instance's bootstrap Secret asks for restore {request.get('replace')}, "
                    f"the pod for {token}",
                )
            manifest = read_manifest(client, spec, request["location"], keyring)
            if manifest.method != "physical":
                raise StorageError("NotPhysical", f"a {manifest.method} backup is not restored by a pod")
            if request.get("verified"):
                # A Job read every object before the instance stopped: the instance is down only
                # for one pass, still checked as it streams (the old data stays aside meanwhile).
                return manifest, streamed_source(client, spec, manifest, keyring)
            return manifest, verified_source(client, spec, manifest, keyring)

        return in_place.replace_in_place(os.environ["RESTORE_MODE"], token, fetch, request.get("pointInTime"))
    bootstrapping = capability(driver, BootstrapsPhysical, "a bootstrap")
    why_not = bootstrapping.bootstrap_wanted()
    if why_not:
        return {"skipped": why_not}
    manifest = read_manifest(client, spec, request["location"], keyring)
    if manifest.method != "physical":
        return {"skipped": f"a {manifest.method} backup is restored once the instance runs"}
    # One pass: the data is extracted aside on an empty volume and moved into place only once
    # every piece matched, so nothing is applied before the checksums are.
    try:
        return bootstrapping.bootstrap(
            manifest, streamed_source(client, spec, manifest, keyring), request.get("pointInTime")
        )
    except (StorageError, BotoCoreError, ClientError, OSError, Stopped):
        raise
    except Exception:
        # The stream broke (tar, zstd) before the damaged piece ended: name it, if that is why.
        verify_objects(client, spec, manifest)
        raise


def peak_memory() -> dict[str, int]:
    """Peak resident memory of this process (the tools it runs are measured by nobody: a
    child's peak counts the parent's pages it was forked with)."""
    return {"job": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def fail(reason: str, message: str) -> int:
    conclude({"error": {"reason": reason, "message": message[:3000]}})
    return 1


class Stopped(Exception):
    """The pod was asked to stop (deleted, its node drained): what is under way is undone."""


def stop(signum: int, frame: Any) -> None:
    raise Stopped("the Job's pod was stopped before it ended")


def main() -> int:
    # As PID 1 of its container the process would ignore SIGTERM and be killed 30 s later, in
    # the middle of an upload or a restore; this way an upload is aborted, a restore undone.
    signal.signal(signal.SIGTERM, stop)
    request = json.loads(os.environ["STATEFLEET_BACKUP_REQUEST"])
    spec = S3Spec.model_validate(request["storage"])
    try:
        client = s3_client(spec, os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
        keyring = keyring_of(spec, os.environ, request.get(REQUEST_FIELD))
        actions = {
            "backup": take_backup,
            "restore": restore,
            "rollback": roll_back,
            "check": check,
            "verify": verify_backup,
            "bootstrap": bootstrap,
        }
        started = time.monotonic()
        result = actions[request["action"]](request, client, spec, keyring)
        result["seconds"] = round(time.monotonic() - started, 3)
        result["peakMemoryBytes"] = peak_memory()
    except StorageError as error:
        return fail(error.reason, str(error))
    except (BotoCoreError, ClientError) as error:
        found = explain(error, spec.bucket)
        return fail(found.reason, str(found))
    except Exception as error:
        return fail(type(error).__name__, str(error))
    conclude({"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
