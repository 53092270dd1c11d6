"""A rollout cannot make the operator send requests anywhere: its URLs' hosts must match the
operator's allow-list (by default, the cluster's own Services)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from framework.rollout.outbound import (
    IN_CLUSTER,
    DestinationRefused,
    allowed,
    guarded_client,
    refused_destinations,
)
from framework.rollout.plan import RolloutObserved, plan_rollout
from tests.unit.test_rollout_plan import spec

pytestmark = pytest.mark.unit


def test_only_hosts_the_list_names_are_allowed() -> None:
    assert allowed("http://canary.shop.svc:8080/health", IN_CLUSTER)
    assert allowed("http://Prometheus.Monitoring.SVC.cluster.local:9090", IN_CLUSTER)
    for refused in (
        "http://169.254.169.254/latest/meta-data",  # a cloud's metadata service
        "https://example.com/hook",
        "http://shop.svc.example.com/",  # .svc must end the name
        "http://10.0.0.1:5432/",
        "not a url",
    ):
        assert not allowed(refused, IN_CLUSTER), refused
    assert allowed("https://hooks.slack.com/services/T/B/x", [*IN_CLUSTER, "hooks.slack.com"])
    assert allowed("http://10.0.0.1/", ["*"])


def rollout_spec(url: str) -> dict:
    body = spec(steps=[{"setPercent": 50}, {"analysis": {"http": {"url": url}}}])
    body["strategy"]["hooks"] = {
        "beforeTakeDown": [{"http": {"url": "http://$(POD_IP):8080/drain"}}],  # known at request time
        "afterReady": [{"http": {"url": "http://consul:8500/v1/agent/maintenance"}}],
    }
    webhooks = [{"url": "http://release.tools.svc/x"}, {"urlSecret": {"name": "s"}}]
    body["notifications"] = {"webhooks": webhooks}
    return body


def test_every_refused_url_of_a_spec_is_named_by_its_field() -> None:
    refused = refused_destinations(rollout_spec("http://169.254.169.254/"), IN_CLUSTER)
    assert refused == [
        "spec.strategy.steps[1].analysis.http.url: 169.254.169.254 is not an allowed destination "
        "(allowed: *.svc, *.svc.cluster.local)",
        "spec.strategy.hooks.afterReady[0].http.url: consul is not an allowed destination "
        "(allowed: *.svc, *.svc.cluster.local)",
    ]
    assert refused_destinations(rollout_spec("http://canary.shop.svc/"), [*IN_CLUSTER, "consul"]) == []


def test_a_rollout_whose_urls_are_refused_is_invalid_and_touches_nothing() -> None:
    observed = RolloutObserved(
        name="web",
        namespace="apps",
        uid="uid-1",
        generation=1,
        spec=rollout_spec("http://169.254.169.254/"),
        status={},
        statefulset=None,
        pods=[],
        now=datetime(2026, 12, 5, tzinfo=UTC),
        allowed_destinations=IN_CLUSTER,
    )
    planned = plan_rollout(observed)
    assert planned.status["phase"] == "InvalidSpec"
    assert planned.status["message"].startswith("spec.strategy.steps[1].analysis.http.url: 169.254.169.254")
    assert planned.statefulset is None
    assert not planned.evict
    assert not planned.delete


def test_the_client_refuses_before_connecting_and_follows_no_redirect() -> None:
    async def ask(url: str) -> None:
        async with guarded_client(IN_CLUSTER, timeout=1) as http:
            assert http.follow_redirects is False
            await http.get(url)

    with pytest.raises(DestinationRefused, match=r"169\.254\.169\.254 is not an allowed destination"):
        asyncio.run(ask("http://169.254.169.254/latest/meta-data"))
