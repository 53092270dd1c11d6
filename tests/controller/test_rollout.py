"""StatefulsetRollout, its controller alone: steps, pauses, notifications, the version leak
(and the native OnDelete contrast), abort, undo, automatic rollback, analysis. The pods go to
kwok's simulated nodes (kwok plays their kubelet, no container runs): the controller sees pods
created, Ready and deleted as it would on any node. e2e/test_rollout.py kills the operator
mid-step with real pods; the services' rollouts (e2e) roll real servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Pod, Secret

from e2e import test_rollout as e2e
from e2e.kube import REPO, get_or_none, kubeconfig_path, wait_until
from e2e.manifests import statefulset
from e2e.receiver import receiving
from e2e.test_rollout import (
    ISSUE_STEPS,
    apply,
    cli,
    event_reasons,
    patch,
    pod_spec,
    started,
    status,
    versions,
    wait_phase,
    wait_versions,
    with_notifications,
)

pytestmark = pytest.mark.controller


@pytest.fixture
def namespace(pods_namespace: str) -> str:
    """A namespace whose pods go to kwok's nodes (overrides the one that allows no pod)."""
    return pods_namespace


def rollout(version: str, steps: list[dict[str, Any]], replicas: int = 5, **strategy: Any) -> dict[str, Any]:
    return e2e.rollout(version, steps, replicas, kwok=True, **strategy)


def test_the_issue_example_rolls_out_in_steps_and_notifies(kube: Client, namespace: str) -> None:
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


def test_no_version_leak_where_on_delete_leaks(kube: Client, namespace: str) -> None:
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
    native = statefulset("native", 5, pod_spec("1", kwok=True), updateStrategy={"type": "OnDelete"})
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


def test_abort_then_undo(kube: Client, namespace: str) -> None:
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


def test_a_crashing_template_is_rolled_back(kube: Client, namespace: str) -> None:
    steps = [{"setPercent": 40}, {"setPercent": 100}]
    started(kube, namespace, rollout("1", steps, maxUnavailable=1))
    apply(
        kube,
        namespace,
        rollout("2", steps, maxUnavailable=1, progressDeadlineSeconds=15, crash=True),
    )
    aborted = wait_phase(kube, namespace, "Aborted", timeout=120, availableReplicas=5)
    assert aborted["message"].startswith("ProgressDeadlineExceeded: web-4 not available within 15s")
    assert versions(kube, namespace) == ["1"] * 5
    reasons = event_reasons(kube, namespace)
    assert reasons.count("RolloutAborted") == 1
    assert "RolledBack" in reasons


def test_analysis_failing_rolls_back_and_passing_goes_on(kube: Client, namespace: str) -> None:
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
