"""Which instance is the primary, and what to do to keep exactly one: a pure function of what
the pods and the servers last said.

Every server starts as a standby of `<name>-rw` (see the start script in the ConfigMap);
only the operator promotes. The `<name>-rw` Service selects the pod labelled
`statefleet.dev/role=primary`, and the operator labels at most one pod so: during a failover
or a switchover it takes the label away first, waits until the Service has no endpoint left,
and only then promotes the chosen standby and labels it. Two primaries are never reachable
through `<name>-rw`, and a server that was primary and comes back starts as a standby
(rewound if it went further than the new primary), so it can never take writes again.

State lives in the resource's status (`currentPrimary`, `targetPrimary`, `failover`), so an
operator restarted in the middle of a failover continues it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from framework.kube.times import format_time

PRIMARY, REPLICA = "primary", "replica"
# A standby that has not streamed for this long while the primary is healthy has diverged (or
# lost its WAL): its pod is restarted, and the start script rewinds or re-clones it.
REJOIN_AFTER = 30.0
FRESH = 3.0  # seconds: a probe older than this does not decide whether the primary is down
# A server whose pod looks ready but that has not answered for this long is down: a frozen
# machine or container keeps its pod Ready (the kubelet's probes hang with it).
SILENT_LIMIT = 3.0
HEARTBEAT = 2.0  # seconds between probes of a cluster with standbys, to notice that
# A failover deletes the old primary's pod with this grace period: a server that still runs
# (cut off from us, not from its clients) stops with a fast shutdown, which hands its last WAL
# to the standbys, and its pod goes soon after.
FENCE_GRACE = 3
# Past the grace period, a fenced server not seen to stop (its kubelet cut off too, a frozen
# container) is taken for stopped this long after: the kubelet kills at the end of the grace.
FENCE_MARGIN = 2.0


@dataclass(frozen=True)
class Facts:
    """One probe of one server."""

    in_recovery: bool
    lsn: int  # a primary's write position; a standby's received or replayed, whichever is further
    timeline: int
    streaming: bool = False  # a standby's WAL receiver is streaming
    # A standby: the pod (or Service) its WAL receiver streams from, or is set to reach while it
    # connects; the first label of the host name.
    upstream: str | None = None


@dataclass(frozen=True)
class Member:
    """One instance: its pod as the API shows it, and its server as the last probe found it."""

    pod: str
    exists: bool = True
    ready: bool = False
    terminating: bool = False
    facts: Facts | None = None  # None: not answering at the last probe (or not probed yet)
    probed_at: float = 0.0  # monotonic time of the last probe, 0 = never
    not_streaming_since: float | None = None
    silent_since: float | None = None  # not answering since (monotonic), None while it answers
    confirmed_primary: bool = False  # answered as a primary in this life of its pod
    server_stopped: bool = False  # its server's container is not running (terminated, or waiting)
    grace_ends: float | None = None  # a pod being deleted: when its grace period ends (epoch)
    unready_since: float | None = None  # its pod's Ready condition False since (epoch)
    # "<pod uid>/<restarts>" of its server's container while that runs, None while it does not:
    # a fenced server is stopped once this changed.
    server_life: str | None = None
    # its server's container waits out the kubelet's crash back-off after serving a while
    backing_off: bool = False

    @property
    def answers_as_primary(self) -> bool:
        return self.facts is not None and not self.facts.in_recovery

    @property
    def standby(self) -> bool:
        return self.facts is not None and self.facts.in_recovery


@dataclass(frozen=True)
class Promote:
    pod: str


@dataclass(frozen=True)
class RestartPod:
    """Delete the pod: its server stops (fast shutdown, which sends the last WAL to the
    standbys) and the StatefulSet brings it back as a standby."""

    pod: str
    reason: str
    grace: int | None = None  # seconds; None: the pod's own grace period


@dataclass(frozen=True)
class Repoint:
    """Make standbys stream from `primary` now (a receiver that was connecting to a frozen
    server would otherwise wait for ever)."""

    pods: tuple[str, ...]
    primary: str


@dataclass(frozen=True)
class Reclone:
    """Leave a mark in the pod's volume, then delete the pod: its start script moves the data
    aside and clones the primary afresh (a standby that lost the WAL it needs never catches
    up by restarting)."""

    pod: str
    reason: str


Action = Promote | RestartPod | Repoint | Reclone


@dataclass
class PrimaryPlan:
    primary: str  # status.currentPrimary
    target: str | None  # status.targetPrimary: a change in progress
    labels: dict[str, str]  # pod -> role
    actions: list[Action] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    failover: dict[str, Any] | None = None  # status.failover: the change in progress, or the last one
    switchover_done: str | None = None  # the switchover request now served (status.switchover.served)
    rollout_switchover_done: str | None = None  # status.switchover.rolloutServed
    probe_again: float | None = None  # seconds until a fresh probe is needed
    # status.rejoins, restarts of standbys that did not follow; None: unchanged (not looked at)
    rejoins: dict[str, int] | None = None


@dataclass(frozen=True)
class PrimaryInput:
    name: str
    instances: int
    status: dict[str, Any]
    members: dict[str, Member]  # by pod name, every pod of the StatefulSet
    rw_endpoints: frozenset[str] | None  # pods behind `<name>-rw` now; None: not looked at
    now: float  # wall-clock seconds (recorded in status)
    monotonic: float  # the probes' clock
    synchronous: int = 0  # synchronous standbys a commit waits for
    switchover_to: str | None = None
    switchover_request: str | None = None  # identifies one request (served once)
    # A rollout's request (status.switchover.rollout, "<pod>@<revision>"): the primary moves to
    # ordinal 0, the pod the rollout updates last.
    rollout_switchover: str | None = None


def change_mark(status: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies the step a change of primary is at: answers asked under another step
    (before a promotion another operator has since completed, say) decide nothing. The primary's
    name alone does not tell: a primary promoted again in place keeps it."""
    change = status.get("failover") or {}
    return (
        status.get("currentPrimary"),
        status.get("targetPrimary"),
        change.get("startedAt"),
        change.get("completedAt"),
    )


