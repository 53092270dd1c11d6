"""Pure: scaling a RabbitMQ cluster down without losing a message.

The nodes that leave are the highest ordinals. Before their pods go, every queue replica they
hold moves: a quorum queue (or stream) gets members on the remaining nodes, as many as it
had up to the nodes left, and only then loses its members on the leaving nodes, so it keeps
its majority at every step. A classic queue lives on one node and cannot move: when one on a
leaving node holds messages (or is durable: its bindings are data too) the scale-down is
refused, naming it. Once nothing is left on them the leaving pods are removed, and the
remaining nodes forget them (`rabbitmqctl forget_cluster_node`).

The moves run as RabbitMQ's own CLI (`rabbitmq-queues`, `rabbitmq-streams`) in a Job against
a remaining node: the management API of RabbitMQ 3 has no way to change a queue's members.
Each pass plans again from the queues as they are, so a Job that failed halfway, or an
operator restarted, only does what is left.
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass
from typing import Any

from framework.kube.pod_security import restricted
from services.rabbitmq.cluster import pod_of
from services.rabbitmq.inter_node import CLI_ARGS_ENV, ERL_ARGS

# `status.scaleDown.phase`
MOVING, STOPPING, FORGETTING = "MovingQueues", "StoppingNodes", "ForgettingNodes"
REPLICATED = {"quorum": "rabbitmq-queues", "stream": "rabbitmq-streams"}
ADD = {"quorum": "add_member", "stream": "add_replica"}
DELETE = {"quorum": "delete_member", "stream": "delete_replica"}
# What `GET /api/queues` is asked for (statistics off: a listing of many queues stays cheap).
QUEUE_COLUMNS = "name,vhost,type,node,members,leader,messages,durable,exclusive,auto_delete"
QUEUES_PATH = f"queues?disable_stats=true&enable_queue_totals=true&columns={QUEUE_COLUMNS}"


@dataclass(frozen=True)
class Queue:
    vhost: str
    name: str
    type: str  # classic, quorum, stream
    node: str  # classic: where it lives; quorum and stream: the leader's node
    members: tuple[str, ...]  # quorum and stream: the nodes holding a replica
    messages: int
    durable: bool
    exclusive: bool

    @property
    def label(self) -> str:
        return f"{self.vhost}/{self.name}" if self.vhost != "/" else self.name


def parse_queues(reply: list[dict[str, Any]]) -> list[Queue]:
    """`GET /api/queues` (the columns of QUEUE_COLUMNS) as Queues."""
    return [
        Queue(
            vhost=item.get("vhost", "/"),
            name=item["name"],
            type=item.get("type") or "classic",
            node=item.get("node") or item.get("leader") or "",
            members=tuple(item.get("members") or ()),
            messages=int(item.get("messages") or 0),
            durable=bool(item.get("durable")),
            exclusive=bool(item.get("exclusive")),
        )
        for item in reply
    ]


@dataclass(frozen=True)
class Moves:
    """What it takes to empty the leaving nodes."""

    commands: tuple[tuple[str, ...], ...]  # CLI calls, in order (each without `-n <node>`)
    refusal: str | None = None  # why it cannot be done without losing data
    replicas_moved: int = 0  # members to delete from the leaving nodes

    @property
    def done(self) -> bool:
        return not self.commands and self.refusal is None


def plan_moves(queues: list[Queue], leaving: list[str], remaining: list[str]) -> Moves:
    """The member changes that leave no queue data on the `leaving` nodes (Erlang node names),
    placing new members on the remaining nodes that hold the fewest."""
    gone = set(leaving)
    stuck = [
        queue
        for queue in queues
        if queue.type not in REPLICATED
        and queue.node in gone
        and not queue.exclusive  # an exclusive queue goes with its connection anyway
        and (queue.messages or queue.durable)
    ]
    if stuck:
        listed = ", ".join(
            f"{q.label} on {pod_of(q.node)} ({q.messages} message{'s' if q.messages != 1 else ''})"
            for q in sorted(stuck, key=lambda q: (q.vhost, q.name))[:10]
        )
        more = f" and {len(stuck) - 10} more" if len(stuck) > 10 else ""
        return Moves(
            (),
            refusal=(
                f"classic queues live only on the leaving nodes and would be lost: {listed}{more}; "
                "drain and delete them (or make them quorum queues) first"
            ),
        )
    load = Counter(member for queue in queues for member in queue.members if member not in gone)
    adds: list[tuple[str, ...]] = []
    deletes: list[tuple[str, ...]] = []
    moved = 0
    for queue in sorted(queues, key=lambda q: (q.vhost, q.name)):
        if queue.type not in REPLICATED or not gone & set(queue.members):
            continue
        kept = [member for member in queue.members if member not in gone]
        wanted = min(len(queue.members), len(remaining))
        candidates = sorted((n for n in remaining if n not in kept), key=lambda n: (load[n], n))
        tool, vhost = REPLICATED[queue.type], ("--vhost", queue.vhost)
        for node in candidates[: max(0, wanted - len(kept))]:
            load[node] += 1
            adds.append((tool, ADD[queue.type], *vhost, queue.name, node))
        for member in queue.members:
            if member in gone:
                moved += 1
                deletes.append((tool, DELETE[queue.type], *vhost, queue.name, member))
    # Every new member first: a queue never has fewer replicas than it had.
    return Moves(tuple(adds + deletes), replicas_moved=moved)


def forget_commands(leftover: list[str]) -> tuple[tuple[str, ...], ...]:
    """Removing nodes that no longer run from the cluster's membership."""
    return tuple(("rabbitmqctl", "forget_cluster_node", node) for node in leftover)


