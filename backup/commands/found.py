"""`backups found --storage NAME [--import]`: every backup in a BackupStorage's bucket, found by
its manifest, whether or not a `Backup` object stands for it (a namespace deleted, a new
cluster after a disaster); `--import` makes a `Backup` (`spec.importFrom`) for each one missing
here, which a `Restore` then restores from."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from lightkube import AsyncClient, Client, codecs

from backup.manifest import Manifest, found_locations, manifest_key, read_manifest
from backup.resources import storage_client, storage_keyring
from backup.sealing import Keyring
from backup.storage import S3Spec, StorageError
from backup.take import BackupKind
from framework.kube.meta import API_VERSION


def add(verbs: Any) -> argparse.ArgumentParser:
    parser = verbs.add_parser("found", help="list the backups in a storage (and import them)")
    parser.add_argument("--storage", required=True, help="the BackupStorage to look into")
    parser.add_argument(
        "--import", dest="import_", action="store_true", help="a Backup for each one that has none here"
    )
    return parser


def backup_name(location: str) -> str:
    """The name an imported Backup gets: its location's last part (`<backup>-<uid8>`)."""
    return location.rsplit("/", 1)[-1][:63].rstrip("-")


def imported_backup(location: str, manifest: Manifest, storage: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Backup",
        "metadata": {"name": backup_name(location), "namespace": namespace},
        "spec": {
            "service": {"kind": manifest.kind, "name": manifest.instance},
            "storage": storage,
            "importFrom": location,
        },
    }


async def read_storage(namespace: str, storage: str) -> tuple[S3Spec, Any, Keyring | None]:
    client = AsyncClient()
    try:
        spec, s3 = await storage_client(client, namespace, storage)
        return spec, s3, await storage_keyring(client, namespace, spec)  # manifests checked as a Job does
    finally:
        await client.close()


def run(args: argparse.Namespace, kube: Client) -> int:
    namespace = args.namespace or kube.namespace
    try:
        spec, s3, keyring = asyncio.run(read_storage(namespace, args.storage))
        locations = found_locations(s3, spec)
    except StorageError as error:
        print(f"backupstorage/{args.storage}: {error}", file=sys.stderr)
        return 1
    known = {
        (b.to_dict().get("status") or {}).get("manifest")
        for b in kube.list(BackupKind.resource(), namespace=namespace)
    }
    print(f"{'LOCATION':<60} {'KIND':<9} {'INSTANCE':<16} {'METHOD':<9} {'BYTES':>12} {'FINISHED':<21} HERE")
    for done, location in enumerate(locations, 1):
        try:
            manifest = read_manifest(s3, spec, location, keyring)
        except (StorageError, ValueError) as error:
            print(f"{location:<60} unreadable: {error}")
            continue
        here = manifest_key(location) in known
        print(
            f"{location:<60} {manifest.kind:<9} {manifest.instance:<16} {manifest.method:<9} "
            f"{manifest.size:>12} {manifest.finished_at:<21} {'yes' if here else 'no'}"
        )
        if args.import_ and not here:
            body = imported_backup(location, manifest, args.storage, namespace)
            kube.create(codecs.from_dict(body))
            print(f"  backup/{body['metadata']['name']} created ({done} of {len(locations)})")
    if not locations:
        print(f"no backup in s3://{spec.bucket}/{spec.prefix}")
    return 0
