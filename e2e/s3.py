"""The test bed's S3 server, as tests and benchmarks reach it from the host."""

from __future__ import annotations

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
