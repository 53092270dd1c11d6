"""PostgreSQL: one primary and streaming replicas, in the official image's layout."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from framework.catalog import ResolvedVersion
from framework.plugin import GeneratedSecret, Observed, ServicePlugin, ServiceStatus
from framework.quantity import parse_quantity
from services.postgres.spec import PostgresSpec

ROLE_LABEL = "statefleet.dev/role"
SUPERUSER = GeneratedSecret("superuser", fixed={"username": "postgres"}, random=("password",))
REPLICATION = GeneratedSecret("replication", fixed={"username": "streaming_replica"}, random=("password",))


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def current_primary(name: str, observed: Observed) -> str:
    """The primary's pod: the one status records, else the first instance."""
    return observed.status.get("currentPrimary") or f"{name}-0"


def major(version: str) -> str:
    return version.split(".", 1)[0]


def claim_template(observed: Observed) -> dict[str, Any] | None:
    """The volume claim template of the existing StatefulSet (immutable once created)."""
    templates = ((observed.statefulset or {}).get("spec") or {}).get("volumeClaimTemplates") or []
    return templates[0] if templates else None


class PostgresPlugin(ServicePlugin):
    kind = "Postgres"
    plural = "postgreses"
    short_names = ("pg",)
    service = "postgres"
    spec_model = PostgresSpec
    generated_secrets = (SUPERUSER, REPLICATION)
    # The StatefulSet is left to a StatefulsetRollout: replicas first, the primary last.
    child_kinds = ("ConfigMap", "Service", "PodDisruptionBudget", "StatefulsetRollout")

    def refuse_change(self, spec: PostgresSpec, observed: Observed) -> str | None:
        running = observed.status.get("version")
        if running and spec.version and major(spec.version) != major(running) and observed.statefulset:
            # The data directory of one major version does not start under another.
            return (
                f"spec.version: upgrading the data from PostgreSQL {running} to {spec.version} needs a "
                f"major upgrade (pg_upgrade), which is not supported yet; set it back to {running}"
            )
        existing = claim_template(observed)
        if existing is None:
            return None
        current_size = existing["spec"]["resources"]["requests"]["storage"]
        if parse_quantity(spec.storage.size) < parse_quantity(current_size):
            return (
                f"spec.storage.size: shrinking the volumes from {current_size} to {spec.storage.size} "
                "would lose data; volumes can only grow"
            )
        if parse_quantity(spec.storage.size) > parse_quantity(current_size):
            return (
                f"spec.storage.size: growing the volumes from {current_size} to {spec.storage.size} "
                "is not supported yet; set it back to " + current_size
            )
        current_class = existing["spec"].get("storageClassName")
        wanted_class = spec.storage.storage_class
        if wanted_class and wanted_class != current_class:
            # Admission refuses a changed class; this catches one added after creation.
            current = current_class or "the cluster's default class"
            return (
                f"spec.storage.storageClass: moving the volumes from {current} to {wanted_class} "
                "would lose data; it cannot change (remove the field to keep the volumes where they are)"
            )
        return None

    def template_context(
        self, spec: PostgresSpec, version: ResolvedVersion, observed: Observed
    ) -> dict[str, Any]:
        existing = claim_template(observed)
        configuration = {"parameters": spec.parameters, "pg_hba": spec.pg_hba, "version": version.version}
        return {
            "primary": current_primary(observed.name, observed),
            "superuser_secret": SUPERUSER.name(observed.name),
            "replication_secret": REPLICATION.name(observed.name),
            "replication_user": REPLICATION.fixed["username"],
            # Pods restart when their configuration changes: it is part of the template.
            "config_hash": hashlib.sha256(json.dumps(configuration, sort_keys=True).encode()).hexdigest()[
                :16
            ],
            "claim_size": existing["spec"]["resources"]["requests"]["storage"]
            if existing
            else spec.storage.size,
            "claim_class": existing["spec"].get("storageClassName")
            if existing
            else spec.storage.storage_class,
        }

    def pod_labels(self, spec: PostgresSpec, observed: Observed) -> dict[str, dict[str, str]]:
        primary = current_primary(observed.name, observed)
        return {
            pod["metadata"]["name"]: {
                ROLE_LABEL: "primary" if pod["metadata"]["name"] == primary else "replica"
            }
            for pod in observed.pods
        }

    def read_status(self, spec: PostgresSpec, version: ResolvedVersion, observed: Observed) -> ServiceStatus:
        primary = current_primary(observed.name, observed)
        ready_pods = {p["metadata"]["name"] for p in observed.pods if pod_ready(p)}
        wanted = {f"{observed.name}-{i}" for i in range(spec.instances)}
        ready = len(ready_pods & wanted)
        primary_ready = primary in ready_pods
        if primary_ready and ready == spec.instances:
            message = f"{ready} of {spec.instances} instances ready; primary {primary}"
        elif primary_ready:
            message = f"primary {primary} ready; {ready} of {spec.instances} instances ready"
        else:
            message = f"waiting for primary {primary}; {ready} of {spec.instances} instances ready"
        host = f"{observed.name}-rw.{observed.namespace}.svc"
        return ServiceStatus(
            ready_instances=ready,
            instances=spec.instances,
            ready=primary_ready,
            degraded=primary_ready and ready < spec.instances,
            message=message,
            fields={
                "currentPrimary": primary,
                "endpoints": {
                    "rw": f"{host}:5432",
                    "ro": f"{observed.name}-ro.{observed.namespace}.svc:5432",
                },
                "superuserSecret": SUPERUSER.name(observed.name),
            },
        )

    def status_properties(self) -> dict[str, Any]:
        return {
            "currentPrimary": {"type": "string"},
            "superuserSecret": {"type": "string"},
            "endpoints": {
                "type": "object",
                "properties": {"rw": {"type": "string"}, "ro": {"type": "string"}},
            },
        }

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns.insert(3, {"name": "Primary", "type": "string", "jsonPath": ".status.currentPrimary"})
        return columns
