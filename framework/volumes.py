"""Pure: the data volumes of an instance, which a spec change must never lose.

A StatefulSet's volume claim template is immutable once created: the templates render the
claims the StatefulSet already has, and a spec that would shrink or move them is refused."""

from __future__ import annotations

from typing import Any

from framework.kube.quantity import parse_quantity
from framework.plugin import Observed
from framework.spec import StorageSpec


def claim_template(observed: Observed) -> dict[str, Any] | None:
    """The volume claim template of the existing StatefulSet."""
    templates = ((observed.statefulset or {}).get("spec") or {}).get("volumeClaimTemplates") or []
    return templates[0] if templates else None


def claim_context(storage: StorageSpec, observed: Observed) -> dict[str, Any]:
    """The template variables `claim_size` and `claim_class`: the existing claims' when there are."""
    existing = claim_template(observed)
    if existing:
        return {
            "claim_size": existing["spec"]["resources"]["requests"]["storage"],
            "claim_class": existing["spec"].get("storageClassName"),
        }
    return {"claim_size": storage.size, "claim_class": storage.storage_class}


def refuse_storage_change(storage: StorageSpec, observed: Observed) -> str | None:
    """Why `spec.storage` cannot apply to the existing volumes (naming the field), or None."""
    existing = claim_template(observed)
    if existing is None:
        return None
    current_size = existing["spec"]["resources"]["requests"]["storage"]
    if parse_quantity(storage.size) < parse_quantity(current_size):
        return (
            f"spec.storage.size: shrinking the volumes from {current_size} to {storage.size} "
            "would lose data; volumes can only grow"
        )
    if parse_quantity(storage.size) > parse_quantity(current_size):
        return (
            f"spec.storage.size: growing the volumes from {current_size} to {storage.size} "
            "is not supported yet; set it back to " + current_size
        )
    current_class = existing["spec"].get("storageClassName")
    wanted_class = storage.storage_class
    if wanted_class and wanted_class != current_class:
        # Admission refuses a changed class; this catches one added after creation.
        current = current_class or "the cluster's default class"
        return (
            f"spec.storage.storageClass: moving the volumes from {current} to {wanted_class} "
            "would lose data; it cannot change (remove the field to keep the volumes where they are)"
        )
    return None
