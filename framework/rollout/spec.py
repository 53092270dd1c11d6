"""The `StatefulsetRollout` resource: a StatefulSet spec and the strategy that rolls it out."""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from framework.kube import conditions
from framework.kube.crd import build_crd, status_properties
from framework.kube.model import ApiModel, StatusModel

KIND = "StatefulsetRollout"
PLURAL = "statefulsetrollouts"
SHORT_NAMES = ("stsr",)

DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
PERCENT = re.compile(r"^(\d{1,3})%$")


def parse_duration(text: str) -> float:
    """Seconds in a duration as Kubernetes users write them: 30s, 5m, 1h30m."""
    match = DURATION.match(text)
    if not text or not match:
        raise ValueError(f"{text!r} is not a duration like 30s, 5m or 1h30m")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def resolve_count(value: int | str, total: int, round_up: bool) -> int:
    """A count or a percentage of `total`, as Kubernetes resolves maxUnavailable (down)."""
    if isinstance(value, int):
        return value
    match = PERCENT.match(value)
    if not match:
        raise ValueError(f"{value!r} is neither a count nor a percentage like 25%")
    exact = int(match.group(1)) * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)


STEP_RULE = {
    "rule": "(has(self.setPercent) ? 1 : 0) + (has(self.setCount) ? 1 : 0) + (has(self.pause) ? 1 : 0)"
    " + (has(self.analysis) ? 1 : 0) == 1",
    "message": "a step sets exactly one of setPercent, setCount, pause, analysis",
}


class Pause(ApiModel):
    duration: str | None = Field(
        default=None, description="How long to pause (30s, 5m, 1h); empty: until promoted or resumed."
    )

    @field_validator("duration")
    @classmethod
    def is_duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value


CONDITION = re.compile(r"^\s*result\s*(<=|>=|==|!=|<|>)\s*(-?[0-9]+(?:\.[0-9]+)?)\s*$")


def check_condition(condition: str, value: float) -> bool:
    """`result < 0.05` and the like: the only expressions a success condition may be."""
    match = CONDITION.match(condition)
    if not match:
        raise ValueError(f"{condition!r} is not a condition like 'result < 0.05'")
    operator, limit = match.group(1), float(match.group(2))
    return {
        "<": value < limit,
        "<=": value <= limit,
        ">": value > limit,
        ">=": value >= limit,
        "==": value == limit,
        "!=": value != limit,
    }[operator]


class HttpCheck(ApiModel):
    url: str = Field(min_length=1, description="GET; a 2xx answer is a success")
    timeout_seconds: float = Field(default=5, gt=0, le=60)


class PrometheusCheck(ApiModel):
    address: str = Field(min_length=1, description="e.g. http://prometheus.monitoring:9090")
    query: str = Field(min_length=1, description="an instant query returning one number")
    success_condition: str = Field(min_length=1, description="e.g. 'result < 0.05'")

    @field_validator("success_condition")
    @classmethod
    def parses(cls, value: str) -> str:
        check_condition(value, 0)
        return value


class OnFailure(StrEnum):
    ROLLBACK = "Rollback"
    PAUSE = "Pause"


class Analysis(ApiModel):
    http: HttpCheck | None = None
    prometheus: PrometheusCheck | None = None
    interval: str = Field(default="10s", description="between measurements")
    count: int = Field(default=3, ge=1, le=100, description="successful measurements to pass")
    failure_limit: int = Field(default=0, ge=0, le=100, description="failed measurements tolerated")
    on_failure: OnFailure = Field(default=OnFailure.ROLLBACK, description="Rollback, or Pause until promoted")

    @model_validator(mode="after")
    def one_check(self) -> Analysis:
        if (self.http is None) == (self.prometheus is None):
            raise ValueError("an analysis sets exactly one of http, prometheus")
        parse_duration(self.interval)
        return self


class Step(ApiModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [STEP_RULE]})
    set_percent: int | None = Field(
        default=None, ge=0, le=100, description="Percent of the replicas on the new revision after the step."
    )
    set_count: int | None = Field(
        default=None, ge=0, description="Replicas on the new revision after the step."
    )
    pause: Pause | None = None
    analysis: Analysis | None = Field(default=None, description="measure before going on")

    @model_validator(mode="after")
    def exactly_one(self) -> Step:
        kinds = ("set_percent", "set_count", "pause", "analysis")
        if len([n for n in kinds if getattr(self, n) is not None]) != 1:
            raise ValueError("a step sets exactly one of setPercent, setCount, pause, analysis")
        return self


