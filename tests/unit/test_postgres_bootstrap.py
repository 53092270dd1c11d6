"""A physical backup becomes a new instance's data in one read: extracted aside, and put in
place only once every piece matched its checksum (the last is known only at the very end)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from backup.driver import Source
from backup.manifest import ManifestObject
from backup.storage import ChecksumMismatch
from services.postgres.backup_driver import BASE_TAR, DRIVER, RESTORED_MARK, CommandFailed
from tests.unit.manifests import physical_manifest

pytestmark = pytest.mark.unit

MANIFEST = physical_manifest(ManifestObject(name=BASE_TAR, key="k/base.tar.zst", size=1, sha256="ab" * 32))
FILES = {"PG_VERSION": b"17\n", "base/1/1259": bytes(range(256)) * 400, "standby.signal": b""}


def compressed_tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return subprocess.run(["zstd", "-c"], input=buffer.getvalue(), capture_output=True, check=True).stdout


def source_of(data: bytes, failure: Exception | None = None) -> Source:
    """The object in small chunks, then `failure`, as a piece's checksum fails once it ended."""

    def chunks(name: str) -> Iterator[bytes]:
        assert name == BASE_TAR
        for start in range(0, len(data), 4096):
            yield data[start : start + 4096]
        if failure:
            raise failure

    return chunks


@pytest.fixture
def pgdata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PGDATA", str(tmp_path / "pgdata"))
    return tmp_path / "pgdata"


def test_the_backup_is_put_in_place_marked_and_never_a_standby(pgdata: Path) -> None:
    DRIVER.bootstrap(MANIFEST, source_of(compressed_tar(FILES)))
    assert (pgdata / "PG_VERSION").read_bytes() == b"17\n"
    assert (pgdata / "base/1/1259").read_bytes() == FILES["base/1/1259"]
    assert (pgdata / RESTORED_MARK).read_text() == "apps/demo-now\n"
    assert not (pgdata / "standby.signal").exists()
    assert not pgdata.with_name("pgdata.restoring").exists()


def test_a_checksum_that_fails_after_the_whole_tar_was_read_puts_nothing_in_place(pgdata: Path) -> None:
    mismatch = ChecksumMismatch("k/base.tar.zst.000002", "ab" * 32, "cd" * 32, 4096)
    with pytest.raises(ChecksumMismatch, match=r"k/base.tar.zst.000002 is corrupted"):
        DRIVER.bootstrap(MANIFEST, source_of(compressed_tar(FILES), mismatch))
    assert not pgdata.exists()
    assert not pgdata.with_name("pgdata.restoring").exists()  # a retry finds the volume as it was


def test_a_stream_cut_short_puts_nothing_in_place(pgdata: Path) -> None:
    data = compressed_tar(FILES)
    with pytest.raises((tarfile.TarError, CommandFailed)):  # whichever sees the end first
        DRIVER.bootstrap(MANIFEST, source_of(data[: len(data) // 2]))
    assert not pgdata.exists()
    assert not pgdata.with_name("pgdata.restoring").exists()
