"""Benchmark: rolling out a new template over a large StatefulSet on kwok's simulated nodes.

Pods become Ready a fixed delay after they are created (kwok stage annotations, no jitter).
Measured in the same run:
- native `RollingUpdate` (one pod at a time) on a smaller StatefulSet; its time per pod is
  what a StatefulSet of the full size would take pod after pod (it is strictly sequential),
  so it is extrapolated linearly, and printed as such;
- a `StatefulsetRollout` of the full size with steps 1%, 10%, 50%, 100% and maxUnavailable
  large enough for each step to be one batch: the total time, the floor (the sum over steps
  of the pod start delay), the operator's API writes per updated pod, its CPU seconds and
  peak RSS.

    .venv/bin/python -m e2e.bench.rollout_fleet [--replicas 1000] [--native-replicas 20] [--delay 5]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any

from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Namespace

from e2e.kube import client, delete_namespace, wait_until
from e2e.manifests import ON_KWOK, PAUSE_IMAGE, statefulset_rollout
from e2e.operator_process import OperatorProcess
from framework.kube.times import parse_time
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
            # Gone as soon as evicted. With a grace period kwok removes the pod itself, and
            # under a mass eviction its pending work on an old pod hits the namesake the
            # StatefulSet controller made (kwok keys by name): pods churn for minutes.
            "terminationGracePeriodSeconds": 0,
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
        # What this machine's control plane adds whatever the controller: it made the first
        # `replicas` pods at `rate` a second; each step's batch takes batch / rate on top.
        rate = args.replicas / max(creation - args.delay, 0.1)
        counts = [round(args.replicas * step["setPercent"] / 100) for step in STEPS]
        batches = [now - before for before, now in zip([0, *counts], counts, strict=False)]
        cluster_floor = sum(args.delay + batch / rate for batch in batches)
        print(
            f"  cluster floor (the start delay plus each batch at the {rate:.0f} pods/s the control "
            f"plane created pods at above): {cluster_floor:.1f} s; "
            f"total / cluster floor: {took / cluster_floor:.2f}"
        )
        history = kube.get(Rollout, "web", namespace=namespace).to_dict()["status"]["history"]
        for entry in history:
            spent = (parse_time(entry["finishedAt"]) - parse_time(entry["startedAt"])).total_seconds()
            print(f"    step {entry['step']} ({entry['description']}): {entry['pods']} in {spent:.0f} s")
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
