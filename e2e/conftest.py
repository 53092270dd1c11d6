"""Fixtures for tests that run on a real cluster: the test bed, or KUBECONFIG's.

The e2e tests run in parallel pytest-xdist workers. Worker N has namespaces of its own
(`t<N>-...`) and an operator of its own that watches only those, so the waits of one test
overlap the work of another and no two operators ever act on one object."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lightkube import Client

from e2e import cert_manager
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace, worker_index, worker_name
from e2e.operator_process import OperatorProcess
from e2e.s3 import new_bucket


@pytest.fixture
def namespace(
    kube: Client, deleted_namespaces: DeletedNamespaces, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards with everything in it."""
    name = new_namespace(kube, namespace_prefix(), request.node.name)
    yield name
    deleted_namespaces.delete(name)


@pytest.fixture(scope="session")
def operator(kube: Client, deleted_namespaces: DeletedNamespaces) -> Iterator[OperatorProcess]:
    """The operator, run from this checkout on the host against the cluster, as a developer
    would: this worker's own, for this worker's namespaces only."""
    # Left by a killed run, it would take over every new instance's certificates (each
    # worker waits for the CRDs to go before its operator starts; a no-op when they are gone).
    cert_manager.uninstall()
    process = OperatorProcess.start(
        namespaces=f"{namespace_prefix()}*",
        log_name=f"operator-e2e-{worker_name()}.log",
        port_offset=worker_index(),
    )
    yield process
    # The finalizers of the deleted namespaces' objects (backups, users) are this operator's.
    try:
        deleted_namespaces.settle()
    finally:
        process.stop()


@pytest.fixture
def bucket() -> Iterator[str]:
    """A bucket of its own per test, emptied and removed afterwards."""
    with new_bucket() as name:
        yield name