Call = tuple[str, ...]  # the node it is made against, then the CLI tool and its arguments
MAX_CALLS = 150  # per Job: one argument list, a deadline; the next Job plans what is left


def cli_script(calls: tuple[Call, ...]) -> str:
    """A bash script that makes each call (`(node, tool, *arguments)`) and ends with a JSON
    report in its termination message: `{"result": ...}`, or `{"error": ...}` naming the call
    that failed and the last lines it printed."""
    lines = [
        "set -u",
        "report() { printf '%s\\n' \"$1\" > /dev/termination-log; printf '%s\\n' \"$1\"; }",
        # JSON-safe: no control characters, backslashes and quotes escaped, short enough for
        # the 4 KiB termination message.
        "escape() { tail -n 5 | tr '\\t\\r\\n' '   ' | tr -d '\\000-\\037' | head -c 1500 |"
        " sed 's/\\\\/\\\\\\\\/g; s/\"/\\\\\"/g'; }",
        "run() {",
        '  if ! out=$("$@" 2>&1); then',
        '    report "{\\"error\\": {\\"reason\\": \\"CommandFailed\\", '
        '\\"message\\": \\"$(printf "%s" "$*" | escape): $(printf "%s" "$out" | escape)\\"}}"',
        "    exit 1",
        "  fi",
        '  printf "%s\\n" "$*"',
        "}",
    ]
    for target, tool, *arguments in calls:
        lines.append(shlex.join(["run", tool, "-n", target, "--longnames", *arguments]))
    lines.append(f'report \'{{"result": {{"calls": {len(calls)}}}}}\'')
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class JobReport:
    """Where the scale-down's current Job stands (`backup.job.job_state`), as last inspected."""

    name: str
    phase: str  # Running, Succeeded, Failed, Missing
    message: str = ""


@dataclass(frozen=True)
class RunCli:
    """Start Job `job` making `calls`, over the distribution the cluster speaks (`inter_node_tls`:
    mutual TLS, `services.rabbitmq.inter_node`)."""

    job: str
    calls: tuple[Call, ...]
    inter_node_tls: bool = False

    def __str__(self) -> str:
        return f"starting Job {self.job}: {len(self.calls)} RabbitMQ CLI calls"


@dataclass(frozen=True)
class DeleteJob:
    job: str

    def __str__(self) -> str:
        return f"deleting Job {self.job}"


@dataclass(frozen=True)
class Step:
    """One pass of a scale-down."""

    state: dict[str, Any] | None  # `status.scaleDown` from now on (None: no scale-down)
    replicas: int  # the nodes the StatefulSet runs now
    refusal: str | None = None
    actions: tuple[RunCli | DeleteJob, ...] = ()
    events: tuple[tuple[str, str, str], ...] = ()  # (type, reason, message)


RETRY_SECONDS = (15, 30, 60, 120, 300)
# What a Job does (`status.scaleDown.purpose`): its success moves the scale-down on.
DRAIN, MOVE, FORGET, REVIVE = "drain", "move", "forget", "revive"


