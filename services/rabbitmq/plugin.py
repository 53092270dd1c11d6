"""RabbitMQ: a cluster of nodes that forms by itself on the headless Service."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import quote

import httpx2
from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import CascadeType

from framework.catalog import ResolvedVersion
from framework.certificates import service_hosts
from framework.kube.api import EventNote
from framework.kube.jobs import read_job
from framework.kube.meta import content_hash, owner_reference
from framework.kube.pods import booting_since, pod_ip
from framework.kube.secrets import NEXT_PASSWORD, PASSWORD, decoded
from framework.kube.times import format_time
from framework.network_policy import client_labels
from framework.plugin import (
    CHANGE_REFUSED,
    TLS_SERVER,
    Backups,
    Bindings,
    GeneratedSecret,
    Inspection,
    Observed,
    Operations,
    Refusal,
    Rotation,
    ServicePlan,
    ServicePlugin,
    ServiceStatus,
    Tls,
    UnknownAction,
    decided,
)
from framework.servers import Answers, ask_servers, ready_of, ready_pods
from framework.volumes import claim_context, refuse_storage_change
from services.rabbitmq import inter_node, scale_down
from services.rabbitmq.cluster import ClusterView, NodeAnswer, node_name, pod_of, read_cluster
from services.rabbitmq.management import AMQPS_PORT, MANAGEMENT_TLS_PORT, Management, ManagementError
from services.rabbitmq.spec import RabbitMQSpec, RabbitMQStatus, config_hazard
from services.rabbitmq.users import RabbitMQPermissionKind, RabbitMQUserKind, RabbitMQVhostKind

DEFAULT_USER = GeneratedSecret("default-user", random=("username", "password"))
ERLANG_COOKIE = GeneratedSecret("erlang-cookie", random=("cookie",), length=64)
MANAGEMENT = Management(DEFAULT_USER.name("{name}"), f"{{name}}-{TLS_SERVER}")
# Seconds between two inspections: often while the cluster forms or misses a node.
INSPECT_FORMING, INSPECT_FORMED = 3.0, 15.0
# A node not up this long after its container started, while other nodes serve, is stuck in its
# boot: RabbitMQ 3.10.8 on Erlang 25.1 and later can hang for good in `global:sync/0` (its own
# workaround is inert there: upstream issue 6034, fixed in 3.10.10), seen when a rollout restarts
# a node soon after another. A new start gets past it. 300 s is RabbitMQ's own patience in its
# boot (10 waits of 30 s for its tables); a cold start, with no other node up, waits as long as
# it takes.
STUCK_BOOT = 300.0


@dataclass(frozen=True)
class RestartNode:
    """Deletes the node's pod: its StatefulSet starts it again."""

    pod: str
    reason: str


def stuck_in_boot(observed: Observed, view: ClusterView, now: float) -> list[str]:
    """Pods whose node has not come up `STUCK_BOOT` seconds after it started (never Ready in
    this life: a node stopped by hand later, `rabbitmqctl stop_app`, is not booting) while
    another node is up: Ready, or running in the cluster (`now`: wall-clock seconds)."""
    running = {pod_of(node) for node in view.running} | ready_pods(observed)
    stuck = []
    for pod in observed.pods:
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp") or name in running:
            continue
        since = booting_since(pod)
        if since is not None and now - since > STUCK_BOOT and running - {name}:
            stuck.append(name)
    return stuck


@dataclass(frozen=True)
class NodeFacts:
    """An inspection's findings (`Inspection.facts`)."""

    nodes: Answers[NodeAnswer]
    # While scaling down: the queues (None: not asked, or no node answered), read after the Job.
    queues: list[scale_down.Queue] | None = None
    job: scale_down.JobReport | None = None


@dataclass(frozen=True)
class SetDefaultUserPassword:
    """The default user's password the Secret stages (`framework.credentials`: its
    `next-password`, else its `password`) set through the management API of the first of `nodes`
    that answers (the cluster shares its users), then checked to log in there."""

    nodes: tuple[str, ...]


