"""Every pod spec Statefleet makes passes PodSecurity `restricted` (checked here against that
level's rules as the Kubernetes documentation lists them; the e2e tests run every scenario
in namespaces that enforce it)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from backup.job import build_job
from backup.storage import S3Spec
from framework.catalog import Catalog
from framework.instance_plan import plan
from framework.kube.api import refusal
from framework.kube.jobs import FAILED, POD_REFUSED, RUNNING, job_state
from framework.kube.pod_security import restricted, restricted_workload
from framework.plugin import Observed
from services.mongodb import PLUGIN as MONGODB
from services.postgres import PLUGIN as POSTGRES
from services.rabbitmq import PLUGIN as RABBITMQ
from services.rabbitmq.scale_down import build_cli_job

pytestmark = pytest.mark.unit

CATALOG = Catalog.from_yaml(
    """
postgres: {default: "17", versions: {"17": {image: pg:17}}}
rabbitmq: {default: "3", versions: {"3": {image: rmq:3}}}
mongodb:
  default: "7"
  versions:
    "7": {image: ferretdb:1.24, flavor: ferretdb}
    "7.0": {image: mongo:7.0, flavor: mongod}
"""
)
STORAGE = {"spec": {"s3": {"endpoint": "http://s3.test:9000", "bucket": "b", "credentialsSecret": "k"}}}
VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim"}
VOLUME_TYPES |= {"projected", "secret"}


def violations(pod: dict[str, Any]) -> list[str]:
    """What PodSecurity `restricted` (with `baseline` under it) would refuse in a pod spec."""
    found = []
    context = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(field)
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= VOLUME_TYPES:
            found.append(f"volume {volume['name']}: {kinds}")
    pod_seccomp = (context.get("seccompProfile") or {}).get("type")
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        name, own = container["name"], container.get("securityContext") or {}
        if own.get("privileged"):
            found.append(f"{name}: privileged")
        if own.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation != false")
        capabilities = own.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities not all dropped")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities added")
        if own.get("runAsNonRoot", context.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot != true")
        if own.get("runAsUser", context.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        if (own.get("seccompProfile") or {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: no seccomp profile")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            found.append(f"{name}: hostPort")
    return found


def pod_of(plugin: Any, name: str, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    observed = Observed(name=name, namespace="apps", generation=1, spec=spec, status={}, **extra)
    planned = plan(plugin, observed, CATALOG, "uid-1", tools_image="statefleet/operator:abc")
    (rollout,) = [c for c in planned.children if c["kind"] == "StatefulsetRollout"]
    return rollout["spec"]["statefulSet"]["template"]["spec"]


POINT_IN_TIME = {"fromBackup": {"name": "nightly"}, "pointInTime": {"time": "2026-12-04T12:00:00Z"}}
PODS = {
    "postgres": lambda: pod_of(POSTGRES, "demo", {"instances": 2, "storage": {"size": "1Gi"}}),
    "postgres archiving, from a point in time": lambda: pod_of(
        POSTGRES,
        "demo",
        {"storage": {"size": "1Gi"}, "walArchive": {"storage": "s3"}, "bootstrap": POINT_IN_TIME},
        references={"walStorage": STORAGE},
    ),
    "rabbitmq": lambda: pod_of(RABBITMQ, "events", {"replicas": 3, "storage": {"size": "1Gi"}}),
    "mongodb on ferretdb": lambda: pod_of(MONGODB, "catalog", {"version": "7", "storage": {"size": "1Gi"}}),
    "mongod": lambda: pod_of(
        MONGODB, "catalog", {"version": "7.0", "members": 3, "storage": {"size": "1Gi"}}
    ),
    "backup job": lambda: build_job(
        owner_kind="Backup",
        owner={"metadata": {"name": "now", "namespace": "apps", "uid": "u"}},
        action="backup",
        request={},
        storage=S3Spec(endpoint="http://s3.test:9000", bucket="backups", credentials_secret="k"),
        service_env=[],
        image="statefleet/operator:abc",
    )["spec"]["template"]["spec"],
    "rabbitmq cli job": lambda: build_cli_job(
        job="events-scale-down",
        namespace="apps",
        instance="events",
        image="rmq:3",
        script="true",
        cookie_secret="c",
        labels={},
        owner={},
        inter_node_tls=True,
    )["spec"]["template"]["spec"],
}


@pytest.mark.parametrize("which", list(PODS))
def test_every_pod_passes_restricted_and_mounts_no_service_account_token(which: str) -> None:
    pod = PODS[which]()
    assert violations(pod) == []
    assert pod["automountServiceAccountToken"] is False


def test_postgres_runs_every_container_on_a_read_only_root() -> None:
    pod = PODS["postgres archiving, from a point in time"]()
    containers = [*pod["initContainers"], *pod["containers"]]
    assert [c["name"] for c in containers] == ["restore", "wal-restore", "wal-archiver", "postgres"]
    assert all(c["securityContext"]["readOnlyRootFilesystem"] is True for c in containers)
    server = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/var/run/postgresql", "/tmp"} <= server  # its socket and lock, initdb's temp files


def test_restricted_keeps_what_the_service_chose_and_overrides_what_the_level_forbids() -> None:
    spec = {
        "securityContext": {
            "runAsUser": 999,
            "runAsNonRoot": False,
            "seccompProfile": {"type": "Unconfined"},
        },
        "automountServiceAccountToken": True,
        "containers": [
            {
                "name": "server",
                "securityContext": {
                    "readOnlyRootFilesystem": True,
                    "privileged": True,
                    "allowPrivilegeEscalation": True,
                    "capabilities": {"add": ["NET_ADMIN", "NET_BIND_SERVICE"]},
                    "runAsUser": 0,
                },
            }
        ],
    }
    made = restricted(spec)
    assert violations(made) == []
    assert made["securityContext"]["runAsUser"] == 999
    assert made["automountServiceAccountToken"] is True  # asked for: kept
    own = made["containers"][0]["securityContext"]
    assert own["readOnlyRootFilesystem"] is True
    assert own["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    assert spec["containers"][0]["securityContext"]["privileged"] is True  # the input is left alone
    config_map = {"kind": "ConfigMap", "data": {}}
    assert restricted_workload(config_map) is config_map


VIOLATION = (
    'pods "demo-0" is forbidden: violates PodSecurity "restricted:latest": seccompProfile (pod or '
    'container "postgres" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
)


def failed_create(message: str, last: str, **times: str) -> dict[str, Any]:
    return {"reason": "FailedCreate", "message": message, "lastTimestamp": last, **times}


def test_the_newest_refusal_after_the_newest_pod_is_the_one_that_counts() -> None:
    events = [
        failed_create("exceeded quota: pods", "2026-12-05T10:00:00Z"),
        failed_create(VIOLATION, "2026-12-05T10:05:00Z"),
        {"reason": "SuccessfulCreate", "message": "made", "lastTimestamp": "2026-12-05T10:09:00Z"},
    ]
    assert refusal(events, since=None) == VIOLATION
    assert refusal(events, since="2026-12-05T10:01:00Z") == VIOLATION
    assert refusal(events, since="2026-12-05T10:06:00Z") is None  # a pod was made since
    # The events API's own times (a series, microseconds) are read too.
    series = {"reason": "FailedCreate", "message": "quota", "eventTime": "2026-12-05T10:00:00.000001Z"}
    series["series"] = {"count": 4, "lastObservedTime": "2026-12-05T10:07:00.250000Z"}
    assert refusal([*events, series], since="2026-12-05T10:06:00Z") == "quota"


def test_a_job_whose_pod_is_refused_has_failed_naming_the_admission_error() -> None:
    job = {"spec": {"backoffLimit": 0}, "status": {}}
    state = job_state(job, None, refused=VIOLATION)
    assert (state.phase, state.reason) == (FAILED, POD_REFUSED)
    assert state.message == f"its pod could not be created: {VIOLATION}"
    assert job_state(job, None).phase == RUNNING  # not created yet, nothing refused
    running = {"metadata": {"name": "p"}, "status": {"phase": "Running"}}
    assert job_state(job, running, refused=VIOLATION).phase == RUNNING  # made after all


def test_an_instance_whose_pods_are_refused_is_degraded_with_the_reason_and_one_event() -> None:
    spec = {"instances": 2, "storage": {"size": "1Gi"}}
    observed = Observed(
        name="demo", namespace="apps", generation=1, spec=spec, status={}, pods_refused=VIOLATION
    )
    planned = plan(POSTGRES, observed, CATALOG, "uid-1")
    degraded = next(c for c in planned.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PodsNotCreated")
    assert degraded["message"] == f"the instance's pods cannot be created: {VIOLATION}"
    notes = [e for e in planned.events if e.reason == "PodsNotCreated"]
    assert [(e.type, e.message) for e in notes] == [("Warning", degraded["message"])]
    again = plan(POSTGRES, replace(observed, status=planned.status), CATALOG, "uid-1")
    assert not [e for e in again.events if e.reason == "PodsNotCreated"]  # one Event, not one a pass
    admitted = plan(POSTGRES, replace(observed, status=planned.status, pods_refused=None), CATALOG, "uid-1")
    assert next(c for c in admitted.status["conditions"] if c["type"] == "Degraded")["reason"] != (
        "PodsNotCreated"
    )
