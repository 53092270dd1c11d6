"""Pure: a MongoDB replica set from its members' own replies, and what the operator does next.

The operator asks every pod `hello`, and the primary `replSetGetConfig` and
`replSetGetStatus`; this module reads those replies (their shapes as MongoDB documents them)
and plans one step at a time: initiate the set on the first pod, add the pods that are not
members, remove the members whose pods are going, set priorities, step the primary down.
MongoDB accepts one voting member more or less per reconfiguration, so each step changes at
most one; the next is planned from the replies that follow. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PORT = 27017
# replSetGetStatus member states (https://www.mongodb.com/docs/manual/reference/replica-states/)
PRIMARY, SECONDARY, RECOVERING, STARTUP2, ARBITER = 1, 2, 3, 5, 7
SYNCING = {STARTUP2, RECOVERING}


def member_host(pod: str, name: str, namespace: str) -> str:
    """A pod's address in the set's config: its stable name on the headless Service."""
    return f"{pod}.{name}-nodes.{namespace}.svc:{PORT}"


def pod_of(host: str) -> str:
    return host.split(".", 1)[0].split(":", 1)[0]


@dataclass(frozen=True)
class Hello:
    """One server's `hello` reply."""

    set_name: str | None  # None: not a replica set member (yet)
    writable_primary: bool
    secondary: bool
    me: str | None
    primary: str | None  # the primary it knows of
    hosts: tuple[str, ...]
    set_version: int | None
    awaiting_config: bool  # started as a replica set member, no config yet (not initiated)


def parse_hello(reply: dict[str, Any]) -> Hello:
    return Hello(
        set_name=reply.get("setName"),
        writable_primary=bool(reply.get("isWritablePrimary", reply.get("ismaster"))),
        secondary=bool(reply.get("secondary")),
        me=reply.get("me"),
        primary=reply.get("primary"),
        hosts=tuple(reply.get("hosts") or ()) + tuple(reply.get("passives") or ()),
        set_version=reply.get("setVersion"),
        # A mongod started with --replSet and no config answers isreplicaset: true.
        awaiting_config=bool(reply.get("isreplicaset")) and not reply.get("setName"),
    )


@dataclass(frozen=True)
class ConfigMember:
    id: int
    host: str
    priority: float
    votes: int


@dataclass(frozen=True)
class SetConfig:
    """`replSetGetConfig`'s `config`."""

    name: str
    version: int
    term: int | None
    members: tuple[ConfigMember, ...]
    raw: dict[str, Any] = field(compare=False, repr=False)

    def hosts(self) -> list[str]:
        return [m.host for m in self.members]


def parse_config(reply: dict[str, Any]) -> SetConfig:
    config = reply["config"]
    return SetConfig(
        name=config["_id"],
        version=int(config["version"]),
        term=config.get("term"),
        members=tuple(
            ConfigMember(
                id=int(m["_id"]),
                host=m["host"],
                priority=float(m.get("priority", 1)),
                votes=int(m.get("votes", 1)),
            )
            for m in config["members"]
        ),
        raw=config,
    )


@dataclass(frozen=True)
class MemberState:
    host: str
    state: int
    state_str: str
    healthy: bool
    lag_seconds: float | None  # behind the primary's last applied write (None: unknown)


def parse_status(reply: dict[str, Any]) -> tuple[MemberState, ...]:
    """`replSetGetStatus`: every member as the answering member sees it."""
    members = reply.get("members") or []
    primary = next((m for m in members if m.get("state") == PRIMARY), None)
    primary_at = _seconds(primary.get("optimeDate")) if primary else None
    result = []
    for m in members:
        at = _seconds(m.get("optimeDate"))
        lag = primary_at - at if primary_at is not None and at is not None else None
        result.append(
            MemberState(
                host=m["name"],
                state=int(m.get("state", 0)),
                state_str=m.get("stateStr", ""),
                healthy=bool(m.get("health", 0)),
                lag_seconds=lag,
            )
        )
    return tuple(result)


def _seconds(moment: Any) -> float | None:
    if moment is None:
        return None
    if hasattr(moment, "timestamp"):
        return float(moment.timestamp())
    if isinstance(moment, dict) and "$date" in moment:  # extended JSON, as the docs show it
        value = moment["$date"]
        return value / 1000 if isinstance(value, int | float) else None
    return None


# --- what to do ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Initiate:
    pod: str
    config: dict[str, Any]

    def __str__(self) -> str:
        return f"initiating replica set {self.config['_id']} on {self.pod}"


@dataclass(frozen=True)
class Reconfigure:
    pod: str  # the primary
    config: dict[str, Any]
    why: str

    def __str__(self) -> str:
        return f"reconfiguring the replica set (version {self.config['version']}): {self.why}"


@dataclass(frozen=True)
class StepDown:
    pod: str
    why: str

    def __str__(self) -> str:
        return f"stepping down the primary {self.pod}: {self.why}"


@dataclass(frozen=True)
class SetView:
    initiated: bool  # a member has a config
    primary: str | None  # pod
    members: tuple[str, ...]  # pods in the config
    healthy: int  # members up, as the primary sees them
    syncing: tuple[str, ...]  # pods in initial sync or recovering
    message: str
    actions: tuple[Initiate | Reconfigure | StepDown, ...] = ()
    # Members whose pods the StatefulSet must keep while they are still in the config.
    keep_replicas: int = 0


