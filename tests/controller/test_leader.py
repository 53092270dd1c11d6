"""Leader election against the real API server: one candidate leads, a killed leader is
replaced once its Lease expired (not before), a leader that stops cleanly hands over at once,
and a leader that lost its Lease learns it at its next renewal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.resources.coordination_v1 import Lease

from e2e.kube import kubeconfig_path
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace
from framework.kube.leader import LeaderElector, LeadershipLost, Timing

pytestmark = pytest.mark.controller

FAST = Timing(duration=3.0, renew_deadline=2.0, retry=0.25)


@pytest.fixture
def lease_namespace(kube: Client, deleted_namespaces: DeletedNamespaces) -> Iterator[str]:
    name = new_namespace(kube, namespace_prefix("u"), "leader")
    yield name
    deleted_namespaces.delete(name)


def client() -> AsyncClient:
    return AsyncClient(config=KubeConfig.from_file(str(kubeconfig_path())))


def test_one_leads_a_killed_leader_is_replaced_after_its_lease_expired(
    kube: Client, lease_namespace: str
) -> None:
    async def scenario() -> tuple[float, str]:
        async with client() as a_client, client() as b_client:
            a = LeaderElector(a_client, lease_namespace, "op", "a", FAST)
            b = LeaderElector(b_client, lease_namespace, "op", "b", FAST)
            await asyncio.wait_for(a.acquire(), 10)
            keeping = asyncio.create_task(a.keep())
            waiting = asyncio.create_task(b.acquire())
            await asyncio.sleep(3 * FAST.duration)  # a renews: b never gets in
            assert not waiting.done()
            assert kube.get(Lease, "op", namespace=lease_namespace).spec.holderIdentity == "a"
            keeping.cancel()  # a dies: no release, no renewal
            killed = time.monotonic()
            await asyncio.wait_for(waiting, 4 * FAST.duration)
            took = time.monotonic() - killed
            return took, kube.get(Lease, "op", namespace=lease_namespace).spec.holderIdentity

    took, holder = asyncio.run(scenario())
    assert holder == "b"
    # Not before the Lease's duration (less the retry since a's last renewal), and at b's next look after it.
    assert FAST.duration - FAST.retry - 0.2 <= took <= FAST.duration + 3 * FAST.retry, f"after {took:.2f} s"


def test_a_clean_stop_hands_over_at_once_and_a_deposed_leader_learns_it(
    kube: Client, lease_namespace: str
) -> None:
    async def scenario() -> float:
        async with client() as a_client, client() as b_client:
            a = LeaderElector(a_client, lease_namespace, "op", "a", FAST)
            b = LeaderElector(b_client, lease_namespace, "op", "b", FAST)
            await asyncio.wait_for(a.acquire(), 10)
            waiting = asyncio.create_task(b.acquire())
            await asyncio.sleep(FAST.retry * 2)
            await a.release()
            released = time.monotonic()
            await asyncio.wait_for(waiting, 2 * FAST.retry + 1)
            took = time.monotonic() - released
            # a believes it still leads (a stale leader): its next renewal finds b's name.
            a.leading = True
            with pytest.raises(LeadershipLost, match="held by b"):
                await asyncio.wait_for(a.keep(), 2 * FAST.duration)
            return took

    took = asyncio.run(scenario())
    assert took < 2 * FAST.retry + 0.5, f"handed over after {took:.2f} s"
    assert kube.get(Lease, "op", namespace=lease_namespace).spec.holderIdentity == "b"
