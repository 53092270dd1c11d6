"""Small helpers for tests and the demo that talk to a real cluster (the test bed, or
whatever cluster KUBECONFIG names)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Event, Namespace, Pod, Secret

from e2e.timing import RECORDER

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def built_image(recipe: str) -> str:
    """The reference of an image the test bed built and imported (`make testbed-up` does both),
    by its recipe's folder name under testbed/images."""
    cache = Path(os.environ.get("STATEFLEET_CACHE") or Path.home() / ".cache" / "statefleet")
    _archive, ref = (cache / "images" / f"{recipe}.current").read_text().split()
    return ref


def operator_image() -> tuple[str, str]:
    """The operator image: repository and tag."""
    repository, tag = built_image("operator").rsplit(":", 1)
    return repository, tag


def kubeconfig_path() -> Path:
    """KUBECONFIG if set (another cluster), else the test bed's."""
    return Path(os.environ.get("KUBECONFIG") or REPO / ".testbed" / "kubeconfig")


def client() -> Client:
    path = kubeconfig_path()
    if not path.exists():
        raise RuntimeError(f"no kubeconfig at {path}: run `make testbed-up` or set KUBECONFIG")
    return Client(config=KubeConfig.from_file(str(path)), field_manager="statefleet-tests")


def statefleet(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The CLI (`statefleet ...`, also `kubectl statefleet ...`), as a user runs it."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig_path())}
    command = [sys.executable, "-m", "statefleet", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def kubectl(*args: str, timeout: float = 180) -> str:
    """The test bed's kubectl (`kubectl exec` into a pod, say); its output. Raises on failure."""
    command = [str(REPO / ".testbed" / "bin" / "kubectl"), "--kubeconfig", str(kubeconfig_path()), *args]
    return subprocess.run(command, check=True, capture_output=True, text=True, timeout=timeout).stdout


def wait_until(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """Polls `probe` until it returns something truthy; fails naming `what` and the last value."""
    started = time.monotonic()
    deadline = started + timeout
    last: Any = None
    try:
        while True:
            last = probe()
            if last:
                return last
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
            time.sleep(interval)
    finally:
        RECORDER.wait(what, time.monotonic() - started)


def pod_is_ready(pod: Pod) -> bool:
    conditions = (pod.status and pod.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def wait_pod_replaced(kube: Client, name: str, namespace: str, before: str, timeout: float) -> None:
    """Until pod `name` is a new one (not uid `before`) and ready."""
    wait_until(
        f"{name} made again and ready",
        lambda: (
            (p := get_or_none(kube, Pod, name, namespace)) is not None
            and p.metadata.uid != before
            and pod_is_ready(p)
        ),
        timeout,
        1,
    )


def get_or_none(kube: Client, resource: Any, name: str, namespace: str) -> Any:
    """The object, or None while it does not exist (e.g. between a pod and its replacement)."""
    try:
        return kube.get(resource, name, namespace=namespace)
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise


def wait_gone(kube: Client, resource: Any, name: str, namespace: str, timeout: float = 180) -> None:
    wait_until(
        f"{resource._api_info.resource.kind} {name} gone",
        lambda: get_or_none(kube, resource, name, namespace) is None,
        timeout,
        interval=1,
    )


def wait_pod_ready(kube: Client, name: str, namespace: str, timeout: float = 120) -> Pod:
    def ready() -> Pod | None:
        pod = get_or_none(kube, Pod, name, namespace)
        return pod if pod and pod_is_ready(pod) else None

    return wait_until(f"pod {namespace}/{name} Ready", ready, timeout)


def wait_pod_finished(kube: Client, name: str, namespace: str, timeout: float = 120) -> Pod:
    def finished() -> Pod | None:
        pod = kube.get(Pod, name, namespace=namespace)
        return pod if pod.status and pod.status.phase in {"Succeeded", "Failed"} else None

    return wait_until(f"pod {namespace}/{name} to finish", finished, timeout)


def pod_logs(kube: Client, name: str, namespace: str) -> str:
    return "\n".join(kube.log(name, namespace=namespace))


def delete_namespace(kube: Client, name: str, wait: float = 120) -> None:
    try:
        kube.delete(Namespace, name)
    except ApiError as error:
        if error.status.code != 404:
            raise
        return

    def gone() -> bool:
        try:
            kube.get(Namespace, name)
        except ApiError as error:
            return error.status.code == 404
        return False

    wait_until(f"namespace {name} deleted", gone, wait)


def apply(kube: Client, resource: Any, namespace: str, name: str, spec: dict[str, Any]) -> None:
    kind = resource._api_info.resource.kind
    body = {"apiVersion": "statefleet.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}
    kube.create(resource.from_dict(body), namespace=namespace)


def ready_condition(kube: Client, resource: Any, namespace: str, name: str) -> dict[str, Any]:
    status = kube.get(resource, name, namespace=namespace).to_dict().get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})


def wait_reason(
    kube: Client, resource: Any, namespace: str, name: str, reason: str, timeout: float = 60
) -> str:
    """Waits for the Ready condition's reason; returns its message."""

    def reached() -> str | None:
        condition = ready_condition(kube, resource, namespace, name)
        return condition.get("message") if condition.get("reason") == reason else None

    return wait_until(f"{name}: Ready reason {reason}", reached, timeout, interval=0.5)


def secret_data(kube: Client, namespace: str, name: str) -> dict[str, str]:
    secret = kube.get(Secret, name, namespace=namespace)
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def events(
    kube: Client, namespace: str, name: str, reason: str, since: datetime | None = None, timeout: float = 30
) -> list[Event]:
    """The Events of `reason` about the object `name` (those of `since` or later if given),
    waited for up to `timeout`: the operator posts an Event after the status write a test saw.
    Empty when none came."""

    def found() -> list[Event]:
        return [
            e
            for e in kube.list(Event, namespace=namespace, fields={"involvedObject.name": name})
            if e.reason == reason
            and (since is None or (e.lastTimestamp or e.eventTime or e.metadata.creationTimestamp) >= since)
        ]

    deadline = time.monotonic() + timeout
    while not (matching := found()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return matching
