"""A developer applies a `RabbitMQ` and gets a running cluster: proven on the test bed with the
operator running from this checkout and real RabbitMQ nodes (Debian's rabbitmq-server)."""

from __future__ import annotations

import base64
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx2
import pika
import pika.exceptions
import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, PersistentVolumeClaim, Pod, Secret, Service
from lightkube.types import PatchType

from e2e.kube import (
    apply,
    get_or_none,
    kubectl,
    pod_is_ready,
    secret_data,
    statefleet,
    wait_pod_replaced,
    wait_reason,
    wait_until,
)
from e2e.namespaces import DeletedNamespaces, namespace_prefix, new_namespace
from e2e.operator_process import OperatorProcess
from e2e.test_backup import Backup, Restore, storage, wait_phase
from framework.binding import ServiceBindingKind
from framework.rollout.controller import Rollout
from services.rabbitmq import PLUGIN
from services.rabbitmq.cluster import pod_of
from services.rabbitmq.users import RabbitMQPermissionKind, RabbitMQUserKind, RabbitMQVhostKind

pytestmark = pytest.mark.e2e

RabbitMQ = PLUGIN.resource()
RabbitMQUser = RabbitMQUserKind.resource()
RabbitMQVhost = RabbitMQVhostKind.resource()
RabbitMQPermission = RabbitMQPermissionKind.resource()
ServiceBinding = ServiceBindingKind.resource()


def create(kube: Client, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": "statefleet.dev/v1alpha1",
        "kind": "RabbitMQ",
        "metadata": {"name": name},
        "spec": spec,
    }
    kube.create(RabbitMQ.from_dict(body), namespace=namespace)


def wait_formed(
    kube: Client, namespace: str, name: str, replicas: int, timeout: float = 300
) -> dict[str, Any]:
    """Ready, every node running in one cluster, the current generation observed."""

    def formed() -> dict[str, Any] | None:
        body = kube.get(RabbitMQ, name, namespace=namespace).to_dict()
        status = body.get("status") or {}
        ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
        done = (
            ready.get("status") == "True"
            and status.get("readyInstances") == replicas
            and (status.get("cluster") or {}).get("formed")
            and status.get("observedGeneration") == body["metadata"]["generation"]
        )
        return status if done else None

    return wait_until(f"RabbitMQ {namespace}/{name}: {replicas} nodes in one cluster", formed, timeout, 1)


def credentials(kube: Client, namespace: str, name: str) -> tuple[str, str]:
    data = kube.get(Secret, f"{name}-default-user", namespace=namespace).data
    return base64.b64decode(data["username"]).decode(), base64.b64decode(data["password"]).decode()


def amqp(kube: Client, namespace: str, name: str, retry_for: float = 30) -> pika.BlockingConnection:
    """A connection through the client Service, as an application makes it (retried while the
    Service's endpoints settle)."""
    user, password = credentials(kube, namespace, name)
    host = kube.get(Service, name, namespace=namespace).spec.clusterIP
    parameters = pika.ConnectionParameters(
        host=host,
        port=5672,
        credentials=pika.PlainCredentials(user, password),
        socket_timeout=5,
        blocked_connection_timeout=10,
        connection_attempts=1,
    )
    deadline = time.monotonic() + retry_for
    while True:
        try:
            return pika.BlockingConnection(parameters)
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def amqp_to_node(kube: Client, namespace: str, name: str, pod: str) -> pika.BlockingConnection:
    """A connection to one node (a classic queue lives on the node its client declared it on)."""
    user, password = credentials(kube, namespace, name)
    ip = kube.get(Pod, pod, namespace=namespace).status.podIP
    return pika.BlockingConnection(
        pika.ConnectionParameters(host=ip, port=5672, credentials=pika.PlainCredentials(user, password))
    )


def management(kube: Client, namespace: str, name: str, path: str) -> Any:
    """`GET /api/<path>` of the management API, through the client Service."""
    host = kube.get(Service, name, namespace=namespace).spec.clusterIP
    response = httpx2.get(
        f"http://{host}:15672/api/{path}", auth=credentials(kube, namespace, name), timeout=10
    )
    response.raise_for_status()
    return response.json()


def publish(channel: Any, queue: str, bodies: list[str]) -> None:
    """Each message persistent and confirmed by the broker before the next."""
    for body in bodies:
        channel.basic_publish("", queue, body.encode(), pika.BasicProperties(delivery_mode=2), mandatory=True)


def drain(channel: Any, queue: str) -> list[str]:
    bodies = []
    while True:
        method, _properties, body = channel.basic_get(queue)
        if method is None:
            return bodies
        channel.basic_ack(method.delivery_tag)
        bodies.append(body.decode())


