"""The operator: kopf watches, one reconcile per resource at a time, all I/O asynchronous.

Level-based: any change of a resource or of its children (StatefulSet, pods) leads to the
same reconcile of the resource, which plans from what it observes. A resource's reconciles
never overlap; requests that arrive during one are folded into a single rerun.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import kopf
from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import ConfigMap, Event, Pod, Secret, Service
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from framework import metrics
from framework.catalog import Catalog
from framework.children import Children
from framework.crd import GROUP, VERSION
from framework.plugin import LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, MANAGER, Observed, ServicePlugin
from framework.reconcile import API_VERSION, EventNote, Plan, plan, status_changed

log = logging.getLogger("statefleet")

CHILD_RESOURCES = {
    "ConfigMap": ConfigMap,
    "Service": Service,
    "PodDisruptionBudget": PodDisruptionBudget,
    "StatefulSet": StatefulSet,
}


def resource_class(plugin: ServicePlugin) -> Any:
    return create_namespaced_resource(GROUP, VERSION, plugin.kind, plugin.plural)


def about(kind: str, namespace: str, name: str, api_version: str = API_VERSION) -> dict[str, Any]:
    """`extra` for a log line about one object: JSON logs carry it as `object`, as kopf's do."""
    return {"k8s_ref": {"apiVersion": api_version, "kind": kind, "namespace": namespace, "name": name}}


