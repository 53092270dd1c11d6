"""The operator for tests: `statefleet operator` as a child process (e2e: restarted, killed
on demand), or in a thread of the test process (the controller tier)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from e2e.catalog import e2e_catalog
from e2e.kube import REPO, kubeconfig_path, operator_image, wait_until
from framework.rollout.outbound import IN_CLUSTER
from statefleet import cli

LIVENESS_PORT = 18080
# Where the tests' rollouts may send requests: in-cluster Services, and the receivers the tests
# run on this host (e2e/receiver.py).
TEST_DESTINATIONS = (*IN_CLUSTER, "127.0.0.1")
METRICS_PORT = 19090


class OperatorProcess:
    def __init__(
        self, log_path: Path, namespaces: str, catalog: Path, port_offset: int = 0, group: int | None = None
    ) -> None:
        self.log_path = log_path
        self.group = group  # the process's group id (a partition test's rules match it)
        self.namespaces = namespaces
        self.catalog = catalog
        # Each parallel test worker's operator has ports of its own.
        self.liveness_port = LIVENESS_PORT + port_offset
        self.metrics_port = METRICS_PORT + port_offset
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped_in = 0.0
        # --network-policies from the next launch on (a restart): every instance gets one.
        self.network_policies = False

    @classmethod
    def start(
        cls,
        namespaces: str = "t-*",
        log_name: str = "operator-e2e.log",
        catalog: Path | None = None,
        port_offset: int = 0,
        group: int | None = None,
    ) -> OperatorProcess:
        """The operator for namespaces matching `namespaces` only: an operator installed with
        Helm, or another test worker's, may own others."""
        log_dir = REPO / ".testbed" / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        operator = cls(log_dir / log_name, namespaces, catalog or e2e_catalog(), port_offset, group)
        operator.launch()
        return operator

    def launch(self) -> None:
        for port in (self.liveness_port, self.metrics_port):
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
                    "statefleet",
                    "operator",
                    "--install-crds",
                    "--catalog",
                    str(self.catalog),
                    "--log-format",
                    "plain",
                    "--liveness",
                    f"http://127.0.0.1:{self.liveness_port}/healthz",
                    "--metrics-port",
                    str(self.metrics_port),
                    "--namespace",
                    self.namespaces,
                    "--job-image",
                    ":".join(operator_image()),
                    *(f"--allowed-destination={host}" for host in TEST_DESTINATIONS),
                    *(["--network-policies"] if self.network_policies else []),
                ],
                cwd=REPO,
                env=env,
                group=self.group,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until("the operator's liveness endpoint", self.alive, timeout=60)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
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
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1
            ) as response:
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


class InProcessOperator:
    """The operator in a thread of the test process (the controller tier): the same
    controllers as `statefleet operator`, started in a second and stopped with a flag."""

    def __init__(self, namespaces: str, log_name: str) -> None:
        self.args = argparse.Namespace(
            catalog=str(e2e_catalog()),
            namespace=[namespaces],
            install_crds=True,
            metrics_port=0,
            job_image=":".join(operator_image()),
            liveness=None,
            leader_election=False,
            allowed_destination=list(TEST_DESTINATIONS),
            network_policies=False,
            operator_namespace=None,
            operator_pod_labels=None,
            network_policy_extra_from=None,
        )
        self.log_path = REPO / ".testbed" / "logs" / log_name
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="operator", daemon=True)
        self.handler: logging.Handler | None = None

    def _run(self) -> None:
        try:
            asyncio.run(cli.run_operator(self.args, stop_flag=self.stop_flag, ready_flag=self.ready_flag))
        except BaseException as error:  # reported by start() or stop()
            self.failure = error

    def start(self) -> InProcessOperator:
        # The operator's clients (lightkube's, kopf's) read the cluster from KUBECONFIG.
        os.environ["KUBECONFIG"] = str(kubeconfig_path())
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.handler = logging.FileHandler(self.log_path)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logging.getLogger().addHandler(self.handler)
        logging.getLogger().setLevel(logging.INFO)
        for noisy in ("httpx", "httpx2", "kopf.objects"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        if os.environ.get("STATEFLEET_KOPF_DEBUG"):
            logging.getLogger("kopf").setLevel(logging.DEBUG)
        self.thread.start()
        wait_until("the in-process operator watching", self._ready, timeout=60, interval=0.1)
        return self

    def _ready(self) -> bool:
        if self.failure is not None:
            raise RuntimeError(f"the operator stopped: {self.failure!r}; see {self.log_path}")
        return self.ready_flag.is_set()

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=30)
        if self.handler is not None:
            logging.getLogger().removeHandler(self.handler)
            self.handler.close()
        if self.thread.is_alive():
            raise RuntimeError("the in-process operator did not stop within 30 s")
