"""The StatefulsetRollout controller's I/O: watches, the pass, and what it does to the cluster.

A pass reads the rollout, takes its StatefulSet and pods from kopf indexes (no request),
plans (pure, `plan.py`), then: applies the StatefulSet (server-side apply), evicts pods
through the Eviction API (PodDisruptionBudgets hold; a refused eviction is tried again on the
next pass), deletes pods that are unavailable anyway, writes status when it changed, posts
Events, and asks the queue for the next pass when time alone will change something.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import kopf
from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import ControllerRevision
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from framework.kube import metrics
from framework.kube.api import about, bounded, get_or_none, post_event
from framework.kube.meta import GROUP, MANAGER, VERSION
from framework.kube.queue import WorkQueue
from framework.kube.runtime import StatusWriter
from framework.kube.times import format_time
from framework.rollout import analysis, hooks, notify, outbound
from framework.rollout.plan import (
    HOOKED_ANNOTATION,
    POLL,
    ROLLOUT_LABEL,
    RolloutObserved,
    RolloutPlan,
    plan_rollout,
    pod_view,
)
from framework.rollout.spec import KIND, PLURAL, Notifications, RolloutSpec, SecretKeyRef

log = logging.getLogger("statefleet")

Rollout = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
PODS_INDEX = "statefleet_rollout_pods"
STATEFULSETS_INDEX = "statefleet_rollout_statefulsets"
EVICTIONS_AT_ONCE = 16
Key = tuple[str, str]  # namespace, name


# The handlers are coroutines even where they do no I/O: kopf runs plain functions in a
# thread pool, and every thread costs a malloc arena of its own (tens of MiB of RSS).


def slim(body: Mapping[str, Any], keep: tuple[str, ...]) -> dict[str, Any]:
    """The parts of an object a plan reads; managedFields and the rest stay out of memory."""
    metadata = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return {"metadata": metadata, **{part: body[part] for part in keep if part in body}}


def rollout_key(body: Mapping[str, Any]) -> Key | None:
    metadata = body.get("metadata") or {}
    name = (metadata.get("labels") or {}).get(ROLLOUT_LABEL)
    return (metadata.get("namespace", ""), name) if name else None


async def index_pod(body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    key = rollout_key(body)
    return {key: slim(body, ("status",))} if key else {}


async def index_statefulset(body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    key = rollout_key(body)
    if not key:
        return {}
    kept = slim(body, ("status",))
    # The pod template is most of a StatefulSet's size: only its annotations are kept (a
    # service plugin reads there which of its templates the StatefulSet has taken).
    spec = body.get("spec") or {}
    kept["spec"] = {k: v for k, v in spec.items() if k != "template"}
    annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    kept["spec"]["template"] = {"metadata": {"annotations": dict(annotations)}}
    return {key: kept}


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions) against a set of labels; as in a
    PodDisruptionBudget, a null selector matches nothing and an empty one everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def revision_template(revision: dict[str, Any]) -> dict[str, Any]:
    """The pod template a StatefulSet's ControllerRevision records."""
    template = dict(revision["data"]["spec"]["template"])
    template.pop("$patch", None)
    return template


