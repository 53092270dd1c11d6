"""Pure: what the nodes' Erlang distribution speaks (plaintext or mutual TLS), and the move of a
running cluster from one to the other.

Distribution over TLS (`-proto_dist inet_tls`) carries everything nodes say to each other and
what RabbitMQ's CLI says to a node. A node speaking TLS cannot reach one speaking plaintext, nor
the other way round: rolling a cluster over one node at a time would leave each restarted node
unable to rejoin the others, so a running cluster moves by a full restart. Every node stops and
starts again with the new setting; each keeps its data and rejoins the cluster it was in, and the
cluster is down in between (no message is lost: queues are on disk). The restart starts only
while every node runs in one cluster and no scale-down is under way, and a scale-down waits
until the restart is over.

What the cluster speaks is kept in `status.interNodeTls`: chosen when the cluster is made
(`spec.tls.interNode`, on unless set to false), read from the StatefulSet for a cluster made
before this setting existed (plaintext), changed only by a full restart that completed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from framework.kube.api import EventNote
from framework.kube.pods import pod_ready
from framework.rollout.plan import REVISION_LABEL

FIELD = "spec.tls.interNode"
# What the nodes and the CLI are started with for distribution over TLS (the options file is the
# ConfigMap's `inter_node_tls.config`, mounted at /etc/statefleet).
OPTIONS_FILE = "/etc/statefleet/inter_node_tls.config"
ERL_ARGS = f"-proto_dist inet_tls -ssl_dist_optfile {OPTIONS_FILE}"
CLI_ARGS_ENV = "RABBITMQ_CTL_ERL_ARGS"
# On the pod template of nodes started for distribution over TLS (absent: plaintext).
ANNOTATION = "statefleet.dev/inter-node"
WAITING, RESTARTING = "Waiting", "Restarting"  # status.interNodeChange.phase


def words(tls: bool) -> str:
    return "TLS" if tls else "plaintext"


def template_speaks_tls(statefulset: dict[str, Any] | None) -> bool | None:
    """Whether the StatefulSet's nodes are started for distribution over TLS (None: no
    StatefulSet), by its pod template's annotation: the operator's index of StatefulSets keeps
    a template's annotations only."""
    if statefulset is None:
        return None
    template = ((statefulset.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return (template.get("annotations") or {}).get(ANNOTATION) == "tls"


def restarted(statefulset: dict[str, Any] | None, pods: list[dict[str, Any]], replicas: int) -> bool:
    """Whether every node runs the StatefulSet's current template: `replicas` ready pods made
    from its update revision. (The StatefulSet's own currentRevision is no witness: the rollout
    controller moves a partition, and the StatefulSet controller leaves it behind.)"""
    if statefulset is None:
        return False
    status = statefulset.get("status") or {}
    generation = (statefulset.get("metadata") or {}).get("generation", 0)
    revision = status.get("updateRevision")
    if not revision or status.get("observedGeneration", 0) < generation:
        return False
    current = [
        pod
        for pod in pods
        if (pod["metadata"].get("labels") or {}).get(REVISION_LABEL) == revision and pod_ready(pod)
    ]
    return len(current) >= replicas


@dataclass(frozen=True)
class InterNode:
    """One pass's decision."""

    tls: bool  # what the templates start the nodes with
    full_restart: bool  # the rollout restarts every node at once (no PDB, no per-node hook)
    cli_tls: bool  # what the CLI Jobs speak (the cluster's settled setting)
    status: dict[str, Any] = field(default_factory=dict)  # interNodeTls, interNodeChange (None: gone)
    events: tuple[EventNote, ...] = ()
    message: str = ""  # for the reading's message while a change waits or runs
    restarting: bool = False


def decide(
    *,
    wanted: bool | None,
    status: dict[str, Any],
    statefulset: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    replicas: int,
    whole: bool,
    scaling_down: bool,
    now: str,
) -> InterNode:
    """`wanted`: spec.tls.interNode (None: not set); `status`: the resource's; `whole`: every
    node ready and running in one cluster; `now`: the time to record."""
    settled = status.get("interNodeTls")
    if settled is None:
        made = statefulset is not None or bool(pods) or bool(status.get("initialized"))
        # A new cluster starts with TLS unless told otherwise; one made before speaks plaintext.
        settled = bool(template_speaks_tls(statefulset)) if made else wanted is not False
    target = settled if wanted is None else wanted
    change = status.get("interNodeChange") or {}

    if change.get("phase") == RESTARTING:
        if template_speaks_tls(statefulset) == target and restarted(statefulset, pods, replicas) and whole:
            message = f"{FIELD}: every node restarted; the cluster speaks {words(target)} between its nodes"
            return InterNode(
                target,
                False,
                target,
                {"interNodeTls": target, "interNodeChange": None},
                (EventNote("Normal", "InterNodeRestarted", message),),
            )
        message = (
            f"{FIELD}: restarting every node at once for distribution over {words(target)} "
            "(a node speaking one cannot reach a node speaking the other)"
        )
        started = change.get("startedAt") or now
        fields = {"to": target, "phase": RESTARTING, "startedAt": started, "message": message}
        return InterNode(
            target,
            True,
            settled,
            {"interNodeTls": settled, "interNodeChange": fields},
            message=message,
            restarting=True,
        )

    if target == settled:
        return InterNode(settled, False, settled, {"interNodeTls": settled, "interNodeChange": None})

    if scaling_down or not whole:
        why = "the scale-down is over" if scaling_down else "every node runs in one cluster"
        message = (
            f"{FIELD}: distribution over {words(target)} needs every node restarted at once; "
            f"waiting until {why}"
        )
        events = (
            () if change.get("message") == message else (EventNote("Normal", "InterNodeWaiting", message),)
        )
        fields = {"to": target, "phase": WAITING, "message": message}
        return InterNode(
            settled, False, settled, {"interNodeTls": settled, "interNodeChange": fields}, events, message
        )

    message = (
        f"{FIELD}: restarting every node at once for distribution over {words(target)} "
        "(a node speaking one cannot reach a node speaking the other): the cluster is down until "
        "they are back; every node keeps its data"
    )
    fields = {"to": target, "phase": RESTARTING, "startedAt": now, "message": message}
    return InterNode(
        target,
        True,
        settled,
        {"interNodeTls": settled, "interNodeChange": fields},
        (EventNote("Warning", "InterNodeRestart", message),),
        message,
        restarting=True,
    )


def scale_down_held(replicas_wanted: int, running: int | None, decision: InterNode) -> str | None:
    """The refusal of a scale-down asked while every node restarts (None: not held)."""
    if not decision.restarting or running is None or replicas_wanted >= running:
        return None
    return (
        f"spec.replicas: scaling down from {running} to {replicas_wanted} nodes waits until the full "
        f"restart for {FIELD} is over; or set spec.replicas back to {running}"
    )
