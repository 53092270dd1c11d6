"""Writes a container image as a docker-archive tar (what `ctr images import` reads).

Usage: pack.py OUT.tar NAME:TAG CONFIG.json LAYER.tar [LAYER.tar ...]

CONFIG.json holds the image's runtime config (Env, Entrypoint, Cmd, User,
ExposedPorts, StopSignal, ...); the layers are uncompressed tars, bottom first.
No registry and no daemon are involved: the archive is plain JSON and tars.
"""

import hashlib
import io
import json
import sys
import tarfile
import time
from pathlib import Path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def main(out: str, ref: str, config_path: str, layers: list[str]) -> None:
    runtime_config = json.loads(Path(config_path).read_text())
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    diff_ids = [sha256_of(Path(layer)) for layer in layers]
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": runtime_config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
        "history": [{"created": created, "created_by": "statefleet testbed/images"} for _ in layers],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [
        {
            "Config": config_name,
            "RepoTags": [ref],
            "Layers": [f"{d}/layer.tar" for d in diff_ids],
        }
    ]
    with tarfile.open(out, "w") as archive:
        for digest, layer in zip(diff_ids, layers, strict=True):
            archive.add(layer, arcname=f"{digest}/layer.tar")
        for name, payload in ((config_name, config_bytes), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            info.mtime = int(time.time())
            archive.addfile(info, fileobj=io.BytesIO(payload))


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