class HttpHook(ApiModel):
    url: str = Field(
        min_length=1,
        description="$(POD), $(NAMESPACE), $(POD_IP), $(ORDINAL) are replaced, e.g. Consul's "
        "http://consul:8500/v1/agent/maintenance?enable=true&reason=$(POD)",
    )
    method: str = Field(default="POST", pattern="^(GET|POST|PUT|DELETE)$")
    timeout_seconds: float = Field(default=10, gt=0, le=300)


class InProcessHook(ApiModel):
    name: str = Field(
        min_length=1, description="a hook a service plugin registered, e.g. <service>-checkpoint"
    )


class Hook(ApiModel):
    http: HttpHook | None = None
    in_process: InProcessHook | None = None

    @model_validator(mode="after")
    def one_kind(self) -> Hook:
        if (self.http is None) == (self.in_process is None):
            raise ValueError("a hook sets exactly one of http, inProcess")
        return self


class Hooks(ApiModel):
    before_take_down: list[Hook] = Field(
        default_factory=list, description="called before a pod is released for its update; 2xx to go on"
    )
    after_ready: list[Hook] = Field(
        default_factory=list, description="called once a pod is back, updated and available"
    )


class Strategy(ApiModel):
    steps: list[Step] = Field(
        min_length=1,
        max_length=64,
        description="setPercent / setCount / pause steps; after the last one every replica is updated.",
    )
    max_unavailable: int | str = Field(
        default="25%",
        description="Replicas that may be unavailable at once (count or percent, at least 1).",
        json_schema_extra={"x-kubernetes-int-or-string": True},
    )
    min_ready_seconds: int = Field(
        default=0, ge=0, description="A new pod counts as available after being Ready this long."
    )
    progress_deadline_seconds: int = Field(
        default=600, ge=1, description="A batch not available within this many seconds fails the rollout."
    )
    auto_rollback: bool = Field(default=True, description="On failure, go back to the stable revision.")
    hooks: Hooks = Field(default_factory=Hooks)

    @field_validator("max_unavailable")
    @classmethod
    def count_or_percent(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 1:
                raise ValueError("must be at least 1")
            return value
        resolve_count(value, 100, round_up=False)
        return value

    def budget(self, replicas: int) -> int:
        return max(1, resolve_count(self.max_unavailable, replicas, round_up=False))


# Bounds that keep the CEL rules' cost estimate inside the API server's budget.
LabelValue = Annotated[str, Field(max_length=63)]


class Selector(ApiModel):
    match_labels: dict[str, LabelValue] = Field(min_length=1, max_length=64)


class TemplateMetadata(ApiModel):
    model_config = ConfigDict(extra="allow")  # merged with ApiModel's
    labels: dict[str, LabelValue] = Field(min_length=1, max_length=64)
    annotations: dict[str, str] = Field(default_factory=dict)


class PodTemplate(ApiModel):
    metadata: TemplateMetadata
    spec: dict[str, Any] = Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})


class PodManagementPolicy(StrEnum):
    PARALLEL = "Parallel"
    ORDERED_READY = "OrderedReady"


SELECTOR_RULE = {
    "rule": "self.selector.matchLabels.all(k, k in self.template.metadata.labels"
    " && self.template.metadata.labels[k] == self.selector.matchLabels[k])",
    "message": "selector.matchLabels must match template.metadata.labels",
}


class StatefulSetSpec(ApiModel):
    """A StatefulSet's spec, less `updateStrategy`, which the controller owns."""

    model_config = ConfigDict(extra="allow")  # merged with ApiModel's
    replicas: int = Field(default=1, ge=0)
    service_name: str = Field(min_length=1)
    selector: Selector
    template: PodTemplate
    pod_management_policy: PodManagementPolicy = Field(
        default=PodManagementPolicy.PARALLEL,
        description="Parallel (the default here) lets a batch's pods start together.",
    )
    volume_claim_templates: list[dict[str, Any]] = Field(
        default_factory=list,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )

    @model_validator(mode="after")
    def consistent(self) -> StatefulSetSpec:
        extra = self.model_extra or {}
        if "updateStrategy" in extra:
            raise ValueError("updateStrategy is the controller's: describe the rollout in strategy")
        labels = self.template.metadata.labels
        if any(labels.get(k) != v for k, v in self.selector.match_labels.items()):
            raise ValueError("selector.matchLabels must match template.metadata.labels")
        return self


