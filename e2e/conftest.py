"""Fixtures for tests that run on a real cluster: the test bed, or KUBECONFIG's."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from e2e import cert_manager
from e2e import kube as kube_helpers
from e2e.operator_process import OperatorProcess
from e2e.s3 import s3_api, s3_settings


@pytest.fixture(scope="session")
def kube() -> Client:
    return kube_helpers.client()


@pytest.fixture
def namespace(kube: Client, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards with everything in it."""
    readable = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"t-{readable}-{uuid.uuid4().hex[:5]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name, labels={"statefleet.dev/test": "true"})))
    yield name
    kube_helpers.delete_namespace(kube, name, wait=180)


@pytest.fixture(scope="session")
def operator(kube: Client) -> Iterator[OperatorProcess]:
    """The operator, run from this checkout on the host against the cluster, as a developer would."""
    cert_manager.uninstall()  # left by a killed run, it would take over every new instance's certificates
    process = OperatorProcess.start()
    yield process
    process.stop()


@pytest.fixture
def bucket() -> Iterator[str]:
    """A bucket of its own per test, emptied and removed afterwards."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    api = s3_api(s3_settings())
    api.create_bucket(Bucket=name)
    yield name
    for page in api.get_paginator("list_objects_v2").paginate(Bucket=name):
        for item in page.get("Contents", []):
            api.delete_object(Bucket=name, Key=item["Key"])
    api.delete_bucket(Bucket=name)