def ordinal(pod: str) -> int:
    return int(pod.rsplit("-", 1)[1])


def down(member: Member | None, monotonic: float) -> str | None:
    """Why the primary cannot serve, or None when it can."""
    if member is None or not member.exists:
        return "its pod is gone"
    if member.terminating:
        return "its pod is being deleted"
    if member.facts is None and not member.ready:
        return "its server does not answer and its pod is not ready"
    if (
        member.facts is None
        and member.silent_since is not None
        and monotonic - member.silent_since >= SILENT_LIMIT
    ):
        return f"its server has not answered for {monotonic - member.silent_since:.0f} s"
    return None


# A pod whose grace period is over and whose server does not answer is taken for stopped this
# long after (the kubelet kills the container at the end of the grace period).
PAST_GRACE = 5.0


# A primary whose pod is not ready gets no client through `<name>-rw`; its server may answer us
# all the same (a readiness probe that times out on a busy machine, a kubelet in trouble).
# This long first, so a probe that fails for a moment moves nothing.
UNREADY_LIMIT = 15.0


def kept_from_clients(current: Member, now: float) -> str | None:
    """Why a primary that answers must be replaced all the same: its pod has not been ready
    for UNREADY_LIMIT seconds (None: it serves, or not for long enough to act)."""
    if current.ready or current.terminating or current.unready_since is None:
        return None
    unready_for = now - current.unready_since
    if unready_for < UNREADY_LIMIT:
        return None
    return (
        f"its pod has not been ready for {unready_for:.0f} s (no client reaches it) while its server answers"
    )


def stuck_stopping(old: Member, now: float) -> str | None:
    """Why a primary whose pod is being deleted no longer holds its switchover back (None: it
    may still be sending its last WAL): its server stopped, yet its pod stays; or its grace
    period is over and its server does not answer."""
    if old.facts is not None:
        return None  # it answers: stopping cleanly, or still a primary (never two)
    if old.server_stopped:
        return f"{old.pod}'s server stopped but its pod is still being deleted"
    if old.grace_ends is not None and now - old.grace_ends > PAST_GRACE:
        return f"{old.pod}'s pod is still being deleted {now - old.grace_ends:.0f} s after its grace period"
    return None


