"""Every pod Statefleet makes passes PodSecurity `restricted`: one pure function applies what
that level requires, so a template or a Job builder states only what its server needs (its
user, a read-only root filesystem and the writable directories that takes)."""

from __future__ import annotations

import copy
from typing import Any

RUNTIME_DEFAULT = {"type": "RuntimeDefault"}
# The one capability `restricted` lets a container add back.
ALLOWED_CAPABILITIES = {"NET_BIND_SERVICE"}


def restricted(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """`pod_spec` as `restricted` requires it: run as a non-root user, the runtime's default
    seccomp profile, no privilege escalation, every capability dropped (NET_BIND_SERVICE alone
    may be added back); and no service-account token, which none of our servers or Jobs uses,
    unless the spec asks for one. A seccomp profile already chosen other than Unconfined, a
    read-only root and the user IDs are kept."""
    spec = copy.deepcopy(pod_spec)
    pod = spec.setdefault("securityContext", {})
    pod["runAsNonRoot"] = True
    if (pod.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        pod["seccompProfile"] = dict(RUNTIME_DEFAULT)
    spec.setdefault("automountServiceAccountToken", False)
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        context = container.setdefault("securityContext", {})
        context["allowPrivilegeEscalation"] = False
        context.pop("privileged", None)
        added = sorted(set((context.get("capabilities") or {}).get("add") or []) & ALLOWED_CAPABILITIES)
        context["capabilities"] = {"drop": ["ALL"], **({"add": added} if added else {})}
        if context.get("runAsUser") == 0:
            del context["runAsUser"]
    return spec


def restricted_workload(child: dict[str, Any]) -> dict[str, Any]:
    """A rendered child with its pod template made `restricted` (a StatefulSet, or the
    StatefulsetRollout that carries one); any other child as it is."""
    paths = {"StatefulSet": ("spec",), "StatefulsetRollout": ("spec", "statefulSet")}
    path = paths.get(child.get("kind", ""))
    if path is None:
        return child
    child = copy.deepcopy(child)
    holder = child
    for key in path:
        holder = holder.get(key) or {}
    template = holder.get("template")
    if template and "spec" in template:
        template["spec"] = restricted(template["spec"])
    return child
