"""Benchmark: how long writes stop, and what is lost, when a Postgres primary fails.

A writer commits numbered rows through `<name>-rw` (reconnecting as a client would) while,
run after run, the primary's server is killed (`kill -9` on the node) or its pod deleted
(no grace period), then a switchover is asked for. For each, the write pause: from the
kill (or the request) to the first commit acknowledged by the new primary (a killed server's
backends may still acknowledge a commit or two in their last moment: those count as lost if
the new primary lacks them, never as resumed writes); and the acknowledged commits missing
from the table once the cluster is whole again, each counted once. Asynchronous, then
synchronous replication (`synchronous: {number: 1}`).

With `--operator-loss`: the operator as the chart installs it (2 replicas, leader election),
and the primary's server killed alone or together with the leading operator, taking turns:
how much longer writes stop when the operator is lost at the same moment.

    .venv/bin/python -m e2e.bench.failover [--runs 10] [--replication asynchronous] [--operator-loss]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from e2e import node
from e2e.kube import client, delete_namespace, wait_until
from e2e.namespaces import save_evidence
from e2e.operator_process import OperatorProcess
from e2e.test_chart import helm, holder_pod, install, operator_pods, ready_replicas
from e2e.test_postgres import Postgres, connect, create, patch_spec
from e2e.test_postgres_ha import wait_whole
from e2e.writer import Writer


def healthy(kube: Client, namespace: str) -> None:
    wait_whole(kube, namespace, timeout=300)


def primary_pod(kube: Client, namespace: str) -> Any:
    name = kube.get(Postgres, "demo", namespace=namespace).to_dict()["status"]["currentPrimary"]
    return kube.get(Pod, name, namespace=namespace)


def measure(
    kube: Client, namespace: str, writer: Writer, runs: int, disrupt: Callable[[], None]
) -> tuple[list[float], int, int, int]:
    """Write pauses (from the disruption to the first commit the new primary acknowledged),
    acknowledged commits lost, how many of those the dying server acknowledged after the
    disruption, and how many runs moved the primary."""
    pauses, lost, late, moved = [], 0, 0, 0
    counted = writer.lost  # lost in an earlier scenario on the same writer
    for _ in range(runs):
        healthy(kube, namespace)
        time.sleep(2)  # the writer is in its stride
        before = primary_pod(kube, namespace).metadata.name
        old_server = writer.last_server()
        disrupt()
        moment = time.monotonic()  # the server is dead, the pod deleted, or the request made
        try:
            resumed = wait_until(
                "a commit by the new primary",
                lambda moment=moment, old=old_server: writer.first_after(moment, not_by=old),
                120,
                interval=0.1,
            )
        except TimeoutError:
            last = writer.acknowledged[-1] if writer.acknowledged else None
            print(
                f"  no commit by a new primary: old {old_server}, last acknowledged {last} by "
                f"{writer.last_server()} at {time.monotonic() - (last[1] if last else 0):.0f} s ago"
            )
            raise
        pauses.append(resumed - moment)
        healthy(kube, namespace)
        moved += primary_pod(kube, namespace).metadata.name != before
        acknowledged = {value for value, at in writer.acknowledged if at < resumed}
        present = {row[0] for row in rows(kube, namespace)}
        missing = acknowledged - present - counted  # the writer runs on: count each loss once
        counted |= missing
        lost += len(missing)
        late += len({value for value, at in writer.acknowledged if value in missing and at >= moment})
    return pauses, lost, late, moved


def rows(kube: Client, namespace: str) -> list[tuple[int]]:
    with connect(kube, namespace, "demo-rw", "demo-superuser") as conn:
        return conn.execute("select value from ticks").fetchall()


def report(label: str, pauses: list[float], lost: int, late: int, moved: int) -> None:
    print(
        f"  {label}: write pause median {statistics.median(pauses):.1f} s, max {max(pauses):.1f} s "
        f"over {len(pauses)} runs ({moved} moved the primary, {len(pauses) - moved} promoted it again "
        f"in place); acknowledged commits lost: {lost} ({late} of them acknowledged by the old "
        "primary after the disruption)"
    )


def scenario(kube: Client, namespace: str, runs: int, spec: dict[str, Any]) -> None:
    create(kube, namespace, "demo", {"version": "15", "instances": 3, "storage": {"size": "1Gi"}, **spec})
    healthy(kube, namespace)
    with connect(kube, namespace, "demo-rw", "demo-superuser") as conn:
        conn.execute("create table ticks(value bigint primary key)")
    writer = Writer(kube, namespace)
    writer.start()
    try:

        def kill_server() -> None:
            node.kill_server(primary_pod(kube, namespace).metadata.uid)

        def delete_pod() -> None:
            kube.delete(Pod, primary_pod(kube, namespace).metadata.name, namespace=namespace, grace_period=0)

        requests = iter(range(1, 10_000))

        def switchover() -> None:
            current = primary_pod(kube, namespace).metadata.name
            target = next(f"demo-{i}" for i in range(3) if f"demo-{i}" != current)
            patch_spec(
                kube, namespace, "demo", {"switchover": {"to": target, "requestedAt": str(next(requests))}}
            )

        report("kill -9 of the primary's server", *measure(kube, namespace, writer, runs, kill_server))
        report("primary pod deleted (no grace)", *measure(kube, namespace, writer, runs, delete_pod))
        report("switchover", *measure(kube, namespace, writer, runs, switchover))
    finally:
        writer.stop()


def operator_loss(kube: Client, runs: int) -> None:
    """The operator installed by the chart (2 replicas, one leading on its Lease) and a
    3-instance Postgres: `kill -9` of the primary's server alone, then of the server and the
    leading operator's process at the same moment, taking turns."""
    namespace = f"bench-oploss-{uuid.uuid4().hex[:5]}"  # not bench-failover-*: the chart's operator serves it
    kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
    try:
        install(namespace)
        create(kube, namespace, "demo", {"version": "15", "instances": 3, "storage": {"size": "1Gi"}})
        healthy(kube, namespace)
        with connect(kube, namespace, "demo-rw", "demo-superuser") as conn:
            conn.execute("create table ticks(value bigint primary key)")
        writer = Writer(kube, namespace)
        writer.start()

        # A killed operator comes back after the kubelet's crash back-off, which doubles with
        # each kill of the same pod up to 5 min: every disruption waits for both, so that one
        # stands by to take over.
        def both_ready() -> None:
            wait_until("both operators ready", lambda: ready_replicas(kube, namespace) == 2, 330)

        def kill_server() -> None:
            both_ready()
            node.kill_server(primary_pod(kube, namespace).metadata.uid)

        def kill_both() -> None:
            both_ready()
            leader = operator_pods(kube, namespace)[holder_pod(kube, namespace) or ""].metadata.uid
            server = primary_pod(kube, namespace).metadata.uid
            node.kill_command(leader, ["python3", "-m", "statefleet"])
            node.kill_server(server)

        results: dict[str, list[Any]] = {"alone": [[], 0, 0, 0], "with the leading operator": [[], 0, 0, 0]}
        try:
            for _ in range(runs):
                for label, disrupt in (("alone", kill_server), ("with the leading operator", kill_both)):
                    pauses, lost, late, moved = measure(kube, namespace, writer, 1, disrupt)
                    print(f"    kill -9 of the primary's server {label}: writes back after {pauses[0]:.1f} s")
                    total = results[label]
                    results[label] = [total[0] + pauses, total[1] + lost, total[2] + late, total[3] + moved]
        except BaseException:
            save_evidence(namespace)  # the namespace goes below: keep what shows why
            raise
        finally:
            writer.stop()
        for label, (pauses, lost, late, moved) in results.items():
            report(f"kill -9 of the primary's server {label}", pauses, lost, late, moved)
        alone = statistics.median(results["alone"][0])
        both = statistics.median(results["with the leading operator"][0])
        print(f"  with the operator killed too: {both / alone:.2f}x the pause (target: median under 15 s)")
    finally:
        helm("uninstall", namespace, "--namespace", namespace, "--wait")
        delete_namespace(kube, namespace, wait=300)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--replication", choices=["asynchronous", "synchronous", "both"], default="both")
    parser.add_argument(
        "--operator-loss",
        action="store_true",
        help="instead: the chart's operator, its leader killed with the primary (issue 23 item 2)",
    )
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    kube = client()
    if args.operator_loss:
        print("3 instances, asynchronous replication, the chart's operator (2 replicas, leader election):")
        operator_loss(kube, args.runs)
        return 0
    operator = OperatorProcess.start(namespaces="bench-failover-*", log_name="operator-bench-failover.log")
    try:
        for label, spec in (
            ("asynchronous", {}),
            ("synchronous (number: 1)", {"synchronous": {"number": 1}}),
        ):
            if args.replication not in ("both", label.split()[0]):
                continue
            namespace = f"bench-failover-{uuid.uuid4().hex[:5]}"
            kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
            print(f"3 instances, {label} replication, a writer committing one row per transaction:")
            try:
                scenario(kube, namespace, args.runs, spec)
            finally:
                delete_namespace(kube, namespace, wait=300)
    finally:
        operator.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
