"""Dynamic local volumes for the test bed: the default StorageClass `standard`.

A claim waits for its first consumer; once the scheduler picks a node, this creates a
hostPath PersistentVolume pinned to that node (a folder under `.testbed/volumes` on the
real node; nothing at all on kwok's simulated nodes). A released volume is deleted with
its folder. As rancher's local-path provisioner does, minus the helper pods.

Usage: python testbed/local_volumes.py --kubeconfig FILE --base-dir DIR --real-node NAME
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim

PROVISIONER = "statefleet.dev/local-path"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
STORAGE_CLASS = "standard"

log = logging.getLogger("local-volumes")


def volume_name(claim: dict[str, Any]) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def wants_volume(claim: dict[str, Any]) -> bool:
    """A claim of our class that the scheduler has placed and that has no volume yet."""
    spec, meta = claim.get("spec", {}), claim["metadata"]
    return (
        spec.get("storageClassName") == STORAGE_CLASS
        and not spec.get("volumeName")
        and SELECTED_NODE in (meta.get("annotations") or {})
        and claim.get("status", {}).get("phase", "Pending") == "Pending"
        and not meta.get("deletionTimestamp")
    )


def build_persistent_volume(claim: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The PersistentVolume that satisfies `claim` on the node the scheduler chose."""
    meta, spec = claim["metadata"], claim["spec"]
    node = meta["annotations"][SELECTED_NODE]
    name = volume_name(claim)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            "storageClassName": STORAGE_CLASS,
            "persistentVolumeReclaimPolicy": "Delete",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "hostPath": {"path": str(base_dir / name), "type": "DirectoryOrCreate"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            },
        },
    }


def is_released_volume_of_ours(volume: dict[str, Any]) -> bool:
    meta, spec = volume["metadata"], volume.get("spec", {})
    return (
        (meta.get("annotations") or {}).get(PROVISIONED_BY) == PROVISIONER
        and spec.get("persistentVolumeReclaimPolicy") == "Delete"
        and volume.get("status", {}).get("phase") in {"Released", "Failed"}
    )


class Provisioner:
    def __init__(self, client: AsyncClient, base_dir: Path, real_node: str) -> None:
        self.client = client
        self.base_dir = base_dir
        self.real_node = real_node

    async def provision(self, claim: dict[str, Any]) -> None:
        if not wants_volume(claim):
            return
        volume = build_persistent_volume(claim, self.base_dir)
        if claim["metadata"]["annotations"][SELECTED_NODE] == self.real_node:
            folder = Path(volume["spec"]["hostPath"]["path"])
            # Containers run as any uid (postgres is 999): the folder must be writable to them.
            await asyncio.to_thread(folder.mkdir, mode=0o777, parents=True, exist_ok=True)
            await asyncio.to_thread(folder.chmod, 0o777)
        try:
            await self.client.create(PersistentVolume.from_dict(volume))
            log.info("provisioned %s for %s/%s", volume["metadata"]["name"], *_claim_ref(claim))
        except ApiError as error:
            if error.status.code != 409:  # 409: made already, by an earlier pass
                raise

    async def reclaim(self, volume: dict[str, Any]) -> None:
        if not is_released_volume_of_ours(volume):
            return
        path = Path(volume["spec"]["hostPath"]["path"])
        if path.parent == self.base_dir:
            await asyncio.to_thread(shutil.rmtree, path, True)
        try:
            await self.client.delete(PersistentVolume, volume["metadata"]["name"])
            log.info("deleted released %s", volume["metadata"]["name"])
        except ApiError as error:
            if error.status.code != 404:
                raise

    async def resync(self) -> None:
        async for claim in self.client.list(PersistentVolumeClaim, namespace="*"):
            await self.provision(claim.to_dict())
        async for volume in self.client.list(PersistentVolume):
            await self.reclaim(volume.to_dict())

    async def watch_claims(self) -> None:
        async for _, claim in self.client.watch(PersistentVolumeClaim, namespace="*"):
            await self.provision(claim.to_dict())

    async def watch_volumes(self) -> None:
        async for _, volume in self.client.watch(PersistentVolume):
            await self.reclaim(volume.to_dict())

    async def run(self) -> None:
        while True:
            try:
                await self.resync()
                # Watches give latency; the periodic resync repairs anything a watch missed.
                async with asyncio.timeout(60):
                    await asyncio.gather(self.watch_claims(), self.watch_volumes())
            except TimeoutError:
                continue
            except Exception:
                log.exception("provisioner pass failed; retrying in 2s")
                await asyncio.sleep(2)


def _claim_ref(claim: dict[str, Any]) -> tuple[str, str]:
    return claim["metadata"]["namespace"], claim["metadata"]["name"]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--base-dir", required=True, type=Path)
    parser.add_argument("--real-node", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.base_dir.mkdir(parents=True, exist_ok=True)
    client = AsyncClient(config=KubeConfig.from_file(args.kubeconfig))
    await Provisioner(client, args.base_dir.resolve(), args.real_node).run()


if __name__ == "__main__":
    asyncio.run(main())
