"""The Jobs Statefleet runs (backups, restores, a service's command-line tools) and what their pods tell: each
Job's container ends with a JSON report in its termination message (`{"result": ...}` or
`{"error": {"reason", "message"}}`) and prints `{"progress": ...}` lines while it works."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod

from framework.kube.api import get_or_none, pods_refused

RUNNING, SUCCEEDED, FAILED = "Running", "Succeeded", "Failed"
POD_REFUSED = "PodRefused"  # the API refused the Job's pod (admission, a quota)


def job_name(owner: str, action: str) -> str:
    """`<owner>-<action>`, within the 63 characters a Job's pods' labels allow."""
    suffix = f"-{action}"
    return owner[: 63 - len(suffix)].rstrip("-") + suffix


@dataclass(frozen=True)
class JobState:
    phase: str  # Running, Succeeded, Failed
    result: dict[str, Any] | None = None  # the job's own report of success
    reason: str = ""
    message: str = ""


NOT_STARTED = JobState(RUNNING)  # what `read_job` says of a Job that does not exist


@dataclass(frozen=True)
class JobView:
    """A Job as a pass saw it (`exists` False: there is none)."""

    exists: bool = False
    deleting: bool = False
    state: JobState = NOT_STARTED
    progress: Any = None


NO_JOB = JobView()


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


def job_state(job: dict[str, Any], pod: dict[str, Any] | None, refused: str | None = None) -> JobState:
    """Pure: where a backup Job stands, from the Job, its pod (None when gone or not yet seen)
    and why the API refused to create that pod, if it did (admission, a quota): such a Job
    has failed, though its controller would try again for as long as its deadline allows."""
    job_conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []}
    report, how = termination(pod)
    if "Complete" in job_conditions or (job.get("status") or {}).get("succeeded"):
        if report and "result" in report:
            return JobState(SUCCEEDED, result=report["result"])
        return JobState(FAILED, reason="NoReport", message="the job ended without reporting its result")
    failed = job_conditions.get("Failed")
    # A pod that failed counts only once the Job has no retry left for it.
    out_of_retries = ((job.get("status") or {}).get("failed") or 0) > (
        (job.get("spec") or {}).get("backoffLimit") or 0
    )
    if (failed and failed.get("status") == "True") or out_of_retries:
        if report and "error" in report:
            return JobState(FAILED, reason=report["error"]["reason"], message=report["error"]["message"])
        why = (failed or {}).get("reason") or "Failed"
        if why == "DeadlineExceeded":
            return JobState(FAILED, reason="DeadlineExceeded", message="the job ran past its deadline")
        detail = f"its container ended: {how}" if how else "its pod was killed or deleted"
        return JobState(FAILED, reason="JobFailed", message=f"the job failed without a report, {detail}")
    if pod is None and refused:
        return JobState(FAILED, reason=POD_REFUSED, message=f"its pod could not be created: {refused}")
    return JobState(RUNNING)


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


async def read_job(
    client: AsyncClient, namespace: str, name: str
) -> tuple[dict[str, Any] | None, JobState, Any]:
    """The Job, where it stands, and its latest progress line."""
    job = await get_or_none(client, Job, name, namespace)
    if job is None:
        return None, JobState(RUNNING), None
    pods = [p.to_dict() async for p in client.list(Pod, namespace=namespace, labels={"job-name": name})]
    pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)
    refused = None
    if pod is None and not (job.get("status") or {}).get("conditions"):
        refused = await pods_refused(client, namespace, "Job", name, since=None)
    state = job_state(job, pod, refused)
    if state.reason == POD_REFUSED and not (job.get("spec") or {}).get("suspend"):
        # Failed for its owner: a pod admitted later (the quota raised) must not run its work.
        await client.patch(Job, name, {"spec": {"suspend": True}}, namespace=namespace)
    progress = None
    if state.phase == RUNNING and pod and (pod.get("status") or {}).get("phase") == "Running":
        try:
            lines = [
                line async for line in client.log(pod["metadata"]["name"], namespace=namespace, tail_lines=5)
            ]
            progress = last_progress("".join(lines))
        except ApiError:
            pass  # the log is not there yet
    return job, state, progress


async def observe_job(client: AsyncClient, namespace: str, name: str) -> JobView:
    job, state, progress = await read_job(client, namespace, name)
    if job is None:
        return NO_JOB
    return JobView(True, bool((job.get("metadata") or {}).get("deletionTimestamp")), state, progress)