class Publisher(threading.Thread):
    """An application publishing through the Service all along: one confirmed message every
    0.1 s, reconnecting when its connection is lost. Records what the broker confirmed."""

    def __init__(self, kube: Client, namespace: str, name: str, queue: str, prefix: str = "live") -> None:
        super().__init__(daemon=True)
        self.kube, self.namespace, self.name, self.queue = kube, namespace, name, queue
        self.prefix = prefix
        self.confirmed: list[str] = []
        self.failures = 0
        self.longest_gap = 0.0  # seconds without a confirmed message
        self.halt = threading.Event()

    def run(self) -> None:
        sent, last = 0, time.monotonic()
        while not self.halt.is_set():
            try:
                with amqp(self.kube, self.namespace, self.name, retry_for=120) as connection:
                    channel = connection.channel()
                    channel.confirm_delivery()
                    while not self.halt.is_set():
                        body = f"{self.prefix}-{sent}"
                        sent += 1
                        publish(channel, self.queue, [body])
                        self.confirmed.append(body)
                        now = time.monotonic()
                        self.longest_gap = max(self.longest_gap, now - last)
                        last = now
                        time.sleep(0.1)
            except pika.exceptions.AMQPError:
                self.failures += 1
                time.sleep(0.5)


def node_memory_limits(kube: Client, namespace: str, name: str) -> dict[str, int]:
    """Each node's memory high watermark in bytes, once every node reports it (a node's
    statistics appear a few seconds after it starts)."""

    def reported() -> dict[str, int] | None:
        nodes = management(kube, namespace, name, "nodes")
        limits = {pod_of(n["name"]): n.get("mem_limit") for n in nodes}
        return limits if all(limits.values()) else None

    return wait_until("every node's memory limit", reported, 60, 1)


DISTRIBUTION_PORT = 25672


def proto_dist(namespace: str, pod: str) -> str:
    """What the node's Erlang distribution runs over, asked through the CLI in its container
    (which must speak what the node speaks to ask at all)."""
    return kubectl(
        "exec", "-n", namespace, pod, "-c", "rabbitmq", "--",
        "rabbitmqctl", "-q", "eval", "init:get_argument(proto_dist).", timeout=120,
    ).strip()  # fmt: skip


def check_distribution_over_mutual_tls(kube: Client, namespace: str, name: str, pod: str) -> str:
    """The node's distribution port, from the test: no Erlang handshake in clear (a TLS alert
    instead); a TLS handshake with the instance's certificate, verifying the node's own name
    against the instance's CA; refused without a client certificate. The node certificate's
    issuer."""
    ip = kube.get(Pod, pod, namespace=namespace).status.podIP
    # An Erlang distribution handshake's first message (send_name, version 5) in clear.
    own = b"e2e@test.invalid"
    body = b"n" + struct.pack(">HI", 5, 0x3499C) + own
    with socket.create_connection((ip, DISTRIBUTION_PORT), timeout=10) as raw:
        raw.sendall(struct.pack(">H", len(body)) + body)
        try:
            reply = raw.recv(64)
        except ConnectionResetError:  # closed with our bytes unread: refused all the same
            reply = b""
    assert reply == b"" or reply[:1] == b"\x15", f"{pod}:25672 answered a plaintext handshake: {reply!r}"
    tls = secret_data(kube, namespace, f"{name}-tls")
    host = f"{pod}.{name}-nodes.{namespace}"  # the node's name: rabbit@<host>
    with tempfile.TemporaryDirectory() as folder:
        for key in ("tls.crt", "tls.key"):
            with open(f"{folder}/{key}", "w") as file:
                file.write(tls[key])
        context = ssl.create_default_context(cadata=tls["ca.crt"])
        context.load_cert_chain(f"{folder}/tls.crt", f"{folder}/tls.key")
        with (
            socket.create_connection((ip, DISTRIBUTION_PORT), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=host) as connection,
        ):
            issuer = dict(item[0] for item in connection.getpeercert()["issuer"])["commonName"]
            print(f"{pod}:{DISTRIBUTION_PORT}: {connection.version()}, certificate issued by {issuer!r}")
    # Without a certificate of its own a peer is refused: at the handshake (TLS 1.2) or at its
    # end (TLS 1.3, the server's alert at the first read).
    anonymous = ssl.create_default_context(cadata=tls["ca.crt"])

    def as_anonymous_peer() -> None:
        with (
            socket.create_connection((ip, DISTRIBUTION_PORT), timeout=10) as raw,
            anonymous.wrap_socket(raw, server_hostname=host) as connection,
        ):
            if not connection.recv(1):
                raise EOFError("closed without a word")

    with pytest.raises((ssl.SSLError, ConnectionError, EOFError)):
        as_anonymous_peer()
    return issuer