def most_advanced(members: list[Member], require_ready: bool = True) -> Member | None:
    """The standby with the most WAL (the lowest ordinal among equals)."""
    ready = [m for m in members if m.standby and (m.ready or not require_ready) and not m.terminating]
    if not ready:
        return None
    return max(ready, key=lambda m: (m.facts.lsn if m.facts else 0, -ordinal(m.pod)))


def plan_primary(observed: PrimaryInput) -> PrimaryPlan:
    status = observed.status
    primary = status.get("currentPrimary") or f"{observed.name}-0"
    target = status.get("targetPrimary")
    members = observed.members
    everyone_replica = {pod: REPLICA for pod in members}

    if target:
        return _finish_change(observed, primary, target, everyone_replica)

    # Only a server seen answering as a primary in this life of its pod carries the label: a
    # restarted one comes back a standby, and `<name>-rw` must not send writes to it.
    labels = {
        pod: (PRIMARY if pod == primary and m.confirmed_primary else REPLICA) for pod, m in members.items()
    }
    plan = PrimaryPlan(primary=primary, target=None, labels=labels, failover=status.get("failover"))
    current = members.get(primary)
    if (
        current is not None
        and current.exists
        and not current.ready
        and not current.terminating
        and observed.monotonic - current.probed_at > FRESH
    ):
        plan.probe_again = 0.2  # its pod is not ready: what does its server say now?
        return plan
    why_down = down(current, observed.monotonic)

    if why_down is None and current is not None and current.answers_as_primary:
        unready = kept_from_clients(current, observed.now)
        best = most_advanced([m for m in members.values() if m.pod != primary])
        if unready is not None and best is not None and observed.instances > 1:
            return _start_change(observed, plan, primary, best, unready, "Failover")
        _keep_healthy(observed, plan, current)
        return plan

    if why_down is None and current is not None and current.standby:
        # The primary's server restarted and came back as a standby, as every server does.
        others = [m for m in members.values() if m.pod != primary]
        rival = next((m for m in others if m.answers_as_primary), None)
        best = most_advanced(others)
        if rival is None and (best is None or best.facts is None or current.facts.lsn >= best.facts.lsn):
            if not status.get("initialized"):
                plan.actions.append(Promote(primary))  # a new cluster's first primary
                plan.probe_again = 0.5
                return plan
            # Recorded first, like any change of primary: a second operator that saw it down
            # meanwhile cannot also start a failover (its status write fails).
            return _start_change(observed, plan, primary, current, "its server restarted", "Restart")
        if rival is None and best is not None:
            return _start_change(observed, plan, primary, best, "it restarted behind a standby", "Failover")
        # Another server answers as a primary without the label: it is the one fenced.
        assert rival is not None
        plan.actions.append(RestartPod(rival.pod, f"it answers as a primary while {primary} is the primary"))
        plan.events.append(
            (
                "Warning",
                "Fenced",
                f"{rival.pod} answered as a primary beside {primary}: restarted as a standby",
            )
        )
        plan.probe_again = 1.0
        return plan

    if why_down is None:
        plan.probe_again = 1.0  # not probed yet, or answering oddly: look again soon
        return plan

    # The primary is down.
    if observed.instances == 1 or len(members) == 1 or not status.get("initialized"):
        plan.probe_again = 2.0  # (a new cluster's first primary is not down: it is starting)
        return plan
    standbys = [m for m in members.values() if m.pod != primary]
    fresh = [m for m in standbys if m.probed_at and observed.monotonic - m.probed_at < FRESH]
    if len(fresh) < len(standbys):
        plan.probe_again = 0.2  # decide on what the standbys say now
        return plan
    if observed.synchronous:
        # A commit was acknowledged once `synchronous` standbys had it: only when enough of
        # them answer is the most advanced sure to hold every acknowledged commit.
        needed = observed.instances - 1 - observed.synchronous + 1  # a missing pod counts as silent
        answering = [m for m in standbys if m.standby and not m.terminating]
        if len(answering) < needed:
            message = (
                f"primary {primary} is down ({why_down}); waiting for {needed} standbys to answer before "
                f"promoting one (synchronous commit: {len(answering)} answer)"
            )
            if (status.get("failover") or {}).get("waiting") != message:
                plan.events.append(("Warning", "FailoverWaiting", message))
                plan.failover = {**(status.get("failover") or {}), "waiting": message}
            plan.probe_again = 1.0
            return plan
    # Synchronous: the most WAL among every standby that answers, ready or not (the one that
    # holds the acknowledged commits may be the one still catching up on replay).
    best = most_advanced(standbys, require_ready=not observed.synchronous)
    if best is None:
        plan.probe_again = 1.0
        return plan
    # A pod taken down on purpose (a rollout's eviction, a delete) stops cleanly: its last WAL
    # reaches the standbys before the new primary is promoted, as in a switchover.
    kind = "Switchover" if current is not None and current.terminating else "Failover"
    return _start_change(observed, plan, primary, best, why_down, kind)


