"""Benchmark: what client-side encryption (`spec.s3.encryption`) costs a backup and a restore.

On the test bed, one PostgreSQL 17 instance of `--size-mb` and two BackupStorages on the same
S3 bucket, one sealing (AES-256-GCM, each piece bound to its key, the manifest signed) and one
not. Each round takes a physical and a logical backup to each, taking turns, then restores
the physical backups of the first round into new instances. Times are the Jobs' own (their
work, not pod start-up); the ratio is sealed over plain (1.00: no cost).

    .venv/bin/python -m e2e.bench.sealing [--size-mb 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from lightkube import Client
from lightkube.resources.core_v1 import Pod

from e2e.bench.backup import MiB, bench_namespace, job_result, load
from e2e.test_backup import Backup, Restore, apply, sql, storage, wait_phase
from e2e.test_postgres import create, wait_ready


def backup(kube: Client, namespace: str, name: str, store: str, method: str) -> float:
    spec = {"service": {"kind": "Postgres", "name": "demo"}, "storage": store, "method": method}
    apply(kube, Backup, namespace, name, spec)
    wait_phase(kube, Backup, namespace, name, "Completed", timeout=1800)
    return float(job_result(kube, namespace, f"{name}-backup")["seconds"])


def physical_restore(kube: Client, namespace: str, backup_name: str, target: str) -> float:
    spec = {"backup": backup_name, "target": {"kind": "Postgres", "name": target}}
    apply(kube, Restore, namespace, f"r-{target}", spec)
    wait_phase(kube, Restore, namespace, f"r-{target}", "Completed", timeout=1800)
    statuses = kube.get(Pod, f"{target}-0", namespace=namespace).to_dict()["status"]["initContainerStatuses"]
    init = next(c for c in statuses if c["name"] == "restore")
    return float(json.loads(init["state"]["terminated"]["message"])["result"]["seconds"])


def scenario(kube: Client, namespace: str, bucket: str, size_mb: int, repeats: int) -> None:
    storage(kube, namespace, "plain", bucket)
    storage(kube, namespace, "sealed", bucket, sealed_with="k1")
    spec = {"version": "17", "storage": {"size": "20Gi"}, "parameters": {"max_wal_size": "4GB"}}
    create(kube, namespace, "demo", spec)
    wait_ready(kube, namespace, "demo", 1)
    size = load(kube, namespace, size_mb)
    sql(kube, namespace, "demo", "CHECKPOINT")
    print(f"database: {size / MiB:.0f} MiB (all databases), PostgreSQL 17, one instance")
    seconds: dict[tuple[str, str], list[float]] = {}
    for run in range(repeats):
        for method in ("physical", "logical"):
            # Taking turns, the first side changing every round: neither is always first.
            sides = ("plain", "sealed") if run % 2 == 0 else ("sealed", "plain")
            for store in sides:
                took = backup(kube, namespace, f"{store}-{method}-{run}", store, method)
                seconds.setdefault((method, store), []).append(took)
    for store in ("plain", "sealed"):
        took = physical_restore(kube, namespace, f"{store}-physical-0", f"copy-{store}")
        seconds[("restore", store)] = [took]
    print("seconds (each run; median), and sealed over plain:")
    for what in ("physical", "logical", "restore"):
        plain, sealed = seconds[(what, "plain")], seconds[(what, "sealed")]
        label = "physical restore" if what == "restore" else f"{what} backup"
        ratio = statistics.median(sealed) / statistics.median(plain)
        print(
            f"  {label:<17} plain {', '.join(f'{s:.1f}' for s in plain)} ({statistics.median(plain):.1f})"
            f"   sealed {', '.join(f'{s:.1f}' for s in sealed)} ({statistics.median(sealed):.1f})"
            f"   ratio {ratio:.2f}   {size / MiB / statistics.median(sealed):.0f} MiB/s sealed"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of backups, each side once")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    sys.stdout.reconfigure(line_buffering=True)
    with bench_namespace("bench-sealing") as (kube, namespace, bucket):
        scenario(kube, namespace, bucket, args.size_mb, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
