import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from testbed.images.pack import main as pack
from testbed.images.pack import merge_runtime_config

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
        [
            *("--out", str(out), "--ref", "localhost/statefleet/test:1"),
            *("--config", str(tmp_path / "config.json")),
            *(str(tmp_path / "a.tar"), str(tmp_path / "b.tar")),
        ]
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


def test_an_image_on_a_base_keeps_its_layers_and_merges_env(tmp_path: Path) -> None:
    make_layer(tmp_path / "base.tar", {"usr/bin/python3": b"elf"})
    (tmp_path / "base.json").write_text(
        json.dumps({"Env": ["PATH=/venv/bin:/usr/bin", "LANG=C.UTF-8"], "Cmd": ["python3"]})
    )
    pack(
        [
            "--out",
            str(tmp_path / "base-image.tar"),
            "--ref",
            "base:1",
            "--config",
            str(tmp_path / "base.json"),
            str(tmp_path / "base.tar"),
        ]
    )
    make_layer(tmp_path / "code.tar", {"opt/app/main.py": b"print()"})
    (tmp_path / "top.json").write_text(
        json.dumps({"Env": ["PYTHONPATH=/opt/app", "LANG=en_US.UTF-8"], "Cmd": ["run"]})
    )
    out = tmp_path / "image.tar"
    pack(
        [
            "--out",
            str(out),
            "--ref",
            "app:2",
            "--config",
            str(tmp_path / "top.json"),
            "--base",
            str(tmp_path / "base-image.tar"),
            str(tmp_path / "code.tar"),
        ]
    )

    with tarfile.open(out) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))[0]
        config = json.load(archive.extractfile(manifest["Config"]))
        layers = [archive.extractfile(name).read() for name in manifest["Layers"]]
    assert layers == [(tmp_path / "base.tar").read_bytes(), (tmp_path / "code.tar").read_bytes()]
    assert config["config"] == {
        "Env": ["PATH=/venv/bin:/usr/bin", "LANG=en_US.UTF-8", "PYTHONPATH=/opt/app"],
        "Cmd": ["run"],
    }


def test_env_merges_by_variable_name() -> None:
    merged = merge_runtime_config({"Env": ["A=1", "B=2"], "User": "0"}, {"Env": ["B=3"], "Cmd": ["x"]})
    assert merged == {"Env": ["A=1", "B=3"], "User": "0", "Cmd": ["x"]}
