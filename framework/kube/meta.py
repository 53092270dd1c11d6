"""Statefleet's API group, the labels it puts on what it makes, and ownership."""

from __future__ import annotations

import hashlib
import json
from typing import Any

GROUP = "statefleet.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
MANAGER = "statefleet"


def owner_reference(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The reference that makes `body` (one of our resources, of `kind`) a child's controller."""
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": body["metadata"]["name"],
        "uid": body["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def decorate(
    child: dict[str, Any], labels: dict[str, str], owner: dict[str, Any], namespace: str
) -> dict[str, Any]:
    """The child as applied: in the resource's namespace, labelled, owned by the resource."""
    metadata = child.setdefault("metadata", {})
    metadata["namespace"] = namespace
    metadata["labels"] = {**labels, **metadata.get("labels", {})}
    metadata["ownerReferences"] = [owner]
    return child


def content_hash(value: Any, length: int = 16) -> str:
    """A short digest of `value` (text as it is, anything else as sorted JSON): put in a pod
    template, it changes the template, and so restarts the pods, exactly when `value` changes."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:length]
