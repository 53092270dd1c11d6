"""Benchmark: N `Postgres` resources applied at once, their pods on kwok's simulated nodes.

Prints, for the operator and for a plain apply of the same rendered children (the API
server's own limit, measured in the same run): the time until every StatefulSet and child
exists and every status is written, the ratio of the two throughputs, the operator's API
requests per resource, and its resident memory at N and at a larger count.

    .venv/bin/python -m e2e.bench.postgres_fleet [--count 200] [--rss-count 500]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from datetime import UTC, datetime

from lightkube import AsyncClient, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

from e2e.kube import client, delete_namespace, kubeconfig_path
from e2e.manifests import ON_KWOK
from e2e.operator_process import OperatorProcess
from framework.instance_plan import plan
from framework.kube.api import bounded
from framework.kube.meta import MANAGER
from framework.plugin import Observed
from framework.rollout.controller import Rollout
from framework.rollout.plan import RolloutObserved, plan_rollout
from services.postgres import PLUGIN
from statefleet.plugins import load_catalog, load_plugins

Postgres = PLUGIN.resource()
CONCURRENCY = 32  # the same for both sides: what a `kubectl apply` of many files would do, in parallel

SPEC = {
    "version": "15",
    "instances": 1,
    "storage": {"size": "1Gi"},
    "podTemplate": ON_KWOK,
}


async def plain_apply(api: AsyncClient, namespace: str, count: int) -> float:
    """Applies what the operators would, without them: Secrets, children, the rollout's
    StatefulSet and status, then the resource's status."""
    catalog = load_catalog(load_plugins())
    started = time.perf_counter()

    async def one(index: int) -> None:
        name = f"pg-{index}"
        body = await api.create(
            Postgres.from_dict({"metadata": {"name": name, "namespace": namespace}, "spec": SPEC}),
            namespace=namespace,
        )
        observed = Observed(name=name, namespace=namespace, generation=1, spec=SPEC, status={})
        planned = plan(PLUGIN, observed, catalog, body.metadata.uid)
        for secret in planned.secrets_to_create:
            await api.create(codecs.from_dict(secret))
        for child in planned.children:
            applied = await api.apply(codecs.from_dict(child), field_manager=MANAGER, force=True)
            if child["kind"] == "StatefulsetRollout":
                # What the rollout controller writes for it: the StatefulSet and a status.
                first = plan_rollout(
                    RolloutObserved(
                        name=name,
                        namespace=namespace,
                        uid=applied.metadata.uid,
                        generation=1,
                        spec=child["spec"],
                        status={},
                        statefulset=None,
                        pods=[],
                        now=datetime.now(UTC),
                        labels=child["metadata"]["labels"],
                    )
                )
                assert first.statefulset is not None
                await api.apply(codecs.from_dict(first.statefulset), field_manager=MANAGER, force=True)
                await api.patch(
                    Rollout.Status,
                    name,
                    {"status": first.status},
                    namespace=namespace,
                    patch_type=PatchType.MERGE,
                )
        await api.patch(
            Postgres.Status, name, {"status": planned.status}, namespace=namespace, patch_type=PatchType.MERGE
        )

    await bounded([one(i) for i in range(count)], CONCURRENCY)
    return time.perf_counter() - started


async def operator_apply(api: AsyncClient, namespace: str, first: int, count: int) -> float:
    started = time.perf_counter()
    await bounded(
        [
            api.create(
                Postgres.from_dict({"metadata": {"name": f"pg-{i}", "namespace": namespace}, "spec": SPEC}),
                namespace=namespace,
            )
            for i in range(first, first + count)
        ],
        CONCURRENCY,
    )
    wanted = {f"pg-{i}" for i in range(first + count)}
    while True:
        done = {
            pg.metadata.name
            async for pg in api.list(Postgres, namespace=namespace)
            if (pg.to_dict().get("status") or {}).get("observedGeneration") == pg.metadata.generation
        }
        statefulsets = {sts.metadata.name async for sts in api.list(StatefulSet, namespace=namespace)}
        if wanted <= done and wanted <= statefulsets:
            return time.perf_counter() - started
        await asyncio.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--rss-count", type=int, default=500)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # figures show before the long cleanup ends
    kube = client()
    run = uuid.uuid4().hex[:5]
    plain_ns, operator_ns = f"bench-plain-{run}", f"bench-op-{run}"
    for namespace in (plain_ns, operator_ns):
        kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
    operator = OperatorProcess.start(namespaces="bench-op-*", log_name="operator-bench.log")
    try:

        async def measure() -> dict[str, float]:
            api = AsyncClient(config=KubeConfig.from_file(str(kubeconfig_path())), field_manager=MANAGER)
            figures = {"plain": await plain_apply(api, plain_ns, args.count)}
            idle_requests = operator.api_requests()
            figures["operator"] = await operator_apply(api, operator_ns, 0, args.count)
            figures["requests"] = (operator.api_requests() - idle_requests) / args.count
            figures["rss_count"] = operator.rss_bytes()
            await operator_apply(api, operator_ns, args.count, args.rss_count - args.count)
            await asyncio.sleep(5)
            figures["rss_more"] = operator.rss_bytes()
            await api.close()
            return figures

        figures = asyncio.run(measure())
        n, plain, through = args.count, figures["plain"], figures["operator"]
        mib = {key: figures[key] / 2**20 for key in ("rss_count", "rss_more")}
        print(f"Postgres resources applied at once: {n} (pods on kwok nodes), concurrency {CONCURRENCY}")
        print(f"  plain apply of the rendered children: {plain:.1f} s ({n / plain:.1f}/s)")
        print(f"  through the operator:                 {through:.1f} s ({n / through:.1f}/s)")
        print(f"  operator throughput / plain apply:    {plain / through:.2f}")
        print(f"  operator API requests per resource:   {figures['requests']:.1f}")
        rss = f"at {n}: {mib['rss_count']:.0f} MiB; at {args.rss_count}: {mib['rss_more']:.0f} MiB"
        print(f"  operator RSS {rss}")
    finally:
        operator.stop()
        for namespace in (plain_ns, operator_ns):
            delete_namespace(kube, namespace, wait=1800)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