class RabbitMQRotation(Rotation):
    """The default user's password (`spec.rotateCredentials`). The pods' RABBITMQ_DEFAULT_PASS
    counts only at a node's first boot, when it makes the user: no node restarts."""

    secrets = (DEFAULT_USER,)

    def waiting(self, observed: Observed) -> str | None:
        if scaling_down(int(observed.spec.get("replicas", 1)), observed):
            return "a scale-down is under way"
        facts: NodeFacts | None = observed.inspection.facts if observed.inspection else None
        answers = facts.nodes.current(observed) if facts else {}
        if not [pod for pod in ready_pods(observed) if answers.get(pod)]:
            return "no ready node answers its management API"
        return None

    def apply(self, observed: Observed) -> SetDefaultUserPassword:
        facts: NodeFacts | None = observed.inspection.facts if observed.inspection else None
        answers = facts.nodes.current(observed) if facts else {}
        answering = sorted(pod for pod in ready_pods(observed) if answers.get(pod))
        return SetDefaultUserPassword(tuple(answering or sorted(ready_pods(observed))))


def scaling_down(spec_replicas: int, observed: Observed) -> bool:
    running = ((observed.statefulset or {}).get("spec") or {}).get("replicas")
    return bool(observed.status.get("scaleDown")) or (running is not None and spec_replicas < running)


def scale_down_step(spec: RabbitMQSpec, observed: Observed, view: ClusterView, now: float) -> scale_down.Step:
    """Where a scale-down stands (`now`, wall-clock seconds, decides when a failed Job is
    tried again)."""
    facts: NodeFacts | None = observed.inspection.facts if observed.inspection else None
    return scale_down.step(
        name=observed.name,
        wanted=spec.replicas,
        running=((observed.statefulset or {}).get("spec") or {}).get("replicas"),
        state=observed.status.get("scaleDown"),
        pods=[pod["metadata"]["name"] for pod in observed.pods],
        members=list(view.members) if view.answered else None,
        queues=facts.queues if facts else None,
        job=facts.job if facts else None,
        node=lambda pod: node_name(pod, observed.name, observed.namespace),
        now=now,
    )


def cluster_view(spec: RabbitMQSpec, observed: Observed) -> ClusterView:
    """The cluster from the nodes' last answers, counting only answers from the pods' current lives."""
    facts: NodeFacts | None = observed.inspection.facts if observed.inspection else None
    answers = facts.nodes.current(observed) if facts else {}
    return read_cluster(observed.name, observed.namespace, spec.replicas, answers)


def inter_node_decision(
    spec: RabbitMQSpec, observed: Observed, view: ClusterView, scaling: bool, now: float
) -> inter_node.InterNode:
    """What the nodes' distribution speaks on this pass, and whether every node restarts."""
    return inter_node.decide(
        wanted=spec.tls.inter_node,
        status=observed.status,
        statefulset=observed.statefulset,
        pods=observed.pods,
        replicas=spec.replicas,
        whole=view.formed and ready_of(observed, spec.replicas) == spec.replicas,
        scaling_down=scaling,
        now=format_time(now),
    )


class RabbitMQTls(Tls):
    def hosts(self, name: str, namespace: str) -> list[str]:
        # The nodes' own names (rabbit@<pod>.<name>-nodes.<namespace>), which Erlang's
        # distribution over TLS checks the certificate against.
        return [*service_hosts([name], namespace, pods_of=f"{name}-nodes"), f"*.{name}-nodes.{namespace}"]


class RabbitMQBindings(Bindings):
    user_kind = "RabbitMQUser"

    def user_spec(self, binding: str, instance: str) -> dict[str, Any]:
        # Each application its own user and its own vhost, named after the binding.
        return {"instance": instance, "ownVhost": True}

    def secret_data(
        self, service: dict[str, Any], user: dict[str, Any], credentials: dict[str, str], ca: str | None
    ) -> dict[str, str]:
        meta, status = service["metadata"], user["status"]
        host = f"{meta['name']}.{meta['namespace']}.svc"
        username, vhost, password = status["username"], status["vhost"], credentials["password"]
        # TLS always (amqps; the plaintext listener may be off): clients verify the server with
        # the CA, which `ca.crt` holds.
        return {
            "type": "rabbitmq",
            "provider": "statefleet",
            "host": host,
            "port": str(AMQPS_PORT),
            "ssl": "true",
            **({"ca.crt": ca} if ca else {}),
            "username": username,
            "password": password,
            "virtual-host": vhost,
            "uri": f"amqps://{quote(username, safe='')}:{quote(password, safe='')}@{host}:{AMQPS_PORT}/"
            + quote(vhost, safe=""),
            # Spring Boot's spring.rabbitmq.addresses, whose amqps scheme turns TLS on.
            "addresses": f"amqps://{host}:{AMQPS_PORT}",
        }