def _keep_healthy(observed: PrimaryInput, plan: PrimaryPlan, current: Member) -> None:
    """The primary serves: fence any other server that answers as a primary, rejoin standbys
    that stopped following, and serve a switchover request."""
    primary = current.pod
    rejoins = {  # a pod being replaced is missing for a moment: only ordinals scaled away go
        pod: int(n)
        for pod, n in (observed.status.get("rejoins") or {}).items()
        if pod in observed.members or ordinal(pod) < observed.instances
    }
    for member in observed.members.values():
        if member.pod == primary or member.terminating:
            continue
        if member.backing_off:
            # Killed again and again (the kubelet's back-off grows to 5 min): a new pod starts
            # at once, as a standby of the primary.
            plan.actions.append(RestartPod(member.pod, "its server waits out the kubelet's back-off"))
            plan.events.append(
                (
                    "Warning",
                    "BackOffSkipped",
                    f"{member.pod}'s server was killed after it had run, and the kubelet holds its "
                    "restart back: its pod is made again, to start now",
                )
            )
        elif member.answers_as_primary:
            plan.actions.append(RestartPod(member.pod, f"it answers as a primary beside {primary}"))
            plan.events.append(
                (
                    "Warning",
                    "Fenced",
                    f"{member.pod} answered as a primary beside {primary}: restarted as a standby",
                )
            )
        elif (
            member.standby
            and member.not_streaming_since is not None
            and observed.monotonic - member.not_streaming_since > REJOIN_AFTER
        ):
            tries = rejoins.get(member.pod, 0)
            rejoins[member.pod] = tries + 1
            silent = f"{member.pod} has not streamed from {primary} for {REJOIN_AFTER:.0f} s"
            if tries == 0:
                plan.actions.append(RestartPod(member.pod, "it stopped following the primary"))
                plan.events.append(("Warning", "Rejoining", f"{silent}: restarted to rewind it"))
            else:
                # A restart did not help: it lacks WAL the primary no longer has.
                plan.actions.append(Reclone(member.pod, "it did not follow the primary after a restart"))
                plan.events.append(
                    (
                        "Warning",
                        "Recloning",
                        f"{silent}, after {tries} restart(s): cloned again from {primary}",
                    )
                )
        elif member.standby and member.facts is not None and member.facts.streaming:
            rejoins.pop(member.pod, None)  # following again
    plan.rejoins = rejoins
    if ordinal(primary) >= observed.instances:
        # Scaling down removes the highest ordinals: the primary moves first.
        staying = most_advanced([m for m in observed.members.values() if ordinal(m.pod) < observed.instances])
        if staying is not None:
            why = f"scaling down to {observed.instances} instances removes {primary}"
            _start_change(observed, plan, primary, staying, why, "Switchover")
            return
        plan.probe_again = 1.0
        return
    served = observed.status.get("switchover") or {}
    asked = observed.switchover_request
    if observed.switchover_to and asked and asked != served.get("served"):
        refusal = f"spec.switchover.to: {observed.switchover_to} is not a ready standby of {observed.name}"
        outcome = _serve_switchover(
            observed, plan, primary, observed.switchover_to, "switchover requested", refusal
        )
        if outcome != WAIT:
            plan.switchover_done = asked
        if outcome == STARTED:
            return
    asked = observed.rollout_switchover
    if asked and asked != served.get("rolloutServed"):
        to = asked.split("@", 1)[0]
        refusal = f"a rollout wanted {to} as the primary, to update it last, but it is not a ready standby"
        outcome = _serve_switchover(observed, plan, primary, to, "a rollout updates this pod last", refusal)
        if outcome != WAIT:
            plan.rollout_switchover_done = asked
        if outcome == STARTED:
            return
    unknown = [m for m in observed.members.values() if m.ready and m.facts is None and not m.terminating]
    if unknown:
        plan.probe_again = 1.0  # a new, restarted or thawed server: what is it?
    else:
        plan.probe_again = HEARTBEAT if len(observed.members) > 1 else None


