"""The StatefulsetRollout planner, driven against a small model of the StatefulSet controller.

`Cluster` does what Kubernetes does with the plan's output: it applies the StatefulSet
(template and partition), recreates a pod that went down on the side of the partition it
belongs to (the StatefulSet controller's rule), and makes new pods Ready after a delay.
The tests assert what a user would check: which revision each pod runs, how many pods were
down at once, which Events were posted, and what status says.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from framework.kube.times import format_time
from framework.rollout import analysis
from framework.rollout.plan import (
    ROLLOUT_LABEL,
    RolloutObserved,
    RolloutPlan,
    plan_rollout,
    pod_template,
    template_hash,
)
from framework.rollout.spec import RolloutSpec, check_condition

pytestmark = pytest.mark.unit

START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def spec(image: str = "web:1", replicas: int = 5, steps: list[dict] | None = None, **strategy: Any) -> dict:
    return {
        "statefulSet": {
            "replicas": replicas,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image}]},
            },
        },
        "strategy": {
            "maxUnavailable": "100%",
            "steps": steps
            if steps is not None
            else [
                {"setPercent": 20},
                {"pause": {}},
                {"setPercent": 60},
                {"pause": {"duration": "30s"}},
                {"setPercent": 100},
            ],
            **strategy,
        },
    }


@dataclass
class Pod:
    revision: str
    ready_at: datetime | None
    deleting: bool = False
    stuck: str = ""


@dataclass
class Cluster:
    """The StatefulSet controller, reduced to what a rollout relies on."""

    now: datetime = START
    start_delay: timedelta = timedelta(seconds=2)
    statefulset: dict[str, Any] | None = None
    revisions: dict[str, str] = field(default_factory=dict)  # template hash -> revision name
    current: str = ""
    update: str = ""
    pods: dict[int, Pod] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    taken_down: list[str] = field(default_factory=list)
    most_down: int = 0
    bad_images: set[str] = field(default_factory=set)
    analysis_passes: bool = True
    measurements: int = 0

    def revision_of(self, template: dict[str, Any]) -> str:
        key = template_hash(template)
        return self.revisions.setdefault(key, f"web-rev{len(self.revisions) + 1}")

    def template_of(self, revision: str) -> dict[str, Any]:
        return self._templates[revision]

    def apply(self, statefulset: dict[str, Any]) -> None:
        self.statefulset = copy.deepcopy(statefulset)
        template = statefulset["spec"]["template"]
        self.update = self.revision_of(template)
        if not hasattr(self, "_templates"):
            self._templates: dict[str, dict[str, Any]] = {}
        self._templates[self.update] = copy.deepcopy(template)
        if not self.current:
            self.current = self.update
        self.sync()

    @property
    def partition(self) -> int:
        assert self.statefulset is not None
        return self.statefulset["spec"]["updateStrategy"]["rollingUpdate"]["partition"]

    @property
    def replicas(self) -> int:
        assert self.statefulset is not None
        return self.statefulset["spec"]["replicas"]

    def image_of(self, revision: str) -> str:
        return self._templates[revision]["spec"]["containers"][0]["image"]

    def sync(self) -> None:
        """Creates missing pods: at the update revision at or above the partition, else current."""
        for ordinal in range(self.replicas):
            if ordinal not in self.pods:
                revision = self.update if ordinal >= self.partition else self.current
                stuck = "web: CrashLoopBackOff" if self.image_of(revision) in self.bad_images else ""
                ready = None if stuck else self.now + self.start_delay
                self.pods[ordinal] = Pod(revision, ready, stuck=stuck)
        if all(p.revision == self.update for p in self.pods.values()) and len(self.pods) == self.replicas:
            self.current = self.update

    def take_down(self, name: str) -> None:
        ordinal = int(name.rsplit("-", 1)[1])
        self.taken_down.append(name)
        del self.pods[ordinal]  # terminated at once; the controller recreates it

    def down(self) -> int:
        return sum(1 for o in range(self.replicas) if o not in self.pods or not self.ready(self.pods[o]))

    def ready(self, pod: Pod) -> bool:
        return pod.ready_at is not None and pod.ready_at <= self.now

    def observe(self, body: dict[str, Any], stable_template: bool = False) -> RolloutObserved:
        pods = []
        for ordinal, pod in sorted(self.pods.items()):
            conditions = []
            if self.ready(pod):
                stamp = pod.ready_at.strftime("%Y-%m-%dT%H:%M:%SZ") if pod.ready_at else None
                conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": stamp})
            waiting = {"state": {"waiting": {"reason": pod.stuck.split(": ")[1]}}} if pod.stuck else None
            pods.append(
                {
                    "metadata": {
                        "name": f"web-{ordinal}",
                        "labels": {"controller-revision-hash": pod.revision, ROLLOUT_LABEL: "web"},
                    },
                    "status": {
                        "conditions": conditions,
                        "containerStatuses": [{"name": "web", **waiting}] if waiting else [],
                    },
                }
            )
        sts = None
        if self.statefulset:
            sts = {
                **copy.deepcopy(self.statefulset),
                "status": {
                    "observedGeneration": 1,
                    "currentRevision": self.current,
                    "updateRevision": self.update,
                },
            }
            sts["metadata"]["generation"] = 1
        stable = None
        if stable_template and self.status.get("stableRevision"):
            stable = self._templates[self.status["stableRevision"]]
        return RolloutObserved(
            name="web",
            namespace="apps",
            uid="uid-1",
            generation=1,
            spec=body,
            status=copy.deepcopy(self.status),
            statefulset=sts,
            pods=pods,
            now=self.now,
            stable_template=stable,
        )

    def reconcile(self, body: dict[str, Any]) -> RolloutPlan:
        """One controller pass, as the I/O layer runs it (measuring a due analysis first)."""
        if analysis.due(body, self.status, self.now) is not None:
            self.measurements += 1
            self.status = analysis.record(
                self.status,
                self.analysis_passes,
                "HTTP 200" if self.analysis_passes else "HTTP 503",
                format_time(self.now),
            )
        planned = plan_rollout(self.observe(body))
        if planned.needs_stable_template:
            planned = plan_rollout(self.observe(body, stable_template=True))
        if planned.statefulset is not None:
            self.apply(planned.statefulset)
        for name in planned.evict + planned.delete:
            self.take_down(name)
        self.most_down = max(self.most_down, self.down())
        self.status = planned.status
        self.events += [e.reason for e in planned.events]
        self.sync()
        return planned

    def run(self, body: dict[str, Any], seconds: float, tick: float = 1.0) -> None:
        end = self.now + timedelta(seconds=seconds)
        while self.now < end:
            self.reconcile(body)
            self.now += timedelta(seconds=tick)
            self.most_down = max(self.most_down, self.down())

    def images(self) -> list[str]:
        return [self.image_of(self.pods[o].revision) for o in sorted(self.pods)]


def running(body: dict[str, Any]) -> Cluster:
    cluster = Cluster()
    cluster.run(body, 5)
    assert cluster.status["phase"] == "Healthy", cluster.status
    assert cluster.images() == ["web:1"] * body["statefulSet"]["replicas"]
    cluster.events.clear()
    cluster.most_down = 0
    return cluster


def promote(body: dict[str, Any], cluster: Cluster, **request: Any) -> dict[str, Any]:
    return {**body, "promote": {"template": cluster.status["updateTemplateHash"], **request}}


def test_the_issue_example_rolls_out_step_by_step() -> None:
    cluster = running(spec())
    body = spec("web:2")
    cluster.reconcile(body)
    assert cluster.events == ["RolloutStarted"]
    assert cluster.partition == 5  # template changed, no pod updated yet
    assert cluster.images() == ["web:1"] * 5

    cluster.run(body, 10)
    assert cluster.images() == ["web:1"] * 4 + ["web:2"]  # 20%: the highest ordinal
    assert cluster.status["phase"] == "Paused"
    assert cluster.status["currentStepIndex"] == 1
    assert cluster.status["message"] == "paused at step 1 until promoted"
    assert cluster.events == ["RolloutStarted", "StepCompleted", "Paused"]

    body = promote(body, cluster, step=1)
    cluster.run(body, 10)
    assert cluster.images() == ["web:1"] * 2 + ["web:2"] * 3  # 60%, two pods in one batch
    assert cluster.status["message"] == "paused at step 3 for 30s"
    cluster.run(body, 35)
    assert cluster.images() == ["web:2"] * 5
    assert cluster.status["phase"] == "Healthy"
    assert cluster.status["stableTemplateHash"] == cluster.status["updateTemplateHash"]
    assert [h["description"] for h in cluster.status["history"]] == [
        "setPercent 20",
        "pause until promoted",
        "setPercent 60",
        "pause 30s",
        "setPercent 100",
    ]
    assert cluster.events[-1] == "RolloutCompleted"
    assert sorted(cluster.taken_down) == ["web-0", "web-1", "web-2", "web-3", "web-4"]  # each once


def test_batches_never_take_down_more_than_max_unavailable() -> None:
    cluster = running(spec(replicas=10))
    body = spec("web:2", replicas=10, steps=[{"setPercent": 100}], maxUnavailable=3)
    cluster.run(body, 60)
    assert cluster.images() == ["web:2"] * 10
    assert cluster.most_down == 3
    assert len(cluster.taken_down) == 10


def test_scaling_alone_starts_no_rollout() -> None:
    cluster = running(spec())
    cluster.run(spec(replicas=7), 10)
    assert "RolloutStarted" not in cluster.events
    assert cluster.images() == ["web:1"] * 7
    assert cluster.taken_down == []


def test_a_pod_below_the_partition_is_left_to_the_statefulset_controller() -> None:
    cluster = running(spec())
    body = spec("web:2")
    cluster.run(body, 10)  # paused at 20%
    down_before = list(cluster.taken_down)
    del cluster.pods[1]  # dies for another reason
    cluster.sync()
    cluster.run(body, 10)
    assert cluster.images() == ["web:1"] * 4 + ["web:2"]  # back at the stable revision
    assert cluster.taken_down == down_before
    assert cluster.status["phase"] == "Paused"


def test_spec_paused_holds_and_promote_full_finishes() -> None:
    cluster = running(spec())
    body = {**spec("web:2"), "paused": True}
    cluster.run(body, 10)
    assert cluster.images() == ["web:1"] * 5
    assert cluster.status["message"] == "paused at step 0 (spec.paused)"
    body = promote(spec("web:2"), cluster, full=True)
    cluster.run(body, 10)
    assert cluster.images() == ["web:2"] * 5
    assert cluster.status["phase"] == "Healthy"


def test_abort_goes_back_to_the_stable_revision_and_withdrawing_it_starts_again() -> None:
    cluster = running(spec())
    cluster.reconcile(spec("web:2"))
    body = promote(spec("web:2"), cluster, step=1)
    cluster.run(body, 12)  # at the 30 s pause, three pods updated
    assert cluster.images() == ["web:1"] * 2 + ["web:2"] * 3
    aborted = {**body, "abort": {"template": cluster.status["updateTemplateHash"]}}
    cluster.run(aborted, 10)
    assert cluster.images() == ["web:1"] * 5
    assert cluster.status["phase"] == "Aborted"
    assert cluster.status["message"].startswith("Aborted on request; 5 of 5 available")
    assert "RolloutAborted" in cluster.events
    assert "RolledBack" in cluster.events
    cluster.events.clear()
    cluster.run(body, 5)  # abort withdrawn: the rollout starts over
    assert cluster.events[0] == "RolloutStarted"


def test_a_crashing_template_is_rolled_back_after_the_deadline_even_without_budget() -> None:
    cluster = running(spec())
    cluster.bad_images.add("web:2")
    body = spec(
        "web:2", steps=[{"setPercent": 40}, {"setPercent": 100}], maxUnavailable=1, progressDeadlineSeconds=20
    )
    cluster.run(body, 15)
    assert cluster.images().count("web:2") == 1  # one crashing pod; the budget stops the rest
    assert cluster.status["phase"] == "Progressing"
    cluster.run(body, 20)
    assert cluster.status["phase"] == "Aborted"
    assert "ProgressDeadlineExceeded: web-4 not available within 20s" in cluster.status["message"]
    assert cluster.images() == ["web:1"] * 5
    assert cluster.events.count("RolloutAborted") == 1


def test_setting_the_template_back_rolls_back_without_steps() -> None:
    cluster = running(spec())
    body = spec("web:2")
    cluster.run(body, 10)  # paused at 20%
    cluster.events.clear()
    cluster.run(spec("web:1"), 10)
    assert cluster.images() == ["web:1"] * 5
    assert cluster.events[0] == "RollbackStarted"
    assert cluster.status["phase"] == "Healthy"


def test_planning_twice_decides_the_same_and_posts_nothing_twice() -> None:
    cluster = running(spec())
    body = spec("web:2")
    cluster.reconcile(body)
    cluster.now += timedelta(seconds=1)
    observed = cluster.observe(body)
    first, second = plan_rollout(observed), plan_rollout(observed)
    assert first.statefulset == second.statefulset
    assert first.evict == second.evict == []
    assert first.statefulset is not None
    assert first.statefulset["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 4
    cluster.reconcile(body)  # the partition is applied; the next pass takes web-4 down
    assert cluster.taken_down == []
    cluster.reconcile(body)
    assert cluster.taken_down == ["web-4"]
    assert [e.reason for e in plan_rollout(cluster.observe(body)).events] == []


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ({"steps": []}, "spec.strategy.steps: List should have at least 1 item"),
        (
            {"steps": [{"setPercent": 120}]},
            "spec.strategy.steps.0.setPercent: Input should be less than or equal to 100",
        ),
        (
            {"steps": [{"setPercent": 20, "pause": {}}]},
            "a step sets exactly one of setPercent, setCount, pause",
        ),
        ({"steps": [{"pause": {"duration": "soon"}}]}, "'soon' is not a duration like 30s, 5m or 1h30m"),
    ],
)
def test_bad_input_names_the_field(strategy: dict, message: str) -> None:
    body = spec()
    body["strategy"] = strategy
    planned = plan_rollout(Cluster().observe(body))
    assert planned.statefulset is None
    assert planned.status["phase"] == "InvalidSpec"
    assert message in planned.status["message"]


def test_a_selector_that_misses_the_template_is_refused() -> None:
    body = spec()
    body["statefulSet"]["selector"] = {"matchLabels": {"app": "other"}}
    planned = plan_rollout(Cluster().observe(body))
    assert (
        "spec.statefulSet: Value error, selector.matchLabels must match template.metadata.labels"
        in (planned.status["message"])
    )


def test_the_pods_carry_the_rollout_label_and_the_statefulset_is_owned() -> None:
    body = spec()
    planned = plan_rollout(Cluster().observe(body))
    assert planned.statefulset is not None
    meta = planned.statefulset["metadata"]
    assert meta["ownerReferences"][0]["kind"] == "StatefulsetRollout"
    assert planned.statefulset["spec"]["template"]["metadata"]["labels"] == {
        "app": "web",
        ROLLOUT_LABEL: "web",
    }
    assert planned.statefulset["spec"]["podManagementPolicy"] == "Parallel"
    observed = Cluster().observe(body)
    assert pod_template(observed, RolloutSpec.model_validate(body)) == planned.statefulset["spec"]["template"]


ANALYSIS_STEPS = [
    {"setPercent": 20},
    {"analysis": {"http": {"url": "http://checks/web"}, "interval": "5s", "count": 2}},
    {"setPercent": 100},
]


def test_an_analysis_step_measures_then_goes_on() -> None:
    cluster = running(spec())
    body = spec("web:2", steps=ANALYSIS_STEPS)
    cluster.run(body, 6)
    assert cluster.status["currentStepIndex"] == 1
    assert cluster.status["message"] == "step 1 analysis: 1 of 2 measurements passed"
    cluster.run(body, 20)
    assert cluster.measurements == 2  # once every 5 s until two passed, then no more
    assert cluster.images() == ["web:2"] * 5
    assert [h["description"] for h in cluster.status["history"]][1] == "analysis http"


def test_a_failed_analysis_rolls_back_or_pauses() -> None:
    cluster = running(spec())
    cluster.analysis_passes = False
    cluster.run(spec("web:2", steps=ANALYSIS_STEPS), 20)
    assert cluster.status["phase"] == "Aborted"
    assert cluster.status["message"].startswith("AnalysisFailed at step 1: HTTP 503")
    assert cluster.images() == ["web:1"] * 5

    cluster = running(spec())
    cluster.analysis_passes = False
    paused_steps = copy.deepcopy(ANALYSIS_STEPS)
    paused_steps[1]["analysis"]["onFailure"] = "Pause"
    body = spec("web:2", steps=paused_steps)
    cluster.run(body, 20)
    assert cluster.status["phase"] == "Paused"
    assert cluster.status["message"] == "AnalysisFailed at step 1: HTTP 503; promote to go on"
    cluster.run(promote(body, cluster, step=1), 20)
    assert cluster.images() == ["web:2"] * 5


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        (
            {
                "status": "success",
                "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1.7e9, "0.02"]}]},
            },
            0.02,
        ),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1.7e9, "3"]}}, 3.0),
    ],
)
def test_prometheus_answers_give_one_number(answer: dict, value: float) -> None:
    assert analysis.prometheus_value(answer) == value


def test_prometheus_answers_that_are_not_one_number_fail_the_measurement() -> None:
    two = {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"value": [1, "1"]}, {"value": [1, "2"]}]},
    }
    with pytest.raises(ValueError, match="the query returned 2 series, not one"):
        analysis.prometheus_value(two)
    with pytest.raises(ValueError, match="query failed: bad_data"):
        analysis.prometheus_value({"status": "error", "error": "bad_data"})


def test_success_conditions_are_comparisons_of_the_result() -> None:
    assert check_condition("result < 0.05", 0.01)
    assert not check_condition("result < 0.05", 0.05)
    assert check_condition("result >= 1", 1)
    with pytest.raises(ValueError, match=re.escape("is not a condition like 'result < 0.05'")):
        check_condition("__import__('os')", 1)
