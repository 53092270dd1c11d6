"""cert-manager on the test bed, for the tests of Statefleet's cert-manager path: its CRDs and
its controllers (built by `make testbed-up` from its Go module), installed for one test and
removed after it, so every other test runs the operator's own certificates."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import ConfigMap

from e2e.kube import REPO, client, kubeconfig_path, kubectl, wait_gone
from framework.instance_controller import Issuer

HOME = REPO / ".testbed" / "bin" / "cert-manager"
CRDS = HOME / "crds"


def uninstall() -> None:
    """Removes the CRDs (and with them every cert-manager object); a killed run may have left them."""
    if CRDS.is_dir():
        kubectl("delete", "--ignore-not-found", "--wait=true", "-f", str(CRDS))


def collected_by_owner(namespace: str = "default") -> None:
    """Waits until the garbage collector deletes cert-manager objects whose owner went: it
    watches new CRDs only from its next resync, and an instance deleted before then keeps its
    Certificates for minutes. Probe: an Issuer owned by a ConfigMap, the ConfigMap deleted."""
    kube = client()
    for kind in (Issuer, ConfigMap):  # what a killed run left
        with contextlib.suppress(ApiError):
            kube.delete(kind, "gc-probe", namespace=namespace)
    wait_gone(kube, ConfigMap, "gc-probe", namespace, timeout=60)
    owner = kube.create(ConfigMap(metadata=ObjectMeta(name="gc-probe")), namespace=namespace)
    reference = OwnerReference(apiVersion="v1", kind="ConfigMap", name="gc-probe", uid=owner.metadata.uid)
    issuer = Issuer.from_dict(
        {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": {"name": "gc-probe", "ownerReferences": [reference.to_dict()]},
            "spec": {"selfSigned": {}},
        }
    )
    kube.create(issuer, namespace=namespace)
    kube.delete(ConfigMap, "gc-probe", namespace=namespace)
    wait_gone(kube, Issuer, "gc-probe", namespace, timeout=300)


@contextmanager
def installed() -> Iterator[None]:
    if not (HOME / "certmanager").exists():
        raise RuntimeError(f"no cert-manager at {HOME}: run `make testbed-up`")
    kubectl("apply", "--server-side", "-f", str(CRDS))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS))
    collected_by_owner()
    log_path = REPO / ".testbed" / "logs" / "cert-manager.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(HOME / "certmanager"), "--kubeconfig", str(kubeconfig_path())],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )
    try:
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        uninstall()
