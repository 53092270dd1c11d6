"""Rollout hooks: URL expansion, HTTP and in-process hooks, and what a failure reports."""

from __future__ import annotations

import asyncio

import httpx2
import pytest

from e2e.receiver import receiving
from framework.rollout import hooks
from framework.rollout.spec import Hook

pytestmark = pytest.mark.unit

CALL = hooks.HookCall("beforeTakeDown", "apps", "web", "web-7", "10.244.1.9", "web-abc")


def test_urls_get_the_pod_in_place_of_the_variables() -> None:
    url = "http://consul:8500/v1/agent/maintenance?enable=true&reason=$(NAMESPACE)/$(POD)&i=$(ORDINAL)&ip=$(POD_IP)"
    assert hooks.expand(url, CALL) == (
        "http://consul:8500/v1/agent/maintenance?enable=true&reason=apps/web-7&i=7&ip=10.244.1.9"
    )


def run(spec: list[dict], in_process: dict[str, hooks.InProcess] | None = None) -> str | None:
    async def go() -> str | None:
        async with httpx2.AsyncClient() as http:
            return await hooks.run([Hook.model_validate(h) for h in spec], CALL, http, in_process or {})

    return asyncio.run(go())


def test_http_hooks_run_in_order_and_a_failure_stops_them() -> None:
    with receiving(failing=frozenset({"/drain-refused"})) as (base, received):
        assert run([{"http": {"url": f"{base}/drain?pod=$(POD)", "method": "PUT"}}]) is None
        failure = run(
            [
                {"http": {"url": f"{base}/drain-refused?pod=$(POD)"}},
                {"http": {"url": f"{base}/never"}},
            ]
        )
    assert [(r.path, r.body) for r in received] == [
        ("/drain?pod=web-7", {"method": "PUT"}),
        ("/drain-refused?pod=web-7", {"method": "POST"}),
    ]
    assert failure == f"beforeTakeDown hook POST {base}/drain-refused: HTTP 503"


def test_in_process_hooks_are_found_by_name() -> None:
    seen = []

    async def record(call: hooks.HookCall) -> None:
        seen.append(call.pod)

    async def refuse(call: hooks.HookCall) -> None:
        raise RuntimeError("replication lag too high")

    offered = {"test-record": record, "test-refuse": refuse}
    assert run([{"inProcess": {"name": "test-record"}}], offered) is None
    assert seen == ["web-7"]
    assert (
        run([{"inProcess": {"name": "test-refuse"}}], offered)
        == "beforeTakeDown hook on web-7: replication lag too high"
    )
    assert (
        run([{"inProcess": {"name": "nope"}}], offered)
        == "beforeTakeDown hook 'nope': no such in-process hook"
    )
