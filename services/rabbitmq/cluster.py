"""Pure: what the nodes of one `RabbitMQ` say about their cluster.

Each node's management API answers `GET /api/nodes` with the cluster as that node sees it:
every member, whether it runs, and the members it is partitioned from. The operator asks
every pod and reads the answers here; nothing in this module does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def node_name(pod: str, name: str, namespace: str) -> str:
    """The Erlang node of a pod (RABBITMQ_NODENAME in the template: a long name on the
    headless Service, stable across restarts)."""
    return f"rabbit@{pod}.{name}-nodes.{namespace}"


def pod_of(node: str) -> str:
    return node.split("@", 1)[-1].split(".", 1)[0]


@dataclass(frozen=True)
class NodeAnswer:
    """One node's `GET /api/nodes`."""

    running: frozenset[str]  # members that run
    stopped: frozenset[str]  # members that do not
    partitions: frozenset[str]  # members this node is partitioned from

    @property
    def members(self) -> frozenset[str]:
        return self.running | self.stopped


def parse_nodes(reply: list[dict[str, Any]]) -> NodeAnswer:
    running = frozenset(n["name"] for n in reply if n.get("running"))
    stopped = frozenset(n["name"] for n in reply if not n.get("running"))
    partitions = frozenset(p for n in reply for p in n.get("partitions") or [])
    return NodeAnswer(running, stopped, partitions)


@dataclass(frozen=True)
class ClusterView:
    members: tuple[str, ...]  # the cluster the answering nodes share (all of them when split)
    running: tuple[str, ...]
    answered: int  # pods whose node answered
    formed: bool  # every wanted pod's node is a running member of one cluster, no partition
    quorum: bool  # a majority of the wanted nodes run in one cluster, no split
    split: bool  # answering nodes belong to clusters that do not know each other
    partitions: tuple[str, ...]
    missing: tuple[str, ...] = ()  # wanted pods whose node is not a member
    leftover: tuple[str, ...] = ()  # members that are no wanted pod's node (scaled away)
    message: str = ""


def read_cluster(
    name: str, namespace: str, replicas: int, answers: dict[str, NodeAnswer | None]
) -> ClusterView:
    """`answers`: by pod, its node's view (None: did not answer)."""
    wanted = [node_name(f"{name}-{i}", name, namespace) for i in range(replicas)]
    views = [answer for answer in answers.values() if answer is not None]
    if not views:
        return ClusterView((), (), 0, False, False, False, (), tuple(wanted), (), "no node answered yet")
    members = frozenset().union(*(view.members for view in views))
    running = frozenset().union(*(view.running for view in views))
    # Two nodes in one cluster list each other; a node another does not list (or that does not
    # list it) is in a cluster of its own, even when the others still count its name as theirs.
    answering = {node_name(pod, name, namespace): answer for pod, answer in answers.items() if answer}
    split = any(
        node not in other.members or other_node not in answer.members
        for node, answer in answering.items()
        for other_node, other in answering.items()
    )
    partitions = frozenset().union(*(view.partitions for view in views))
    missing = tuple(node for node in wanted if node not in members)
    leftover = tuple(sorted(members - set(wanted)))
    down = [node for node in wanted if node in members and node not in running]
    formed = not split and not partitions and not missing and not down
    quorum = not split and not partitions and len(set(wanted) & running) > replicas // 2
    if split:
        message = "the nodes formed separate clusters: " + "; ".join(
            sorted({", ".join(sorted(pod_of(n) for n in view.running)) for view in views})
        )
    elif partitions:
        message = "network partition: " + ", ".join(sorted(pod_of(n) for n in partitions))
    elif missing:
        message = "waiting for " + ", ".join(pod_of(n) for n in missing) + " to join the cluster"
    elif down:
        message = ", ".join(pod_of(n) for n in down) + " not running"
    else:
        message = f"{len(wanted)} of {replicas} nodes running in the cluster"
    return ClusterView(
        members=tuple(sorted(members)),
        running=tuple(sorted(running)),
        answered=len(views),
        formed=formed,
        quorum=quorum,
        split=split,
        partitions=tuple(sorted(partitions)),
        missing=missing,
        leftover=leftover,
        message=message,
    )
