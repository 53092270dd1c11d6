"""Test namespaces: made per test (or per module of ordered steps), deleted without waiting,
checked to be gone at the end of the session."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from e2e.kube import REPO, kubeconfig_path

TEST_LABEL = {"statefleet.dev/test": "true"}
# Every test namespace enforces PodSecurity `restricted`, as a platform team's would: every
# scenario proves that each pod and Job the operator makes is admitted there.
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}

# How long a deleted test namespace may take to go (its pods stopped, its finalizers run):
# the same limit as when every test waited for its own.
NAMESPACE_DELETION_LIMIT = 180.0


def worker_tag() -> str:
    """N for xdist's worker gwN; empty outside xdist (a test run by hand beside a parallel run
    then has namespaces and ports of its own)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return worker[2:] if worker.startswith("gw") else ""


def worker_index() -> int:
    """0 outside xdist, N + 1 for worker gwN: an offset for this process's ports."""
    tag = worker_tag()
    return int(tag) + 1 if tag else 0


def worker_name() -> str:
    """gwN under xdist, main outside."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def namespace_prefix(kind: str = "t") -> str:
    """`t<N>-` for worker N's e2e tests (`c<N>-`: its controller tier), `t-` outside xdist;
    t1-* does not match t10-...: no two patterns overlap."""
    return f"{kind}{worker_tag()}-"


# Tests of this process that failed so far, and how many had when each namespace was made: a
# namespace deleted after one more failed keeps its evidence (see `save_evidence`).
FAILURES: list[str] = []
FAILURES_AT: dict[str, int] = {}
EVIDENCE = REPO / ".testbed" / "logs" / "evidence"
KUBECTL = REPO / ".testbed" / "bin" / "kubectl"


def save_evidence(name: str) -> None:
    """What a failure leaves to look at once its namespace is gone: every pod's description and
    logs (each container's, and its previous run's after a restart) and the namespace's Events.
    Best effort: it never fails the run."""
    folder = EVIDENCE / name
    folder.mkdir(parents=True, exist_ok=True)
    base = [str(KUBECTL), "--kubeconfig", str(kubeconfig_path()), "-n", name]

    def save(file: str, *args: str) -> None:
        try:
            done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60, check=False)
            (folder / file).write_text(done.stdout + done.stderr)
        except (OSError, subprocess.SubprocessError) as error:
            (folder / file).write_text(f"{error}\n")

    save("events.txt", "get", "events", "--sort-by=.lastTimestamp")
    save("pods.txt", "describe", "pods")
    save("statefleet.yaml", "get", "statefleet", "-o", "yaml")
    try:
        pods = subprocess.run(
            [*base, "get", "pods", "-o", "jsonpath={range .items[*]}{.metadata.name}{'\\n'}{end}"],
            capture_output=True, text=True, timeout=60, check=False,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pods = []
    for pod in pods:
        save(f"{pod}.log", "logs", pod, "--all-containers", "--prefix", "--timestamps")
        save(f"{pod}.previous.log", "logs", pod, "--all-containers", "--prefix", "--timestamps", "--previous")


class DeletedNamespaces:
    """Namespaces deleted by this worker's tests. A test does not wait for its namespace to
    go (17 to 71 s each, mostly pods stopping): the deletions go on while the next tests run,
    and at the end of the session every one must have finished within its time limit."""

    def __init__(self, kube: Client) -> None:
        self.kube = kube
        self.deleted: dict[str, float] = {}  # name -> when it was deleted (monotonic)

    def delete(self, name: str) -> None:
        if len(FAILURES) > FAILURES_AT.pop(name, len(FAILURES)):
            save_evidence(name)
        try:
            self.kube.delete(Namespace, name)
        except ApiError as error:
            if error.status.code != 404:
                raise
        self.deleted[name] = time.monotonic()

    def present(self) -> set[str]:
        return {
            ns.metadata.name
            for ns in self.kube.list(Namespace, labels=TEST_LABEL)
            if ns.metadata.name in self.deleted
        }

    def settle(self) -> None:
        """Waits for every deleted namespace; fails naming those past their limit."""
        while self.deleted:
            left = self.present()
            now = time.monotonic()
            late = {name for name in left if now - self.deleted[name] > NAMESPACE_DELETION_LIMIT}
            self.deleted = {name: at for name, at in self.deleted.items() if name in left}
            if late:
                stuck = {name: self.deleted.pop(name) for name in late}
                raise AssertionError(
                    f"namespaces not deleted within {NAMESPACE_DELETION_LIMIT:.0f} s: {sorted(stuck)} "
                    "(kubectl get ns NAME -o yaml tells what holds them)"
                )
            if self.deleted:
                time.sleep(1)


def new_namespace(kube: Client, prefix: str, readable: str, restricted: bool = True) -> str:
    """`<prefix><readable>-<random>`, labelled as a test's, enforcing PodSecurity `restricted`
    unless told otherwise (the test bed's own proofs run plain images as root)."""
    readable = re.sub(r"[^a-z0-9]+", "-", readable.lower())[:40].strip("-")
    name = f"{prefix}{readable}-{uuid.uuid4().hex[:5]}"
    labels = {**TEST_LABEL, **(RESTRICTED if restricted else {})}
    kube.create(Namespace(metadata=ObjectMeta(name=name, labels=labels)))
    FAILURES_AT[name] = len(FAILURES)
    return name
