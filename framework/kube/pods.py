"""Pure readings of a pod (as a dict, the way `Observed.pods` holds them)."""

from __future__ import annotations

from typing import Any

from framework.kube.times import parse_time


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def unready_since(pod: dict[str, Any]) -> str | None:
    """When the pod's Ready condition last turned False (None: ready, or never said)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "False":
            return condition.get("lastTransitionTime")
    return None


def pod_ip(pod: dict[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("podIP")


def incarnation(pod: dict[str, Any]) -> str:
    """Which life of the pod's server: a new pod or a restarted container is another one."""
    restarts = sum(c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])
    return f"{pod['metadata'].get('uid')}/{restarts}"


def booting_since(pod: dict[str, Any]) -> float | None:
    """When the pod's running container started (seconds since the epoch) if the pod has not
    been Ready since: a server still in its boot. None when none runs, or it was Ready in this
    life (a server that stops answering later is not booting)."""
    ready = next(
        (c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    if ready.get("status") == "True":
        return None
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        started = parse_time(((status.get("state") or {}).get("running") or {}).get("startedAt"))
        if started is None:
            continue
        changed = parse_time(ready.get("lastTransitionTime"))
        return started.timestamp() if changed is None or changed <= started else None
    return None


def has_run(pod: dict[str, Any]) -> bool:
    """Whether a container of the pod has started (running now, or ended since): it read its
    mounted files then. A pod still being created reads them as they are when it starts."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any({"running", "terminated"} & set(s.get("state") or {}) or s.get("lastState") for s in statuses)


def waiting_out_backoff(pod: dict[str, Any], container: str, ran_for: float = 30.0) -> bool:
    """Whether `container` waits out the kubelet's crash back-off (10 s, doubling to 5 min,
    reset only after 10 min of running) after a run of at least `ran_for` seconds: a server
    that served, then was killed (kill -9, the OOM killer), not one that fails at its start.
    A new pod starts without the back-off."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != container:
            continue
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") != "CrashLoopBackOff":
            return False
        last = (status.get("lastState") or {}).get("terminated") or {}
        started, finished = parse_time(last.get("startedAt")), parse_time(last.get("finishedAt"))
        return bool(started and finished and (finished - started).total_seconds() >= ran_for)
    return False
