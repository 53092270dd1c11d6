"""Checks every unit test of an instance's plan gets for free."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from framework import instance_plan
from framework.kube.crd import dropped_fields
from framework.plugin import ServicePlugin


def status_schema(plugin: ServicePlugin) -> dict[str, Any]:
    return plugin.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


def kept_by_the_api_server(plan: Callable[..., instance_plan.Plan]) -> Callable[..., instance_plan.Plan]:
    """`plan`, failing when the status it plans has a field the CRD's status schema does not
    name: the API server would drop it on the write, and the next pass would not find what
    this one decided (it happened: a failover's mark, so two pods were promoted)."""

    def checked(plugin: ServicePlugin, *args: Any, **kwargs: Any) -> instance_plan.Plan:
        planned = plan(plugin, *args, **kwargs)
        schema = status_schema(plugin)
        assert dropped_fields(planned.status, schema) == [], f"{plugin.kind}'s CRD would drop these"
        assert dropped_fields(planned.operations.status, schema) == [], (
            f"{plugin.kind}'s CRD would drop these"
        )
        return planned

    return checked


@pytest.fixture(autouse=True)
def planned_status_is_kept(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    module = request.module
    if getattr(module, "plan", None) is instance_plan.plan:
        monkeypatch.setattr(module, "plan", kept_by_the_api_server(instance_plan.plan))