def step(
    *,
    name: str,
    wanted: int,
    running: int | None,
    state: dict[str, Any] | None,
    pods: list[str],
    members: list[str] | None,
    queues: list[Queue] | None,
    job: JobReport | None,
    node: Any,
    now: float,
) -> Step:
    """The next step of scaling the StatefulSet from `running` to `wanted` nodes.

    `state` is `status.scaleDown`; `pods` the pods that exist; `members` the cluster's nodes
    and `queues` its queues as last inspected, after the Job (None: not known); `job` the last
    inspection of the Job `state` names; `node(pod)` the Erlang node of a pod; `now`
    wall-clock seconds.

    Once their queue replicas have moved, the leaving nodes are drained (`rabbitmq-upgrade
    drain`: maintenance mode, no clients, no queue leaders, their queue replicas stopped), and
    the queues listed once more: a queue a client put there in between is moved too (the nodes
    revived first, so that it keeps its majority), and only a clean listing after the drain
    lets the pods go. A scale-down cancelled after a drain revives them."""
    if state is None:
        if running is None or wanted >= running:
            return Step(None, wanted)
        state = {"from": running, "to": wanted, "phase": MOVING, "jobs": 0}
        message = (
            f"scaling down from {running} to {wanted} nodes: moving queue replicas off the leaving nodes"
        )
        return Step({**state, "message": message}, running, events=(("Normal", "ScalingDown", message),))
    source, target, phase = state["from"], state["to"], state["phase"]
    if phase == MOVING and wanted != target and not state.get("cancelled"):
        if wanted >= source:
            state = {**state, "cancelled": True}
        else:
            state, target = {**state, "to": wanted}, wanted
    drained = list(state.get("drained") or [])  # nodes in maintenance mode
    leaving = [node(f"{name}-{i}") for i in range(target, source)]
    remaining = [node(f"{name}-{i}") for i in range(target)]
    replicas = source if phase == MOVING else target

    # A Job of ours runs: wait for it, then learn from how it ended.
    current = state.get("job")
    if current:
        if job is None or job.name != current or job.phase == "Running":
            return Step(state, replicas)
        purpose = state.get("purpose")
        state = {k: v for k, v in state.items() if k not in ("job", "purpose", "calls")}
        if job.phase != "Succeeded":
            failures = state.get("failures", 0) + 1
            delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS)) - 1]
            why = job.message or ("the Job is gone" if job.phase == "Missing" else job.phase)
            message = f"{phase}: Job {current} ({purpose}) failed: {why}; trying again in {delay} s"
            state = {**state, "failures": failures, "retryAt": now + delay, "message": message}
            return Step(
                state,
                replicas,
                actions=(DeleteJob(current),),
                events=(("Warning", "ScaleDownStepFailed", message),),
            )
        state = {k: v for k, v in state.items() if k not in ("failures", "retryAt")}
        if purpose == DRAIN:
            state["drained"] = leaving
        if purpose == REVIVE:
            state["drained"] = []
        return Step(state, replicas, actions=(DeleteJob(current),))

    moves = plan_moves(queues, leaving, remaining) if phase == MOVING and queues is not None else None
    if moves and moves.refusal and not state.get("cancelled"):  # never held back by a retry time
        refusal = (
            f"spec.replicas: scaling down from {source} to {target} nodes would lose data: "
            f"{moves.refusal}; or set spec.replicas back to {source}"
        )
        return Step({**state, "message": refusal}, replicas, refusal=refusal)
    if now < state.get("retryAt", 0):
        return Step(state, replicas)

    def revive(why: str) -> Step:
        calls = tuple((n, "rabbitmq-upgrade", "revive") for n in drained)
        return run(state, name, calls, replicas, REVIVE, f"reviving {', '.join(map(pod_of, drained))}: {why}")

    if drained and (state.get("cancelled") or set(drained) != set(leaving)):
        return revive("they no longer leave" if state.get("cancelled") else "the nodes leaving changed")
    if state.get("cancelled"):
        message = f"scale-down to {target} cancelled: spec.replicas is {wanted} again"
        return Step(None, wanted, events=(("Normal", "ScaleDownCancelled", message),))

    if phase == MOVING:
        if moves is None:
            return Step(state, replicas)
        if moves.commands and drained:
            return revive("queue replicas to move appeared on them")  # stopped while drained
        if moves.commands:
            calls = tuple((remaining[0], *command) for command in moves.commands[:MAX_CALLS])
            return run(state, name, calls, replicas, MOVE, f"moving {moves.replicas_moved} queue replicas")
        if not drained:
            calls = tuple((n, "rabbitmq-upgrade", "drain") for n in leaving)
            return run(state, name, calls, replicas, DRAIN, "draining " + ", ".join(map(pod_of, leaving)))
        message = f"scaling down from {source} to {target} nodes: queues moved, stopping " + ", ".join(
            pod_of(n) for n in leaving
        )
        return Step(
            {**state, "phase": STOPPING, "message": message},
            target,
            events=(("Normal", "QueuesMoved", message),),
        )
    if phase == STOPPING:
        if running != target or any(pod_of(n) in pods for n in leaving):
            return Step(state, target)
        message = f"scaling down from {source} to {target} nodes: removing the stopped nodes from the cluster"
        return Step({**state, "phase": FORGETTING, "message": message}, target)
    # FORGETTING
    if members is None:
        return Step(state, target)
    left = [n for n in leaving if n in members]
    if left:
        calls = tuple((remaining[0], *command) for command in forget_commands(left))
        return run(state, name, calls, target, FORGET, "forgetting " + ", ".join(map(pod_of, left)))
    message = f"scaled down from {source} to {target} nodes"
    return Step(None, target, events=(("Normal", "ScaledDown", message),))


