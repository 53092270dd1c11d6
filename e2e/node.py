"""The test bed's real node, seen from the host: the processes of a pod's containers, to kill
or freeze them as a failing machine would (the tests run as root on that node)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def _cgroups(pid: int) -> dict[str, str]:
    """controller -> path, from /proc/PID/cgroup (v1 lines look like `4:freezer:/kubepods/...`)."""
    found = {}
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") or [""]:
                found[controller] = path
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return found


def _command(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def pod_processes(pod_uid: str) -> list[int]:
    """Every process in the pod's containers (the pause container included)."""
    marker = f"pod{pod_uid}"
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and any(marker in path for path in _cgroups(int(entry)).values()):
            pids.append(int(entry))
    return sorted(pids)


def postmaster(pod_uid: str) -> int:
    """The pod's PostgreSQL server process (the one whose parent is not a postgres too)."""
    pids = pod_processes(pod_uid)
    servers = [pid for pid in pids if _command(pid)[:1] == ["postgres"]]
    for pid in servers:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if parent not in servers:
            return pid
    raise LookupError(f"no postgres server in pod {pod_uid} (processes: {pids})")


def kill_command(pod_uid: str, command: list[str]) -> int:
    """SIGKILL to the pod's process that runs `command` (an out-of-memory kill, a lost node: no
    chance to clean up, unlike a pod deleted, which gets SIGTERM first)."""
    for pid in pod_processes(pod_uid):
        if _command(pid)[: len(command)] == command:
            os.kill(pid, signal.SIGKILL)
            return pid
    raise LookupError(f"no {' '.join(command)} in pod {pod_uid}")


def kill_server(pod_uid: str) -> int:
    pid = postmaster(pod_uid)
    os.kill(pid, signal.SIGKILL)
    return pid


def freezer(pod_uid: str) -> Path:
    """The cgroup v1 freezer of the pod's PostgreSQL container."""
    path = _cgroups(postmaster(pod_uid)).get("freezer")
    if not path:
        raise LookupError("this node has no cgroup v1 freezer")
    return Path("/sys/fs/cgroup/freezer") / path.lstrip("/") / "freezer.state"


def pod_freezer(pod_uid: str) -> Path:
    """The cgroup v1 freezer of the whole pod: every container, its sidecars too."""
    return freezer(pod_uid).parent.parent / "freezer.state"


def freeze(state_file: Path) -> None:
    """Every process of the container stops where it is, as on a hung machine."""
    state_file.write_text("FROZEN")


def thaw(state_file: Path) -> None:
    if state_file.exists():
        state_file.write_text("THAWED")


def block_loopback_port(pod_uid: str, port: int) -> None:
    """Inside the pod's network namespace, connections over loopback to `port` go unanswered
    (its exec probes that connect to 127.0.0.1 time out); its pod IP still answers. The rule
    goes with the namespace when the pod does."""
    # Entered through the sandbox's pause process, which lives as long as the namespace: any
    # other may be an exec probe's, ended before nsenter opens /proc/PID/ns/net.
    pid = next(pid for pid in pod_processes(pod_uid) if _command(pid)[:1] == ["/pause"])
    rule = ["-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"]
    subprocess.run(["nsenter", "-t", str(pid), "-n", "iptables", "-w", "-I", "INPUT", *rule], check=True)


def network_policies_enforced() -> bool:
    """Whether the node enforces NetworkPolicies: kube-router's chains are in place (up.sh)."""
    found = subprocess.run(["iptables", "-w", "-n", "-L", "KUBE-NWPLCY-DEFAULT"], capture_output=True)
    return found.returncode == 0


# The operators of a partition test run with this group id: a partition drops their packets only
# (the host's iptables match the sending process's group), so the primary's clients, its
# kubelet and its standbys still reach it, as when a network fault isolates the operator.
PARTITIONED_GROUP = 61234
PARTITION_COMMENT = "statefleet-test-partition"
# In the raw table: kube-router (the NetworkPolicy enforcer) rewrites the filter table whole on
# each of its syncs, and a rule inserted there between its save and its restore would be lost.
PARTITION_TABLE = "raw"


def _partition_rule(pod_ip: str) -> list[str]:
    return [
        "OUTPUT",
        "-d",
        pod_ip,
        "-m",
        "owner",
        "--gid-owner",
        str(PARTITIONED_GROUP),
        "-m",
        "comment",
        "--comment",
        PARTITION_COMMENT,
        "-j",
        "DROP",
    ]


def cut_off(pod_ip: str) -> None:
    """Every packet an operator of PARTITIONED_GROUP sends to `pod_ip` is dropped."""
    subprocess.run(["iptables", "-w", "-t", PARTITION_TABLE, "-I", *_partition_rule(pod_ip)], check=True)


def heal_partitions() -> None:
    """Every rule `cut_off` inserted goes (those a killed run left too, and those of a run from
    before they moved to the raw table)."""
    for table in (PARTITION_TABLE, "filter"):
        listed = subprocess.run(
            ["iptables", "-w", "-t", table, "-S", "OUTPUT"], check=True, capture_output=True, text=True
        )
        for line in listed.stdout.splitlines():
            if PARTITION_COMMENT in line and line.startswith("-A "):
                subprocess.run(["iptables", "-w", "-t", table, "-D", *line.split()[1:]], check=True)
