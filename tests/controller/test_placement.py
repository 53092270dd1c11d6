"""Where an instance's pods go, on kwok's simulated nodes (one per zone: zone-0, zone-1,
zone-2; no server runs there, only the scheduler's choice is checked)."""

from __future__ import annotations

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Node, Pod

from e2e.kube import wait_until
from e2e.manifests import ON_KWOK
from e2e.test_postgres import create

pytestmark = pytest.mark.controller

ZONE = "topology.kubernetes.io/zone"


def test_an_instances_pods_spread_over_zones_by_default(kube: Client, pods_namespace: str) -> None:
    zones = {
        node.metadata.name: (node.metadata.labels or {}).get(ZONE)
        for node in kube.list(Node, labels={"type": "kwok"})
    }
    assert len(set(zones.values()) - {None}) >= 3, f"the kwok nodes are not in 3 zones: {zones}"
    create(
        kube, pods_namespace, "spread", {"instances": 3, "storage": {"size": "1Gi"}, "podTemplate": ON_KWOK}
    )

    def placed() -> dict[str, str] | None:
        pods = kube.list(Pod, namespace=pods_namespace, labels={"app.kubernetes.io/instance": "spread"})
        nodes = {pod.metadata.name: pod.spec.nodeName for pod in pods if pod.spec.nodeName}
        return nodes if len(nodes) == 3 else None

    nodes = wait_until("3 pods placed", placed, timeout=120, interval=0.5)
    assert len({zones[node] for node in nodes.values()}) == 3, nodes  # one per zone
    # Said by the StatefulSet itself, not left to the cluster's scheduler defaults.
    template = kube.get(StatefulSet, "spread", namespace=pods_namespace).spec.template.spec
    assert [(c.topologyKey, c.whenUnsatisfiable) for c in template.topologySpreadConstraints] == [
        ("kubernetes.io/hostname", "ScheduleAnyway"),
        (ZONE, "ScheduleAnyway"),
    ]
