"""Pure readings of a pod (as a dict, the way `Observed.pods` holds them)."""

from __future__ import annotations

from typing import Any


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def pod_ip(pod: dict[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("podIP")


def incarnation(pod: dict[str, Any]) -> str:
    """Which life of the pod's server: a new pod or a restarted container is another one."""
    restarts = sum(c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])
    return f"{pod['metadata'].get('uid')}/{restarts}"
