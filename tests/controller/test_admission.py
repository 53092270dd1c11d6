"""What the CRDs' rules refuse at admission, and what the operator refuses before any pod
exists, for the kinds other than Postgres (tests/controller/test_postgres.py has its own)."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.types import PatchType

from e2e.kube import get_or_none, wait_reason, wait_until
from e2e.test_mongodb import MongoDB
from e2e.test_mongodb import create as create_mongodb
from e2e.test_rabbitmq import create as create_rabbitmq
from e2e.test_rollout import ISSUE_STEPS, rollout
from framework.rollout.controller import Rollout

pytestmark = pytest.mark.controller


def test_rabbitmq_config_may_not_set_what_the_operator_manages(kube: Client, namespace: str) -> None:
    with pytest.raises(ApiError) as refused:
        create_rabbitmq(
            kube,
            namespace,
            "events",
            {
                "replicas": 3,
                "storage": {"size": "1Gi"},
                "config": {"cluster_formation.peer_discovery_backend": "k8s"},
            },
        )
    assert refused.value.status.code == 422
    assert "spec.config" in refused.value.status.message
    assert "config may not set what the operator manages" in refused.value.status.message
    # A value that would leave its line in rabbitmq.conf (and its place in the ConfigMap).
    for config, said in (
        ({"log.console.level": "info\nloopback_users.guest = false"}, "config values may not hold control"),
        ({"log console": "info"}, "config keys are rabbitmq.conf's"),
    ):
        with pytest.raises(ApiError) as refused:
            create_rabbitmq(
                kube, namespace, "events", {"replicas": 1, "storage": {"size": "1Gi"}, "config": config}
            )
        assert refused.value.status.code == 422
        assert "spec.config" in refused.value.status.message
        assert said in refused.value.status.message


def test_mongodb_members_the_server_cannot_keep_are_refused(kube: Client, namespace: str) -> None:
    with pytest.raises(ApiError, match="an even number of members cannot keep a majority"):
        create_mongodb(kube, namespace, "even", {"version": "7", "members": 2, "storage": {"size": "1Gi"}})
    # The issue's example: three members. The test bed's "7" is FerretDB, which cannot replicate.
    create_mongodb(kube, namespace, "catalog", {"version": "7", "members": 3, "storage": {"size": "1Gi"}})
    message = wait_reason(kube, MongoDB, namespace, "catalog", "InvalidSpec")
    assert (
        message
        == "spec.members: version 7 is served here by FerretDB, which has no replication: it runs 1 member"
    )
    assert not list(kube.list(StatefulSet, namespace=namespace))
    # Set to one member, its server is made (e2e/test_mongodb.py proves it serves).
    kube.patch(MongoDB, "catalog", {"spec": {"members": 1}}, namespace=namespace, patch_type=PatchType.MERGE)
    made = wait_until(
        "the StatefulSet",
        lambda: get_or_none(kube, StatefulSet, "catalog", namespace),
        timeout=30,
        interval=0.2,
    )
    assert made.spec.replicas == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"strategy": {"steps": []}},
            "spec.strategy.steps: Invalid value: 0: spec.strategy.steps in body should have at least 1 items",
        ),
        (
            {"strategy": {"steps": [{"setPercent": 120}]}},
            "spec.strategy.steps[0].setPercent: Invalid value: 120",
        ),
        (
            {"statefulSet": {"selector": {"matchLabels": {"app": "other"}}}},
            "spec.statefulSet: Invalid value: selector.matchLabels must match template.metadata.labels",
        ),
        (
            {"strategy": {"steps": [{"setPercent": 10, "pause": {}}]}},
            "a step sets exactly one of setPercent, setCount, pause",
        ),
    ],
)
def test_bad_rollouts_are_refused_at_admission(
    kube: Client, namespace: str, change: dict[str, Any], message: str
) -> None:
    body = rollout("1", ISSUE_STEPS)
    for part, value in change.items():
        body["spec"][part] = {**body["spec"][part], **value}
    with pytest.raises(ApiError) as refused:
        kube.create(Rollout.from_dict(body), namespace=namespace)
    assert refused.value.status.code == 422
    assert message in refused.value.status.message
