"""Analysis: measurements a rollout takes before it goes on (an HTTP check, a Prometheus
query with a success condition). Measuring is I/O, done by the controller before it plans;
the results land in `status.analysis`, and the plan decides from them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx2

from framework.kube.times import parse_time
from framework.rollout.spec import Analysis, RolloutSpec, check_condition, parse_duration


def prometheus_value(answer: dict[str, Any]) -> float:
    """The one number of an instant query's answer (a scalar, or a vector of one sample)."""
    if answer.get("status") != "success":
        raise ValueError(f"query failed: {answer.get('error', answer.get('status'))}")
    data = answer["data"]
    if data["resultType"] == "scalar":
        return float(data["result"][1])
    if data["resultType"] == "vector":
        if len(data["result"]) != 1:
            raise ValueError(f"the query returned {len(data['result'])} series, not one")
        return float(data["result"][0]["value"][1])
    raise ValueError(f"the query returned a {data['resultType']}, not a number")


async def measure(analysis: Analysis, http: httpx2.AsyncClient) -> tuple[bool, str]:
    """One measurement: (passed, what was seen)."""
    try:
        if analysis.http is not None:
            response = await http.get(analysis.http.url, timeout=analysis.http.timeout_seconds)
            return (
                response.status_code // 100 == 2,
                f"GET {analysis.http.url.split('?')[0]}: HTTP {response.status_code}",
            )
        assert analysis.prometheus is not None
        check = analysis.prometheus
        response = await http.get(f"{check.address.rstrip('/')}/api/v1/query", params={"query": check.query})
        value = prometheus_value(response.json())
        return check_condition(
            check.success_condition, value
        ), f"{check.query} = {value:g} ({check.success_condition})"
    except Exception as error:  # an unreachable endpoint is a failed measurement
        return False, f"measurement failed: {error}"


def current(status: dict[str, Any], template: str, step: int) -> dict[str, Any]:
    """The results recorded for this template and step (fresh ones for another)."""
    record = status.get("analysis") or {}
    if record.get("template") == template and record.get("step") == step:
        return record
    return {"template": template, "step": step, "successes": 0, "failures": 0}


def decided(analysis: Analysis, record: dict[str, Any]) -> str | None:
    if record["failures"] > analysis.failure_limit:
        return "failed"
    if record["successes"] >= analysis.count:
        return "passed"
    return None


def due(body_spec: dict[str, Any], status: dict[str, Any], now: datetime) -> Analysis | None:
    """The analysis to measure now, if the rollout waits at one whose next measurement is due."""
    template, index = status.get("updateTemplateHash"), status.get("currentStepIndex")
    if not template or index is None or status.get("abortedTemplateHash") == template:
        return None
    if template == status.get("stableTemplateHash"):
        return None
    try:
        steps = RolloutSpec.model_validate(body_spec).strategy.steps
    except ValueError:
        return None
    if index >= len(steps) or steps[index].analysis is None:
        return None
    analysis = steps[index].analysis
    record = current(status, template, index)
    if decided(analysis, record):
        return None
    measured = record.get("measuredAt")
    if measured:
        last = parse_time(measured)
        if now - last < timedelta(seconds=parse_duration(analysis.interval)):
            return None
    return analysis


def record(status: dict[str, Any], passed: bool, seen: str, measured_at: str) -> dict[str, Any]:
    """`status` with one more measurement of the analysis the rollout waits at."""
    entry = dict(current(status, status["updateTemplateHash"], status["currentStepIndex"]))
    entry["successes" if passed else "failures"] += 1
    entry.update(measuredAt=measured_at, message=seen)
    return {**status, "analysis": entry}
