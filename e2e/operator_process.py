"""Runs `statefleet operator` as a child process for tests, and restarts it on demand."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from e2e.kube import REPO, kubeconfig_path, operator_image, wait_until

LIVENESS_PORT = 18080
METRICS_PORT = 19090
E2E_CATALOG = Path(__file__).resolve().parent / "catalog.yaml"


class OperatorProcess:
    def __init__(self, log_path: Path, namespaces: str, catalog: Path) -> None:
        self.log_path = log_path
        self.namespaces = namespaces
        self.catalog = catalog
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped_in = 0.0

    @classmethod
    def start(
        cls, namespaces: str = "t-*", log_name: str = "operator-e2e.log", catalog: Path = E2E_CATALOG
    ) -> OperatorProcess:
        """The operator for namespaces matching `namespaces` only: an operator installed with
        Helm may own others."""
        log_dir = REPO / ".testbed" / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        operator = cls(log_dir / log_name, namespaces, catalog)
        operator.launch()
        return operator

    def launch(self) -> None:
        for port in (LIVENESS_PORT, METRICS_PORT):
            # Another operator left running would answer the liveness check for this one.
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    raise RuntimeError(
                        f"port {port} is taken: is an operator from an earlier run still running?"
                    )
        env = {**os.environ, "KUBECONFIG": str(kubeconfig_path())}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "framework",
                    "operator",
                    "--install-crds",
                    "--catalog",
                    str(self.catalog),
                    "--log-format",
                    "plain",
                    "--liveness",
                    f"http://127.0.0.1:{LIVENESS_PORT}/healthz",
                    "--metrics-port",
                    str(METRICS_PORT),
                    "--namespace",
                    self.namespaces,
                    "--job-image",
                    ":".join(operator_image()),
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until("the operator's liveness endpoint", self.alive, timeout=60)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5) as response:
            return response.read().decode()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def rss_bytes(self, field: str = "VmRSS") -> int:
        """Resident memory now (VmRSS), or at its peak so far (VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field}")

    def cpu_seconds(self) -> float:
        """User and system CPU time the process has used."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def api_requests(self, verbs: tuple[str, ...] = ()) -> int:
        """Requests the operator sent to the API server (its own counter), of `verbs` or all."""
        total = 0.0
        for verb, value in re.findall(
            r'^statefleet_api_requests_total\{verb="([A-Z]+)"\} (\S+)$', self.metrics(), re.M
        ):
            if not verbs or verb in verbs:
                total += float(value)
        return int(total)

    def alive(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"the operator exited; see {self.log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{LIVENESS_PORT}/healthz", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM, as the kubelet sends; `stopped_in` records how long the operator took."""
        started = time.monotonic()
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stopped_in = time.monotonic() - started
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a lost node would."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        time.sleep(0.5)
        self.launch()
