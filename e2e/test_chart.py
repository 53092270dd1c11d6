"""The Helm chart installs a working operator: proven by creating a Postgres through it and
running a verified backup plan, which touches every kind of object the release's role grants;
then its leader is killed and the standby replica takes over. Its NetworkPolicies are on: the
operator reaches the instance from its pods, and the backup and restore Jobs reach theirs,
through the policies (enforced on the test bed by kube-router)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.networking_v1 import NetworkPolicy

from e2e import node
from e2e.kube import REPO, get_or_none, kubeconfig_path, kubectl, operator_image, wait_until
from e2e.namespaces import RESTRICTED, TEST_LABEL, DeletedNamespaces
from e2e.test_backup import Backup, BackupPlan, Restore, plan_backups, storage, verified
from e2e.test_postgres import Postgres, create, wait_ready
from e2e.test_rollout import rollout
from framework.rollout.controller import Rollout

pytestmark = pytest.mark.e2e


def helm(*args: str) -> str:
    command = [str(REPO / ".testbed" / "bin" / "helm"), "--kubeconfig", str(kubeconfig_path()), *args]
    return subprocess.run(command, check=True, text=True, capture_output=True).stdout


def install(namespace: str) -> None:
    """The chart as a release of the namespace's name, serving that namespace only."""
    repository, tag = operator_image()
    helm(
        "upgrade", "--install", namespace, str(REPO / "charts" / "statefleet"),
        "--namespace", namespace, "--wait", "--timeout", "3m",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", f"watchNamespaces={{{namespace}}}", "--set", "resources.requests.cpu=10m",
        "--set", "networkPolicies.enabled=true",
    )  # fmt: skip


@pytest.fixture
def chart_namespace(kube: Client, deleted_namespaces: DeletedNamespaces) -> Iterator[str]:
    # Not t<N>-*: the operators the other tests run on the host must not see this namespace.
    name = f"chart-{uuid.uuid4().hex[:6]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name, labels={**TEST_LABEL, **RESTRICTED})))
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
    install(chart_namespace)
    # Least privilege: the release watches its own namespace only, so its rights on Secrets,
    # StatefulSets and Jobs hold there alone; cluster-wide it reads CRDs and namespaces.
    account = f"system:serviceaccount:{chart_namespace}:{chart_namespace}-operator"
    for verb, resource, where, allowed in (
        ("create", "statefulsets", chart_namespace, True),
        ("get", "secrets", chart_namespace, True),
        ("create", "jobs", chart_namespace, True),
        ("create", "networkpolicies", chart_namespace, True),
        ("delete", "networkpolicies", chart_namespace, True),  # pruned when the value is turned off
        ("create", "networkpolicies", "default", False),
        ("list", "secrets", chart_namespace, False),  # never listed, read by name
        ("get", "secrets", "kube-system", False),
        ("create", "statefulsets", "default", False),
        ("create", "jobs", "default", False),
        ("delete", "pods", "default", False),
        ("watch", "customresourcedefinitions", "", True),
        ("list", "namespaces", "", True),
        ("delete", "namespaces", "", False),
    ):
        scope = where or "the cluster"
        assert can_i(account, verb, resource, where) is allowed, f"{verb} {resource} in {scope}"
    # Outbound requests bounded: a rollout that would make the operator call a host outside
    # the allow-list (the default: in-cluster Services) is refused at admission, naming the field.
    probing = rollout("1", [{"setPercent": 50}, {"analysis": {"http": {"url": "http://169.254.169.254/"}}}])
    with pytest.raises(ApiError) as refused:
        kube.create(Rollout.from_dict(probing), namespace=chart_namespace)
    assert refused.value.status.code == 403
    assert "spec.strategy.steps[].analysis.http.url: the host is not an allowed destination" in (
        refused.value.status.message
    )
    deployment = kube.get(Deployment, f"{chart_namespace}-operator", namespace=chart_namespace)
    assert deployment.status.readyReplicas == 2  # the leader and a standby, both ready
    leader = wait_until("a leader", lambda: lease_holder(kube, chart_namespace), timeout=30)
    assert leader.rsplit("_", 1)[0] in operator_pods(kube, chart_namespace)
    create(kube, chart_namespace, "viachart", {"version": "15", "storage": {"size": "1Gi"}})
    status = wait_ready(kube, chart_namespace, "viachart", 1)
    assert status["currentPrimary"] == "viachart-0"
    # Ready through its NetworkPolicy: the operator's pods (this namespace, the release's labels)
    # are the peer that lets the operator ask the server.
    policy = kube.get(NetworkPolicy, "viachart-ingress", namespace=chart_namespace).to_dict()
    assert policy["metadata"]["ownerReferences"][0]["name"] == "viachart"
    assert policy["spec"]["ingress"][0]["from"][0] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": chart_namespace}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "statefleet",
                "app.kubernetes.io/instance": chart_namespace,
            }
        },
    }
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
    took_over, first_reconcile = kill_the_leader(kube, chart_namespace, leader)
    print(f"leader killed: Lease taken after {took_over:.1f} s, reconciling after {first_reconcile:.1f} s")
    # Not before the Lease expired (8 s, less the 1 s between renewals), and soon after it.
    assert 6.5 <= took_over <= 13, f"the standby took over after {took_over:.1f} s"
    assert first_reconcile <= took_over + 10, f"first reconcile {first_reconcile:.1f} s after the kill"
    # The killed leader's container restarts, and waits as the standby.
    wait_until("the restarted operator ready", lambda: ready_replicas(kube, chart_namespace) == 2, timeout=90)
    assert lease_holder(kube, chart_namespace) != leader  # the restarted one waits its turn
    # The release's least-privilege role sufficed: the operator's log shows no refusal.
    pods = kube.list(Pod, namespace=chart_namespace, labels={"app.kubernetes.io/name": "statefleet"})
    logs = "\n".join(line for pod in pods for line in kube.log(pod.metadata.name, namespace=chart_namespace))
    assert "Forbidden" not in logs
    assert '"status": 403' not in logs


