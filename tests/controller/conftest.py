"""The controller tier: the operator in this process, against the test bed's real API server
and etcd (the CRDs and their CEL rules, admission, the StatefulSet and garbage collectors),
with no pod ever started: every namespace has a quota of zero pods, as envtest has no kubelet
(the StatefulsetRollout's tests put their pods on kwok's simulated nodes instead).
What is checked here is what the operator writes to the API, in which order, with which
status; what needs a running server stays in e2e/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.models.core_v1 import ResourceQuotaSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ResourceQuota

from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace, worker_name
from e2e.operator_process import InProcessOperator


def prefix() -> str:
    """c<N>-: this worker's (the e2e tests' operators watch t<N>-*)."""
    return namespace_prefix("c")


@pytest.fixture(scope="session")
def operator(deleted_namespaces: DeletedNamespaces) -> Iterator[InProcessOperator]:
    running = InProcessOperator(
        namespaces=f"{prefix()}*", log_name=f"operator-controller-{worker_name()}.log"
    ).start()
    yield running
    try:
        deleted_namespaces.settle()  # their objects' finalizers are this operator's
    finally:
        running.stop()


def new_test_namespace(kube: Client, request: pytest.FixtureRequest, pods: bool = False) -> str:
    """This worker's namespace for the test; without `pods`, one where no pod can be created."""
    name = new_namespace(kube, prefix(), request.node.name)
    if not pods:
        quota = ResourceQuota(metadata=ObjectMeta(name="no-pods"), spec=ResourceQuotaSpec(hard={"pods": "0"}))
        kube.create(quota, namespace=name)
    return name


@pytest.fixture
def namespace(
    kube: Client,
    deleted_namespaces: DeletedNamespaces,
    operator: InProcessOperator,
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """A fresh namespace where no pod can be created, deleted afterwards."""
    name = new_test_namespace(kube, request)
    yield name
    deleted_namespaces.delete(name)


@pytest.fixture
def pods_namespace(
    kube: Client,
    deleted_namespaces: DeletedNamespaces,
    operator: InProcessOperator,
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """A fresh namespace whose pods may exist (they go to kwok's nodes), deleted afterwards."""
    name = new_test_namespace(kube, request, pods=True)
    yield name
    deleted_namespaces.delete(name)