class RolloutController:
    def __init__(
        self,
        client: AsyncClient,
        in_process_hooks: Mapping[str, hooks.InProcess] | None = None,
        destinations: Sequence[str] = outbound.IN_CLUSTER,
    ) -> None:
        self.client = client
        self.destinations = tuple(destinations)  # where analysis, hooks and notifications may go
        self.in_process_hooks = dict(in_process_hooks or {})  # by name: the plugins' hooks
        self.queue = WorkQueue(self._reconcile_once, self._describe)
        self._pods: Mapping[Key, Any] = {}
        self._statefulsets: Mapping[Key, Any] = {}
        self.status = StatusWriter[Key](client)
        self.sender = notify.Sender(self.destinations)

    def register(self) -> None:
        kopf.index("", "v1", "pods", labels={ROLLOUT_LABEL: kopf.PRESENT}, id=PODS_INDEX)(index_pod)
        kopf.index("apps", "v1", "statefulsets", labels={ROLLOUT_LABEL: kopf.PRESENT}, id=STATEFULSETS_INDEX)(
            index_statefulset
        )

        @kopf.on.startup(id="statefleet-rollout-indexes")
        async def attach(**indices: Any) -> None:
            self._pods = indices[PODS_INDEX]
            self._statefulsets = indices[STATEFULSETS_INDEX]

        async def rollout_changed(body: kopf.Body, **_: Any) -> None:
            meta = body["metadata"]
            key = (meta["namespace"], meta["name"])
            if self.status.is_echo(key, body):
                return  # the echo of our own status write
            await self.queue.process(key)

        async def child_changed(body: kopf.Body, **_: Any) -> None:
            key = rollout_key(body)
            if key:
                self.queue.soon(key, delay=0.2)

        kopf.on.event(GROUP, VERSION, PLURAL, id="statefulsetrollout-changed")(rollout_changed)
        kopf.on.event("apps", "v1", "statefulsets", labels={ROLLOUT_LABEL: kopf.PRESENT}, id="rollout-sts")(
            child_changed
        )
        kopf.on.event("", "v1", "pods", labels={ROLLOUT_LABEL: kopf.PRESENT}, id="rollout-pods")(
            child_changed
        )

    def _describe(self, key: Key) -> dict[str, Any]:
        return about(KIND, *key)

    def children(self, key: Key) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        name = key[1]
        statefulsets = [s for s in self._statefulsets.get(key, ()) if s["metadata"].get("name") == name]
        return (statefulsets[0] if statefulsets else None), list(self._pods.get(key, ()))

    async def _disruptions_allowed(self, namespace: str, labels: Mapping[str, str]) -> int | None:
        """The tightest PodDisruptionBudget over the pods, if any covers them."""
        allowed = None
        async for budget in self.client.list(PodDisruptionBudget, namespace=namespace):
            selector = budget.spec.selector.to_dict() if budget.spec and budget.spec.selector else None
            if selector_matches(selector, labels):
                value = budget.status.disruptionsAllowed if budget.status else 0
                allowed = value if allowed is None else min(allowed, value)
        return allowed

    async def _reconcile_once(self, key: Key, thorough: bool) -> float | None:
        namespace, name = key
        body = await get_or_none(self.client, Rollout, name, namespace)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.queue.forget(key)
            self.status.forget(key)
            return None
        with metrics.timed_reconcile(KIND):
            statefulset, pods = self.children(key)
            status = body.get("status") or {}
            observed = RolloutObserved(
                name=name,
                namespace=namespace,
                uid=body["metadata"]["uid"],
                generation=body["metadata"].get("generation", 0),
                spec=body.get("spec") or {},
                status=status,
                statefulset=statefulset,
                pods=pods,
                now=datetime.now(UTC),
                labels=body["metadata"].get("labels") or {},
                allowed_destinations=self.destinations,
            )
            check = analysis.due(observed.spec, status, observed.now)
            if check is not None:
                passed, seen = await analysis.measure(check, self.sender.http)
                observed.status = analysis.record(status, passed, seen, format_time(observed.now))
            rolling = status.get("updateTemplateHash") != status.get("stableTemplateHash") or status.get(
                "abortedTemplateHash"
            )
            if statefulset is not None and rolling:
                labels = (
                    ((body.get("spec") or {}).get("statefulSet") or {})
                    .get("template", {})
                    .get("metadata", {})
                )
                observed.disruptions_allowed = await self._disruptions_allowed(
                    namespace, {**(labels.get("labels") or {}), ROLLOUT_LABEL: name}
                )
            planned = plan_rollout(observed)
            if planned.needs_stable_template:
                revision = await get_or_none(
                    self.client, ControllerRevision, status["stableRevision"], namespace
                )
                if revision is None:
                    raise RuntimeError(
                        f"the stable revision {status['stableRevision']} is gone: cannot roll back"
                    )
                observed.stable_template = revision_template(revision)
                planned = plan_rollout(observed)
            await self._execute(body, observed, planned)
        return planned.requeue_after

    def _hook_call(self, moment: str, observed: RolloutObserved, pod: str, revision: str) -> hooks.HookCall:
        found = next((p for p in observed.pods if p["metadata"]["name"] == pod), {})
        pod_ip = (found.get("status") or {}).get("podIP", "")
        views = tuple(map(pod_view, observed.pods))
        return hooks.HookCall(
            moment, observed.namespace, observed.name, pod, pod_ip, revision, self.client, views
        )

    async def _before_take_down(
        self, observed: RolloutObserved, planned: RolloutPlan, spec: RolloutSpec
    ) -> None:
        """Runs the hooks of the pods the plan releases, highest first; the partition stops
        above the first pod whose hook fails, so no pod is updated without its hook."""
        revision = planned.status.get("updateRevision", "")
        for pod in planned.released:
            call = self._hook_call("beforeTakeDown", observed, pod, revision)
            failure = await hooks.run(
                spec.strategy.hooks.before_take_down, call, self.sender.http, self.in_process_hooks
            )
            if failure:
                log.warning(
                    "%s; holding the partition above it",
                    failure,
                    extra=self._describe((observed.namespace, observed.name)),
                )
                assert planned.statefulset is not None
                planned.statefulset["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = call.ordinal + 1
                planned.requeue_after = min(planned.requeue_after or POLL, POLL)
                return

    async def _after_ready(self, observed: RolloutObserved, planned: RolloutPlan, spec: RolloutSpec) -> None:
        revision = planned.status.get("updateRevision", "")
        for pod in planned.after_ready:
            call = self._hook_call("afterReady", observed, pod, revision)
            failure = await hooks.run(
                spec.strategy.hooks.after_ready, call, self.sender.http, self.in_process_hooks
            )
            if failure:
                log.warning(
                    "%s; trying again", failure, extra=self._describe((observed.namespace, observed.name))
                )
                planned.requeue_after = min(planned.requeue_after or POLL, POLL)
                continue
            await self.client.patch(
                Pod,
                pod,
                {"metadata": {"annotations": {HOOKED_ANNOTATION: revision}}},
                namespace=observed.namespace,
                patch_type=PatchType.MERGE,
            )

    async def _evict(self, key: Key, pod: str) -> None:
        namespace = key[0]
        try:
            await self.client.create(
                Pod.Eviction(metadata=ObjectMeta(name=pod, namespace=namespace)),
                name=pod,
                namespace=namespace,
            )
            metrics.ROLLOUT_PODS_TAKEN_DOWN.labels("evicted").inc()
        except ApiError as error:
            if error.status.code == 429:  # a PodDisruptionBudget says not now: next pass
                log.info(
                    "eviction of %s refused for now: %s", pod, error.status.message, extra=self._describe(key)
                )
            elif error.status.code != 404:
                raise

    async def _delete(self, key: Key, pod: str) -> None:
        try:
            await self.client.delete(Pod, pod, namespace=key[0])
            metrics.ROLLOUT_PODS_TAKEN_DOWN.labels("deleted").inc()
        except ApiError as error:
            if error.status.code != 404:
                raise

    async def _execute(self, body: dict[str, Any], observed: RolloutObserved, planned: RolloutPlan) -> None:
        namespace = observed.namespace
        spec = planned.spec
        if spec is not None and planned.released and spec.strategy.hooks.before_take_down:
            await self._before_take_down(observed, planned, spec)
        if planned.statefulset is not None:
            await self.client.apply(codecs.from_dict(planned.statefulset), field_manager=MANAGER, force=True)
        key = (namespace, observed.name)
        # Several at a time: a batch of hundreds goes out in a second or two, without one
        # request per pod waiting on the one before.
        await bounded([self._evict(key, pod) for pod in planned.evict], EVICTIONS_AT_ONCE)
        for pod in planned.delete:
            await self._delete(key, pod)
        if spec is not None and planned.after_ready:
            await self._after_ready(observed, planned, spec)
        written = body.get("status") or {}  # observed.status may carry a fresh measurement
        sending = notify.unsent(
            notify.notices(namespace, observed.name, planned.events, planned.status), written
        )
        notify.record(planned.status, sending)  # before sending: a restart does not send twice
        await self.status.write((namespace, observed.name), Rollout, body, written, planned.status)
        for note in planned.events:
            metrics.ROLLOUT_EVENTS.labels(note.reason).inc()
            await post_event(self.client, KIND, body, note)
        if sending:
            assert spec is not None  # notices come from the events of a valid spec's plan
            await self._notify(namespace, spec.notifications, sending)

    async def _secret_value(self, namespace: str, ref: SecretKeyRef) -> str:
        secret = await get_or_none(self.client, Secret, ref.name, namespace)
        data = (secret or {}).get("data") or {}
        if ref.key not in data:
            raise ValueError(f"notifications: Secret {namespace}/{ref.name} has no key {ref.key!r}")
        return base64.b64decode(data[ref.key]).decode().strip()

    async def _notify(self, namespace: str, settings: Notifications, sending: list[notify.Notice]) -> None:
        try:
            for slack in settings.slack:
                url = await self._secret_value(namespace, slack.webhook_secret)
                for notice in sending:
                    self.sender.send(url, notify.slack_message(notice, slack.channel))
            for hook in settings.webhooks:
                url = hook.url or await self._secret_value(namespace, hook.url_secret)  # type: ignore[arg-type]
                for notice in sending:
                    self.sender.send(url, notify.webhook_payload(notice))
        except Exception as error:  # a notification must never fail the rollout
            log.warning(
                "notifications not sent: %s", error, extra=about(KIND, *sending[0].rollout.split("/", 1))
            )
