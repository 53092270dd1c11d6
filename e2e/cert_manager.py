"""cert-manager on the test bed, for the tests of Statefleet's cert-manager path: its CRDs and
its controllers (built by `make testbed-up` from its Go module), installed for one test and
removed after it, so every other test runs the operator's own certificates."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from e2e.kube import REPO, kubeconfig_path

HOME = REPO / ".testbed" / "bin" / "cert-manager"
CRDS = HOME / "crds"


def kubectl(*args: str) -> None:
    command = [str(REPO / ".testbed" / "bin" / "kubectl"), "--kubeconfig", str(kubeconfig_path()), *args]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=180)


def uninstall() -> None:
    """Removes the CRDs (and with them every cert-manager object); a killed run may have left them."""
    if CRDS.is_dir():
        kubectl("delete", "--ignore-not-found", "--wait=true", "-f", str(CRDS))


@contextmanager
def installed() -> Iterator[None]:
    if not (HOME / "certmanager").exists():
        raise RuntimeError(f"no cert-manager at {HOME}: run `make testbed-up`")
    kubectl("apply", "--server-side", "-f", str(CRDS))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS))
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
