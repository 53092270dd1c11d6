"""Benchmark: rolling out a new template over a large StatefulSet on kwok's simulated nodes.

Pods become Ready a fixed delay after they are created (kwok stage annotations, no jitter).
Measured in the same run:
- native `RollingUpdate` (one pod at a time) on a smaller StatefulSet; its time per pod is
  what a StatefulSet of the full size would take pod after pod (it is strictly sequential),
  so it is extrapolated linearly, and printed as such;
- the cluster floor: the same steps on a plain StatefulSet of the full size, driven by this
  script (partition moved, the batch evicted at once), without the controller: what the
  API server, scheduler, StatefulSet controller and kwok on these two cores allow;
- a `StatefulsetRollout` of the full size with steps 1%, 10%, 50%, 100% and maxUnavailable
  large enough for each step to be one batch: the total time, the floor (the sum over steps
  of the pod start delay), the operator's API writes per updated pod, its CPU seconds and
  peak RSS.

    .venv/bin/python -m e2e.bench.rollout_fleet [--replicas 1000] [--native-replicas 20] [--delay 5]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import sys
import time
import uuid
from typing import Any

from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Namespace, Pod

from e2e.kube import client, delete_namespace, kubeconfig_path, wait_until
from e2e.manifests import ON_KWOK, PAUSE_IMAGE, statefulset_rollout
from e2e.operator_process import OperatorProcess
from framework.api import bounded
from framework.rollout.controller import Rollout

STEPS = [{"setPercent": 1}, {"setPercent": 10}, {"setPercent": 50}, {"setPercent": 100}]
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def template(version: str, delay: float) -> dict[str, Any]:
    stage = "stage.kwok.x-k8s.io"
    return {
        "metadata": {
            "labels": {"app": "web"},
            "annotations": {
                f"pod-create.{stage}/delay": "0s",
                f"pod-create.{stage}/jitter-delay": "0s",
                # kwok waits a random time between delay and jitter-delay: the same, for a fixed delay
                f"pod-ready.{stage}/delay": f"{delay:g}s",
                f"pod-ready.{stage}/jitter-delay": f"{delay:g}s",
                f"pod-delete.{stage}/delay": "0s",
                f"pod-delete.{stage}/jitter-delay": "0s",
            },
        },
        "spec": {
            **ON_KWOK,
            # kwok removes a deleted pod by its deletionTimestamp (within a second here); a
            # grace period of 0 deletes the pod at once, behind kwok's back, and kwok's
            # pending work on the old pod then hits its namesake: endless churn
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "web", "image": PAUSE_IMAGE, "env": [{"name": "VERSION", "value": version}]}
            ],
        },
    }


def native_rollout(kube: Client, namespace: str, replicas: int, delay: float) -> float:
    """Seconds for native RollingUpdate to replace every pod of a `replicas` StatefulSet."""
    body = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "native"},
        "spec": {
            "replicas": replicas,
            "serviceName": "native",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "web"}},
            "template": template("1", delay),
        },
    }
    kube.apply(StatefulSet.from_dict(body), namespace=namespace, field_manager="bench")

    def ready_at(version_seen: bool) -> bool:
        sts = kube.get(StatefulSet, "native", namespace=namespace)
        status = sts.status
        done = (
            status.observedGeneration == sts.metadata.generation
            and (status.readyReplicas or 0) == replicas
            and (status.updatedReplicas or 0) == replicas
            and status.currentRevision == status.updateRevision
        )
        return done and version_seen

    wait_until("native StatefulSet Ready", lambda: ready_at(True), timeout=600)
    body["spec"]["template"] = template("2", delay)
    started = time.perf_counter()
    kube.apply(StatefulSet.from_dict(body), namespace=namespace, field_manager="bench")
    time.sleep(1)
    wait_until("native rollout done", lambda: ready_at(True), timeout=3600, interval=1)
    return time.perf_counter() - started


def batches(replicas: int) -> list[int]:
    """The pods each step updates (1%, 10%, 50%, 100% of `replicas`, as the planner counts)."""
    targets = [math.ceil(step["setPercent"] * replicas / 100) for step in STEPS]
    return [later - earlier for earlier, later in itertools.pairwise([0, *targets])]


def cluster_floor(kube: Client, namespace: str, replicas: int, delay: float) -> list[float]:
    """The same mechanism without the controller, driven by this script: a plain StatefulSet
    of the same size gets the new template with partition = replicas, then for each step the
    partition moves down by the batch and the batch's pods are evicted at once (16 requests
    in flight), until they run the new template and are Ready. The API server, the
    StatefulSet controller, the scheduler and kwok on these two cores set this time."""

    def body(version: str, partition: int) -> dict[str, Any]:
        pods = template(version, delay)
        pods["metadata"]["labels"] = {"app": "floor"}
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "floor"},
            "spec": {
                "replicas": replicas,
                "serviceName": "floor",
                "podManagementPolicy": "Parallel",
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}},
                "selector": {"matchLabels": {"app": "floor"}},
                "template": pods,
            },
        }

    def status() -> Any:
        sts = kube.get(StatefulSet, "floor", namespace=namespace)
        return sts.status if sts.status.observedGeneration == sts.metadata.generation else None

    kube.apply(StatefulSet.from_dict(body("1", 0)), namespace=namespace, field_manager="bench")
    wait_until(
        "the floor StatefulSet Ready", lambda: (s := status()) and s.readyReplicas == replicas, 1200, 1
    )
    kube.apply(StatefulSet.from_dict(body("2", replicas)), namespace=namespace, field_manager="bench")
    wait_until("the new template seen", status, 60, 0.2)
    times, released = [], replicas
    for batch in batches(replicas):
        started = time.perf_counter()
        partition = released - batch
        kube.apply(StatefulSet.from_dict(body("2", partition)), namespace=namespace, field_manager="bench")
        wait_until("the partition seen", status, 60, 0.1)

        async def evict_all(first: int = partition, last: int = released) -> None:
            api = AsyncClient(config=KubeConfig.from_file(str(kubeconfig_path())))
            names = [f"floor-{o}" for o in range(first, last)]
            await bounded(
                [
                    api.create(
                        Pod.Eviction(metadata=ObjectMeta(name=n, namespace=namespace)),
                        name=n,
                        namespace=namespace,
                    )
                    for n in names
                ]
            )
            await api.close()

        asyncio.run(evict_all())
        updated = replicas - partition

        def step_done(updated: int = updated) -> bool:
            current = status()
            return bool(current) and current.updatedReplicas == updated and current.readyReplicas == replicas

        wait_until(f"{batch} pods updated and Ready", step_done, timeout=1200, interval=0.5)
        times.append(time.perf_counter() - started)
        released = partition
    kube.delete(StatefulSet, "floor", namespace=namespace)
    return times


def rollout_body(replicas: int, version: str, delay: float) -> dict[str, Any]:
    return statefulset_rollout(template(version, delay), STEPS, replicas, maxUnavailable="50%")


def healthy(kube: Client, namespace: str, replicas: int, old_template: str = "") -> dict[str, Any] | None:
    """The rollout's status once every replica is available on a template other than `old_template`."""
    body = kube.get(Rollout, "web", namespace=namespace).to_dict()
    status = body.get("status") or {}
    done = (
        status.get("observedGeneration") == body["metadata"]["generation"]
        and status.get("phase") == "Healthy"
        and status.get("availableReplicas") == replicas
        and status.get("updatedReplicas") == replicas
        and status.get("stableTemplateHash") != old_template
    )
    return status if done else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--native-replicas", type=int, default=20)
    parser.add_argument("--delay", type=float, default=5.0, help="seconds from a pod's creation to Ready")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    kube = client()
    namespace = f"bench-rollout-{uuid.uuid4().hex[:5]}"
    kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
    operator = OperatorProcess.start(namespaces="bench-rollout-*", log_name="operator-bench-rollout.log")
    try:
        native = native_rollout(kube, namespace, args.native_replicas, args.delay)
        per_pod = native / args.native_replicas
        print(
            f"native RollingUpdate, {args.native_replicas} replicas: {native:.1f} s ({per_pod:.2f} s a pod)"
        )
        extrapolated = per_pod * args.replicas
        print(f"  extrapolated to {args.replicas} replicas (sequential): {extrapolated:.0f} s")

        floors = cluster_floor(kube, namespace, args.replicas, args.delay)
        done = ", ".join(f"{n} pods {t:.1f} s" for n, t in zip(batches(args.replicas), floors, strict=True))
        print(f"cluster floor, the same steps on a plain StatefulSet driven by this script: {done}")

        def floor_gone() -> bool:
            return not list(kube.list(Pod, namespace=namespace, labels={"app": "floor"}))

        wait_until("the floor's pods gone", floor_gone, timeout=1200, interval=2)

        kube.apply(
            Rollout.from_dict(rollout_body(args.replicas, "1", args.delay)),
            namespace=namespace,
            field_manager="bench",
        )
        created = time.perf_counter()
        wait_until(
            "the rollout's pods Ready",
            lambda: healthy(kube, namespace, args.replicas),
            timeout=1200,
            interval=1,
        )
        creation = time.perf_counter() - created
        print(f"StatefulsetRollout created with {args.replicas} Ready pods in {creation:.1f} s")

        writes, cpu = operator.api_requests(WRITES), operator.cpu_seconds()
        before = kube.get(Rollout, "web", namespace=namespace).to_dict()["status"]["stableTemplateHash"]
        kube.apply(
            Rollout.from_dict(rollout_body(args.replicas, "2", args.delay)),
            namespace=namespace,
            field_manager="bench",
        )
        started = time.perf_counter()
        wait_until(
            "the rollout done",
            lambda: healthy(kube, namespace, args.replicas, before),
            timeout=3600,
            interval=0.5,
        )
        took = time.perf_counter() - started
        floor = len(STEPS) * args.delay
        written = operator.api_requests(WRITES) - writes
        shape = "steps 1/10/50/100%, maxUnavailable 50%"
        print(f"StatefulsetRollout, {args.replicas} replicas, {shape}: {took:.1f} s")
        print(f"  floor (sum over steps of the {args.delay:g} s start delay): {floor:.0f} s")
        print(f"  total / floor: {took / floor:.2f}")
        measured = sum(floors)
        print(
            f"  cluster floor (measured above, summed): {measured:.1f} s; total / it: {took / measured:.2f}"
        )
        print(f"  speed-up over native (extrapolated): {extrapolated / took:.1f}x")
        print(f"  operator API writes per updated pod: {written / args.replicas:.2f} ({written} writes)")
        print(f"  operator CPU during the rollout: {operator.cpu_seconds() - cpu:.1f} s")
        print(f"  operator peak RSS: {operator.rss_bytes('VmHWM') / 2**20:.0f} MiB")
    finally:
        operator.stop()
        delete_namespace(kube, namespace, wait=1800)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
