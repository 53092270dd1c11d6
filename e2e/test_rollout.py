"""StatefulsetRollout on the test bed with real pods on the real node: the operator killed
mid-step (SIGKILL) continues where it was, taking each pod down exactly once. The helpers here
serve tests/controller/test_rollout.py too, where the controller's steps, pauses, abort, undo,
rollback and analysis are checked with pods on kwok's simulated nodes."""

from __future__ import annotations

import subprocess
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Event, Pod
from lightkube.types import PatchType

from e2e.kube import client, get_or_none, statefleet, wait_until
from e2e.manifests import ON_KWOK, PAUSE_IMAGE, statefulset_rollout
from e2e.operator_process import OperatorProcess
from framework.rollout.controller import Rollout

pytestmark = pytest.mark.e2e

ISSUE_STEPS = [
    {"setPercent": 20},
    {"pause": {}},
    {"setPercent": 60},
    {"pause": {"duration": "30s"}},
    {"setPercent": 100},
]


# kwok keeps a pod from Ready for this long: a template whose pods never become available (kwok
# takes the smaller of the two as the delay, so both are set).
NEVER_READY = {
    "pod-ready.stage.kwok.x-k8s.io/delay": "1h",
    "pod-ready.stage.kwok.x-k8s.io/jitter-delay": "1h",
}


def pod_spec(version: str, crash: bool = False, kwok: bool = False) -> dict[str, Any]:
    """`version` in the pod's environment; on kwok's simulated nodes (no container runs: kwok
    plays the kubelet) or on the real node, where `crash` runs a binary that does not exist."""
    container: dict[str, Any] = {
        "name": "web",
        "image": PAUSE_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": "VERSION", "value": version}],
        # As a user's pod in a namespace that enforces PodSecurity `restricted` must be.
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if crash and not kwok:
        container["command"] = ["/no-such-binary"]
    return {
        "terminationGracePeriodSeconds": 1,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65535,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        **(ON_KWOK if kwok else {}),
    }


def rollout(
    version: str,
    steps: list[dict[str, Any]],
    replicas: int = 5,
    crash: bool = False,
    kwok: bool = False,
    **strategy: Any,
) -> dict[str, Any]:
    """The issue's example, with `version` in the pods' environment; `crash`: pods that never
    become available."""
    metadata: dict[str, Any] = {"labels": {"app": "web"}}
    if crash and kwok:
        metadata["annotations"] = NEVER_READY
    template = {"metadata": metadata, "spec": pod_spec(version, crash, kwok)}
    return statefulset_rollout(template, steps, replicas, **{"maxUnavailable": "100%", **strategy})


def cli(namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl statefleet rollout ...`, as a user runs it."""
    done = statefleet("rollout", *args, "web", "-n", namespace)
    assert done.returncode == 0, done.stderr
    return done


def with_notifications(body: dict[str, Any], notifications: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["notifications"] = notifications
    return body


def apply(kube: Client, namespace: str, body: dict[str, Any]) -> None:
    kube.apply(Rollout.from_dict(body), namespace=namespace, field_manager="user", force=True)


def patch(kube: Client, namespace: str, change: dict[str, Any]) -> None:
    kube.patch(Rollout, "web", {"spec": change}, namespace=namespace, patch_type=PatchType.MERGE)


def status(kube: Client, namespace: str) -> dict[str, Any]:
    return kube.get(Rollout, "web", namespace=namespace).to_dict().get("status") or {}


def versions(kube: Client, namespace: str, name: str = "web") -> list[str | None]:
    """The VERSION each pod runs, by ordinal; None for a pod that is missing or terminating."""
    replicas = kube.get(StatefulSet, name, namespace=namespace).spec.replicas
    found: list[str | None] = []
    for ordinal in range(replicas):
        pod = get_or_none(kube, Pod, f"{name}-{ordinal}", namespace)
        if pod is None or pod.metadata.deletionTimestamp:
            found.append(None)
            continue
        env = {e.name: e.value for e in pod.spec.containers[0].env or []}
        found.append(env.get("VERSION"))
    return found


def wait_phase(
    kube: Client, namespace: str, phase: str, timeout: float = 120, **fields: Any
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        current = status(kube, namespace)
        wanted = current.get("phase") == phase and all(current.get(k) == v for k, v in fields.items())
        return current if wanted else None

    return wait_until(f"rollout phase {phase} {fields}", reached, timeout)


def wait_versions(kube: Client, namespace: str, expected: list[str], timeout: float = 120) -> None:
    wait_until(f"pods at {expected}", lambda: versions(kube, namespace) == expected, timeout)


def event_reasons(kube: Client, namespace: str) -> list[str]:
    events = kube.list(Event, namespace=namespace, fields={"involvedObject.kind": "StatefulsetRollout"})
    return [
        e.reason for e in sorted(events, key=lambda e: (e.firstTimestamp or e.eventTime, e.metadata.name))
    ]


@pytest.fixture
def pod_incarnations(kube: Client, namespace: str) -> Iterator[dict[str, set[str]]]:
    """Every pod UID seen per pod name while the test runs (a watch in a thread)."""
    seen: dict[str, set[str]] = defaultdict(set)
    stop = threading.Event()

    def watch() -> None:
        watcher = client()  # its own connection
        while not stop.is_set():
            try:
                for _, pod in watcher.watch(
                    Pod, namespace=namespace, labels={"app": "web"}, server_timeout=2
                ):
                    seen[pod.metadata.name].add(pod.metadata.uid)
                    if stop.is_set():
                        return
            except Exception:  # the namespace goes away at the end
                if stop.is_set():
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    yield seen
    stop.set()
    thread.join(timeout=5)


def started(kube: Client, namespace: str, body: dict[str, Any]) -> None:
    apply(kube, namespace, body)
    wait_phase(kube, namespace, "Healthy", availableReplicas=body["spec"]["statefulSet"]["replicas"])


def test_the_operator_killed_mid_step_continues_where_it_was(
    kube: Client, namespace: str, operator: OperatorProcess, pod_incarnations: dict[str, set[str]]
) -> None:
    steps = [{"setPercent": 100}]
    body = rollout("1", steps, replicas=6, maxUnavailable=1, minReadySeconds=2)
    started(kube, namespace, body)
    apply(kube, namespace, rollout("2", steps, replicas=6, maxUnavailable=1, minReadySeconds=2))
    wait_until("two pods updated", lambda: versions(kube, namespace).count("2") >= 2, timeout=120)
    operator.kill()  # SIGKILL: no chance to tidy up
    operator.launch()
    wait_phase(kube, namespace, "Healthy", timeout=180, availableReplicas=6, updatedReplicas=6)
    assert versions(kube, namespace) == ["2"] * 6
    # Each pod was taken down exactly once: its first incarnation, then the updated one.
    assert {name: len(uids) for name, uids in pod_incarnations.items()} == {f"web-{i}": 2 for i in range(6)}
    # Events are posted after the status a wait saw.
    wait_until("its Event", lambda: "RolloutStarted" in event_reasons(kube, namespace), timeout=30)
    assert event_reasons(kube, namespace).count("RolloutStarted") == 1
