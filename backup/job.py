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

from backup.sealing import ENV_PREFIX
from backup.storage import CREDENTIAL_KEYS, S3Spec
from framework.kube.jobs import job_name
from framework.kube.meta import LABEL_MANAGED_BY, LABEL_PART_OF, MANAGER, owner_reference
from framework.kube.pod_security import restricted

JOB_LABEL = "statefleet.dev/backup-job"
DEFAULT_DEADLINE = 6 * 3600  # seconds


@dataclass(frozen=True)
class StartJob:
    """A planned Job of a Backup or a Restore (`build_job`)."""

    action: str  # backup, restore, verify, rollback: the Job is `<owner>-<action>`
    request: dict[str, Any]
    service_env: bool = True  # the Job reaches the instance (a verify Job reads the storage only)
    retries: int = 0
    owned_by_target: bool = False  # a Restore being deleted has its target own the Job
    deadline_seconds: int = DEFAULT_DEADLINE


@dataclass(frozen=True)
class DeleteJob:
    action: str
    foreground: bool = False  # wait for its pod, so it holds nothing
    best_effort: bool = False


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
    client_of: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Job `<owner>-<action>`, owned by `owner` unless `owned_by` (kind, body) says another;
    `client_of`: the labels that let it through the NetworkPolicy of the instance it reaches
    (`framework.network_policy.client_labels`)."""
    meta = owner["metadata"]
    name = job_name(meta["name"], action)
    labels = {**(client_of or {}), LABEL_MANAGED_BY: MANAGER, LABEL_PART_OF: "statefleet", JOB_LABEL: name}
    credentials = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": storage.credentials_secret, "key": key}}}
        for key in CREDENTIAL_KEYS
    ]
    # A storage that encrypts: every entry of its keys Secret (the current key seals, the others
    # open older backups). Optional: a Secret missing is the Job's reported failure (KeyMissing,
    # naming it), not a pod that never starts until the deadline.
    keys = (
        [{"secretRef": {"name": storage.encryption.keys_secret, "optional": True}, "prefix": ENV_PREFIX}]
        if storage.encryption
        else []
    )
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
                "spec": restricted(
                    {
                        "restartPolicy": "Never",
                        "enableServiceLinks": False,
                        "securityContext": {"runAsUser": 999, "runAsGroup": 999},
                        "containers": [
                            {
                                "name": action,
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "command": ["python3", "-m", "backup"],
                                **({"envFrom": keys} if keys else {}),
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
                                "securityContext": {"readOnlyRootFilesystem": True},
                                "volumeMounts": [
                                    {"name": "tmp", "mountPath": "/tmp"}
                                ],  # the tools' temp files
                            }
                        ],
                        "volumes": [{"name": "tmp", "emptyDir": {}}],
                    }
                ),
            },
        },
    }
