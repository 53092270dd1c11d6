"""What a StatefulsetRollout does next: a pure function of what it observes.

The StatefulSet runs the `RollingUpdate` strategy and the controller owns its `partition`:
pods at or above the partition run the update revision, pods below it the stable one. The
StatefulSet controller itself recreates any pod that dies on the side of the partition it
belongs to, which is why there is no version leak: a pod not yet due comes back at the stable
revision whether the rollout is paused, mid-step or aborted. To go faster than one pod at a
time, the plan lowers the partition by a whole batch (as far as `maxUnavailable` and any
PodDisruptionBudget allow) and evicts the batch's pods together.

Everything the rollout must remember lives in `status`, so a restarted controller continues
where it was: the partition (on the StatefulSet) says which pods were released, and a
released pod that is still on the old revision and not terminating has not been taken down.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from framework.kube import conditions
from framework.kube.api import EventNote
from framework.kube.conditions import Condition
from framework.kube.meta import API_VERSION, LABEL_MANAGED_BY, MANAGER, content_hash
from framework.kube.model import describe_validation_error
from framework.kube.times import format_time, parse_time
from framework.rollout import analysis
from framework.rollout.outbound import refused_destinations
from framework.rollout.spec import KIND, OnFailure, RolloutPhase, RolloutSpec, Step, parse_duration

ROLLOUT_LABEL = "statefleet.dev/rollout"
REVISION_LABEL = "controller-revision-hash"  # set on every pod by the StatefulSet controller
HOOKED_ANNOTATION = "statefleet.dev/after-ready-hooks"  # the revision whose afterReady hooks ran
STUCK_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "InvalidImageName",
        "RunContainerError",
    }
)
POLL = 5.0  # while pods are changing; their watch events usually come first


HEALTHY, PROGRESSING, PAUSED, DEGRADED, ROLLING_BACK, ABORTED, INVALID = RolloutPhase


def template_hash(template: dict[str, Any]) -> str:
    return content_hash(template, 10)


@dataclass(frozen=True)
class PodView:
    name: str
    ordinal: int
    revision: str
    ready_since: datetime | None  # None: not Ready
    terminating: bool
    stuck: str  # why the pod cannot become Ready by itself ("" when it might)
    hooked: str = ""  # the revision whose afterReady hooks ran on this pod

    def available(self, now: datetime, min_ready_seconds: int) -> bool:
        return (
            not self.terminating
            and self.ready_since is not None
            and now - self.ready_since >= timedelta(seconds=min_ready_seconds)
        )


def pod_view(pod: dict[str, Any]) -> PodView:
    metadata, status = pod["metadata"], pod.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    ready_since = parse_time(ready.get("lastTransitionTime")) if ready.get("status") == "True" else None
    if ready.get("status") == "True" and ready_since is None:
        ready_since = datetime.min.replace(tzinfo=UTC)
    stuck = ""
    for container in status.get("containerStatuses") or []:
        reason = ((container.get("state") or {}).get("waiting") or {}).get("reason", "")
        if reason in STUCK_REASONS:
            stuck = f"{container.get('name')}: {reason}"
    if status.get("phase") == "Failed":
        stuck = "Failed"
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        stuck = "Unschedulable"
    return PodView(
        name=metadata["name"],
        ordinal=int(metadata["name"].rsplit("-", 1)[1]),
        revision=(metadata.get("labels") or {}).get(REVISION_LABEL, ""),
        ready_since=ready_since,
        terminating=bool(metadata.get("deletionTimestamp")),
        stuck=stuck,
        hooked=(metadata.get("annotations") or {}).get(HOOKED_ANNOTATION, ""),
    )


@dataclass
class RolloutObserved:
    name: str
    namespace: str
    uid: str
    generation: int
    spec: dict[str, Any]
    status: dict[str, Any]
    statefulset: dict[str, Any] | None
    pods: list[dict[str, Any]]
    now: datetime
    stable_template: dict[str, Any] | None = None  # the pod template of status.stableRevision
    labels: dict[str, str] = field(default_factory=dict)  # the rollout's, passed on to the StatefulSet
    disruptions_allowed: int | None = None  # the tightest PodDisruptionBudget over the pods
    allowed_destinations: tuple[str, ...] = ("*",)  # hosts analysis, hooks, notifications may reach


@dataclass
class RolloutPlan:
    status: dict[str, Any]
    statefulset: dict[str, Any] | None = None  # to apply; None leaves it as it is
    evict: list[str] = field(default_factory=list)  # through the Eviction API (PDBs hold)
    delete: list[str] = field(default_factory=list)  # stuck or unavailable: nothing to protect
    events: list[EventNote] = field(default_factory=list)
    requeue_after: float | None = None
    needs_stable_template: bool = False  # fetch status.stableRevision's template, plan again
    spec: RolloutSpec | None = None  # as validated (None: invalid)
    released: list[str] = field(default_factory=list)  # pods the new partition releases, highest first
    after_ready: list[str] = field(default_factory=list)  # updated, available, afterReady hooks not run


def build_statefulset(
    observed: RolloutObserved, spec: RolloutSpec, template: dict[str, Any], partition: int
) -> dict[str, Any]:
    body = spec.stateful_set.to_api()
    body["template"] = template
    body["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": observed.name,
            "namespace": observed.namespace,
            "labels": {**observed.labels, ROLLOUT_LABEL: observed.name, LABEL_MANAGED_BY: MANAGER},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": observed.name,
                    "uid": observed.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": body,
    }


def pod_template(observed: RolloutObserved, spec: RolloutSpec) -> dict[str, Any]:
    """The user's template, with the label that lets the controller find the pods."""
    template = json.loads(json.dumps(spec.stateful_set.template.model_dump(by_alias=True, mode="json")))
    template["metadata"]["labels"][ROLLOUT_LABEL] = observed.name
    if not template["metadata"].get("annotations"):
        template["metadata"].pop("annotations", None)
    return template


