"""The Helm chart installs a working operator: proven by creating a Postgres through it."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace, Pod

from e2e.kube import REPO, delete_namespace, kubeconfig_path, operator_image
from e2e.test_postgres import create, wait_ready

pytestmark = pytest.mark.e2e


def helm(*args: str) -> str:
    command = [str(REPO / ".testbed" / "bin" / "helm"), "--kubeconfig", str(kubeconfig_path()), *args]
    return subprocess.run(command, check=True, text=True, capture_output=True).stdout


@pytest.fixture
def chart_namespace(kube: Client) -> Iterator[str]:
    # Not t-*: the operator the other tests run on the host must not see this namespace.
    name = f"chart-{uuid.uuid4().hex[:6]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name, labels={"statefleet.dev/test": "true"})))
    yield name
    subprocess.run(
        [str(REPO / ".testbed" / "bin" / "helm"), "--kubeconfig", str(kubeconfig_path()), "uninstall", name,
         "--namespace", name, "--wait"],
        check=False, capture_output=True,
    )  # fmt: skip
    delete_namespace(kube, name, wait=180)


def test_chart_installs_an_operator_that_serves_postgres(kube: Client, chart_namespace: str) -> None:
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
    # The release's least-privilege role sufficed: the operator's log shows no refusal.
    pods = kube.list(Pod, namespace=chart_namespace, labels={"app.kubernetes.io/name": "statefleet"})
    logs = "\n".join(line for pod in pods for line in kube.log(pod.metadata.name, namespace=chart_namespace))
    assert "Forbidden" not in logs
    assert '"status": 403' not in logs