DONE, STARTED, WAIT = "done", "started", "wait"


def _serve_switchover(
    observed: PrimaryInput, plan: PrimaryPlan, primary: str, to: str, why: str, refusal: str
) -> str:
    """Serves one switchover request: DONE (refused, or nothing to do), STARTED, or WAIT (the
    wanted pod has not been asked yet what it is)."""
    wanted = observed.members.get(to)
    if to == primary:
        plan.events.append(("Normal", "SwitchoverDone", f"{primary} is the primary already"))
        return DONE
    silent = wanted is not None and down(wanted, observed.monotonic) is not None
    if wanted is not None and wanted.ready and wanted.facts is None and not silent:
        return WAIT  # the next probe says whether it is a standby (a frozen one is refused)
    if wanted is None or not (wanted.standby and wanted.ready):
        plan.events.append(("Warning", "SwitchoverRefused", refusal))
        return DONE
    _start_change(observed, plan, primary, wanted, why, "Switchover")
    return STARTED


def _start_change(
    observed: PrimaryInput, plan: PrimaryPlan, primary: str, to: Member, why: str, kind: str
) -> PrimaryPlan:
    plan.target = to.pod
    plan.labels = {pod: REPLICA for pod in observed.members}
    old = observed.members.get(primary)
    if (
        kind == "Failover"
        and old is not None
        and old.exists
        and (old.ready or old.answers_as_primary or old.server_life is not None)
        and not (old.terminating or old.standby)
    ):
        # Fenced: its pod looks ready but its server is silent to us (frozen, or cut off from
        # us but not from its clients), or its server answers from a pod that is not ready:
        # its clients lose it now. Its pod goes with a short grace period (a clean stop sends
        # its last WAL) and comes back a standby; nothing is promoted until this life of its
        # server is over (see `_fence_pending`). A server that is down and not ready serves
        # nobody and is left to restart.
        plan.actions.append(RestartPod(primary, "fenced: a failover replaces it", grace=FENCE_GRACE))
        fenced = old.server_life
    else:
        fenced = None
    plan.failover = {
        "kind": kind,
        "from": primary,
        "to": to.pod,
        "reason": why,
        "startedAt": format_time(observed.now),
        "startedAtSeconds": observed.now,
        **({"fenced": fenced} if fenced else {}),
    }
    lsn = f" at LSN {format_lsn(to.facts.lsn)}" if to.facts else ""
    if kind == "Restart":
        message = f"{primary} is promoted again in place{lsn}: {why}"
    else:
        message = f"{primary} -> {to.pod}{lsn}: {why}"
    plan.events.append(("Warning" if kind == "Failover" else "Normal", f"{kind}Started", message))
    plan.probe_again = 0.2 if kind != "Restart" else 0.05
    return plan


