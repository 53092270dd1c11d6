"""Status writes that decide who serves carry a resourceVersion precondition: of two writers
acting on the same state (two operators, a stale leader), only the first decision lands."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from lightkube import AsyncClient, Client, KubeConfig

from e2e.kube import kubeconfig_path
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace
from e2e.test_postgres import Postgres, create
from framework.kube.runtime import StaleStatus, StatusWriter

pytestmark = pytest.mark.controller


@pytest.fixture
def unwatched(kube: Client, deleted_namespaces: DeletedNamespaces) -> Iterator[str]:
    """A namespace no operator watches: only the test's writers write there."""
    name = new_namespace(kube, namespace_prefix("u"), "status-writes")
    yield name
    deleted_namespaces.delete(name)


def test_a_decision_made_on_a_stale_read_is_refused(kube: Client, unwatched: str) -> None:
    create(kube, unwatched, "demo", {"storage": {"size": "1Gi"}})

    async def race() -> str:
        async with AsyncClient(config=KubeConfig.from_file(str(kubeconfig_path()))) as client:
            read = (await client.get(Postgres, "demo", namespace=unwatched)).to_dict()
            first, second = StatusWriter(client), StatusWriter(client)
            await first.write("k", Postgres, read, {}, {"currentPrimary": "demo-1"}, precondition=True)
            with pytest.raises(StaleStatus, match="changed since resourceVersion"):
                await second.write("k", Postgres, read, {}, {"currentPrimary": "demo-2"}, precondition=True)
            # Without the precondition (a write that decides nothing), the last one wins as before.
            await second.write("k", Postgres, read, {}, {"readyInstances": 0})
            return (await client.get(Postgres, "demo", namespace=unwatched)).to_dict()["status"][
                "currentPrimary"
            ]

    assert asyncio.run(race()) == "demo-1"