def plan_replica_set(
    *,
    name: str,
    namespace: str,
    wanted: int,
    answers: dict[str, Hello | None],
    config: SetConfig | None,
    states: tuple[MemberState, ...] | None,
    priorities: dict[str, float] | None = None,
    initiated_before: bool = False,
) -> SetView:
    """The set named `name` should have pods `<name>-0 .. <name>-<wanted-1>` as members, each
    with its priority (default 1). `answers`: `hello` by pod (None: no answer); `config`
    and `states`: from the primary (None when there is none or it did not answer);
    `initiated_before`: status says the set was initiated once (never initiate again: a
    member that lost its disk must not start a second set under the same name)."""
    host = lambda pod: member_host(pod, name, namespace)  # noqa: E731
    wanted_pods = [f"{name}-{i}" for i in range(wanted)]
    priorities = {pod: (priorities or {}).get(pod, 1.0) for pod in wanted_pods}
    answered = {pod: hello for pod, hello in answers.items() if hello is not None}
    primaries = [pod for pod, hello in answered.items() if hello.writable_primary]
    initiated = initiated_before or any(hello.set_name for hello in answered.values())

    if not initiated:
        first = answered.get(wanted_pods[0]) if wanted_pods else None
        if first is None:
            return SetView(False, None, (), 0, (), f"waiting for {name}-0 to answer")
        if not first.awaiting_config:
            return SetView(False, None, (), 0, (), f"{name}-0 is not started as a replica set member")
        initial = {
            "_id": name,
            "version": 1,
            "members": [{"_id": 0, "host": host(wanted_pods[0]), "priority": priorities[wanted_pods[0]]}],
        }
        return SetView(
            False,
            None,
            (),
            0,
            (),
            f"initiating the replica set on {wanted_pods[0]}",
            actions=(Initiate(wanted_pods[0], initial),),
            keep_replicas=wanted,
        )

    if len(primaries) != 1 or config is None:
        many = f"{len(primaries)} members claim to be primary" if len(primaries) > 1 else "no primary"
        members = tuple(sorted({pod_of(h) for hello in answered.values() for h in hello.hosts}))
        return SetView(True, None, members, 0, (), f"{many}: waiting for an election", keep_replicas=wanted)

    primary = primaries[0]
    in_config = {pod_of(m.host): m for m in config.members}
    members = tuple(sorted(in_config, key=_ordinal))
    by_host = {s.host: s for s in states or ()}
    healthy = sum(1 for m in config.members if (s := by_host.get(m.host)) and s.healthy)
    syncing = tuple(pod_of(s.host) for s in states or () if s.state in SYNCING)
    leaving = [pod for pod in members if pod not in wanted_pods]
    joining = [pod for pod in wanted_pods if pod not in in_config]
    keep = max([wanted, *(_ordinal(pod) + 1 for pod in members)])
    summary = f"{healthy} of {len(members)} members healthy, primary {primary}"

    def reconfigure(new_members: list[dict[str, Any]], why: str) -> SetView:
        new = {**config.raw, "version": config.version + 1, "members": new_members}
        return SetView(
            True,
            primary,
            members,
            healthy,
            syncing,
            f"{summary}; {why}",
            actions=(Reconfigure(primary, new, why),),
            keep_replicas=keep,
        )

    current = [dict(m) for m in config.raw["members"]]
    if leaving:
        # Highest ordinal first: the StatefulSet removes pods from the top.
        going = max(leaving, key=_ordinal)
        if going == primary:
            return SetView(
                True,
                primary,
                members,
                healthy,
                syncing,
                f"{summary}; {going} leaves the set: stepping it down first",
                actions=(StepDown(primary, f"{going} leaves the replica set"),),
                keep_replicas=keep,
            )
        return reconfigure(
            [m for m in current if pod_of(m["host"]) != going], f"removing {going} (members: {wanted})"
        )
    if joining and not syncing:
        # One at a time, each once the one before has caught up (initial sync is heavy).
        ready_to_join = [pod for pod in joining if (hello := answered.get(pod)) and hello.awaiting_config]
        if ready_to_join:
            pod = min(ready_to_join, key=_ordinal)
            new_id = max((int(m["_id"]) for m in current), default=-1) + 1
            return reconfigure(
                [*current, {"_id": new_id, "host": host(pod), "priority": priorities[pod], "votes": 1}],
                f"adding {pod}",
            )
    changed = [
        {**m, "priority": priorities[pod_of(m["host"])]}
        if float(m.get("priority", 1)) != priorities[pod_of(m["host"])]
        else m
        for m in current
    ]
    if changed != current:
        return reconfigure(changed, "setting member priorities")
    waiting = ""
    if joining:
        waiting = "; waiting for " + ", ".join(joining) + (" (a member is syncing)" if syncing else "")
    return SetView(True, primary, members, healthy, syncing, summary + waiting, keep_replicas=keep)


def _ordinal(pod: str) -> int:
    return int(pod.rsplit("-", 1)[-1])