def _finish_change(
    observed: PrimaryInput, primary: str, target: str, everyone_replica: dict[str, str]
) -> PrimaryPlan:
    status = observed.status
    change = dict(status.get("failover") or {})
    plan = PrimaryPlan(primary=primary, target=target, labels=everyone_replica, failover=change)
    if target == primary:
        return _finish_restart(observed, plan, change)
    chosen = observed.members.get(target)
    old = observed.members.get(primary)
    failover = change.get("kind") == "Failover"
    if observed.rw_endpoints is None or observed.rw_endpoints:
        plan.probe_again = 0.2  # the label is gone; wait until the Service lets go as well
        return plan
    if change.get("kind") == "Switchover" and old is not None and old.terminating:
        # Stopping: a server in a fast shutdown refuses new connections at once, but sends its
        # last WAL to the standbys until it exits, and its pod goes only after that. A pod that
        # stays (a finalizer, a kubelet that is gone) holds nothing back once its server stopped,
        # or once its grace period is over and it does not answer.
        stuck = stuck_stopping(old, observed.now)
        if stuck is None:
            plan.probe_again = 0.3
            return plan
        if change.get("stuck") != stuck:
            plan.failover = change = {**change, "stuck": stuck}
            plan.events.append(("Warning", "PrimaryStuckTerminating", f"{stuck}: promoting {target}"))
    if old is not None and old.answers_as_primary:
        # Nothing is promoted while the old primary answers as one. A failover fenced it (a
        # server that answers again is fenced all the same: it may have lost writes' answers
        # to its clients, and a second operator may have seen it down); a switchover stops it
        # cleanly, which sends every last WAL record to the standbys.
        if not old.terminating:
            if failover:
                plan.actions.append(RestartPod(primary, "fenced: a failover replaces it", grace=FENCE_GRACE))
                if not change.get("fenced") and old.server_life:
                    plan.failover = {**change, "fenced": old.server_life}
            else:
                plan.actions.append(
                    RestartPod(primary, "switchover: it stops so the new primary has all its WAL")
                )
        plan.probe_again = 0.3
        return plan
    if failover and _fence_pending(observed, plan, change, old):
        return plan
    change = plan.failover or change
    if (chosen is None or chosen.facts is None or chosen.terminating) and change.get("promoting"):
        plan.probe_again = 1.0  # promoted, or being: never a second one
        return plan
    if chosen is not None and chosen.facts is None and not _gone(chosen, observed.monotonic):
        # One answer lost (a busy machine): the chosen one is the most advanced, or the one a
        # switchover asked for; another would be a different choice, so ask again first.
        plan.probe_again = 0.3
        return plan
    if chosen is None or chosen.facts is None or chosen.terminating:
        # The chosen standby went away too: choose again among those that answer.
        others = [m for m in observed.members.values() if m.pod not in (primary, target)]
        best = most_advanced(others)
        if best is None:
            plan.probe_again = 1.0
            return plan
        plan.target = best.pod
        change["to"] = best.pod
        plan.failover = change
        plan.probe_again = 0.2
        return plan
    if chosen.standby:
        if change.get("promoting") != target and failover and _detach(observed, plan, change, chosen):
            return plan
        return _promote(plan, change, target)
    return _complete(observed, plan, change, primary, target)


def _promote(plan: PrimaryPlan, change: dict[str, Any], pod: str) -> PrimaryPlan:
    """Recorded before it is asked: a promotion whose call failed, or whose answer was lost (a
    busy machine), is asked again of the same pod, never of another."""
    if change.get("promoting") != pod:
        plan.failover = {**change, "promoting": pod}
        plan.probe_again = 0.05
        return plan
    plan.actions.append(Promote(pod))
    plan.probe_again = 0.2
    return plan


def _fence_pending(
    observed: PrimaryInput, plan: PrimaryPlan, change: dict[str, Any], old: Member | None
) -> bool:
    """Whether the fenced old primary may still be running: the life of its server recorded at
    the fence (`failover.fenced`) is not over yet (container running, same restart count, same
    pod), and its grace period and FENCE_MARGIN have not passed. Past them, a server not seen
    to stop (a node cut off from the API too, a frozen container) is taken for stopped, and an
    Event says so."""
    fenced = change.get("fenced")
    if not fenced or change.get("unconfirmed") or change.get("promoting"):
        return False
    if old is None or not old.exists or old.server_life != fenced:
        return False  # this life of its server is over
    if not old.terminating:
        # The deletion recorded with the decision did not happen (an operator stopped between
        # the two, a refused call): asked again; nothing is taken for stopped before it.
        plan.actions.append(RestartPod(old.pod, "fenced: a failover replaces it", grace=FENCE_GRACE))
        plan.probe_again = 0.2
        return True
    grace_ends = old.grace_ends or float(change.get("startedAtSeconds", observed.now)) + FENCE_GRACE
    if observed.now < grace_ends + FENCE_MARGIN:
        plan.probe_again = 0.2
        return True
    waited = observed.now - float(change.get("startedAtSeconds", observed.now))
    plan.failover = {**change, "unconfirmed": format_time(observed.now)}
    plan.events.append(
        (
            "Warning",
            "FenceUnconfirmed",
            f"{old.pod}'s server was not seen to stop {waited:.1f} s after it was fenced "
            f"(its container still runs as far as the API knows): promoting {change.get('to')}",
        )
    )
    return False


