"""The Helm chart installs a working operator: proven by creating a Postgres through it and
running a verified backup plan, which touches every kind of object the release's role grants."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace, Pod

from e2e.kube import REPO, kubeconfig_path, operator_image, wait_until
from e2e.namespaces import TEST_LABEL, DeletedNamespaces
from e2e.test_backup import Backup, BackupPlan, Restore, plan_backups, storage, verified
from e2e.test_postgres import Postgres, create, wait_ready

pytestmark = pytest.mark.e2e


def helm(*args: str) -> str:
    command = [str(REPO / ".testbed" / "bin" / "helm"), "--kubeconfig", str(kubeconfig_path()), *args]
    return subprocess.run(command, check=True, text=True, capture_output=True).stdout


@pytest.fixture
def chart_namespace(kube: Client, deleted_namespaces: DeletedNamespaces) -> Iterator[str]:
    # Not t<N>-*: the operators the other tests run on the host must not see this namespace.
    name = f"chart-{uuid.uuid4().hex[:6]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name, labels=TEST_LABEL)))
    yield name
    # Backups and Restores carry the operator's finalizer: remove them while it still runs.
    for kind in (BackupPlan, Backup, Restore):
        kube.deletecollection(kind, namespace=name)
    wait_until(
        "backups and restores finalized",
        lambda: not any(list(kube.list(kind, namespace=name)) for kind in (BackupPlan, Backup, Restore)),
        timeout=120,
    )
    subprocess.run(
        [str(REPO / ".testbed" / "bin" / "helm"), "--kubeconfig", str(kubeconfig_path()), "uninstall", name,
         "--namespace", name, "--wait"],
        check=False, capture_output=True,
    )  # fmt: skip
    deleted_namespaces.delete(name)


def test_chart_installs_an_operator_that_serves_postgres(
    kube: Client, bucket: str, chart_namespace: str
) -> None:
    repository, tag = operator_image()
    helm(
        "upgrade", "--install", chart_namespace, str(REPO / "charts" / "statefleet"),
        "--namespace", chart_namespace, "--wait", "--timeout", "3m",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", f"watchNamespaces={{{chart_namespace}}}", "--set", "resources.requests.cpu=10m",
    )  # fmt: skip
    deployment = kube.get(Deployment, f"{chart_namespace}-operator", namespace=chart_namespace)
    assert deployment.status.readyReplicas == 1
    create(kube, chart_namespace, "viachart", {"version": "15", "storage": {"size": "1Gi"}})
    status = wait_ready(kube, chart_namespace, "viachart", 1)
    assert status["currentPrimary"] == "viachart-0"
    # Backups, their plan, its restore test and the throwaway instance it creates and deletes.
    storage(kube, chart_namespace, "s3", bucket)
    plan = {
        "service": {"kind": "Postgres", "name": "viachart"},
        "storage": "s3",
        "schedule": "* * * * *",
        "method": "logical",
        "retention": {"keepLast": 1},
        "verify": {"enabled": True},
    }
    kube.create(BackupPlan(metadata=ObjectMeta(name="nightly", namespace=chart_namespace), spec=plan))

    def passed() -> bool:
        conditions = [verified(backup) for backup in plan_backups(kube, chart_namespace, "nightly").values()]
        return any(condition and condition["status"] == "True" for condition in conditions)

    wait_until("a verified backup through the chart's operator", passed, timeout=300, interval=2)
    wait_until(
        "the throwaway instance deleted",
        lambda: [p.metadata.name for p in kube.list(Postgres, namespace=chart_namespace)] == ["viachart"],
        timeout=120,
    )
    # The release's least-privilege role sufficed: the operator's log shows no refusal.
    pods = kube.list(Pod, namespace=chart_namespace, labels={"app.kubernetes.io/name": "statefleet"})
    logs = "\n".join(line for pod in pods for line in kube.log(pod.metadata.name, namespace=chart_namespace))
    assert "Forbidden" not in logs
    assert '"status": 403' not in logs
