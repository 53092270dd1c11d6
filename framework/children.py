"""The services' StatefulSets and pods as the watches last delivered them.

Reconciles read children from here rather than asking the API server on every pass: at a
few hundred resources those reads were most of the operator's requests. The store is a pair
of kopf indexes, which kopf fills from its initial listings before it calls any handler, so
the first reconcile after a start already sees every existing child.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from framework.plugin import LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, MANAGER

PODS_INDEX = "statefleet_pods"
STATEFULSETS_INDEX = "statefleet_statefulsets"

Key = tuple[str, str, str]  # namespace, service, instance
Object = dict[str, Any]


def key_of(body: Mapping[str, Any]) -> Key | None:
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if not labels.get(LABEL_NAME) or not labels.get(LABEL_INSTANCE):
        return None
    return metadata.get("namespace", ""), labels[LABEL_NAME], labels[LABEL_INSTANCE]


def slim(body: Mapping[str, Any], keep: tuple[str, ...]) -> dict[str, Any]:
    """The parts of an object a plan reads; managedFields and the rest stay out of memory."""
    metadata = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return {"metadata": metadata, **{part: body[part] for part in keep if part in body}}


def index_pod(body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    key = key_of(body)
    return {key: slim(body, ("status",))} if key else {}


def index_statefulset(body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    key = key_of(body)
    return {key: slim(body, ("spec", "status"))} if key else {}


class Children:
    def __init__(self) -> None:
        self._pods: Mapping[Key, Any] = {}
        self._statefulsets: Mapping[Key, Any] = {}

    def register(self) -> None:
        kopf.index(
            "",
            "v1",
            "pods",
            labels={LABEL_INSTANCE: kopf.PRESENT, LABEL_NAME: kopf.PRESENT},
            id=PODS_INDEX,
        )(index_pod)
        kopf.index("apps", "v1", "statefulsets", labels={LABEL_MANAGED_BY: MANAGER}, id=STATEFULSETS_INDEX)(
            index_statefulset
        )

        @kopf.on.startup(id="statefleet-children")
        def attach(**indices: Any) -> None:
            # kopf hands its (live, still filling) indexes to every handler; keep them.
            self._pods = indices[PODS_INDEX]
            self._statefulsets = indices[STATEFULSETS_INDEX]

    def of(self, service: str, namespace: str, name: str) -> tuple[Object | None, list[Object]]:
        """The resource's StatefulSet (or None) and its pods, sorted by name."""
        key = (namespace, service, name)
        statefulsets = [s for s in self._statefulsets.get(key, ()) if s["metadata"].get("name") == name]
        pods = sorted(self._pods.get(key, ()), key=lambda pod: pod["metadata"]["name"])
        return (statefulsets[0] if statefulsets else None), pods
