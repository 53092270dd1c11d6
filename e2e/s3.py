"""The test bed's S3 server, as tests and benchmarks reach it from the host."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import boto3

from e2e.kube import REPO


def s3_settings() -> dict[str, str]:
    lines = (REPO / ".testbed" / "s3.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def s3_api(settings: dict[str, str], secret: str | None = None) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=settings["S3_ENDPOINT"],
        aws_access_key_id=settings["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=secret or settings["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )


@contextmanager
def new_bucket() -> Iterator[str]:
    """A bucket of its own, emptied and removed afterwards."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    api = s3_api(s3_settings())
    api.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        for page in api.get_paginator("list_objects_v2").paginate(Bucket=name):
            for item in page.get("Contents", []):
                api.delete_object(Bucket=name, Key=item["Key"])
        api.delete_bucket(Bucket=name)


def keys_under(bucket: str, prefix: str) -> list[str]:
    api = s3_api(s3_settings())
    pages = api.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _admin(*args: str) -> None:
    """The S3 server's admin API, through its own command (the test bed's build of it)."""
    version = re.search(r"^S3_VERSION=(\S+)", (REPO / "testbed" / "lib.sh").read_text(), re.M)
    assert version, "testbed/lib.sh names no S3_VERSION"
    cache = Path(os.environ.get("STATEFLEET_CACHE") or Path.home() / ".cache" / "statefleet")
    settings = s3_settings()
    subprocess.run(
        [
            str(cache / "bin" / f"versitygw-v{version[1]}" / "versitygw"),
            "admin",
            "--access",
            settings["AWS_ACCESS_KEY_ID"],
            "--secret",
            settings["AWS_SECRET_ACCESS_KEY"],
            "--endpoint-url",
            settings["S3_ENDPOINT"],
            *args,
        ],
        check=True,
        capture_output=True,
    )


def create_keys() -> tuple[str, str]:
    """Keys of a new user of the S3 server, allowed every bucket (as a storage's keys are)."""
    access, secret = f"t{uuid.uuid4().hex[:15]}", secrets.token_hex(20)
    _admin("create-user", "--access", access, "--secret", secret, "--role", "admin")
    return access, secret


def revoke_keys(access: str) -> None:
    """The user deleted: the server refuses its keys from the next request on."""
    with suppress(subprocess.CalledProcessError):  # revoked already
        _admin("delete-user", "--access", access)
