"""The Jobs that take and restore backups (pure builders), and what their pods tell when they end.

A Job runs the Statefleet image's `python -m backup` once (no retries inside the Job: a
`BackupPlan` retries with backoff, a failed `Backup` stays failed and says why), but for a
replacing restore's rollback, which is idempotent and retried. It is owned by the `Backup` or
`Restore` it serves, so it goes with it; a rollback started while its Restore is being deleted
is owned by the instance instead, and deleted by the Restore's finalizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from backup.storage import CREDENTIAL_KEYS, S3Spec
from framework.plugin import LABEL_MANAGED_BY, LABEL_PART_OF, MANAGER
from framework.reconcile import owner_reference

JOB_LABEL = "statefleet.dev/backup-job"
DEFAULT_DEADLINE = 6 * 3600  # seconds


def job_name(owner: str, action: str) -> str:
    """`<owner>-<action>`, within the 63 characters a Job's pods' labels allow."""
    suffix = f"-{action}"
    return owner[: 63 - len(suffix)].rstrip("-") + suffix


def build_job(
    *,
    owner_kind: str,
    owner: dict[str, Any],
    action: str,  # backup or restore
    request: dict[str, Any],
    storage: S3Spec,
    service_env: list[dict[str, Any]],
    image: str,
    deadline_seconds: int = DEFAULT_DEADLINE,
    retries: int = 0,
    owned_by: tuple[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The Job `<owner>-<action>`, owned by `owner` unless `owned_by` (kind, body) says another."""
    meta = owner["metadata"]
    name = job_name(meta["name"], action)
    labels = {LABEL_MANAGED_BY: MANAGER, LABEL_PART_OF: "statefleet", JOB_LABEL: name}
    credentials = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": storage.credentials_secret, "key": key}}}
        for key in CREDENTIAL_KEYS
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [owner_reference(*(owned_by or (owner_kind, owner)))],
        },
        "spec": {
            "backoffLimit": retries,
            "activeDeadlineSeconds": deadline_seconds,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "securityContext": {"runAsUser": 999, "runAsGroup": 999, "runAsNonRoot": True},
                    "containers": [
                        {
                            "name": action,
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python3", "-m", "backup"],
                            "env": [
                                {"name": "STATEFLEET_BACKUP_REQUEST", "value": json.dumps(request)},
                                *credentials,
                                *service_env,
                            ],
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                # Streaming holds a few parts in memory whatever the data's size.
                                "limits": {"memory": "512Mi"},
                            },
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": False,  # pg tools write temp files
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }


@dataclass(frozen=True)
class JobState:
    phase: str  # Running, Succeeded, Failed
    result: dict[str, Any] | None = None  # the job's own report of success
    reason: str = ""
    message: str = ""


def termination(pod: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """The job's JSON report from its pod's termination message, and how the container ended."""
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if not terminated:
            continue
        how = terminated.get("reason") or f"exit code {terminated.get('exitCode')}"
        text = (terminated.get("message") or "").strip().splitlines()
        for line in reversed(text):
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict):
                return report, how
        return None, how
    return None, ""


def job_state(job: dict[str, Any], pod: dict[str, Any] | None) -> JobState:
    """Pure: where a backup Job stands, from the Job and its pod (None when gone or not yet seen)."""
    job_conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []}
    report, how = termination(pod)
    if "Complete" in job_conditions or (job.get("status") or {}).get("succeeded"):
        if report and "result" in report:
            return JobState("Succeeded", result=report["result"])
        return JobState("Failed", reason="NoReport", message="the job ended without reporting its result")
    failed = job_conditions.get("Failed")
    # A pod that failed counts only once the Job has no retry left for it.
    out_of_retries = ((job.get("status") or {}).get("failed") or 0) > (
        (job.get("spec") or {}).get("backoffLimit") or 0
    )
    if (failed and failed.get("status") == "True") or out_of_retries:
        if report and "error" in report:
            return JobState("Failed", reason=report["error"]["reason"], message=report["error"]["message"])
        why = (failed or {}).get("reason") or "Failed"
        if why == "DeadlineExceeded":
            return JobState("Failed", reason="DeadlineExceeded", message="the job ran past its deadline")
        detail = f"its container ended: {how}" if how else "its pod was killed or deleted"
        return JobState("Failed", reason="JobFailed", message=f"the job failed without a report, {detail}")
    return JobState("Running")


def last_progress(log_tail: str) -> dict[str, Any] | None:
    """The latest progress line a job printed (`{"progress": {...}}`)."""
    for line in reversed(log_tail.strip().splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and "progress" in report:
            return report["progress"]
    return None