def _detach(observed: PrimaryInput, plan: PrimaryPlan, change: dict[str, Any], chosen: Member) -> bool:
    """Before a failover's promotion, no other standby may still follow the old primary: each
    is repointed to the chosen one (and streams from it, cascading, until it is promoted). With
    synchronous commit, an old primary that is still running then cannot acknowledge a commit
    the new one lacks: the chosen standby stops receiving when it is promoted, and fewer than
    `synchronous` others could still be silent followers. A standby that went further than the
    chosen one (the old primary kept streaming to it) is promoted instead. Whether it is
    waiting for that."""
    primary, target = plan.primary, chosen.pod
    others = [m for m in observed.members.values() if m.pod not in (primary, target) and m.exists]
    following = [m for m in others if m.standby and m.facts is not None and m.facts.upstream != target]
    if following:
        plan.actions.append(Repoint(tuple(m.pod for m in following), target))
        plan.probe_again = 0.2
        return True
    silent = [m for m in others if m.facts is None and m.server_life is not None]
    if observed.synchronous and len(silent) >= observed.synchronous:
        plan.probe_again = 0.5  # they may still acknowledge for the old primary
        return True
    further = most_advanced([m for m in others if m.standby and not m.terminating], require_ready=False)
    ahead = further.facts.lsn if further is not None and further.facts is not None else 0
    if further is not None and chosen.facts is not None and ahead > chosen.facts.lsn:
        plan.target = further.pod
        plan.failover = {**change, "to": further.pod}
        plan.events.append(
            (
                "Normal",
                "FailoverRetargeted",
                f"{further.pod} has more WAL than {target} ({format_lsn(ahead)} > "
                f"{format_lsn(chosen.facts.lsn)}): promoting it instead",
            )
        )
        plan.probe_again = 0.2
        return True
    return False


def _finish_restart(observed: PrimaryInput, plan: PrimaryPlan, change: dict[str, Any]) -> PrimaryPlan:
    """A primary whose server restarted (and came back a standby, as every server does) is
    promoted again in place, as a recorded change."""
    primary = plan.primary
    member = observed.members.get(primary)
    if member is not None and member.answers_as_primary:
        return _complete(observed, plan, change, primary, primary)
    if member is not None and member.standby and not member.terminating:
        return _promote(plan, change, primary)
    # Once its promotion was asked, a pod not ready yet (a fresh container) and one answer lost
    # are no reason to fail over: it may be promoted already, and that would be a second one.
    asked = change.get("promoting") == primary
    if member is not None and not _gone(member, observed.monotonic, unready_counts=not asked):
        plan.probe_again = 0.3  # one answer lost (a busy machine): asked again
        return plan
    # Down again (promoted or not: it was the primary already): the next pass treats it as any
    # primary that is down, and fails over with the same care.
    plan.target = None
    plan.probe_again = 0.2
    return plan


def _complete(
    observed: PrimaryInput, plan: PrimaryPlan, change: dict[str, Any], primary: str, target: str
) -> PrimaryPlan:
    """The chosen one answers as a primary: the change is done."""
    took = observed.now - float(change.get("startedAtSeconds", observed.now))
    plan.primary, plan.target = target, None
    plan.labels = {pod: (PRIMARY if pod == target else REPLICA) for pod in observed.members}
    kind = change.get("kind", "Failover")
    plan.failover = {
        **{k: v for k, v in change.items() if k not in ("waiting", "promoting")},
        "completedAt": format_time(observed.now),
        "seconds": round(took, 1),
    }
    plan.actions.append(Repoint(tuple(p for p in observed.members if p != target), target))
    if target == primary:
        message = f"{target} is the primary again after {took:.1f} s"
    else:
        message = f"{target} is the primary (was {primary}) after {took:.1f} s"
    plan.events.append(("Normal", f"{kind}Completed", message))
    plan.probe_again = 1.0
    return plan


def _gone(member: Member, monotonic: float, unready_counts: bool = True) -> bool:
    """Whether a standby that does not answer is down: its pod gone, stopping or not Ready (when
    that counts), or its server silent for as long as declares a primary down."""
    if not member.exists or member.terminating or (unready_counts and not member.ready):
        return True
    return member.silent_since is not None and monotonic - member.silent_since >= SILENT_LIMIT


def parse_lsn(text: str | None) -> int:
    if not text:
        return 0
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