def step_target(step: Step, replicas: int) -> int | None:
    """Replicas on the new revision once `step` is done; None for a pause."""
    if step.set_percent is not None:
        return min(replicas, math.ceil(step.set_percent * replicas / 100))
    if step.set_count is not None:
        return min(replicas, step.set_count)
    return None


def describe_step(step: Step) -> str:
    if step.set_percent is not None:
        return f"setPercent {step.set_percent}"
    if step.set_count is not None:
        return f"setCount {step.set_count}"
    if step.analysis is not None:
        return "analysis " + ("http" if step.analysis.http else "prometheus")
    assert step.pause is not None
    return f"pause {step.pause.duration}" if step.pause.duration else "pause until promoted"


class _Pass:
    """One planning pass: the observed state, read once, and the decisions taken so far."""

    def __init__(self, observed: RolloutObserved, spec: RolloutSpec) -> None:
        self.observed = observed
        self.spec = spec
        self.now = observed.now
        self.replicas = spec.stateful_set.replicas
        self.strategy = spec.strategy
        self.status: dict[str, Any] = {k: v for k, v in observed.status.items() if k != "kopf"}
        self.events: list[EventNote] = []
        self.evict: list[str] = []
        self.delete: list[str] = []
        self.requeue: list[float] = []
        self.released: list[str] = []
        sts = observed.statefulset or {}
        sts_status = sts.get("status") or {}
        # The StatefulSet controller has seen our last change: its revisions can be trusted.
        self.caught_up = bool(sts) and sts_status.get("observedGeneration", 0) >= (
            sts.get("metadata") or {}
        ).get("generation", 0)
        self.update_revision = sts_status.get("updateRevision", "")
        self.current_revision = sts_status.get("currentRevision", "")
        rolling = ((sts.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate") or {}
        self.partition = int(rolling.get("partition", 0))
        self.pods = {view.ordinal: view for view in map(pod_view, observed.pods)}

    # --- reading ------------------------------------------------------------------------
    def available(self, ordinal: int) -> bool:
        pod = self.pods.get(ordinal)
        return bool(pod) and pod.available(self.now, self.strategy.min_ready_seconds)

    def updated(self, ordinal: int) -> bool:
        pod = self.pods.get(ordinal)
        return bool(pod) and not pod.terminating and pod.revision == self.update_revision

    def unavailable(self) -> int:
        """Never-created, terminating and not-yet-available pods all count against the budget."""
        return sum(1 for ordinal in range(self.replicas) if not self.available(ordinal))

    def allowance(self) -> int:
        allowed = self.strategy.budget(self.replicas) - self.unavailable()
        if self.observed.disruptions_allowed is not None:
            allowed = min(allowed, self.observed.disruptions_allowed)
        return max(0, allowed)

    def next_availability(self) -> None:
        """Requeue for the moment a Ready pod passes minReadySeconds (no event marks it)."""
        wait = self.strategy.min_ready_seconds
        for pod in self.pods.values():
            if pod.ready_since and not pod.available(self.now, wait):
                remaining = (pod.ready_since + timedelta(seconds=wait) - self.now).total_seconds()
                self.requeue.append(max(0.5, remaining))

    # --- acting -------------------------------------------------------------------------
    def take_down(self, ordinal: int, allowed: int) -> int:
        """Takes a released, not-updated pod down; returns the budget left."""
        pod = self.pods.get(ordinal)
        if pod is None or pod.terminating or pod.revision == self.update_revision:
            return allowed
        if not self.available(ordinal):
            self.delete.append(pod.name)  # unavailable already: nothing to protect
            return allowed
        if allowed <= 0:
            return allowed
        self.evict.append(pod.name)
        return allowed - 1

    def note(self, type_: str, reason: str, message: str) -> None:
        self.events.append(EventNote(type_, reason, message))


ABORT_REQUESTED = "Aborted on request"


def plan_rollout(observed: RolloutObserved) -> RolloutPlan:
    try:
        spec = RolloutSpec.model_validate(observed.spec)
    except ValidationError as error:
        return _invalid(observed, describe_validation_error(error))
    refused = refused_destinations(observed.spec, observed.allowed_destinations)
    if refused:
        return _invalid(observed, "; ".join(refused))
    run = _Pass(observed, spec)
    template = pod_template(observed, spec)
    wanted = template_hash(template)
    status = run.status

    if observed.statefulset is None:
        # Nothing runs yet: nothing to roll out; the StatefulSet starts at this template.
        status.update(stableTemplateHash=wanted, updateTemplateHash=wanted, currentStepIndex=None)
        for key in ("abortedTemplateHash", "abortReason", "stableRevision"):
            status.pop(key, None)
        return _finish(
            run, build_statefulset(observed, spec, template, partition=0), PROGRESSING, requeue=1.0
        )

    if not status.get("stableTemplateHash"):
        # Adopting a StatefulSet made elsewhere: what runs now is the stable revision.
        status["stableTemplateHash"] = "adopted"
        status["stableRevision"] = run.current_revision
    stable = status["stableTemplateHash"]
    manual_abort = spec.abort is not None and spec.abort.template == wanted
    if status.get("abortReason") == ABORT_REQUESTED and not manual_abort:
        status["updateTemplateHash"] = ""  # the abort was withdrawn: roll out again from the start

    if status.get("updateTemplateHash") != wanted:
        status.pop("abortedTemplateHash", None)
        status.pop("abortReason", None)
        status["updateTemplateHash"] = wanted
        if wanted == stable:
            # Back to the stable template: replace what differs at once, no steps.
            status["currentStepIndex"] = None
            run.note("Normal", "RollbackStarted", f"template set back to the stable {stable}")
        else:
            status["stableRevision"] = run.current_revision or status.get("stableRevision", "")
            status["currentStepIndex"] = 0
            status["stepStartedAt"] = status["batchStartedAt"] = format_time(run.now)
            status["history"] = []
            run.note(
                "Normal",
                "RolloutStarted",
                f"rolling out template {wanted} over {run.replicas} replicas "
                f"(stable {stable}) in {len(spec.strategy.steps)} steps",
            )
            # Template and partition in one apply: no pod is updated before its step.
            sts = build_statefulset(observed, spec, template, partition=run.replicas)
            return _finish(run, sts, PROGRESSING, requeue=1.0)

    if wanted == stable:
        return _converge(run, template, done_phase=HEALTHY)
    if manual_abort and status.get("abortedTemplateHash") != wanted:
        _abort(run, wanted, ABORT_REQUESTED)
    if status.get("abortedTemplateHash") == wanted:
        return _rollback(run)
    return _progress(run, template, wanted)


def _abort(run: _Pass, wanted: str, reason: str) -> None:
    run.status["abortedTemplateHash"] = wanted
    run.status["abortReason"] = reason
    run.note(
        "Warning", "RolloutAborted", f"rollout of {wanted} aborted: {reason}; back to the stable revision"
    )


def _rollback(run: _Pass) -> RolloutPlan:
    if run.observed.stable_template is None:
        # The controller reads the stable revision's template and plans again.
        return RolloutPlan(status=run.observed.status, needs_stable_template=True)
    return _converge(run, run.observed.stable_template, done_phase=ABORTED)


def _progress(run: _Pass, template: dict[str, Any], wanted: str) -> RolloutPlan:
    spec, status, observed = run.spec, run.status, run.observed
    steps = spec.strategy.steps
    if not run.caught_up:  # the StatefulSet controller has not seen our last partition yet
        return _finish(run, None, PROGRESSING, requeue=1.0)
    index = status.get("currentStepIndex") or 0
    promote = spec.promote if spec.promote and spec.promote.template == wanted else None
    partition = run.partition
    while True:
        status["currentStepIndex"] = index
        if spec.paused:
            sts = build_statefulset(observed, spec, template, partition)
            return _finish(run, sts, PAUSED, message=f"paused at step {index} (spec.paused)")
        full = promote is not None and promote.full
        step = steps[index] if index < len(steps) and not full else None
        target = run.replicas if step is None else step_target(step, run.replicas)

        if step is not None and step.analysis is not None:
            record = analysis.current(status, wanted, index)
            outcome = analysis.decided(step.analysis, record)
            passed = promote is not None and promote.step is not None and promote.step >= index
            if outcome == "passed" or passed:
                index = _step_done(run, index, step)
                continue
            sts = build_statefulset(observed, spec, template, partition)
            if outcome == "failed":
                reason = f"AnalysisFailed at step {index}: {record.get('message', '')}"
                if step.analysis.on_failure == OnFailure.ROLLBACK:
                    _abort(run, wanted, reason)
                    return _rollback(run)
                return _finish(run, sts, PAUSED, message=f"{reason}; promote to go on")
            wait = parse_duration(step.analysis.interval) if record.get("measuredAt") else 0.5
            seen = f"{record['successes']} of {step.analysis.count} measurements passed"
            return _finish(run, sts, PROGRESSING, message=f"step {index} analysis: {seen}", requeue=wait)

        if target is None:  # a pause step
            assert step is not None
            assert step.pause is not None
            passed = promote is not None and promote.step is not None and promote.step >= index
            if not passed and step.pause.duration:
                started = parse_time(status.get("stepStartedAt")) or run.now
                remaining = started + timedelta(seconds=parse_duration(step.pause.duration)) - run.now
                passed = remaining <= timedelta(0)
                if not passed:
                    run.requeue.append(remaining.total_seconds())
            if not passed:
                sts = build_statefulset(observed, spec, template, partition)
                until = f"for {step.pause.duration}" if step.pause.duration else "until promoted"
                return _finish(run, sts, PAUSED, message=f"paused at step {index} {until}")
            index = _step_done(run, index, step)
            continue

        floor = run.replicas - target
        done = partition <= floor and all(
            run.updated(o) and run.available(o) for o in range(max(floor, 0), run.replicas)
        )
        if done and step is None:  # every replica runs the new template: the rollout is done
            status["stableTemplateHash"] = wanted
            status["stableRevision"] = run.update_revision
            status["currentStepIndex"] = None
            run.note("Normal", "RolloutCompleted", f"template {wanted} runs on all {run.replicas} replicas")
            return _finish(run, build_statefulset(observed, spec, template, 0), HEALTHY)
        if done:
            assert step is not None
            index = _step_done(run, index, step)
            continue

        late = _late_pods(run, partition)
        if late:
            reason = (
                f"ProgressDeadlineExceeded: {', '.join(late)} not available within "
                f"{spec.strategy.progress_deadline_seconds}s"
            )
            if spec.strategy.auto_rollback:
                _abort(run, wanted, reason)
                return _rollback(run)
            sts = build_statefulset(observed, spec, template, partition)
            return _finish(run, sts, DEGRADED, message=reason)

        # Released pods still on the old revision go down now (the StatefulSet controller has
        # seen the partition, so they come back updated); then the partition moves down over
        # as many more pods as the budget allows: those go down on the next pass.
        allowed = run.allowance()
        for ordinal in range(max(partition, 0), run.replicas):
            allowed = run.take_down(ordinal, allowed)
        released = partition
        while partition > floor:
            below = partition - 1
            if run.available(below) and not run.updated(below):
                if allowed <= 0:
                    break
                allowed -= 1
            partition = below
        if partition < released:
            status["batchStartedAt"] = format_time(run.now)
            run.released = [f"{observed.name}-{o}" for o in range(released - 1, partition - 1, -1)]
        run.next_availability()
        updated = sum(1 for o in range(run.replicas) if run.updated(o))
        description = describe_step(step) if step else "the rest"
        message = (
            f"step {index} ({description}): {updated} of {run.replicas} replicas updated, {target} wanted"
        )
        sts = build_statefulset(observed, spec, template, partition)
        return _finish(run, sts, PROGRESSING, message=message, requeue=POLL)


def pod_range(name: str, first: int, last: int) -> str:
    """Pods `first`..`last` (ordinals, inclusive) in a line, however many there are."""
    if last < first:
        return ""
    if first == last:
        return f"{name}-{first}"
    return f"{name}-{first}..{name}-{last} ({last - first + 1} pods)"


def _step_done(run: _Pass, index: int, step: Step) -> int:
    history = list(run.status.get("history") or [])
    entry: dict[str, Any] = {
        "step": index,
        "description": describe_step(step),
        "startedAt": run.status.get("stepStartedAt") or format_time(run.now),
        "finishedAt": format_time(run.now),
    }
    target = step_target(step, run.replicas)
    if target is not None:
        before = max((h.get("updated", 0) for h in history), default=0)
        entry["updated"] = target
        entry["pods"] = pod_range(run.observed.name, run.replicas - target, run.replicas - before - 1)
    history.append(entry)
    run.status["history"] = history
    run.status["stepStartedAt"] = run.status["batchStartedAt"] = format_time(run.now)
    done = f"step {index} ({describe_step(step)}) done"
    run.note("Normal", "StepCompleted", f"{done}: {entry['pods']} updated" if entry.get("pods") else done)
    return index + 1


def _late_pods(run: _Pass, partition: int) -> list[str]:
    """Released pods not available within the deadline, counted from their batch's release."""
    started = parse_time(run.status.get("batchStartedAt"))
    deadline = run.spec.strategy.progress_deadline_seconds
    if started is None:
        return []
    if run.now - started < timedelta(seconds=deadline):
        run.requeue.append((started + timedelta(seconds=deadline) - run.now).total_seconds())
        return []
    return [f"{run.observed.name}-{o}" for o in range(partition, run.replicas) if not run.available(o)]


def _converge(run: _Pass, template: dict[str, Any], done_phase: str) -> RolloutPlan:
    """Every pod on `template`, at once within the budget; stuck pods go regardless of it."""
    observed, status = run.observed, run.status
    sts = build_statefulset(observed, run.spec, template, partition=0)
    waiting_phase = PROGRESSING if done_phase == HEALTHY else ROLLING_BACK
    if not run.caught_up:
        return _finish(run, sts, waiting_phase, requeue=1.0)
    if not status.get("stableRevision"):
        status["stableRevision"] = run.update_revision  # the first revision of a new StatefulSet
    if run.update_revision != status["stableRevision"]:
        return _finish(run, sts, waiting_phase, requeue=1.0)  # our template is not applied yet
    allowed = run.allowance()
    for ordinal in sorted(run.pods, reverse=True):
        pod = run.pods[ordinal]
        if pod.terminating or pod.revision == run.update_revision:
            continue
        if pod.stuck or not run.available(ordinal):
            run.delete.append(pod.name)
        elif allowed > 0:
            run.evict.append(pod.name)
            allowed -= 1
    everything = all(run.updated(o) and run.available(o) for o in range(run.replicas))
    if done_phase == ABORTED and everything and run.status.get("phase") == ROLLING_BACK:
        run.note("Warning", "RolledBack", f"every replica back on the stable revision {run.update_revision}")
    if not everything:
        run.next_availability()
        return _finish(run, sts, waiting_phase, requeue=POLL)
    return _finish(run, sts, done_phase)


def _finish(
    run: _Pass,
    statefulset: dict[str, Any] | None,
    phase: str,
    message: str | None = None,
    requeue: float | None = None,
) -> RolloutPlan:
    status, observed = run.status, run.observed
    previous_phase = status.get("phase")
    if requeue is not None:
        run.requeue.append(requeue)
    pods = list(run.pods.values())
    updated = sum(1 for o in range(run.replicas) if run.updated(o))
    ready = sum(1 for p in pods if p.ready_since is not None and not p.terminating)
    available = sum(1 for o in range(run.replicas) if run.available(o))
    if phase == ABORTED:
        message = (
            f"{status.get('abortReason')}; {available} of {run.replicas} available on the stable revision"
        )
    elif phase == ROLLING_BACK:
        message = f"{status.get('abortReason')}; rolling back, {available} of {run.replicas} available"
    elif message is None:
        message = {
            HEALTHY: f"{available} of {run.replicas} replicas available",
            PROGRESSING: f"{updated} of {run.replicas} replicas updated, {available} available",
        }.get(phase, phase)
    status.update(
        observedGeneration=observed.generation,
        phase=phase,
        message=message,
        replicas=run.replicas,
        updatedReplicas=updated,
        readyReplicas=ready,
        availableReplicas=available,
        updateRevision=run.update_revision,
        currentRevision=run.current_revision,
        steps=len(run.spec.strategy.steps),
    )
    if status.get("currentStepIndex") is None:
        status.pop("currentStepIndex", None)
    healthy = phase == HEALTHY and available == run.replicas
    if phase == PAUSED and previous_phase != PAUSED:
        run.note("Normal", "Paused", message)
    status["conditions"] = conditions.merge_conditions(
        status.get("conditions"),
        [
            Condition(conditions.READY, healthy, phase, message),
            Condition(conditions.PROGRESSING, phase in (PROGRESSING, ROLLING_BACK), phase, message),
            Condition(conditions.DEGRADED, phase in (DEGRADED, ROLLING_BACK, ABORTED), phase, message),
        ],
        observed.generation,
        now=format_time(run.now),
    )
    after_ready = []
    if run.spec.strategy.hooks.after_ready:
        for ordinal, pod in sorted(run.pods.items()):
            if run.updated(ordinal) and run.available(ordinal) and pod.hooked != run.update_revision:
                after_ready.append(pod.name)
    return RolloutPlan(
        status=status,
        statefulset=statefulset,
        evict=run.evict,
        delete=run.delete,
        events=run.events,
        requeue_after=min(run.requeue) if run.requeue else None,
        spec=run.spec,
        released=run.released,
        after_ready=after_ready,
    )


def _invalid(observed: RolloutObserved, message: str) -> RolloutPlan:
    status = {k: v for k, v in observed.status.items() if k != "kopf"}
    previous = conditions.find(status.get("conditions"), conditions.READY)
    events = []
    if not previous or previous.get("message") != message:
        events.append(EventNote("Warning", INVALID, message))
    status.update(observedGeneration=observed.generation, phase=INVALID, message=message)
    status["conditions"] = conditions.merge_conditions(
        status.get("conditions"),
        [
            Condition(conditions.READY, False, INVALID, message),
            Condition(conditions.PROGRESSING, False, INVALID, message),
        ],
        observed.generation,
        now=format_time(observed.now),
    )
    return RolloutPlan(status=status, events=events)