class Operator:
    def __init__(self, client: AsyncClient, catalog: Catalog, plugins: Iterable[ServicePlugin]) -> None:
        self.client = client
        self.catalog = catalog
        self.plugins = {plugin.service: plugin for plugin in plugins}
        self._locks: dict[tuple[str, str, str], asyncio.Lock] = {}
        self._dirty: set[tuple[str, str, str]] = set()
        self._readiness: dict[tuple[str, str, str], bool] = {}
        self._failures: dict[tuple[str, str, str], int] = {}
        self._written: dict[tuple[str, str, str], str] = {}  # resourceVersion of our last status write
        self._background: set[asyncio.Future[None]] = set()
        self._scheduled: set[tuple[str, str, str]] = set()
        self.children = Children()
        # Set by the first handler call, which kopf makes only once its indexes are filled.
        self._watching = asyncio.Event()

    # --- observe ------------------------------------------------------------------------
    async def _get(self, resource: Any, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return (await self.client.get(resource, name, namespace=namespace)).to_dict()
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise

    async def observe(self, plugin: ServicePlugin, body: dict[str, Any], thorough: bool) -> Observed:
        """The resource's children, as the watches last delivered them (no request).

        Generated Secrets are read only on `thorough` passes (the periodic resync): before the
        first apply they are simply created (a conflict means they exist), and once made they
        are never remade, so a status that records an apply means they exist; a deleted one is
        recreated by the next resync."""
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        statefulset, pods = self.children.of(plugin.service, namespace, name)
        secrets: dict[str, dict[str, Any]] = {}
        applied_before = bool((body.get("status") or {}).get("childrenHash"))
        for generated in plugin.generated_secrets:
            if not thorough:
                if applied_before:
                    secrets[generated.suffix] = {}  # exists: made by the pass that applied the children
                continue
            secret = await self._get(Secret, generated.name(name), namespace)
            if secret is not None:
                secrets[generated.suffix] = secret
        return Observed(
            name=name,
            namespace=namespace,
            generation=body["metadata"].get("generation", 0),
            spec=dict(body.get("spec") or {}),
            status=dict(body.get("status") or {}),
            statefulset=statefulset,
            pods=sorted(pods, key=lambda p: p["metadata"]["name"]),
            secrets=secrets,
        )

    # --- act --------------------------------------------------------------------------------
    async def execute(
        self, plugin: ServicePlugin, body: dict[str, Any], planned: Plan, observed: Observed
    ) -> None:
        for secret in planned.secrets_to_create:
            try:
                await self.client.create(codecs.from_dict(secret))
            except ApiError as error:
                if error.status.code != 409:  # made by an earlier pass: never regenerate
                    raise
        if planned.apply and planned.children:
            for child in planned.children:
                await self.client.apply(codecs.from_dict(child), field_manager=MANAGER, force=True)
                metrics.CHILD_APPLIES.labels(plugin.kind, child["kind"]).inc()
            log.info(
                "applied %d children (render %s)",
                len(planned.children),
                planned.status.get("childrenHash"),
                extra=about(plugin.kind, observed.namespace, observed.name),
            )
            if observed.status.get("childrenHash"):  # before the first apply there is nothing to prune
                await self._prune(plugin, observed, planned.children)
        # Always: a pod that comes back (deleted, evicted) must get its role label at once.
        await self._label_pods(observed, planned.pod_labels)
        if status_changed(observed.status, planned.status):
            written = await self.client.patch(
                resource_class(plugin).Status,
                observed.name,
                {"status": planned.status},
                namespace=observed.namespace,
                patch_type=PatchType.MERGE,
            )
            self._written[(plugin.service, observed.namespace, observed.name)] = (
                written.metadata.resourceVersion
            )
        for note in planned.events:
            log.log(
                logging.WARNING if note.type == "Warning" else logging.INFO,
                "%s: %s",
                note.reason,
                note.message,
                extra=about(plugin.kind, observed.namespace, observed.name),
            )
            await self.post_event(plugin, body, note)

    async def _prune(self, plugin: ServicePlugin, observed: Observed, children: list[dict[str, Any]]) -> None:
        wanted = {(c["kind"], c["metadata"]["name"]) for c in children}
        selector = {LABEL_NAME: plugin.service, LABEL_INSTANCE: observed.name, LABEL_MANAGED_BY: MANAGER}
        for kind in plugin.child_kinds:
            resource = CHILD_RESOURCES[kind]
            async for existing in self.client.list(resource, namespace=observed.namespace, labels=selector):
                if (kind, existing.metadata.name) not in wanted:
                    log.info(
                        "deleting %s %s: no longer rendered",
                        kind,
                        existing.metadata.name,
                        extra=about(plugin.kind, observed.namespace, observed.name),
                    )
                    await self.client.delete(resource, existing.metadata.name, namespace=observed.namespace)

    async def _label_pods(self, observed: Observed, pod_labels: dict[str, dict[str, str]]) -> None:
        current = {p["metadata"]["name"]: p["metadata"].get("labels") or {} for p in observed.pods}
        for pod, labels in pod_labels.items():
            if pod in current and any(current[pod].get(k) != v for k, v in labels.items()):
                await self.client.patch(
                    Pod,
                    pod,
                    {"metadata": {"labels": labels}},
                    namespace=observed.namespace,
                    patch_type=PatchType.MERGE,
                )

    async def post_event(self, plugin: ServicePlugin, body: dict[str, Any], note: EventNote) -> None:
        meta = body["metadata"]
        now = datetime.now(UTC)
        event = Event(
            metadata=ObjectMeta(generateName=f"{meta['name']}.", namespace=meta["namespace"]),
            involvedObject=ObjectReference(
                apiVersion=API_VERSION,
                kind=plugin.kind,
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
            ),
            reason=note.reason,
            message=note.message,
            type=note.type,
            source=EventSource(component=MANAGER),
            reportingComponent=MANAGER,
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        await self.client.create(event)

    # --- the loop ---------------------------------------------------------------------------
    async def reconcile(
        self, plugin: ServicePlugin, namespace: str, name: str, force_apply: bool = False
    ) -> None:
        key = (plugin.service, namespace, name)
        lock = self._locks.setdefault(key, asyncio.Lock())
        if lock.locked():
            self._dirty.add(key)  # the running pass will go round once more
            return
        async with lock:
            while True:
                self._dirty.discard(key)
                try:
                    body = await self._get(resource_class(plugin), name, namespace)
                    if body is None or body["metadata"].get("deletionTimestamp"):
                        self._forget(key)
                        return
                    with metrics.timed_reconcile(plugin.kind):
                        observed = await self.observe(plugin, body, thorough=force_apply)
                        planned = plan(plugin, observed, self.catalog, body["metadata"]["uid"], force_apply)
                        await self.execute(plugin, body, planned, observed)
                except Exception:
                    self._retry_later(plugin, key)
                    return
                self._failures.pop(key, None)
                self._record_readiness(plugin, key, planned)
                if key not in self._dirty:
                    return

    def reconcile_soon(self, plugin: ServicePlugin, namespace: str, name: str, delay: float = 0.5) -> None:
        """One pass for a burst of child events (a pod's status, then its StatefulSet's, ...):
        the first event schedules it, the others within `delay` join it."""
        key = (plugin.service, namespace, name)
        if key in self._scheduled:
            return
        self._scheduled.add(key)

        async def later() -> None:
            await asyncio.sleep(delay)
            self._scheduled.discard(key)
            await self.reconcile(plugin, namespace, name)

        self._keep(asyncio.ensure_future(later()))

    def _keep(self, task: asyncio.Future[None]) -> None:
        self._background.add(task)  # a task nobody references may be collected mid-flight
        task.add_done_callback(self._background.discard)

    def _retry_later(self, plugin: ServicePlugin, key: tuple[str, str, str]) -> None:
        """A failed pass is retried after 2, 4, 8 ... 60 s: never hot, never forgotten."""
        attempt = self._failures.get(key, 0) + 1
        self._failures[key] = attempt
        delay = min(60, 2**attempt)
        _, namespace, name = key
        log.exception(
            "reconcile failed (attempt %d); retry in %ss",
            attempt,
            delay,
            extra=about(plugin.kind, namespace, name),
        )

        def retry() -> None:
            self._keep(asyncio.ensure_future(self.reconcile(plugin, namespace, name)))

        asyncio.get_running_loop().call_later(delay, retry)

    def _forget(self, key: tuple[str, str, str]) -> None:
        self._locks.pop(key, None)
        self._readiness.pop(key, None)
        self._failures.pop(key, None)
        self._written.pop(key, None)

    def _record_readiness(self, plugin: ServicePlugin, key: tuple[str, str, str], planned: Plan) -> None:
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in planned.status.get("conditions", [])
        )
        self._readiness[key] = ready
        mine = [v for k, v in self._readiness.items() if k[0] == plugin.service]
        metrics.READY.labels(plugin.kind).set(sum(mine))
        metrics.NOT_READY.labels(plugin.kind).set(len(mine) - sum(mine))

    def register(self) -> None:
        """kopf handlers: the resources themselves, and their children, all into `reconcile`."""
        self.children.register()
        for plugin in self.plugins.values():
            self._register_plugin(plugin)

        async def child_changed(body: dict[str, Any], **_: Any) -> None:
            self._watching.set()
            labels = body.get("metadata", {}).get("labels") or {}
            plugin = self.plugins.get(labels.get(LABEL_NAME, ""))
            if plugin and labels.get(LABEL_INSTANCE):
                self.reconcile_soon(plugin, body["metadata"]["namespace"], labels[LABEL_INSTANCE])

        managed = {LABEL_MANAGED_BY: MANAGER}
        kopf.on.event("apps", "v1", "statefulsets", labels=managed, id="statefulset-changed")(child_changed)
        kopf.on.event(
            "",
            "v1",
            "pods",
            labels={LABEL_INSTANCE: kopf.PRESENT, LABEL_NAME: kopf.PRESENT},
            id="pod-changed",
        )(child_changed)

    def _register_plugin(self, plugin: ServicePlugin) -> None:
        async def resource_changed(body: dict[str, Any], **_: Any) -> None:
            self._watching.set()
            meta = body["metadata"]
            if self._written.get((plugin.service, meta["namespace"], meta["name"])) == meta.get(
                "resourceVersion"
            ):
                return  # the echo of our own status write: nothing new to observe
            await self.reconcile(plugin, meta["namespace"], meta["name"])

        kopf.on.event(GROUP, VERSION, plugin.plural, id=f"{plugin.service}-changed")(resource_changed)

    async def resync_forever(self, namespaces: list[str], interval: float = 60) -> None:
        """Reconciles every resource now and then: retries what failed, repairs drift that no
        event announced (a child edited by hand). Ours rather than kopf's timers, which would
        put a finalizer on every resource."""
        while True:
            await asyncio.sleep(interval)
            if not self._watching.is_set():
                continue  # kopf's first listings are not in yet: children would look missing
            for plugin in self.plugins.values():
                try:
                    async for resource in self.client.list(resource_class(plugin), namespace="*"):
                        namespace = resource.metadata.namespace
                        if namespaces and not any(fnmatch.fnmatchcase(namespace, p) for p in namespaces):
                            continue
                        await self.reconcile(plugin, namespace, resource.metadata.name, force_apply=True)
                except Exception:
                    log.exception("resync of %s failed; next in %ss", plugin.plural, interval)
