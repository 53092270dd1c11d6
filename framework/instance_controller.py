"""The operator: kopf watches, one reconcile per resource at a time, all I/O asynchronous.

Level-based: any change of a resource or of its children (StatefulSet, pods) leads to the
same reconcile of the resource, which plans from what it observes. A resource's reconciles
never overlap; requests that arrive during one are folded into a single rerun.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import kopf
from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret, Service
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from framework import credentials
from framework.catalog import Catalog
from framework.certificates import CERT_MANAGER, choose_tls_provider
from framework.instance_plan import Plan, plan
from framework.kube import metrics
from framework.kube.api import EventNote, about, get_or_none, not_found, pods_refused, post_event
from framework.kube.meta import GROUP, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, MANAGER, VERSION
from framework.kube.queue import WorkQueue
from framework.kube.runtime import StaleStatus, StatusWriter, resync_forever
from framework.kube.secrets import NEXT_PASSWORD, PASSWORD
from framework.kube.status import decides
from framework.network_policy import NetworkPolicies
from framework.plugin import TLS_CA, TLS_SERVER, Inspection, Observed, ServicePlugin, random_text
from framework.rollout.controller import Rollout, RolloutController

log = logging.getLogger("statefleet")

Certificate = create_namespaced_resource("cert-manager.io", "v1", "Certificate", "certificates")
Issuer = create_namespaced_resource("cert-manager.io", "v1", "Issuer", "issuers")  # codecs read it

CHILD_RESOURCES = {
    "ConfigMap": ConfigMap,
    "Service": Service,
    "PodDisruptionBudget": PodDisruptionBudget,
    "StatefulSet": StatefulSet,
    "StatefulsetRollout": Rollout,
    "NetworkPolicy": NetworkPolicy,
}
# Children the framework itself renders for every plugin (pruned whatever the plugin renders):
# the NetworkPolicy, when the operator makes them.
FRAMEWORK_CHILD_KINDS = ("NetworkPolicy",)
BINDINGS_INDEX = "statefleet-bindings-by-instance"
BINDINGS_PLURAL = "servicebindings"


def binding_key(body: Any) -> tuple[str, str, str] | None:
    """The instance a ServiceBinding names: (namespace, kind, name)."""
    service = (body.get("spec") or {}).get("service") or {}
    namespace = (body.get("metadata") or {}).get("namespace")
    if not (namespace and service.get("kind") and service.get("name")):
        return None
    return (namespace, service["kind"], service["name"])


async def index_binding(body: kopf.Body, **_: Any) -> dict[tuple[str, str, str], dict[str, Any]]:
    """A ServiceBinding, by the instance it names: its name and spec (what a NetworkPolicy needs)."""
    key = binding_key(body)
    if key is None:
        return {}
    metadata = {k: body["metadata"][k] for k in ("name", "deletionTimestamp") if body["metadata"].get(k)}
    return {key: {"metadata": metadata, "spec": dict(body.get("spec") or {})}}


def rotation_moved(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """A credentials rotation went a step further on this pass and is not done yet."""
    was, now = before.get(credentials.STATUS_FIELD) or {}, after.get(credentials.STATUS_FIELD) or {}
    return credentials.under_way(now) and (was.get("phase"), was.get("requested")) != (
        now.get("phase"),
        now.get("requested"),
    )


class InstanceController:
    """The controller of every service instance (of every plugin's kind): observe, plan
    (`framework.instance_plan`), execute."""

    def __init__(
        self,
        client: AsyncClient,
        catalog: Catalog,
        plugins: Iterable[ServicePlugin],
        rollouts: RolloutController,
        tools_image: str = "",
        network_policies: NetworkPolicies | None = None,
    ) -> None:
        self.client = client
        self.tools_image = tools_image
        # None: the operator makes no NetworkPolicies (and prunes those it made before).
        self.network_policies = network_policies
        self._bindings: Any = {}  # kopf's index of ServiceBindings by instance, when they are needed
        # A binding's uid -> the instance it named and its workload, as last seen.
        self._bound_to: dict[str, tuple[tuple[str, str, str] | None, str]] = {}
        self.catalog = catalog
        self.plugins = {plugin.service: plugin for plugin in plugins}
        self.queue = WorkQueue(self._reconcile_once, self._describe)
        self._readiness: dict[tuple[str, str, str], bool] = {}
        self.status = StatusWriter[tuple[str, str, str]](client)
        # A service's StatefulSet and pods belong to its StatefulsetRollout (same name): the
        # rollout controller's indexes hold them, one copy for both controllers.
        self.rollouts = rollouts
        # Set by the first handler call, which kopf makes only once its indexes are filled.
        self._watching = asyncio.Event()
        # What each resource's servers last said, asked in the background (never inside a
        # reconcile: a server that does not answer must not hold the others up).
        self._inspections: dict[tuple[str, str, str], Inspection] = {}
        self._inspecting: dict[tuple[str, str, str], asyncio.TimerHandle | asyncio.Task[None]] = {}
        self._silent: dict[tuple[str, str, str], int] = {}  # inspections in a row nobody answered
        self._inspect_basis: dict[tuple[str, str, str], Observed] = {}  # what the next one asks with
        self._inspectors = asyncio.Semaphore(32)

    async def cert_manager_served(self, namespace: str) -> bool:
        """Whether cert-manager's API is served. Asked only for instances whose certificates
        have no provider yet, so once per new instance, not on every pass."""
        try:
            async for _ in self.client.list(Certificate, namespace=namespace, chunk_size=1):
                break
            return True
        except Exception as error:
            if not not_found(error):
                log.warning("cannot tell whether cert-manager is installed: %s", error)
            return False

    # --- observe ------------------------------------------------------------------------
    async def observe(self, plugin: ServicePlugin, body: dict[str, Any], thorough: bool) -> Observed:
        """The resource's children, as the watches last delivered them (no request).

        Generated Secrets are read only on `thorough` passes (the periodic resync), and on every
        pass while a credentials rotation is asked for or under way (`framework.credentials`):
        before the first apply they are simply created (a conflict means they exist), and once
        made they are never remade, so a status that records an apply means they exist; a deleted
        one is recreated by the next resync."""
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        statefulset, pods = self.rollouts.children((namespace, name))
        secrets: dict[str, dict[str, Any]] = {}
        applied_before = bool((body.get("status") or {}).get("childrenHash"))
        rotating = plugin.rotation is not None and credentials.pending(
            body.get("spec") or {}, body.get("status") or {}
        )
        for generated in plugin.generated_secrets:
            if not thorough and not rotating:
                if applied_before:
                    secrets[generated.suffix] = {}  # exists: made by the pass that applied the children
                continue
            secret = await get_or_none(self.client, Secret, generated.name(name), namespace)
            if secret is not None:
                secrets[generated.suffix] = secret
        tls_status = (body.get("status") or {}).get("tls") or {}
        cert_manager, certificate, ca_certificate = False, None, None
        if plugin.tls is not None:
            # Read on resyncs (a certificate is renewed weeks before it expires), and until the
            # status shows one issued (an instance from before TLS gets them at once).
            issued = bool(tls_status.get("notAfter"))
            for suffix in (TLS_CA, TLS_SERVER):
                if not thorough and applied_before and issued:
                    secrets[suffix] = {}
                    continue
                secret = await get_or_none(self.client, Secret, f"{name}-{suffix}", namespace)
                if secret is not None:
                    secrets[suffix] = secret
            # Asked only while the instance has no provider yet: once chosen, it is kept.
            cert_manager = not tls_status and await self.cert_manager_served(namespace)
            server = secrets.get(TLS_SERVER)
            if server != {} and choose_tls_provider(tls_status, server, cert_manager) == CERT_MANAGER:
                certificate = await get_or_none(self.client, Certificate, f"{name}-{TLS_SERVER}", namespace)
                ca_certificate = await get_or_none(self.client, Certificate, f"{name}-{TLS_CA}", namespace)
        refused = None
        if statefulset and len(pods) < ((statefulset.get("spec") or {}).get("replicas") or 0):
            # Asked only while pods are missing: the StatefulSet controller says why in Events.
            newest = max((p["metadata"].get("creationTimestamp") or "" for p in pods), default="")
            sts = statefulset["metadata"]["name"]
            refused = await pods_refused(self.client, namespace, "StatefulSet", sts, newest or None)
        references = {
            key: await get_or_none(self.client, reference.resource, reference.name, namespace)
            for key, reference in plugin.references(dict(body.get("spec") or {})).items()
        }
        bindings = (
            [dict(b) for b in self._bindings.get((namespace, plugin.kind, name), ())]
            if self.network_policies is not None
            else []
        )
        return Observed(
            name=name,
            namespace=namespace,
            generation=body["metadata"].get("generation", 0),
            spec=dict(body.get("spec") or {}),
            status=dict(body.get("status") or {}),
            annotations=dict(body["metadata"].get("annotations") or {}),
            statefulset=statefulset,
            pods=sorted(pods, key=lambda p: p["metadata"]["name"]),
            secrets=secrets,
            inspection=self._inspections.get((plugin.service, namespace, name)),
            clock=asyncio.get_running_loop().time(),
            cert_manager=cert_manager,
            certificate=certificate,
            ca_certificate=ca_certificate,
            references=references,
            pods_refused=refused,
            bindings=bindings,
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
        for secret in planned.secrets_to_apply:
            await self.client.apply(codecs.from_dict(secret), field_manager=MANAGER, force=True)
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
        key = (plugin.service, observed.namespace, observed.name)
        written = observed.status
        if decides(plugin.decisive_status, observed.status, planned.status):
            # A decision (who is the primary, a change started) is recorded before anything acts
            # on it, over the status it was made from: of two operators that decided at once,
            # only one acts; the other's write fails and it plans again from what is true now.
            # Only the decision: what the actions will do (a reload, a certificate) is recorded
            # once they did it.
            written = copy.deepcopy(observed.status)
            for field in plugin.decisive_status:
                if field in planned.status:
                    written[field] = copy.deepcopy(planned.status[field])
                else:
                    written.pop(field, None)
            decided = await self._write_status(
                plugin, key, body, observed, observed.status, written, precondition=True
            )
            if not decided:
                return
        # Always: a pod that comes back (deleted, evicted) must get its role label at once.
        await self._label_pods(observed, planned.operations.pod_labels)
        for action in planned.operations.actions:
            log.info("%s", action, extra=about(plugin.kind, observed.namespace, observed.name))
            if isinstance(action, credentials.StageCredentials):
                await self._stage_credentials(observed.namespace, action)
            elif isinstance(action, credentials.SwapCredentials):
                await self._swap_credentials(observed.namespace, action)
            else:
                await plugin.perform(self.client, observed, action)
        await self._apply_tls_resources(plugin, body, planned)
        # What the actions did (or that cert-manager refused) is recorded after them.
        if not await self._write_status(
            plugin, key, body, observed, written, planned.status, precondition=False
        ):
            return
        for note in planned.events:
            await post_event(self.client, plugin.kind, body, note)

    async def _stage_credentials(self, namespace: str, action: credentials.StageCredentials) -> None:
        """A new `next-password` in each Secret without one (one staged already is kept: the
        servers may take it). Written over the version read: of two writers, one stages."""
        for name in action.secrets:
            secret = (await self.client.get(Secret, name, namespace=namespace)).to_dict()
            if NEXT_PASSWORD in (secret.get("data") or {}):
                continue
            staged = base64.b64encode(random_text(action.length).encode()).decode()
            change = {
                "metadata": {"resourceVersion": secret["metadata"]["resourceVersion"]},
                "data": {NEXT_PASSWORD: staged},
            }
            await self.client.patch(Secret, name, change, namespace=namespace, patch_type=PatchType.MERGE)

    async def _swap_credentials(self, namespace: str, action: credentials.SwapCredentials) -> None:
        """Each Secret's `next-password` becomes its `password` (one without is swapped already)."""
        for name in action.secrets:
            secret = (await self.client.get(Secret, name, namespace=namespace)).to_dict()
            staged = (secret.get("data") or {}).get(NEXT_PASSWORD)
            if not staged:
                continue
            change = {
                "metadata": {"resourceVersion": secret["metadata"]["resourceVersion"]},
                "data": {PASSWORD: staged, NEXT_PASSWORD: None},
            }
            await self.client.patch(Secret, name, change, namespace=namespace, patch_type=PatchType.MERGE)

    async def _write_status(
        self,
        plugin: ServicePlugin,
        key: tuple[str, str, str],
        body: dict[str, Any],
        observed: Observed,
        current: dict[str, Any],
        desired: dict[str, Any],
        precondition: bool,
    ) -> bool:
        """Whether the status was written (or needed nothing); a stale decisive write sends the
        resource round again at once."""
        try:
            await self.status.write(key, plugin.resource(), body, current, desired, precondition=precondition)
        except StaleStatus as stale:
            # Another writer (a second operator, a stale leader) changed it: this decision was
            # made on what is no longer true. The running pass goes round again at once.
            log.warning(
                "%s: planning again", stale, extra=about(plugin.kind, observed.namespace, observed.name)
            )
            await self.queue.process(key)
            return False
        return True

    async def _apply_tls_resources(self, plugin: ServicePlugin, body: dict[str, Any], planned: Plan) -> None:
        """After the service's own actions: cert-manager refusing (or gone) must not stop a failover."""
        try:
            for resource in planned.tls_resources:
                await self.client.apply(codecs.from_dict(resource), field_manager=MANAGER, force=True)
        except Exception as error:  # refused, or cert-manager's API no longer served
            planned.status.get("tls", {}).pop("resourcesHash", None)  # so the next pass tries again
            reason = error.status.message if isinstance(error, ApiError) else str(error).splitlines()[0]
            message = f"cert-manager's objects could not be applied: {reason}"
            await post_event(
                self.client, plugin.kind, body, EventNote("Warning", "CertificateFailed", message)
            )

    async def _prune(self, plugin: ServicePlugin, observed: Observed, children: list[dict[str, Any]]) -> None:
        wanted = {(c["kind"], c["metadata"]["name"]) for c in children}
        selector = {LABEL_NAME: plugin.service, LABEL_INSTANCE: observed.name, LABEL_MANAGED_BY: MANAGER}
        for kind in (*plugin.child_kinds, *FRAMEWORK_CHILD_KINDS):
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

    # --- the loop ---------------------------------------------------------------------------
    async def reconcile(
        self, plugin: ServicePlugin, namespace: str, name: str, force_apply: bool = False
    ) -> None:
        await self.queue.process((plugin.service, namespace, name), thorough=force_apply)

    async def _reconcile_once(self, key: tuple[str, str, str], force_apply: bool) -> None:
        service, namespace, name = key
        plugin = self.plugins[service]
        body = await get_or_none(self.client, plugin.resource(), name, namespace)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._forget(key)
            return
        with metrics.timed_reconcile(plugin.kind):
            observed = await self.observe(plugin, body, thorough=force_apply)
            planned = plan(
                plugin,
                observed,
                self.catalog,
                body["metadata"]["uid"],
                force_apply,
                time.time(),
                self.tools_image,
                self.network_policies,
            )
            try:
                await self.execute(plugin, body, planned, observed)
                if rotation_moved(observed.status, planned.status):
                    # The next step at once: between the servers taking the new passwords and
                    # the Secrets holding them, a login with the Secret's password fails.
                    self.queue.soon(key, delay=0)
            finally:
                self._inspect_later(
                    plugin, key, replace(observed, status=planned.status), planned.operations.inspect_in
                )
        self._record_readiness(plugin, key, planned)

    # --- asking the servers -------------------------------------------------------------------
    def _inspect_later(
        self, plugin: ServicePlugin, key: tuple[str, str, str], observed: Observed, delay: float | None
    ) -> None:
        """One inspection in `delay` seconds (backing off while no server answers), then a pass
        with what it found. An earlier one already due is kept."""
        if delay is None:
            return
        self._inspect_basis[key] = observed  # a timer already set still asks with the latest status
        silent = self._silent.get(key, 0)
        if silent:
            delay = max(delay, min(60.0, 2.0**silent))
        loop = asyncio.get_running_loop()
        pending = self._inspecting.get(key)
        if isinstance(pending, asyncio.Task) and not pending.done():
            return  # one is under way; its pass plans the next
        if isinstance(pending, asyncio.TimerHandle):
            if pending.when() <= loop.time() + delay:
                return
            pending.cancel()

        def start() -> None:
            self._inspecting[key] = asyncio.ensure_future(self._inspect(plugin, key, observed))

        self._inspecting[key] = loop.call_later(delay, start)

    async def _inspect(self, plugin: ServicePlugin, key: tuple[str, str, str], observed: Observed) -> None:
        _, namespace, name = key
        try:
            # The freshest pods (an IP may have changed since `observed`).
            statefulset, pods = self.rollouts.children((namespace, name))
            current = replace(
                self._inspect_basis.get(key, observed),
                statefulset=statefulset,
                pods=sorted(pods, key=lambda p: p["metadata"]["name"]),
            )
            async with self._inspectors:
                inspection = await plugin.inspect(self.client, current, self._inspections.get(key))
        except Exception:
            log.exception("inspecting the servers failed", extra=about(plugin.kind, namespace, name))
            inspection = None
            self._silent[key] = self._silent.get(key, 0) + 1  # backs off like a silence
        finally:
            self._inspecting.pop(key, None)
        if inspection is not None:
            self._inspections[key] = inspection
            self._silent[key] = 0 if inspection.answered else self._silent.get(key, 0) + 1
        self.queue.soon(key, delay=0)

    def _describe(self, key: tuple[str, str, str]) -> dict[str, Any]:
        service, namespace, name = key
        return about(self.plugins[service].kind, namespace, name)

    def _forget(self, key: tuple[str, str, str]) -> None:
        self.queue.forget(key)
        self._inspections.pop(key, None)
        self._silent.pop(key, None)
        self._inspect_basis.pop(key, None)
        pending = self._inspecting.pop(key, None)
        if pending is not None:
            pending.cancel()
        self._readiness.pop(key, None)
        self.status.forget(key)

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
        for plugin in self.plugins.values():
            self._register_plugin(plugin)

        async def child_changed(body: dict[str, Any], **_: Any) -> None:
            self._watching.set()
            labels = body.get("metadata", {}).get("labels") or {}
            plugin = self.plugins.get(labels.get(LABEL_NAME, ""))
            if plugin and labels.get(LABEL_INSTANCE):
                key = (plugin.service, body["metadata"]["namespace"], labels[LABEL_INSTANCE])
                self._silent.pop(key, None)  # something changed: ask the servers without backing off
                self.queue.soon(key)  # one pass for a burst (a pod's status, then its StatefulSet's)

        managed = {LABEL_MANAGED_BY: MANAGER}
        kopf.on.event("apps", "v1", "statefulsets", labels=managed, id="statefulset-changed")(child_changed)
        if self.network_policies is not None:
            self._register_bindings()
        kopf.on.event(
            "",
            "v1",
            "pods",
            labels={LABEL_INSTANCE: kopf.PRESENT, LABEL_NAME: kopf.PRESENT},
            id="pod-changed",
        )(child_changed)

    def _register_bindings(self) -> None:
        """The ServiceBindings, indexed by the instance they name (no request per pass); a
        binding made, changed or deleted sends its instance round (and the one it named
        before), whose NetworkPolicy then lets its workload in or no longer does."""
        kopf.index(GROUP, VERSION, BINDINGS_PLURAL, id=BINDINGS_INDEX)(index_binding)

        @kopf.on.startup(id="statefleet-bindings-index")
        async def attach(**indices: Any) -> None:
            self._bindings = indices[BINDINGS_INDEX]

        by_kind = {plugin.kind: plugin for plugin in self.plugins.values()}

        async def binding_changed(body: kopf.Body, type: str | None = None, **_: Any) -> None:
            uid = body["metadata"].get("uid", "")
            now = binding_key(body)
            seen = (now, repr((body.get("spec") or {}).get("workload")))
            if type != "DELETED" and self._bound_to.get(uid) == seen:
                return  # its status written, or nothing a policy reads: no pass
            keys = {(self._bound_to.pop(uid, None) or (None, ""))[0]}
            if type != "DELETED" and now is not None:
                self._bound_to[uid] = seen
            keys.add(now)
            for key in keys:
                plugin = by_kind.get(key[1]) if key else None
                if key is not None and plugin is not None:
                    self.queue.soon((plugin.service, key[0], key[2]))

        kopf.on.event(GROUP, VERSION, BINDINGS_PLURAL, id="binding-changed-instance")(binding_changed)

    def _register_plugin(self, plugin: ServicePlugin) -> None:
        async def resource_changed(body: dict[str, Any], **_: Any) -> None:
            self._watching.set()
            meta = body["metadata"]
            if self.status.is_echo((plugin.service, meta["namespace"], meta["name"]), body):
                return  # the echo of our own status write: nothing new to observe
            await self.reconcile(plugin, meta["namespace"], meta["name"])

        kopf.on.event(GROUP, VERSION, plugin.plural, id=f"{plugin.service}-changed")(resource_changed)

    async def resync_forever(self, namespaces: list[str], interval: float = 60) -> None:
        """Every resource now and then, its children applied again (`runtime.resync_forever`);
        not before kopf's first listings are in, or children would look missing."""

        async def again(service: str, namespace: str, name: str) -> None:
            await self.reconcile(self.plugins[service], namespace, name, force_apply=True)

        resources = {plugin.service: plugin.resource() for plugin in self.plugins.values()}
        await resync_forever(self.client, resources, namespaces, interval, again, self._watching.is_set)
