"""`make demo`: the test bed's nodes and a running PostgreSQL, reached through cluster DNS.

Idempotent: running it again re-applies the same objects and runs the query again.
"""

from __future__ import annotations

import base64
import secrets
import subprocess
import sys

from lightkube import codecs
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace, Secret

from e2e import manifests
from e2e.kube import (
    REPO,
    client,
    delete_pod,
    kubeconfig_path,
    pod_logs,
    wait_pod_finished,
    wait_pod_ready,
)

NAMESPACE = "demo"


def kubectl(*args: str) -> None:
    kubectl_bin = REPO / ".testbed" / "bin" / "kubectl"
    subprocess.run([str(kubectl_bin), "--kubeconfig", str(kubeconfig_path()), *args], check=True)


def main() -> int:
    kube = client()
    print("== nodes: one real node (containerd) and kwok's simulated nodes")
    kubectl("get", "nodes", "-o", "wide")

    kube.apply(Namespace.from_dict({"metadata": {"name": NAMESPACE}}))
    try:
        secret = kube.get(Secret, "demo-postgres", namespace=NAMESPACE)
        password = base64.b64decode(secret.data["password"]).decode()
    except ApiError:
        password = secrets.token_hex(12)
        kube.create(
            Secret.from_dict({"metadata": {"name": "demo-postgres"}, "stringData": {"password": password}}),
            namespace=NAMESPACE,
        )
    for manifest in (
        manifests.service("postgres", {"app": "postgres"}, 5432, headless=True),
        manifests.postgres_statefulset("postgres", password),
    ):
        kube.apply(codecs.from_dict(manifest), namespace=NAMESPACE, force=True)

    print("\n== waiting for PostgreSQL (localhost/statefleet/postgres:15) to be Ready")
    wait_pod_ready(kube, "postgres-0", namespace=NAMESPACE, timeout=180)
    kubectl("-n", NAMESPACE, "get", "statefulset,pods,pvc,svc", "-o", "wide")

    uri = f"postgresql://postgres:{password}@postgres-0.postgres.{NAMESPACE}.svc.cluster.local/postgres"
    sql = "select 'connected to ' || version() || ' as ' || current_user"
    delete_pod(kube, "psql", NAMESPACE)  # the one from an earlier run
    kube.create(codecs.from_dict(manifests.psql_client_pod("psql", uri, sql)), namespace=NAMESPACE)
    pod = wait_pod_finished(kube, "psql", namespace=NAMESPACE)
    print(f"\n== psql from another pod, through postgres-0.postgres.{NAMESPACE}.svc.cluster.local")
    print(pod_logs(kube, "psql", NAMESPACE))
    return 0 if pod.status.phase == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