def test_a_cluster_forms_serves_keeps_its_queues_when_a_node_is_lost_rolls_out_and_scales_3_5_3(
    kube: Client, namespace: str, operator: OperatorProcess
) -> None:
    started = time.monotonic()
    create(kube, namespace, "events", {"version": "4", "replicas": 3, "storage": {"size": "1Gi"}})
    status = wait_formed(kube, namespace, "events", 3)
    formed_in = time.monotonic() - started
    assert status["cluster"]["nodes"] == ["events-0", "events-1", "events-2"]
    assert status["cluster"]["members"] == 3
    assert status["endpoints"]["amqp"] == f"amqp://events.{namespace}.svc:5672"
    print(f"\n3-node cluster formed and Ready in {formed_in:.1f} s")
    # What a user looks at: the default user's Secret (owned by the resource), the Services,
    # the Event, and the cluster as RabbitMQ itself describes it.
    secret = kube.get(Secret, "events-default-user", namespace=namespace)
    assert {"username", "password"} <= set(secret.data)
    owner = secret.metadata.ownerReferences[0]
    assert (owner.kind, owner.name) == ("RabbitMQ", "events")
    ports = {p.name: p.port for p in kube.get(Service, "events", namespace=namespace).spec.ports}
    assert ports["amqp"] == 5672
    assert ports["management"] == 15672
    reasons = {e.reason for e in kube.list(Event, namespace=namespace) if e.involvedObject.kind == "RabbitMQ"}
    assert "ClusterFormed" in reasons
    nodes = management(kube, namespace, "events", "nodes")
    assert sorted(pod_of(n["name"]) for n in nodes if n["running"]) == ["events-0", "events-1", "events-2"]
    assert {n["name"] for n in nodes} == {f"rabbit@events-{i}.events-nodes.{namespace}" for i in range(3)}

    # The cluster formed over Erlang distribution over mutual TLS (a new cluster's default): a
    # node runs inet_tls (the others formed a cluster with it, so they do too), the CLI in its
    # container speaks it (and later the scale-down's Jobs), a CLI without it cannot reach the
    # node; the distribution port speaks only TLS, with the instance's certificate.
    assert status["interNodeTls"] is True
    assert proto_dist(namespace, "events-0") == '{ok,[["inet_tls"]]}'
    with pytest.raises(subprocess.CalledProcessError):
        kubectl(
            "exec", "-n", namespace, "events-0", "-c", "rabbitmq", "--", "env", "-u", "RABBITMQ_CTL_ERL_ARGS",
            "rabbitmqctl", "-q", "--timeout", "15", "cluster_status", timeout=120,
        )  # fmt: skip
    assert (
        check_distribution_over_mutual_tls(kube, namespace, "events", "events-1") == "statefleet instance CA"
    )

    # A quorum queue, replicated on the three nodes; messages published through the Service.
    first = [f"m{i}" for i in range(100)]
    with amqp(kube, namespace, "events") as connection:
        channel = connection.channel()
        channel.queue_declare("orders", durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        publish(channel, "orders", first)
        # (The management API's message counts are statistics, seconds late: ask the queue.)
        assert channel.queue_declare("orders", passive=True).method.message_count == 100
    queue = management(kube, namespace, "events", "queues/%2F/orders")
    assert len(queue["members"]) == 3

    # The node that leads the queue is lost: the queue stays available on the other two.
    leader = pod_of(queue["leader"])
    kubectl("exec", "-n", namespace, leader, "-c", "rabbitmq", "--", "rabbitmqctl", "stop_app", timeout=120)
    lost = wait_until(
        "the operator sees the node lost",
        lambda: (
            (s := kube.get(RabbitMQ, "events", namespace=namespace).status)
            and leader not in s["cluster"]["nodes"]
            and s
        ),
        90,
        1,
    )
    assert lost["cluster"]["formed"] is False
    ready = next(c for c in lost["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"  # two of three: still serving, degraded
    assert next(c for c in lost["conditions"] if c["type"] == "Degraded")["status"] == "True"
    with amqp(kube, namespace, "events") as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        publish(channel, "orders", [f"m{i}" for i in range(100, 110)])
        consumed = [channel.basic_get("orders", auto_ack=True)[2].decode() for _ in range(5)]
    assert consumed == ["m0", "m1", "m2", "m3", "m4"]
    new_leader = pod_of(management(kube, namespace, "events", "queues/%2F/orders").get("leader") or "")
    assert new_leader in {"events-0", "events-1", "events-2"} - {leader}
    kubectl("exec", "-n", namespace, leader, "-c", "rabbitmq", "--", "rabbitmqctl", "start_app", timeout=120)
    wait_formed(kube, namespace, "events", 3, timeout=120)

    # A configuration change rolls out one node at a time through the StatefulsetRollout, each
    # only once the quorum queue keeps its majority without it, while an application publishes.
    before = {p.metadata.name: p.metadata.uid for p in kube.list(Pod, namespace=namespace)}
    limits_before = node_memory_limits(kube, namespace, "events")
    publisher = Publisher(kube, namespace, "events", "orders")
    publisher.start()
    time.sleep(2)
    rollout_started = time.monotonic()
    try:
        kube.patch(
            RabbitMQ,
            "events",
            {"spec": {"config": {"vm_memory_high_watermark.relative": "0.5"}}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

        moments: dict[str, dict[str, float]] = {name: {} for name in before}  # when each pod went, came back

        def rolled_out() -> bool:
            now = time.monotonic() - rollout_started
            found = list(kube.list(Pod, namespace=namespace))
            for pod in found:
                seen = moments[pod.metadata.name]
                if pod.metadata.uid == before[pod.metadata.name]:
                    if pod.metadata.deletionTimestamp:
                        seen.setdefault("stopping", now)
                else:
                    seen.setdefault("created", now)
                    if pod_is_ready(pod):
                        seen.setdefault("ready", now)
            pods = {p.metadata.name: p.metadata.uid for p in found}
            rollout = kube.get(Rollout, "events", namespace=namespace).status or {}
            replaced = len(pods) == 3 and all(pods.get(name) != uid for name, uid in before.items())
            return replaced and rollout.get("phase") == "Healthy" and rollout.get("updatedReplicas") == 3

        wait_until("every node updated", rolled_out, 600, 1)
        wait_formed(kube, namespace, "events", 3, timeout=180)
        rollout_took = time.monotonic() - rollout_started
        time.sleep(2)
    finally:  # the application stops publishing, whatever happened
        publisher.halt.set()
        publisher.join(30)
    print(
        f"rollout of 3 nodes in {rollout_took:.1f} s; the publisher had {len(publisher.confirmed)} "
        f"messages confirmed, {publisher.failures} lost connections, at most "
        f"{publisher.longest_gap:.1f} s without a confirm"
    )
    for pod, seen in sorted(moments.items(), key=lambda item: item[1].get("stopping", 0)):
        print(f"  {pod}: " + ", ".join(f"{what} at {at:.0f} s" for what, at in seen.items()))
    limits_after = node_memory_limits(kube, namespace, "events")
    for pod, limit in limits_after.items():  # 0.6 of the memory before (RabbitMQ 4's default), 0.5 now
        assert limit / limits_before[pod] == pytest.approx(0.5 / 0.6, rel=0.01)
    assert len(publisher.confirmed) > 50

    # Scale up: two more nodes join the running cluster, nobody restarts.
    running = {p.metadata.name: p.metadata.uid for p in kube.list(Pod, namespace=namespace)}
    kube.patch(RabbitMQ, "events", {"spec": {"replicas": 5}}, namespace=namespace, patch_type=PatchType.MERGE)
    status = wait_formed(kube, namespace, "events", 5, timeout=300)
    assert status["cluster"]["nodes"] == [f"events-{i}" for i in range(5)]
    after = {p.metadata.name: p.metadata.uid for p in kube.list(Pod, namespace=namespace)}
    assert all(after[name] == uid for name, uid in running.items())

    # Scale down 5 -> 3 without losing a message. A quorum queue on all five nodes, one whose
    # members are only events-0 and the two leaving nodes (it must get new members first), and
    # a classic queue with messages on events-4, which cannot move: refused, naming it.
    def cli(*arguments: str) -> None:
        try:
            kubectl("exec", "-n", namespace, "events-0", "-c", "rabbitmq", "--", *arguments, timeout=120)
        except subprocess.CalledProcessError as error:  # say what the CLI said
            raise AssertionError(f"{' '.join(arguments)}: exit {error.returncode}: {error.stderr}") from error

    with amqp(kube, namespace, "events") as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for queue in ("wide", "narrow"):
            channel.queue_declare(
                queue, durable=True, arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": 5}
            )
            publish(channel, queue, [f"{queue}-{i}" for i in range(200)])
    members = lambda queue: sorted(  # noqa: E731
        pod_of(n) for n in management(kube, namespace, "events", f"queues/%2F/{queue}")["members"]
    )

    def led_without(pod: str) -> bool:
        """The queue's membership has no `pod` and a leader among its members: Raft takes the
        next membership change only then (in between, the CLI exits 69, unavailable)."""
        queue = management(kube, namespace, "events", "queues/%2F/narrow")
        left = [pod_of(n) for n in queue["members"]]
        return pod not in left and pod_of(queue.get("leader") or "") in left

    def removed(pod: str) -> bool:
        """Whether Raft took the change: a leader takes none until it committed an entry of its
        own term and the last change (`cluster_change_not_permitted`, exit 69, which the
        management API does not show): asked again then. Any other refusal fails at once."""
        try:
            cli("rabbitmq-queues", "delete_member", "narrow", f"rabbit@{pod}.events-nodes.{namespace}")
        except AssertionError as error:
            if "cluster_change_not_permitted" in str(error):
                return False
            raise
        return True

    for pod in ("events-1", "events-2"):
        wait_until("narrow led", lambda: led_without("none"), 60, 0.5)
        wait_until(f"Raft takes the removal of {pod}", lambda pod=pod: removed(pod), 60, 1)
        wait_until(f"narrow led without {pod}", lambda pod=pod: led_without(pod), 60, 0.5)
    assert members("wide") == [f"events-{i}" for i in range(5)]
    assert members("narrow") == ["events-0", "events-3", "events-4"]
    with amqp_to_node(kube, namespace, "events", "events-4") as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("jobs", durable=True)
        publish(channel, "jobs", ["j1", "j2", "j3"])
    kube.patch(RabbitMQ, "events", {"spec": {"replicas": 3}}, namespace=namespace, patch_type=PatchType.MERGE)
    refused = wait_reason(kube, RabbitMQ, namespace, "events", "ChangeRefused")
    assert refused.startswith("spec.replicas: scaling down from 5 to 3 nodes would lose data: classic queues")
    assert "jobs on events-4 (3 messages)" in refused
    time.sleep(5)
    assert len(list(kube.list(Pod, namespace=namespace))) == 5
    assert [members("wide"), members("narrow")] == [
        [f"events-{i}" for i in range(5)],
        ["events-0", "events-3", "events-4"],
    ]
    with amqp_to_node(kube, namespace, "events", "events-4") as connection:  # the user drains it
        channel = connection.channel()
        assert drain(channel, "jobs") == ["j1", "j2", "j3"]
        channel.queue_delete("jobs")

    scaler = Publisher(kube, namespace, "events", "orders", prefix="scale")
    scaler.start()
    scale_started = time.monotonic()
    try:

        def scaled_down() -> dict[str, Any] | None:
            status = kube.get(RabbitMQ, "events", namespace=namespace).status or {}
            done = (
                "scaleDown" not in status
                and status.get("readyInstances") == 3
                and (status.get("cluster") or {}).get("members") == 3
                and len(list(kube.list(Pod, namespace=namespace))) == 3
            )
            return status if done else None

        status = wait_until("the scale-down to 3 nodes", scaled_down, 600, 1)
        scale_took = time.monotonic() - scale_started
        time.sleep(2)
    finally:
        scaler.halt.set()
        scaler.join(30)
    print(
        f"scale-down 5 -> 3 in {scale_took:.1f} s; the publisher had {len(scaler.confirmed)} messages "
        f"confirmed, {scaler.failures} lost connections, at most {scaler.longest_gap:.1f} s without a confirm"
    )
    nodes = management(kube, namespace, "events", "nodes")
    assert sorted(pod_of(n["name"]) for n in nodes) == ["events-0", "events-1", "events-2"]
    assert members("wide") == members("narrow") == ["events-0", "events-1", "events-2"]
    claims = {c.metadata.name for c in kube.list(PersistentVolumeClaim, namespace=namespace)}
    assert claims == {f"data-events-{i}" for i in range(3)}
    reasons = [e.reason for e in kube.list(Event, namespace=namespace) if e.involvedObject.kind == "RabbitMQ"]
    assert {"ScalingDown", "QueuesMoved", "ScaledDown"} <= set(reasons)
    assert not [job for job in kube.list(Job, namespace=namespace) if "scale-down" in job.metadata.name]
    with amqp(kube, namespace, "events") as connection:
        channel = connection.channel()
        assert drain(channel, "wide") == [f"wide-{i}" for i in range(200)]
        assert drain(channel, "narrow") == [f"narrow-{i}" for i in range(200)]

    # Nothing the broker confirmed is lost, in order.
    with amqp(kube, namespace, "events") as connection:
        remaining = drain(connection.channel(), "orders")
    assert remaining[:105] == [f"m{i}" for i in range(5, 110)]
    for application in (publisher, scaler):
        published = [body for body in remaining[105:] if body.startswith(application.prefix + "-")]
        assert set(application.confirmed) <= set(published)
        assert published == sorted(published, key=lambda body: int(body.split("-")[1]))
    assert len(scaler.confirmed) > 20


def login(kube: Client, namespace: str, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    """As an application would, through the client Service; retried only while the Service
    has no endpoint yet, never on refused credentials."""
    host = kube.get(Service, "events", namespace=namespace).spec.clusterIP
    parameters = pika.ConnectionParameters(
        host=host,
        virtual_host=vhost,
        credentials=pika.PlainCredentials(user, password),
        socket_timeout=5,
        connection_attempts=1,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            return pika.BlockingConnection(parameters)
        except pika.exceptions.AMQPConnectionError as error:
            refused = isinstance(
                error, pika.exceptions.ProbableAuthenticationError | pika.exceptions.ProbableAccessDeniedError
            )
            if refused or time.monotonic() > deadline:
                raise
            time.sleep(1)


def tls_context(ca: str | None) -> ssl.SSLContext:
    """A client's: verifies the server's name and chain (with `ca`, or the system's CAs)."""
    return ssl.create_default_context(cadata=ca) if ca else ssl.create_default_context()


def login_tls(
    kube: Client, namespace: str, bound: dict[str, str], ca: str | None = "binding", retry_for: float = 30
) -> pika.BlockingConnection:
    """amqps as the binding Secret says (its host name verified, its CA unless told), through
    the client Service's address (the test runs outside the cluster's DNS)."""
    name = bound["host"].split(".", 1)[0]
    address = kube.get(Service, name, namespace=namespace).spec.clusterIP
    parameters = pika.ConnectionParameters(
        host=address,
        port=int(bound["port"]),
        virtual_host=bound["virtual-host"],
        credentials=pika.PlainCredentials(bound["username"], bound["password"]),
        ssl_options=pika.SSLOptions(tls_context(bound["ca.crt"] if ca == "binding" else ca), bound["host"]),
        socket_timeout=5,
        connection_attempts=1,
    )
    deadline = time.monotonic() + retry_for
    while True:
        try:
            return pika.BlockingConnection(parameters)
        except pika.exceptions.AMQPConnectionError:  # (a refused certificate is raised as itself)
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.fixture(scope="module")
def one_node(kube: Client, deleted_namespaces: DeletedNamespaces, operator: OperatorProcess) -> Iterator[str]:
    """A namespace with a 1-node RabbitMQ `events`, which the steps marked with the group
    `rabbitmq-one-node` share (one worker runs them, in order). Made with plaintext distribution,
    as a cluster made before distribution over TLS runs: the last step moves it."""
    name = new_namespace(kube, namespace_prefix(), "rabbitmq-one-node")
    spec = {"version": "3", "replicas": 1, "storage": {"size": "1Gi"}, "tls": {"interNode": False}}
    create(kube, name, "events", spec)
    status = wait_formed(kube, name, "events", 1)
    assert status["interNodeTls"] is False
    yield name
    deleted_namespaces.delete(name)


@pytest.mark.xdist_group("rabbitmq-one-node")
def test_users_vhosts_permissions_and_a_binding(kube: Client, one_node: str) -> None:
    namespace = one_node

    # A binding: the application's own user and vhost, in a servicebinding.io Secret.
    apply(kube, ServiceBinding, namespace, "orders", {"service": {"kind": "RabbitMQ", "name": "events"}})
    wait_reason(kube, ServiceBinding, namespace, "orders", "Bound", timeout=120)
    secret = kube.get(Secret, "orders", namespace=namespace)
    assert secret.type == "servicebinding.io/rabbitmq"
    bound = secret_data(kube, namespace, "orders")
    assert bound["uri"] == (
        f"amqps://orders:{quote(bound['password'], safe='')}@events.{namespace}.svc:5671/orders"
    )
    assert (bound["username"], bound["virtual-host"], bound["port"]) == ("orders", "orders", "5671")
    assert bound["addresses"] == f"amqps://events.{namespace}.svc:5671"
    # As the application connects: amqps, the server verified by name with the binding's CA.
    with login_tls(kube, namespace, bound) as connection:
        channel = connection.channel()
        channel.queue_declare("work", durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        publish(channel, "work", ["one", "two"])
        assert drain(channel, "work") == ["one", "two"]
    # Its own vhost only.
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        login(kube, namespace, "orders", bound["password"], "/")

    # A vhost, a user and a permission as resources of their own: the worker may publish to
    # and consume from the queues of `jobs` but not declare any.
    apply(kube, RabbitMQVhost, namespace, "jobs", {"instance": "events", "description": "batch jobs"})
    apply(kube, RabbitMQUser, namespace, "worker", {"instance": "events", "tags": ["monitoring"]})
    apply(
        kube,
        RabbitMQPermission,
        namespace,
        "worker-jobs",
        {"instance": "events", "user": "worker", "vhost": "jobs", "configure": "^$"},
    )
    for resource, name in (
        (RabbitMQVhost, "jobs"),
        (RabbitMQUser, "worker"),
        (RabbitMQPermission, "worker-jobs"),
    ):
        wait_reason(kube, resource, namespace, name, "Reconciled", timeout=60)
    vhost = management(kube, namespace, "events", "vhosts/jobs")
    assert vhost["description"] == "batch jobs"
    worker = management(kube, namespace, "events", "users/worker")
    assert "monitoring" in worker["tags"]
    user, password = credentials(kube, namespace, "events")
    with login(kube, namespace, user, password, "jobs") as connection:
        connection.channel().queue_declare("tasks", durable=True)
    worker_password = secret_data(kube, namespace, "worker-credentials")["password"]
    with login(kube, namespace, "worker", worker_password, "jobs") as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        publish(channel, "tasks", ["t1"])
        assert drain(channel, "tasks") == ["t1"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="ACCESS_REFUSED"):
            connection.channel().queue_declare("mine", durable=True)

    # A new password in the Secret is applied within a minute (Secrets are not watched).
    kube.patch(
        Secret,
        "worker-credentials",
        {"stringData": {"password": "rotated-password-1"}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )

    def rotated() -> bool:
        try:
            login(kube, namespace, "worker", "rotated-password-1", "jobs").close()
        except pika.exceptions.ProbableAuthenticationError:
            return False
        return True

    wait_until("the new password works", rotated, 90, 2)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(kube, namespace, "worker", worker_password, "jobs")

    # A user that exists and is not this resource's is never taken over.
    apply(kube, RabbitMQUser, namespace, "clash", {"instance": "events", "username": user})
    message = wait_reason(kube, RabbitMQUser, namespace, "clash", "Refused")
    assert f"the user {user} exists and was not created for this resource" in message
    with login(kube, namespace, user, password, "/"):
        pass  # the default user still logs in with its own password

    # Deleting: the binding's user goes (its vhost and messages stay), the permission is
    # revoked, a Retain vhost stays.
    kube.delete(ServiceBinding, "orders", namespace=namespace)
    wait_until("the binding's user deleted", lambda: not users(kube, namespace) & {"orders"}, 60, 1)
    assert "orders" in vhosts(kube, namespace)
    kube.delete(RabbitMQPermission, "worker-jobs", namespace=namespace)
    wait_until(
        "the permission revoked",
        lambda: not [p for p in management(kube, namespace, "events", "users/worker/permissions")],
        60,
        1,
    )
    kube.delete(RabbitMQVhost, "jobs", namespace=namespace)
    kube.delete(RabbitMQUser, "clash", namespace=namespace)
    wait_until(
        "the vhost resource gone", lambda: get_or_none(kube, RabbitMQVhost, "jobs", namespace) is None, 60, 1
    )
    assert "jobs" in vhosts(kube, namespace)
    assert user in users(kube, namespace)  # the refused resource deleted nothing


def users(kube: Client, namespace: str) -> set[str]:
    return {u["name"] for u in management(kube, namespace, "events", "users")}


def vhosts(kube: Client, namespace: str) -> set[str]:
    return {v["name"] for v in management(kube, namespace, "events", "vhosts")}


def management_change(kube: Client, namespace: str, name: str, method: str, path: str, body: Any) -> None:
    """A change through the management API, as an administrator makes it by hand."""
    host = kube.get(Service, name, namespace=namespace).spec.clusterIP
    response = httpx2.request(
        method,
        f"http://{host}:15672/api/{path}",
        json=body,
        auth=credentials(kube, namespace, name),
        timeout=30,
    )
    response.raise_for_status()


@pytest.mark.xdist_group("rabbitmq-one-node")
def test_definitions_backup_restores_into_a_new_cluster(kube: Client, one_node: str, bucket: str) -> None:
    namespace = one_node
    apply(kube, RabbitMQUser, namespace, "app", {"instance": "events", "ownVhost": True})
    wait_reason(kube, RabbitMQUser, namespace, "app", "Reconciled", timeout=60)
    app_password = secret_data(kube, namespace, "app-credentials")["password"]
    # What an administrator defined by hand: an exchange, a quorum queue, a binding, a policy.
    change = lambda method, path, body: management_change(kube, namespace, "events", method, path, body)  # noqa: E731
    change("PUT", "exchanges/app/events", {"type": "topic", "durable": True})
    change("PUT", "queues/app/work", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    change("POST", "bindings/app/e/events/q/work", {"routing_key": "order.#"})
    change(
        "PUT",
        "policies/app/limits",
        {"pattern": "^work$", "definition": {"max-length": 1000}, "apply-to": "queues"},
    )

    storage(kube, namespace, "s3", bucket)
    apply(
        kube,
        Backup,
        namespace,
        "events-now",
        {"service": {"kind": "RabbitMQ", "name": "events"}, "storage": "s3"},
    )
    backed_up = wait_phase(kube, Backup, namespace, "events-now", "Completed", timeout=180)
    assert backed_up["method"] == "definitions"
    apply(
        kube,
        Restore,
        namespace,
        "events-copy",
        {"backup": "events-now", "target": {"kind": "RabbitMQ", "name": "events-copy"}},
    )
    restored = wait_phase(kube, Restore, namespace, "events-copy", "Completed", timeout=300)
    print(f"\ndefinitions restored: {restored.get('details')}")

    copy = lambda path: management(kube, namespace, "events-copy", path)  # noqa: E731
    assert copy("exchanges/app/events")["type"] == "topic"
    assert copy("queues/app/work")["arguments"] == {"x-queue-type": "quorum"}
    assert [b["routing_key"] for b in copy("queues/app/work/bindings") if b["source"] == "events"] == [
        "order.#"
    ]
    assert copy("policies/app/limits")["definition"] == {"max-length": 1000}
    # The application's user came with its password; the old cluster's administrator did not.
    host = kube.get(Service, "events-copy", namespace=namespace).spec.clusterIP
    parameters = pika.ConnectionParameters(
        host=host,
        virtual_host="app",
        credentials=pika.PlainCredentials("app", app_password),
        connection_attempts=3,
    )
    with pika.BlockingConnection(parameters) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            "events", "order.created", b"routed", pika.BasicProperties(delivery_mode=2), mandatory=True
        )
        assert drain(channel, "work") == ["routed"]
    old_admin = credentials(kube, namespace, "events")[0]
    assert old_admin not in {u["name"] for u in copy("users")}

    # Definitions never go over a running cluster: refused before anything is read.
    apply(
        kube,
        Restore,
        namespace,
        "over",
        {"backup": "events-now", "target": {"kind": "RabbitMQ", "name": "events", "replace": True}},
    )
    message = wait_reason(kube, Restore, namespace, "over", "ReplaceRefused")
    assert "a definitions backup of a RabbitMQ is restored into a new instance only" in message


@pytest.mark.xdist_group("rabbitmq-one-node")
def test_the_default_user_s_password_rotates_without_downtime(kube: Client, one_node: str) -> None:
    """`statefleet rabbitmq rotate-credentials`: a connection opened before stays usable, the new
    password logs in, the old one no longer does, and the operator still manages the cluster."""
    namespace = one_node
    user, old = credentials(kube, namespace, "events")
    with amqp(kube, namespace, "events") as before:
        channel = before.channel()
        channel.queue_declare("rotation", durable=True)
        done = statefleet("rabbitmq", "rotate-credentials", "events", "-n", namespace, "--timeout", "120")
        assert done.returncode == 0, done.stdout + done.stderr
        channel.confirm_delivery()
        publish(channel, "rotation", ["after the rotation"])
        assert drain(channel, "rotation") == ["after the rotation"]
        channel.queue_delete("rotation")
    secret = kube.get(Secret, "events-default-user", namespace=namespace).data
    assert "next-password" not in secret
    _, new = credentials(kube, namespace, "events")
    assert new != old
    with login(kube, namespace, user, new, "/"):
        pass
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(kube, namespace, user, old, "/")
    apply(kube, RabbitMQUser, namespace, "after-rotation", {"instance": "events"})
    wait_reason(kube, RabbitMQUser, namespace, "after-rotation", "Reconciled", timeout=60)
    kube.delete(RabbitMQUser, "after-rotation", namespace=namespace)


@pytest.mark.xdist_group("rabbitmq-one-node")
def test_amqp_and_the_management_api_over_tls_then_tls_only(kube: Client, one_node: str) -> None:
    """Last of the group: it turns the shared cluster's plaintext listeners off, and moves its
    distribution to TLS in the same restart (every node at once: `spec.tls.interNode`)."""
    namespace = one_node
    user, password = credentials(kube, namespace, "events")
    host = f"events.{namespace}.svc"
    ca = secret_data(kube, namespace, "events-tls")["ca.crt"]
    as_admin = {"host": host, "port": "5671", "virtual-host": "/", "username": user, "password": password}

    def round_trip(queue: str) -> None:
        with login_tls(kube, namespace, as_admin, ca=ca) as connection:
            channel = connection.channel()
            channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
            channel.confirm_delivery()
            publish(channel, queue, ["over tls"])
            assert drain(channel, queue) == ["over tls"]

    round_trip("secure")
    assert "inet_tls" not in proto_dist(namespace, "events-0")  # made with plaintext distribution
    with login_tls(kube, namespace, as_admin, ca=ca) as connection:  # kept through the restart
        channel = connection.channel()
        channel.queue_declare("kept", durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        publish(channel, "kept", ["from before the restart"])
    # A client that does not trust the instance's CA is refused by its own check.
    with pytest.raises(
        (pika.exceptions.AMQPConnectionError, ssl.SSLError), match="CERTIFICATE_VERIFY_FAILED"
    ):
        login_tls(kube, namespace, as_admin, ca=None).close()
    address = kube.get(Service, "events", namespace=namespace).spec.clusterIP

    def management_tls() -> dict[str, Any]:
        transport = httpx2.HTTPTransport(verify=tls_context(ca))
        # The certificate names the Service; the test reaches its address.
        with httpx2.Client(transport=transport, timeout=10) as http:
            response = http.get(
                f"https://{address}:15671/api/overview",
                auth=(user, password),
                extensions={"sni_hostname": host},
                headers={"host": host},
            )
        response.raise_for_status()
        return response.json()

    assert management_tls()["cluster_name"] == "events"

    # TLS only: the plaintext listeners go, the operator keeps managing the node over HTTPS.
    before = kube.get(Pod, "events-0", namespace=namespace).metadata.uid
    kube.patch(
        RabbitMQ,
        "events",
        {"spec": {"tls": {"required": True, "interNode": True}}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    # The node restarted with the new configuration (a new pod, ready), then the cluster formed.
    wait_pod_replaced(kube, "events-0", namespace, before, 240)
    status = wait_formed(kube, namespace, "events", 1, timeout=240)
    assert "amqp" not in status["endpoints"]
    moved = wait_until(
        "the move to distribution over TLS recorded",
        lambda: (
            (s := kube.get(RabbitMQ, "events", namespace=namespace).status)
            and s.get("interNodeTls") is True
            and "interNodeChange" not in s
            and s
        ),
        120,
        1,
    )
    assert (moved["cluster"]["formed"], moved["cluster"]["nodes"]) == (True, ["events-0"])
    reasons = {e.reason for e in kube.list(Event, namespace=namespace) if e.involvedObject.kind == "RabbitMQ"}
    assert {"InterNodeRestart", "InterNodeRestarted"} <= reasons
    assert proto_dist(namespace, "events-0") == '{ok,[["inet_tls"]]}'
    assert (
        check_distribution_over_mutual_tls(kube, namespace, "events", "events-0") == "statefleet instance CA"
    )
    assert status["endpoints"]["amqps"] == f"amqps://{host}:5671"
    ports = {p.name for p in kube.get(Service, "events", namespace=namespace).spec.ports}
    assert ports == {"amqps", "management-tls", "prometheus"}
    ip = kube.get(Pod, "events-0", namespace=namespace).status.podIP

    def plaintext_refused() -> bool:
        for port in (5672, 15672):
            try:
                socket.create_connection((ip, port), timeout=2).close()
                return False
            except OSError:
                pass
        return True

    wait_until("the plaintext listeners off", plaintext_refused, 120, 2)
    round_trip("secure-only")
    with login_tls(kube, namespace, as_admin, ca=ca) as connection:
        assert drain(connection.channel(), "kept") == ["from before the restart"]

    def over_https() -> str | None:
        try:
            return management_tls()["cluster_name"]
        except (httpx2.TransportError, httpx2.HTTPStatusError):
            return None  # its listener a moment behind AMQP's

    assert wait_until("the management API over HTTPS", over_https, 60, 1) == "events"