def can_i(account: str, verb: str, resource: str, namespace: str) -> bool:
    """`kubectl auth can-i` as `account` (in `namespace`; "": cluster-scoped)."""
    scope = ["--namespace", namespace] if namespace else []
    command = [str(REPO / ".testbed" / "bin" / "kubectl"), "--kubeconfig", str(kubeconfig_path()), "auth"]
    asked = [*command, "can-i", verb, resource, f"--as={account}", *scope]
    done = subprocess.run(asked, capture_output=True, text=True, timeout=30)
    answer = done.stdout.strip()
    assert answer in ("yes", "no"), done.stdout + done.stderr
    return answer == "yes"


def ready_replicas(kube: Client, namespace: str) -> int:
    return kube.get(Deployment, f"{namespace}-operator", namespace=namespace).status.readyReplicas or 0


def operator_pods(kube: Client, namespace: str) -> dict[str, Pod]:
    return {
        pod.metadata.name: pod
        for pod in kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/name": "statefleet"})
        if not pod.metadata.deletionTimestamp
    }


def lease_holder(kube: Client, namespace: str) -> str | None:
    lease = get_or_none(kube, Lease, f"{namespace}-operator", namespace)
    return lease.spec.holderIdentity if lease is not None and lease.spec is not None else None


def holder_pod(kube: Client, namespace: str) -> str | None:
    """The pod whose operator holds the Lease (its identity: the pod's name, `_`, a suffix)."""
    holder = lease_holder(kube, namespace)
    return holder.rsplit("_", 1)[0] if holder else None


def metric(namespace: str, pod: str, name: str) -> float:
    """The sum of a metric's samples on an operator pod (through the API server's pod proxy)."""
    text = kubectl(
        "get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:9090/proxy/metrics", timeout=10
    )
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def kill_the_leader(kube: Client, namespace: str, leader: str) -> tuple[float, float]:
    """SIGKILL to the leading operator's process (an OOM kill, a lost node): seconds until the
    standby holds the Lease, and until it finished its first reconcile of an instance."""
    leader_pod = leader.rsplit("_", 1)[0]
    standby = next(name for name in operator_pods(kube, namespace) if name != leader_pod)
    assert metric(namespace, standby, "statefleet_leader") == 0
    assert metric(namespace, standby, 'statefleet_reconcile_total{kind="Postgres"') == 0
    uid = operator_pods(kube, namespace)[leader_pod].metadata.uid
    node.kill_command(uid, ["python3", "-m", "statefleet"])
    killed = time.monotonic()
    wait_until(
        "the standby holds the Lease",
        lambda: holder_pod(kube, namespace) == standby,
        timeout=30,
        interval=0.1,
    )
    took_over = time.monotonic() - killed
    wait_until(
        "the new leader's first reconcile",
        lambda: metric(namespace, standby, 'statefleet_reconcile_total{kind="Postgres"') > 0,
        timeout=30,
        interval=0.1,
    )
    assert metric(namespace, standby, "statefleet_leader") == 1
    return took_over, time.monotonic() - killed
