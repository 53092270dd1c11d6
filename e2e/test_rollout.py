"""StatefulsetRollout on the test bed, with real pods on the real node: steps, pauses, the
version leak (and the native OnDelete contrast), abort, undo, automatic rollback, the
operator killed mid-step, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Event, Pod, Secret
from lightkube.types import PatchType

from e2e.kube import REPO, client, get_or_none, kubeconfig_path, statefleet, wait_until
from e2e.manifests import PAUSE_IMAGE, statefulset, statefulset_rollout
from e2e.operator_process import OperatorProcess
from e2e.receiver import receiving
from framework.rollout.controller import Rollout

pytestmark = pytest.mark.e2e

ISSUE_STEPS = [
    {"setPercent": 20},
    {"pause": {}},
    {"setPercent": 60},
    {"pause": {"duration": "30s"}},
    {"setPercent": 100},
]


def pod_spec(version: str, crash: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "web",
        "image": PAUSE_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": "VERSION", "value": version}],
    }
    if crash:
        container["command"] = ["/no-such-binary"]
    return {"terminationGracePeriodSeconds": 1, "containers": [container]}


def rollout(version: str, steps: list[dict[str, Any]], replicas: int = 5, **strategy: Any) -> dict[str, Any]:
    """The issue's example, with `version` in the pods' environment."""
    template = {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec(version, **strategy.pop("pod", {}))}
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


def test_the_issue_example_rolls_out_in_steps_and_notifies(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    with receiving() as (base, received):
        # The Slack webhook URL lives in a Secret; the release system's hook is a plain URL.
        kube.create(
            Secret(metadata=ObjectMeta(name="slack"), stringData={"url": f"{base}/slack"}),
            namespace=namespace,
        )
        notifications = {
            "slack": [{"webhookSecret": {"name": "slack"}, "channel": "#deploys"}],
            "webhooks": [{"url": f"{base}/release"}],
        }
        started(kube, namespace, with_notifications(rollout("1", ISSUE_STEPS), notifications))
        apply(kube, namespace, with_notifications(rollout("2", ISSUE_STEPS), notifications))
        paused = wait_phase(kube, namespace, "Paused", currentStepIndex=1)
        assert paused["message"] == "paused at step 1 until promoted"
        assert versions(kube, namespace) == ["1", "1", "1", "1", "2"]  # 20%: the highest ordinal
        assert paused["updatedReplicas"] == 1

        assert cli(namespace, "promote").stdout == "statefulsetrollout/web promoted past step 1\n"
        timed = wait_phase(kube, namespace, "Paused", currentStepIndex=3)
        assert timed["message"] == "paused at step 3 for 30s"
        assert versions(kube, namespace) == ["1", "1", "2", "2", "2"]

        done = wait_phase(kube, namespace, "Healthy", timeout=90, availableReplicas=5, updatedReplicas=5)
        wait_until("the last notifications", lambda: len(received) >= 2 * 9, timeout=30)

    assert versions(kube, namespace) == ["2"] * 5
    assert [h["description"] for h in done["history"]] == [
        "setPercent 20",
        "pause until promoted",
        "setPercent 60",
        "pause 30s",
        "setPercent 100",
    ]
    assert [h.get("pods") for h in done["history"]] == [
        "web-4",
        None,
        "web-2..web-3 (2 pods)",
        None,
        "web-0..web-1 (2 pods)",
    ]
    sts = kube.get(StatefulSet, "web", namespace=namespace)
    assert sts.status.currentRevision == sts.status.updateRevision
    assert sts.metadata.ownerReferences[0].kind == "StatefulsetRollout"
    reasons = event_reasons(kube, namespace)
    assert reasons.count("RolloutStarted") == 1
    assert reasons.count("StepCompleted") == 5
    assert reasons.count("RolloutCompleted") == 1

    # Every transition reached both ends once, in order, Slack in Block Kit.
    release = [r.body for r in received if r.path == "/release"]
    slack = [r.body for r in received if r.path == "/slack"]
    events = ["started", "step", "paused", "step", "step", "paused", "step", "step", "succeeded"]
    assert [(b["event"], b["step"]) for b in release] == list(
        zip(events, [0, 0, 1, 1, 2, 3, 3, 4, None], strict=True)
    )
    assert len(slack) == len(release)
    assert all(m["channel"] == "#deploys" and m["blocks"][0]["type"] == "header" for m in slack)
    assert slack[1]["blocks"][-1]["elements"][0]["text"] == "Pods: web-4"
    assert slack[-1]["blocks"][0]["text"]["text"] == f"✅ {namespace}/web: rollout succeeded"

    # kubectl finds the plugin (the kubectl-statefleet script) on PATH.
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig_path()),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    shown = subprocess.run(
        [
            str(REPO / ".testbed" / "bin" / "kubectl"),
            "statefleet",
            "rollout",
            "status",
            "web",
            "-n",
            namespace,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert shown.splitlines()[0] == f"StatefulsetRollout {namespace}/web: Healthy"

    # Scaling alone starts no rollout: the new pod runs the current template.
    patch(kube, namespace, {"statefulSet": {"replicas": 6}})
    wait_phase(kube, namespace, "Healthy", availableReplicas=6)
    assert versions(kube, namespace) == ["2"] * 6
    assert event_reasons(kube, namespace).count("RolloutStarted") == 1


def test_no_version_leak_where_on_delete_leaks(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    steps = [{"setPercent": 40}, {"pause": {}}]
    started(kube, namespace, rollout("1", steps))
    apply(kube, namespace, rollout("2", steps))
    wait_phase(kube, namespace, "Paused", currentStepIndex=1)
    assert versions(kube, namespace) == ["1", "1", "1", "2", "2"]

    # A pod not yet due dies for another reason: it comes back at the stable revision.
    old = kube.get(Pod, "web-1", namespace=namespace).metadata.uid
    kube.delete(Pod, "web-1", namespace=namespace)
    wait_until(
        "web-1 replaced",
        lambda: (pod := get_or_none(kube, Pod, "web-1", namespace)) and pod.metadata.uid != old,
        timeout=60,
    )
    wait_versions(kube, namespace, ["1", "1", "1", "2", "2"])
    assert status(kube, namespace)["phase"] == "Paused"

    # The same scenario with the OnDelete strategy an operator would drive: the pod leaks.
    native = statefulset("native", 5, pod_spec("1"), updateStrategy={"type": "OnDelete"})
    native["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    kube.apply(StatefulSet.from_dict(native), namespace=namespace, field_manager="user")
    wait_until(
        "native Ready",
        lambda: kube.get(StatefulSet, "native", namespace=namespace).status.readyReplicas == 5,
        120,
    )
    native["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "2"
    kube.apply(StatefulSet.from_dict(native), namespace=namespace, field_manager="user")
    for ordinal in (3, 4):  # the operator's 40%: it deletes the two highest pods
        kube.delete(Pod, f"native-{ordinal}", namespace=namespace)
    wait_until(
        "native 40% updated",
        lambda: versions(kube, namespace, "native")[3:] == ["2", "2"],
        timeout=60,
    )
    kube.delete(Pod, "native-1", namespace=namespace)  # paused; a pod not yet due dies
    wait_until("native-1 back", lambda: versions(kube, namespace, "native")[1] is not None, timeout=60)
    assert versions(kube, namespace, "native") == ["1", "2", "1", "2", "2"]  # leaked to version 2


def test_abort_then_undo(kube: Client, namespace: str, operator: OperatorProcess) -> None:
    steps = [{"setPercent": 60}, {"pause": {}}]
    started(kube, namespace, rollout("1", steps))
    apply(kube, namespace, rollout("2", steps))
    wait_phase(kube, namespace, "Paused", currentStepIndex=1)
    assert versions(kube, namespace) == ["1", "1", "2", "2", "2"]

    # Abort: back to the stable revision, every updated pod at once.
    cli(namespace, "abort")
    aborted = wait_phase(kube, namespace, "Aborted", availableReplicas=5)
    assert aborted["message"] == "Aborted on request; 5 of 5 available on the stable revision"
    assert versions(kube, namespace) == ["1"] * 5
    assert "RolledBack" in event_reasons(kube, namespace)

    # Withdraw the abort, finish at once, then undo: version 1's template is rolled out again.
    cli(namespace, "abort", "--withdraw")
    wait_phase(kube, namespace, "Paused", currentStepIndex=1)
    cli(namespace, "promote", "--full")
    watched = cli(namespace, "status", "--watch", "--timeout", "120")
    assert "[##############################] 5/5" in watched.stdout
    wait_phase(kube, namespace, "Healthy", availableReplicas=5, updatedReplicas=5)
    assert versions(kube, namespace) == ["2"] * 5
    assert cli(namespace, "undo").stdout.startswith("statefulsetrollout/web rolling back to revision ")
    wait_phase(kube, namespace, "Paused", currentStepIndex=1)  # an earlier template is a new rollout
    assert versions(kube, namespace) == ["2", "2", "1", "1", "1"]
    cli(namespace, "resume")
    wait_phase(kube, namespace, "Healthy", availableReplicas=5, updatedReplicas=5)
    assert versions(kube, namespace) == ["1"] * 5


def test_a_crashing_template_is_rolled_back(kube: Client, namespace: str, operator: OperatorProcess) -> None:
    steps = [{"setPercent": 40}, {"setPercent": 100}]
    started(kube, namespace, rollout("1", steps, maxUnavailable=1))
    apply(
        kube,
        namespace,
        rollout("2", steps, maxUnavailable=1, progressDeadlineSeconds=15, pod={"crash": True}),
    )
    aborted = wait_phase(kube, namespace, "Aborted", timeout=120, availableReplicas=5)
    assert aborted["message"].startswith("ProgressDeadlineExceeded: web-4 not available within 15s")
    assert versions(kube, namespace) == ["1"] * 5
    reasons = event_reasons(kube, namespace)
    assert reasons.count("RolloutAborted") == 1
    assert "RolledBack" in reasons


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
    assert event_reasons(kube, namespace).count("RolloutStarted") == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"strategy": {"steps": []}},
            "spec.strategy.steps: Invalid value: 0: spec.strategy.steps in body should have at least 1 items",
        ),
        (
            {"strategy": {"steps": [{"setPercent": 120}]}},
            "spec.strategy.steps[0].setPercent: Invalid value: 120",
        ),
        (
            {"statefulSet": {"selector": {"matchLabels": {"app": "other"}}}},
            "spec.statefulSet: Invalid value: selector.matchLabels must match template.metadata.labels",
        ),
        (
            {"strategy": {"steps": [{"setPercent": 10, "pause": {}}]}},
            "a step sets exactly one of setPercent, setCount, pause",
        ),
    ],
)
def test_bad_input_is_refused_at_admission(
    kube: Client, namespace: str, operator: OperatorProcess, change: dict[str, Any], message: str
) -> None:
    body = rollout("1", ISSUE_STEPS)
    for part, value in change.items():
        body["spec"][part] = {**body["spec"][part], **value}
    with pytest.raises(ApiError) as refused:
        kube.create(Rollout.from_dict(body), namespace=namespace)
    assert refused.value.status.code == 422
    assert message in refused.value.status.message


def test_analysis_failing_rolls_back_and_passing_goes_on(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    with receiving(failing=frozenset({"/sick"})) as (base, received):

        def steps(check: str) -> list[dict[str, Any]]:
            analysis = {"http": {"url": f"{base}/{check}?pod=web"}, "interval": "2s", "count": 2}
            return [{"setPercent": 40}, {"analysis": analysis}, {"setPercent": 100}]

        started(kube, namespace, rollout("1", steps("sick")))
        apply(kube, namespace, rollout("2", steps("sick")))
        aborted = wait_phase(kube, namespace, "Aborted", timeout=120, availableReplicas=5)
        assert aborted["message"].startswith(f"AnalysisFailed at step 1: GET {base}/sick: HTTP 503")
        assert versions(kube, namespace) == ["1"] * 5

        apply(kube, namespace, rollout("3", steps("healthy")))
        done = wait_phase(kube, namespace, "Healthy", timeout=120, availableReplicas=5, updatedReplicas=5)
        assert versions(kube, namespace) == ["3"] * 5
    assert done["history"][1]["description"] == "analysis http"
    assert [r.path for r in received if r.path.startswith("/healthy")] == ["/healthy?pod=web"] * 2