class RabbitMQBackups(Backups):
    driver = "services.rabbitmq.backup_driver"
    methods = ("definitions",)
    throwaway_spec: ClassVar[dict[str, Any]] = {"replicas": 1}

    def job_env(self, name: str) -> list[dict[str, Any]]:
        return [
            {"name": "RABBITMQ_MANAGEMENT_URL", "value": f"https://{name}:{MANAGEMENT_TLS_PORT}"},
            {
                "name": "RABBITMQ_CA",
                "valueFrom": {"secretKeyRef": {"name": f"{name}-{TLS_SERVER}", "key": "ca.crt"}},
            },
            DEFAULT_USER.env("RABBITMQ_USERNAME", name, "username"),
            DEFAULT_USER.env("RABBITMQ_PASSWORD", name, "password"),
        ]


class RabbitMQPlugin(ServicePlugin):
    kind = "RabbitMQ"
    plural = "rabbitmqs"
    short_names = ("rmq",)
    service = "rabbitmq"
    spec_model = RabbitMQSpec
    generated_secrets = (DEFAULT_USER, ERLANG_COOKIE)
    child_kinds = ("ConfigMap", "Service", "PodDisruptionBudget", "StatefulsetRollout")
    # A scale-down runs RabbitMQ's CLI in Jobs.
    rbac_rules = ({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "create", "delete"]},)
    actions = (scale_down.DeleteJob, scale_down.RunCli, RestartNode, SetDefaultUserPassword)
    status_model = RabbitMQStatus
    bindings = RabbitMQBindings()
    backups = RabbitMQBackups()
    tls = RabbitMQTls()
    rotation = RabbitMQRotation()

    def in_service_kinds(self) -> list[Any]:
        return list(ACCESS_KINDS)

    def plan(
        self, spec: RabbitMQSpec, version: ResolvedVersion, observed: Observed, now: float
    ) -> ServicePlan:
        view = cluster_view(spec, observed)
        scaling = scaling_down(spec.replicas, observed)
        inter = inter_node_decision(spec, observed, view, scaling, now)
        # No scale-down while every node restarts (one under way holds the restart back).
        step = scale_down_step(spec, observed, view, now) if scaling and not inter.restarting else None
        if step:
            actions = tuple(
                replace(a, inter_node_tls=inter.cli_tls) if isinstance(a, scale_down.RunCli) else a
                for a in step.actions
            )
            step = replace(step, actions=actions)
        operations = self.operations(observed, view, step, stuck_in_boot(observed, view, now), inter)
        running = ((observed.statefulset or {}).get("spec") or {}).get("replicas")
        refusal = (
            config_hazard(spec.config)
            or inter_node.scale_down_held(spec.replicas, running, inter)
            or (step.refusal if step else None)
            or refuse_storage_change(spec.storage, observed)
        )
        if refusal:
            return ServicePlan(None, operations, refusal=Refusal(CHANGE_REFUSED, refusal))
        # The templates render from the status as read; the reading is of what was decided.
        return ServicePlan(
            self.reading(spec, decided(observed, operations), view, inter),
            operations,
            self.template_context(spec, version, observed, step, inter),
        )

    def template_context(
        self,
        spec: RabbitMQSpec,
        version: ResolvedVersion,
        observed: Observed,
        step: scale_down.Step | None,
        inter: inter_node.InterNode,
    ) -> dict[str, Any]:
        # Pods restart when what they read at start changes (not the peers: read when a node
        # first joins, so scaling restarts nobody).
        configuration = {"config": spec.config, "plugins": spec.enabled_plugins(), "version": version.version}
        replicas = step.replicas if step else spec.replicas
        return {
            "replicas": replicas,
            "cluster_state": "initialized" if observed.status.get("initialized") else "new",
            "peers": max(replicas, len(observed.pods)),
            "default_user_secret": DEFAULT_USER.name(observed.name),
            "cookie_secret": ERLANG_COOKIE.name(observed.name),
            "config_hash": content_hash(configuration),
            "inter_node_tls": inter.tls,
            "inter_node_erl_args": inter_node.ERL_ARGS,
            "inter_node_annotation": inter_node.ANNOTATION,
            "full_restart": inter.full_restart,
            **claim_context(spec.storage, observed),
        }

    def operations(
        self,
        observed: Observed,
        view: ClusterView,
        step: scale_down.Step | None,
        stuck: list[str],
        inter: inter_node.InterNode,
    ) -> Operations:
        status: dict[str, Any] = {
            # Once a node has answered, a node without data always joins the others.
            "initialized": observed.status.get("initialized") or view.answered > 0,
            "cluster": {
                "nodes": [pod_of(node) for node in view.running],
                "members": len(view.members),
                "formed": view.formed,
                "partitions": [pod_of(node) for node in view.partitions],
                "message": view.message,
            },
        }
        status.update(inter.status)
        before = observed.status.get("cluster") or {}
        events = list(inter.events)
        actions: list[Any] = []
        if step:
            status["scaleDown"] = step.state
            actions.extend(step.actions)
            events.extend(EventNote(*event) for event in step.events)
        for pod in stuck:
            why = f"{pod} has not come up {STUCK_BOOT:.0f} s after it started while the cluster runs"
            actions.append(RestartNode(pod, why))
            events.append(EventNote("Warning", "NodeStuck", f"{why}: its pod is deleted to start it again"))
        if view.formed and not before.get("formed"):
            events.append(EventNote("Normal", "ClusterFormed", view.message))
        if view.split and "separate clusters" not in before.get("message", ""):
            events.append(EventNote("Warning", "ClusterSplit", view.message))
        if view.partitions and not before.get("partitions"):
            events.append(EventNote("Warning", "NetworkPartition", view.message))
        return Operations(
            status=status,
            events=events,
            actions=actions,
            inspect_in=INSPECT_FORMED
            if view.formed and not status.get("scaleDown") and not inter.restarting
            else INSPECT_FORMING,
        )

    async def inspect(
        self, client: AsyncClient, observed: Observed, previous: Inspection | None
    ) -> Inspection | None:
        # The Job first: when it is seen ended, the nodes and queues below show what it did.
        scaling = scaling_down(int(observed.spec.get("replicas", 1)), observed)
        job = await self._scale_down_job(client, observed) if scaling else None
        nodes = await ask_servers(
            observed, lambda _, ip: MANAGEMENT.cluster(client, observed.namespace, observed.name, ip)
        )
        queues = None
        if scaling:
            answering = [pod_ip(pod) for pod in observed.pods if nodes.by_pod.get(pod["metadata"]["name"])]
            queues = await self._queues(client, observed, answering)
        return Inspection(
            at=asyncio.get_running_loop().time(),
            facts=NodeFacts(nodes, queues=queues, job=job),
            answered=nodes.answered,
        )

    async def _scale_down_job(self, client: AsyncClient, observed: Observed) -> scale_down.JobReport | None:
        name = (observed.status.get("scaleDown") or {}).get("job")
        if not name:
            return None
        job, state, _ = await read_job(client, observed.namespace, name)
        if job is None:
            return scale_down.JobReport(name, "Missing")
        return scale_down.JobReport(name, state.phase, state.message)

    async def _queues(
        self, client: AsyncClient, observed: Observed, ips: list[str | None]
    ) -> list[scale_down.Queue] | None:
        for ip in ips:
            try:
                reply = await MANAGEMENT.read(
                    client, observed.namespace, observed.name, ip, scale_down.QUEUES_PATH
                )
            except (ManagementError, OSError, ApiError, httpx2.HTTPError):
                continue
            return scale_down.parse_queues(reply or [])
        return None

    async def perform(self, client: AsyncClient, observed: Observed, action: Any) -> None:
        if isinstance(action, scale_down.DeleteJob):
            try:
                await client.delete(
                    Job, action.job, namespace=observed.namespace, cascade=CascadeType.BACKGROUND
                )
            except ApiError as error:
                if error.status.code != 404:
                    raise
        elif isinstance(action, scale_down.RunCli):
            owner = await client.get(self.resource(), observed.name, namespace=observed.namespace)
            job = scale_down.build_cli_job(
                job=action.job,
                namespace=observed.namespace,
                instance=observed.name,
                image=observed.status["image"],
                script=scale_down.cli_script(action.calls),
                cookie_secret=ERLANG_COOKIE.name(observed.name),
                labels={**self.labels(observed.name), **client_labels(self.service, observed.name)},
                owner=owner_reference(self.kind, owner.to_dict()),
                inter_node_tls=action.inter_node_tls,
            )
            try:
                await client.create(codecs.from_dict(job))
            except ApiError as error:
                if error.status.code != 409:  # made by a pass whose status write was lost
                    raise
        elif isinstance(action, SetDefaultUserPassword):
            await self.set_default_user_password(client, observed, action)
        elif isinstance(action, RestartNode):
            try:
                await client.delete(Pod, action.pod, namespace=observed.namespace)
            except ApiError as error:
                if error.status.code != 404:
                    raise
        else:
            raise UnknownAction(self, action)

    async def set_default_user_password(
        self, client: AsyncClient, observed: Observed, action: SetDefaultUserPassword
    ) -> None:
        data = decoded(
            (
                await client.get(Secret, DEFAULT_USER.name(observed.name), namespace=observed.namespace)
            ).to_dict()
        )
        password = data.get(NEXT_PASSWORD) or data[PASSWORD]
        ips = {pod["metadata"]["name"]: pod_ip(pod) for pod in observed.pods}
        failures = []
        for node in action.nodes:
            ip = ips.get(node)
            if not ip:
                failures.append(f"{node}: no IP")
                continue
            try:
                await MANAGEMENT.set_password(
                    client, observed.namespace, observed.name, ip, data["username"], password
                )
            except (ManagementError, httpx2.HTTPError, OSError) as error:
                failures.append(f"{node}: {error}")
                continue
            return
        raise RuntimeError(f"the default user's new password is not set: {'; '.join(failures) or 'no node'}")

    def reading(
        self,
        spec: RabbitMQSpec,
        observed: Observed,
        view: ClusterView,
        inter: inter_node.InterNode | None = None,
    ) -> ServiceStatus:
        ready = ready_of(observed, spec.replicas)
        serving = view.quorum and ready > spec.replicas // 2
        message = f"{ready} of {spec.replicas} nodes ready; {view.message}"
        if observed.status.get("scaleDown"):
            message += "; " + observed.status["scaleDown"].get("message", "scaling down")
        if inter and inter.message:
            message += "; " + inter.message
        host = f"{observed.name}.{observed.namespace}.svc"
        return ServiceStatus(
            ready_instances=ready,
            instances=spec.replicas,
            ready=serving,
            degraded=serving and not (view.formed and ready == spec.replicas),
            message=message,
            fields={
                "endpoints": {
                    "amqps": f"amqps://{host}:{AMQPS_PORT}",
                    **({} if spec.tls.required else {"amqp": f"amqp://{host}:5672"}),
                    "management": f"https://{host}:{MANAGEMENT_TLS_PORT}",
                },
                "defaultUserSecret": DEFAULT_USER.name(observed.name),
            },
        )

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns.insert(3, {"name": "Formed", "type": "boolean", "jsonPath": ".status.cluster.formed"})
        return columns


ACCESS_KINDS = tuple(
    kind(MANAGEMENT, RabbitMQPlugin.resource())
    for kind in (RabbitMQUserKind, RabbitMQVhostKind, RabbitMQPermissionKind)
)
