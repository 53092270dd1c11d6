"""An instance whose pods the API refuses (here: the namespace's quota of zero pods, as an
admission plugin refuses them) says so: Degraded, with the API's own message, and one Event,
for every service. What PodSecurity `restricted` would refuse takes the same way (the e2e
namespaces enforce it, and every scenario there shows our pods pass it)."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event

from e2e.kube import wait_until
from services.mongodb import PLUGIN as MONGODB
from services.postgres import PLUGIN as POSTGRES
from services.rabbitmq import PLUGIN as RABBITMQ

pytestmark = pytest.mark.controller

INSTANCES = {
    POSTGRES: ("db", {"instances": 2, "storage": {"size": "1Gi"}}),
    RABBITMQ: ("queue", {"replicas": 1, "storage": {"size": "1Gi"}}),
    MONGODB: ("docs", {"storage": {"size": "1Gi"}}),
}


def degraded(kube: Client, resource: Any, namespace: str, name: str) -> dict[str, Any] | None:
    status = kube.get(resource, name, namespace=namespace).to_dict().get("status") or {}
    found = next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), None)
    return found if found and found["reason"] == "PodsNotCreated" else None


def test_every_service_whose_pods_are_refused_is_degraded_naming_the_refusal(
    kube: Client, namespace: str
) -> None:
    for plugin, (name, spec) in INSTANCES.items():
        body = {"apiVersion": "statefleet.dev/v1alpha1", "kind": plugin.kind, "metadata": {"name": name}}
        kube.create(plugin.resource().from_dict({**body, "spec": spec}), namespace=namespace)
    for plugin, (name, _) in INSTANCES.items():
        # Within the operator's periodic pass (60 s): nothing else changes while pods are refused.
        condition = wait_until(
            f"{plugin.kind} {name} Degraded: PodsNotCreated",
            lambda plugin=plugin, name=name: degraded(kube, plugin.resource(), namespace, name),
            timeout=90,
            interval=1,
        )
        assert condition["status"] == "True"
        assert condition["message"].startswith("the instance's pods cannot be created: "), condition
        assert "exceeded quota: no-pods" in condition["message"], condition  # the API's own words
        notes = kube.list(Event, namespace=namespace, fields={"involvedObject.name": name})
        said = [e for e in notes if e.reason == "PodsNotCreated" and e.involvedObject.kind == plugin.kind]
        assert [(e.type, e.message) for e in said] == [("Warning", condition["message"])]
