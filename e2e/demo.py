"""`make demo`: the operator installed on the test bed with its Helm chart, and the first
example a user is shown (`examples/postgres-demo.yaml`: apps/demo, 3 instances) running.

Idempotent and quick the second time: the image, the release and the resource are the
same, so nothing changes.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import time

from lightkube.resources.core_v1 import Namespace, Pod, Secret, Service

from e2e.kube import REPO, client, kubeconfig_path, operator_image, wait_until
from services.postgres import PLUGIN

RELEASE, OPERATOR_NAMESPACE, APP_NAMESPACE = "statefleet", "statefleet-system", "apps"
Postgres = PLUGIN.resource()


def tool(name: str, *args: str, capture: bool = False) -> str:
    command = [str(REPO / ".testbed" / "bin" / name), "--kubeconfig", str(kubeconfig_path()), *args]
    result = subprocess.run(command, check=True, text=True, capture_output=capture)
    return result.stdout if capture else ""


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def main() -> int:
    kube = client()
    step("the test bed: one real node (containerd) and kwok's simulated nodes")
    tool("kubectl", "get", "nodes", "-o", "wide")

    repository, tag = operator_image()
    step(f"installing the operator with Helm ({repository}:{tag})")
    # The application namespace first: the chart binds the operator's rights there (it watches
    # that namespace only). As a platform team's namespace would be: only pods that pass
    # PodSecurity `restricted`.
    restricted = {"pod-security.kubernetes.io/enforce": "restricted"}
    kube.apply(Namespace.from_dict({"metadata": {"name": APP_NAMESPACE, "labels": restricted}}))
    tool("kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    tool(
        "helm", "upgrade", "--install", RELEASE, str(REPO / "charts" / "statefleet"),
        "--namespace", OPERATOR_NAMESPACE, "--create-namespace", "--wait", "--timeout", "3m",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", f"watchNamespaces={{{APP_NAMESPACE}}}",
    )  # fmt: skip
    tool("kubectl", "-n", OPERATOR_NAMESPACE, "get", "deployment,pods")

    step("a developer applies examples/postgres-demo.yaml")
    tool("kubectl", "apply", "-f", str(REPO / "examples" / "postgres-demo.yaml"))
    started = time.monotonic()

    def ready() -> dict | None:
        status = kube.get(Postgres, "demo", namespace=APP_NAMESPACE).to_dict().get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        return status if conditions.get("Ready") == "True" and status.get("readyInstances") == 3 else None

    status = wait_until("apps/demo Ready with 3 instances", ready, timeout=300, interval=1)
    print(f"ready after {time.monotonic() - started:.0f}s")
    tool("kubectl", "-n", APP_NAMESPACE, "get", "postgres", "demo")

    step("instances and their roles")
    pods = kube.list(Pod, namespace=APP_NAMESPACE, labels={"app.kubernetes.io/instance": "demo"})
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        role = (pod.metadata.labels or {}).get("statefleet.dev/role", "?")
        print(f"  {pod.metadata.name:10} {role:8} {pod.status.podIP}")
    endpoints = status["endpoints"]
    print(f"  primary: {status['currentPrimary']}; rw: {endpoints['rw']}; ro: {endpoints['ro']}")

    secret = kube.get(Secret, "demo-superuser", namespace=APP_NAMESPACE)
    password = base64.b64decode(secret.data["password"]).decode()
    rw_ip = kube.get(Service, "demo-rw", namespace=APP_NAMESPACE).spec.clusterIP
    check = subprocess.run(
        ["psql", f"postgresql://postgres@{rw_ip}:5432/postgres", "-tAc", "select version()"],
        env={"PGPASSWORD": password, "PATH": "/usr/bin:/bin"},
        text=True,
        capture_output=True,
    )
    step("psql from this machine, through demo-rw")
    print(check.stdout.strip() or check.stderr.strip())
    kubectl = ".testbed/bin/kubectl -n apps get"
    print(
        f"\n  export KUBECONFIG={kubeconfig_path()}\n"
        f"  PGPASSWORD=$({kubectl} secret demo-superuser -o jsonpath='{{.data.password}}' | base64 -d) \\\n"
        f"    psql -h $({kubectl} service demo-rw -o jsonpath='{{.spec.clusterIP}}') -U postgres"
    )
    return check.returncode


if __name__ == "__main__":
    sys.exit(main())
