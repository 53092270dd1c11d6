"""Writes a container image as a docker-archive tar (what `ctr images import` reads).

Usage: pack.py --out OUT.tar --ref NAME:TAG --config CONFIG.json [--base BASE.tar] LAYER.tar...

CONFIG.json holds the image's runtime config (Env, Entrypoint, Cmd, User, ExposedPorts,
StopSignal, ...); the layers are uncompressed tars, bottom first. With --base, the new
layers go on top of another archive's, and the runtime config is the base's with
CONFIG.json's keys on top (Env merged by variable name). No registry and no daemon are
involved: the archive is plain JSON and tars.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def merge_runtime_config(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = {**base, **top}
    env: dict[str, str] = {}
    for entry in [*base.get("Env", []), *top.get("Env", [])]:
        key, _, value = entry.partition("=")
        env[key] = value
    if env:
        merged["Env"] = [f"{k}={v}" for k, v in env.items()]
    return merged


def extract_base(archive: Path, into: Path) -> tuple[list[Path], dict[str, Any]]:
    """The base image's layer files (extracted into `into`) and runtime config."""
    with tarfile.open(archive) as base:
        manifest = json.load(base.extractfile("manifest.json"))[0]
        config = json.load(base.extractfile(manifest["Config"]))
        layers = []
        for index, name in enumerate(manifest["Layers"]):
            target = into / f"base-{index}.tar"
            with base.extractfile(name) as source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
            layers.append(target)
    return layers, config.get("config", {})


def pack(out: Path, ref: str, runtime_config: dict[str, Any], layers: list[Path]) -> None:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    diff_ids = [sha256_of(layer) for layer in layers]
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
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [f"{d}/layer.tar" for d in diff_ids]}]
    with tarfile.open(out, "w") as archive:
        for digest, layer in zip(diff_ids, layers, strict=True):
            archive.add(layer, arcname=f"{digest}/layer.tar")
        for name, payload in ((config_name, config_bytes), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            info.mtime = int(time.time())
            archive.addfile(info, fileobj=io.BytesIO(payload))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--base", type=Path)
    parser.add_argument("layers", nargs="+", type=Path)
    args = parser.parse_args(argv)
    runtime_config = json.loads(args.config.read_text())
    with tempfile.TemporaryDirectory(dir=args.out.parent) as scratch:
        layers = list(args.layers)
        if args.base:
            base_layers, base_config = extract_base(args.base, Path(scratch))
            layers = [*base_layers, *layers]
            runtime_config = merge_runtime_config(base_config, runtime_config)
        pack(args.out, args.ref, runtime_config, layers)


if __name__ == "__main__":
    main()
