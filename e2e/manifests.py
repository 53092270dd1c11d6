"""Manifests the test bed's proofs and the demo apply: plain dicts, built by pure functions."""

from __future__ import annotations

from typing import Any

POSTGRES_15 = "localhost/statefleet/postgres:15"
PAUSE_IMAGE = "localhost/statefleet/pause:3.10.2"


def postgres_container(password: str, image: str = POSTGRES_15) -> dict[str, Any]:
    return {
        "name": "postgres",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": "POSTGRES_PASSWORD", "value": password}],
        "ports": [{"name": "postgres", "containerPort": 5432}],
        "readinessProbe": {
            "exec": {"command": ["pg_isready", "-U", "postgres", "-h", "127.0.0.1"]},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
    }


def postgres_pod(name: str, password: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [postgres_container(password)],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }


def service(name: str, selector: dict[str, str], port: int, headless: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": selector, "ports": [{"name": "main", "port": port}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def psql_client_pod(name: str, uri: str, sql: str) -> dict[str, Any]:
    """A one-shot pod that runs `sql` through psql against `uri` and prints the result."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "psql",
                    "image": POSTGRES_15,
                    "imagePullPolicy": "IfNotPresent",
                    # kube-proxy follows a pod that just turned ready a moment later: psql
                    # runs once the address answers (for up to 30 s).
                    "command": [
                        "bash",
                        "-c",
                        'for _ in $(seq 30); do pg_isready -q -d "$0" -t 2 && break; sleep 1; done; '
                        'exec psql "$0" -v ON_ERROR_STOP=1 -tAc "$1"',
                        uri,
                        sql,
                    ],
                }
            ],
        },
    }


def statefulset(name: str, replicas: int, pod_spec: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A StatefulSet named `name` whose pods carry the label app=<name>; `spec` adds fields."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            **spec,
        },
    }


def postgres_statefulset(name: str, password: str, replicas: int = 1, storage: str = "1Gi") -> dict[str, Any]:
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}}
    return statefulset(
        name,
        replicas,
        {"terminationGracePeriodSeconds": 5, "containers": [postgres_container(password)]},
        volumeClaimTemplates=[{"metadata": {"name": "data"}, "spec": claim}],
    )


# Pod spec fields that put a pod on kwok's simulated nodes only (for pods that need not run).
ON_KWOK: dict[str, Any] = {
    "nodeSelector": {"type": "kwok"},
    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
}


def kwok_statefulset(name: str, replicas: int) -> dict[str, Any]:
    """A StatefulSet whose pods land only on kwok's simulated nodes."""
    return statefulset(
        name,
        replicas,
        {**ON_KWOK, "containers": [{"name": "app", "image": PAUSE_IMAGE}]},
        podManagementPolicy="Parallel",
    )


def statefulset_rollout(
    template: dict[str, Any], steps: list[dict[str, Any]], replicas: int, name: str = "web", **strategy: Any
) -> dict[str, Any]:
    """A StatefulsetRollout whose pods carry app=<name> (the template must carry it too)."""
    return {
        "apiVersion": "statefleet.dev/v1alpha1",
        "kind": "StatefulsetRollout",
        "metadata": {"name": name},
        "spec": {
            "statefulSet": {
                "replicas": replicas,
                "serviceName": name,
                "selector": {"matchLabels": {"app": name}},
                "template": template,
            },
            "strategy": {"steps": steps, **strategy},
        },
    }
