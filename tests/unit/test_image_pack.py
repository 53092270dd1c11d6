import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from testbed.images.pack import main as pack

pytestmark = pytest.mark.unit


def make_layer(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as layer:
        for name, payload in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            layer.addfile(info, io.BytesIO(payload))


def test_archive_names_the_image_and_checksums_each_layer(tmp_path: Path) -> None:
    make_layer(tmp_path / "a.tar", {"etc/hello": b"hello"})
    make_layer(tmp_path / "b.tar", {"usr/bin/tool": b"#!/bin/sh\n"})
    (tmp_path / "config.json").write_text(json.dumps({"Cmd": ["postgres"], "StopSignal": "SIGINT"}))
    out = tmp_path / "image.tar"

    pack(
        str(out),
        "localhost/statefleet/test:1",
        str(tmp_path / "config.json"),
        [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")],
    )

    with tarfile.open(out) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))
        assert manifest[0]["RepoTags"] == ["localhost/statefleet/test:1"]
        config_bytes = archive.extractfile(manifest[0]["Config"]).read()
        assert manifest[0]["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json"
        config = json.loads(config_bytes)
        assert config["config"] == {"Cmd": ["postgres"], "StopSignal": "SIGINT"}
        layers = [archive.extractfile(name).read() for name in manifest[0]["Layers"]]
    expected = [(tmp_path / name).read_bytes() for name in ("a.tar", "b.tar")]
    assert layers == expected
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(b).hexdigest()}" for b in expected]