def run(
    state: dict[str, Any], name: str, calls: tuple[Call, ...], replicas: int, purpose: str, what: str
) -> Step:
    jobs = state.get("jobs", 0) + 1
    job = f"{name}-scale-down-{jobs}"
    message = f"scaling down from {state['from']} to {state['to']} nodes: {what} (Job {job})"
    return Step(
        {**state, "jobs": jobs, "job": job, "purpose": purpose, "message": message},
        replicas,
        actions=(RunCli(job, calls),),
    )


def build_cli_job(
    *,
    job: str,
    namespace: str,
    instance: str,
    image: str,
    script: str,
    cookie_secret: str,
    labels: dict[str, str],
    owner: dict[str, Any],
    inter_node_tls: bool = False,
) -> dict[str, Any]:
    """The Job that runs `script` (RabbitMQ's CLI) from the instance's own image, with its
    Erlang cookie. Its pod gets a name under the nodes' headless Service: the CLI's own Erlang
    node needs a fully qualified host name to speak to nodes with long names. With
    `inter_node_tls` the CLI speaks distribution over mutual TLS as the nodes do: the instance's
    certificate (`<instance>-tls`) and the nodes' options file (`<instance>-config`)."""
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "RABBITMQ_USE_LONGNAME", "value": "true"},
        {
            "name": "RABBITMQ_ERLANG_COOKIE",
            "valueFrom": {"secretKeyRef": {"name": cookie_secret, "key": "cookie"}},
        },
    ]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]  # HOME: the CLI's files
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    if inter_node_tls:
        env.append({"name": CLI_ARGS_ENV, "value": ERL_ARGS})
        mounts += [
            {"name": "config", "mountPath": "/etc/statefleet", "readOnly": True},
            {"name": "tls", "mountPath": "/etc/statefleet-tls", "readOnly": True},
        ]
        volumes += [
            {
                "name": "config",
                "configMap": {
                    "name": f"{instance}-config",
                    "items": [{"key": "inter_node_tls.config", "path": "inter_node_tls.config"}],
                },
            },
            # root-owned, group rabbitmq (fsGroup), 0440: as the nodes mount it
            {"name": "tls", "secret": {"secretName": f"{instance}-tls", "defaultMode": 0o440}},
        ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job, "namespace": namespace, "labels": labels, "ownerReferences": [owner]},
        "spec": {
            "backoffLimit": 0,  # the operator retries, planning again from the queues as they are
            "activeDeadlineSeconds": 1800,
            "template": {
                "metadata": {"labels": {k: v for k, v in labels.items() if k != "app.kubernetes.io/name"}},
                "spec": restricted(
                    {
                        "restartPolicy": "Never",
                        "enableServiceLinks": False,
                        "hostname": "scale-down",
                        "subdomain": f"{instance}-nodes",
                        "securityContext": {"runAsUser": 999, "runAsGroup": 999, "fsGroup": 999},
                        "containers": [
                            {
                                "name": "cli",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "command": ["bash", "-c", script],
                                "env": env,
                                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                                "terminationMessagePolicy": "FallbackToLogsOnError",
                                "securityContext": {"readOnlyRootFilesystem": True},
                                "volumeMounts": mounts,
                            }
                        ],
                        "volumes": volumes,
                    }
                ),
            },
        },
    }