class PromoteRequest(ApiModel):
    template: str = Field(min_length=1, description="status.updateTemplateHash of the rollout to promote")
    step: int | None = Field(default=None, ge=0, description="pass the pauses up to this step index")
    full: bool = Field(default=False, description="skip every remaining step")


class AbortRequest(ApiModel):
    template: str = Field(min_length=1, description="status.updateTemplateHash of the rollout to abort")


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1, description="a Secret in the rollout's namespace")
    key: str = Field(default="url", min_length=1)


class SlackNotification(ApiModel):
    webhook_secret: SecretKeyRef = Field(description="the Secret key holding the incoming webhook URL")
    channel: str | None = Field(default=None, description="e.g. #deploys; the webhook's own when empty")


class WebhookNotification(ApiModel):
    """A release system's endpoint: JSON of every started/step/paused/succeeded/failed/rolled-back."""

    url: str | None = None
    url_secret: SecretKeyRef | None = None

    @model_validator(mode="after")
    def one_source(self) -> WebhookNotification:
        if (self.url is None) == (self.url_secret is None):
            raise ValueError("set exactly one of url, urlSecret")
        return self


class Notifications(ApiModel):
    slack: list[SlackNotification] = Field(default_factory=list)
    webhooks: list[WebhookNotification] = Field(default_factory=list)


class RolloutSpec(ApiModel):
    stateful_set: StatefulSetSpec = Field(
        json_schema_extra={
            "x-kubernetes-validations": [SELECTOR_RULE],
            "x-kubernetes-preserve-unknown-fields": True,
        }
    )
    strategy: Strategy
    paused: bool = Field(default=False, description="Hold the rollout where it is.")
    promote: PromoteRequest | None = None
    abort: AbortRequest | None = None
    notifications: Notifications = Field(default_factory=Notifications)


# Phases, as users read them in `kubectl get stsr`.
class RolloutPhase(StrEnum):
    HEALTHY = "Healthy"
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    DEGRADED = "Degraded"
    ROLLING_BACK = "RollingBack"
    ABORTED = "Aborted"
    INVALID = "InvalidSpec"


DATE_TIME = {"format": "date-time"}


class StepRecord(StatusModel):
    step: int | None = None
    description: str | None = None
    started_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    finished_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    updated: int | None = Field(default=None, description="replicas on the new revision after it")
    pods: str | None = Field(default=None, description="the pods this step updated")


class RolloutStatus(StatusModel):
    """`status` of a StatefulsetRollout besides its conditions."""

    observed_generation: int | None = Field(default=None, json_schema_extra={"format": "int64"})
    phase: RolloutPhase | None = None
    message: str | None = None
    replicas: int | None = None
    updated_replicas: int | None = Field(default=None, description="pods on the update revision")
    ready_replicas: int | None = None
    available_replicas: int | None = None
    current_step_index: int | None = None
    steps: int | None = None
    stable_template_hash: str | None = None
    update_template_hash: str | None = Field(default=None, description="the template being rolled out")
    stable_revision: str | None = Field(default=None, description="the StatefulSet revision to roll back to")
    current_revision: str | None = None
    update_revision: str | None = None
    aborted_template_hash: str | None = None
    abort_reason: str | None = None
    notified: list[str] | None = Field(default=None, description="notifications sent")
    step_started_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    batch_started_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    history: list[StepRecord] | None = None


STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {**status_properties(RolloutStatus), "conditions": conditions.SCHEMA},
}

PRINTER_COLUMNS = [
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.statefulSet.replicas"},
    {"name": "Updated", "type": "integer", "jsonPath": ".status.updatedReplicas"},
    {"name": "Available", "type": "integer", "jsonPath": ".status.availableReplicas"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.currentStepIndex"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def rollout_crd() -> dict[str, Any]:
    return build_crd(KIND, PLURAL, RolloutSpec, STATUS_SCHEMA, SHORT_NAMES, PRINTER_COLUMNS)
