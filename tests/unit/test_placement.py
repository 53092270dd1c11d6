"""Where an instance's pods go: every service spreads them over nodes and zones unless its
spec.podTemplate says otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from framework.catalog import Catalog
from framework.instance_plan import plan
from framework.plugin import Observed
from services.mongodb import PLUGIN as MONGODB
from services.postgres import PLUGIN as POSTGRES
from services.rabbitmq import PLUGIN as RABBITMQ

pytestmark = pytest.mark.unit

CATALOG = Catalog.from_yaml(
    """
postgres: {default: "15", versions: {"15": {image: pg:15}}}
rabbitmq: {default: "3", versions: {"3": {image: rmq:3}}}
mongodb: {default: "7", versions: {"7": {image: mongo:7, flavor: mongod}}}
"""
)
SERVICES = [
    (POSTGRES, {"instances": 3, "storage": {"size": "1Gi"}}),
    (RABBITMQ, {"replicas": 3, "storage": {"size": "1Gi"}}),
    (MONGODB, {"members": 3, "storage": {"size": "1Gi"}}),
]


def pod_spec(plugin: Any, spec: dict[str, Any]) -> dict[str, Any]:
    observed = Observed(name="demo", namespace="apps", generation=1, spec=spec, status={})
    planned = plan(plugin, observed, CATALOG, "uid")
    assert planned.children, planned.status
    rollout = next(c for c in planned.children if c["kind"] == "StatefulsetRollout")
    return rollout["spec"]["statefulSet"]["template"]["spec"]


@pytest.mark.parametrize(("plugin", "spec"), SERVICES, ids=lambda p: getattr(p, "service", ""))
def test_pods_spread_over_nodes_and_zones_unless_the_spec_says_otherwise(plugin: Any, spec: dict) -> None:
    spread = pod_spec(plugin, spec)["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["maxSkew"], c["whenUnsatisfiable"]) for c in spread] == [
        ("kubernetes.io/hostname", 1, "ScheduleAnyway"),  # a one-node cluster still runs them all
        ("topology.kubernetes.io/zone", 1, "ScheduleAnyway"),
    ]
    assert {c["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] for c in spread} == {"demo"}
    required = [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
    ]
    overridden = pod_spec(plugin, {**spec, "podTemplate": {"topologySpreadConstraints": required}})
    assert overridden["topologySpreadConstraints"] == required
    assert "topologySpreadConstraints" not in pod_spec(
        plugin, {**spec, "podTemplate": {"topologySpreadConstraints": []}}
    )
