"""Benchmark: backup and restore throughput against the plain pipelines, and the backup Job's
peak memory at two database sizes.

On the test bed, with a real PostgreSQL 17 and the test bed's S3 server. Each side runs as a
Job from the same image with the same resources, on the same node:
  logical backup    ours: a `Backup` (pg_dump -Fc, streamed, sha256, manifest)
                    plain: pg_dump -Fc | boto3 upload_fileobj from stdin (what `aws s3 cp -` does)
  logical restore   ours: a `Restore` into a new instance (every checksum read first, then
                    pg_restore from the stream); plain: boto3 download | pg_restore
  physical backup   ours: a `Backup` (pg_basebackup -Ft -X fetch, zstd by the server, to S3 as
                    16 MiB pieces)
                    plain: pg_basebackup -Ft -X fetch to the pod's local disk, uncompressed;
                    and pg_basebackup -Ft -D - | boto3 upload_fileobj (to S3, uncompressed)
  physical restore  ours: a `Restore`: the new instance's init container reads the object
                    once (each piece checked as it streams, extracted aside); plain: boto3
                    download | zstd -dc | tar -x to local disk (the same object: ours is
                    zstd-compressed by the server)
Times are the tools' own (the Jobs time their work, not pod start-up). Throughput is the
database size divided by the time; the ratio is ours over plain (1.0: as fast).

    .venv/bin/python -m e2e.bench.backup [--size-mb 1024] [--small-mb 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace, Pod

from e2e.kube import client, delete_namespace, operator_image, wait_until
from e2e.operator_process import OperatorProcess
from e2e.s3 import s3_api, s3_settings
from e2e.test_backup import Backup, Restore, apply, sql, storage, wait_phase
from e2e.test_postgres import create, wait_ready
from framework.kube.jobs import termination

MiB = 1024 * 1024
UPLOAD = (
    "import boto3, os, sys; boto3.client('s3', endpoint_url=os.environ['S3_ENDPOINT'])"
    ".upload_fileobj(sys.stdin.buffer, os.environ['BUCKET'], sys.argv[1])"
)
DOWNLOAD = (  # each key given, in order, to stdout
    "import boto3, os, sys; s3 = boto3.client('s3', endpoint_url=os.environ['S3_ENDPOINT'])\n"
    "for key in sys.argv[1:]: s3.download_fileobj(os.environ['BUCKET'], key, sys.stdout.buffer)"
)


def load(kube: Client, namespace: str, size_mb: int) -> int:
    """Rows into bench.t until the database holds `size_mb`; returns its size in bytes."""
    if not sql(kube, namespace, "demo", "SELECT count(*) FROM pg_database WHERE datname = 'bench'"):
        sql(kube, namespace, "demo", "CREATE DATABASE bench")
        sql(kube, namespace, "demo", "CREATE TABLE t (id bigint, payload text)", database="bench")
    size = 0
    while size < size_mb * MiB:
        sql(
            kube, namespace, "demo",
            "INSERT INTO t SELECT g, md5(g::text) || md5((g * 7)::text) || repeat(md5((g * 13)::text), 2)"
            " FROM generate_series(coalesce((SELECT max(id) FROM t), 0) + 1,"
            " coalesce((SELECT max(id) FROM t), 0) + 500000) g",
            database="bench",
        )  # fmt: skip
        size = sql(kube, namespace, "demo", "SELECT pg_database_size('bench')")
    return int(sql(kube, namespace, "demo", "SELECT sum(pg_database_size(datname)) FROM pg_database"))


def job_result(kube: Client, namespace: str, job: str, container: str | None = None) -> dict[str, Any]:
    """The JSON result a Job's pod left in its termination message."""
    (pod,) = kube.list(Pod, namespace=namespace, labels={"job-name": job})
    report, how = termination(pod.to_dict())
    if not report or "result" not in report:
        raise AssertionError(f"{job}: {how}: {report}")
    return report["result"]


def plain_job(kube: Client, namespace: str, name: str, script: str, bucket: str, env: list[dict]) -> float:
    """A Job running `script` with bash's own timing; returns its seconds."""
    settings = s3_settings()
    repository, tag = operator_image()
    credentials = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": key}}}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsUser": 999, "runAsGroup": 999},
                    "containers": [
                        {
                            "name": "plain",
                            "image": f"{repository}:{tag}",
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["bash", "-c", f"set -o pipefail; TIMEFORMAT=%R; time ( {script} )"],
                            "env": [
                                {"name": "S3_ENDPOINT", "value": settings["S3_ENDPOINT"]},
                                {"name": "BUCKET", "value": bucket},
                                {"name": "AWS_DEFAULT_REGION", "value": "us-east-1"},
                                *credentials,
                                *env,
                            ],
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                        }
                    ],
                    "volumes": [{"name": "scratch", "emptyDir": {}}],
                }
            },
        },
    }
    kube.create(Job.from_dict(body))

    def ended() -> Any:
        status = kube.get(Job, name, namespace=namespace).status
        if status and status.failed:
            raise AssertionError(f"plain job {name} failed: {list(kube.log(pod_of(kube, namespace, name)))}")
        return status and status.succeeded

    wait_until(f"plain job {name}", ended, timeout=1800, interval=1)
    lines = [line.strip() for line in kube.log(pod_of(kube, namespace, name), namespace=namespace)]
    return float([line for line in lines if line][-1])


def pod_of(kube: Client, namespace: str, job: str) -> str:
    (pod,) = kube.list(Pod, namespace=namespace, labels={"job-name": job})
    return pod.metadata.name


def postgres_env(instance: str) -> list[dict]:
    def secret(variable: str, name: str, key: str) -> dict:
        return {"name": variable, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}

    return [
        {"name": "PGHOST", "value": f"{instance}-rw"},
        {"name": "PGSSLMODE", "value": "require"},
        secret("PGUSER", f"{instance}-superuser", "username"),
        secret("PGPASSWORD", f"{instance}-superuser", "password"),
        secret("REPLICATION_USER", f"{instance}-replication", "username"),
        secret("REPLICATION_PASSWORD", f"{instance}-replication", "password"),
    ]


def backup_once(kube: Client, namespace: str, name: str, method: str) -> dict[str, Any]:
    apply(
        kube,
        Backup,
        namespace,
        name,
        {"service": {"kind": "Postgres", "name": "demo"}, "storage": "s3", "method": method},
    )
    wait_phase(kube, Backup, namespace, name, "Completed", timeout=1800)
    return job_result(kube, namespace, f"{name}-backup")


def row(label: str, size: int, ours: float, plain: float) -> None:
    print(
        f"  {label:<17} ours {ours:7.1f} s ({size / MiB / ours:6.1f} MiB/s)   plain {plain:7.1f} s "
        f"({size / MiB / plain:6.1f} MiB/s)   ratio {plain / ours:4.2f}"
    )


def scenario(kube: Client, namespace: str, bucket: str, size_mb: int, small_mb: int, repeats: int) -> None:
    storage(kube, namespace, "s3", bucket)
    spec = {"version": "17", "storage": {"size": "20Gi"}, "parameters": {"max_wal_size": "4GB"}}
    create(kube, namespace, "demo", spec)
    wait_ready(kube, namespace, "demo", 1)

    small = load(kube, namespace, small_mb)
    small_peak = backup_once(kube, namespace, "small", "logical")["peakMemoryBytes"]
    size = load(kube, namespace, size_mb)
    sql(kube, namespace, "demo", "CHECKPOINT")
    print(f"database: {size / MiB:.0f} MiB (all databases), PostgreSQL 17, one instance")

    logical = backup_once(kube, namespace, "logical", "logical")
    plain_logical = plain_job(
        kube, namespace, "plain-dump", f'pg_dump -Fc --dbname bench | python3 -c "{UPLOAD}" plain/bench.dump',
        bucket, postgres_env("demo"),
    )  # fmt: skip
    # The physical sides take seconds, as long as the machine's hiccups: each is run `repeats`
    # times, taking turns, and compared by their medians.
    physical_runs: list[dict[str, Any]] = []
    plain_physical_runs: list[float] = []
    for run in range(repeats):
        name = "physical" if run == 0 else f"physical-{run}"
        physical_runs.append(backup_once(kube, namespace, name, "physical"))
        plain_physical_runs.append(plain_job(
            kube, namespace, f"plain-basebackup-{run}",
            "PGUSER=$REPLICATION_USER PGPASSWORD=$REPLICATION_PASSWORD"
            " pg_basebackup -D /scratch/base -Ft -X fetch -c fast",
            bucket, postgres_env("demo"),
        ))  # fmt: skip
    physical_seconds = statistics.median(r["seconds"] for r in physical_runs)
    physical = physical_runs[0]
    plain_physical = statistics.median(plain_physical_runs)
    plain_physical_s3 = plain_job(
        kube, namespace, "plain-basebackup-s3",
        "PGUSER=$REPLICATION_USER PGPASSWORD=$REPLICATION_PASSWORD"
        f' pg_basebackup -D - -Ft -X fetch -c fast | python3 -c "{UPLOAD}" plain/base.tar',
        bucket, postgres_env("demo"),
    )  # fmt: skip

    # Restores: ours into new instances; plain into an empty instance and to local disk.
    apply(
        kube,
        Restore,
        namespace,
        "r-logical",
        {"backup": "logical", "target": {"kind": "Postgres", "name": "copy-l"}},
    )
    wait_phase(kube, Restore, namespace, "r-logical", "Completed", timeout=1800)
    ours_logical_restore = job_result(kube, namespace, "r-logical-restore")
    create(kube, namespace, "empty", {"version": "17", "storage": {"size": "20Gi"}})
    wait_ready(kube, namespace, "empty", 1)
    plain_logical_restore = plain_job(
        kube, namespace, "plain-restore",
        f'python3 -c "{DOWNLOAD}" plain/bench.dump | pg_restore --create --exit-on-error --dbname postgres',
        bucket, postgres_env("empty"),
    )  # fmt: skip
    apply(
        kube,
        Restore,
        namespace,
        "r-physical",
        {"backup": "physical", "target": {"kind": "Postgres", "name": "copy-p"}},
    )
    wait_phase(kube, Restore, namespace, "r-physical", "Completed", timeout=1800)
    init = next(
        c for c in kube.get(Pod, "copy-p-0", namespace=namespace).to_dict()["status"]["initContainerStatuses"]
        if c["name"] == "restore"
    )  # fmt: skip
    ours_physical_restore = json.loads(init["state"]["terminated"]["message"])["result"]
    manifest_key = status_of(kube, namespace, "physical")["manifest"]
    manifest = json.loads(s3_api(s3_settings()).get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    base_keys = " ".join(piece["key"] for piece in manifest["objects"][0]["pieces"])
    plain_physical_restore = plain_job(
        kube, namespace, "plain-untar",
        f'mkdir /scratch/data && python3 -c "{DOWNLOAD}" {base_keys} | zstd -dc | tar -x -C /scratch/data',
        bucket, [],
    )  # fmt: skip

    print("throughput (database size / time; ratio = ours / plain, 1.0 = as fast):")
    row("logical backup", size, logical["seconds"], plain_logical)
    row("logical restore", size, ours_logical_restore["seconds"], plain_logical_restore)
    row("physical backup", size, physical_seconds, plain_physical)
    print(
        f"  {'':<17} each run: ours {', '.join(str(r['seconds']) for r in physical_runs)} s;"
        f" plain {', '.join(str(s) for s in plain_physical_runs)} s (medians above)"
    )
    row("  plain to S3", size, physical_seconds, plain_physical_s3)
    row("physical restore", size, ours_physical_restore["seconds"], plain_physical_restore)
    print("peak resident memory of the logical backup Job's own process (pg_dump runs beside it):")
    for label, total, peak in (("small", small, small_peak), ("large", size, logical["peakMemoryBytes"])):
        print(f"  {label}: database {total / MiB:6.0f} MiB -> job {peak['job'] / MiB:5.1f} MiB")
    print(
        f"  physical backup job {physical['peakMemoryBytes']['job'] / MiB:.1f} MiB; bytes stored: logical "
        f"{logical['bytes'] / MiB:.0f} MiB, physical {physical['bytes'] / MiB:.0f} MiB"
    )


def status_of(kube: Client, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(Backup, name, namespace=namespace).to_dict()["status"]


@contextmanager
def bench_namespace(prefix: str) -> Iterator[tuple[Client, str, str]]:
    """An operator watching `<prefix>-*`, a namespace of its own and a bucket; all gone after."""
    kube = client()
    operator = OperatorProcess.start(namespaces=f"{prefix}-*", log_name=f"operator-{prefix}.log")
    namespace = f"{prefix}-{uuid.uuid4().hex[:5]}"
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    api = s3_api(s3_settings())
    api.create_bucket(Bucket=bucket)
    kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
    try:
        yield kube, namespace, bucket
    finally:
        delete_namespace(kube, namespace, wait=300)
        for page in api.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                api.delete_object(Bucket=bucket, Key=item["Key"])
        api.delete_bucket(Bucket=bucket)
        operator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--small-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each physical backup side")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    sys.stdout.reconfigure(line_buffering=True)
    with bench_namespace("bench-backup") as (kube, namespace, bucket):
        scenario(kube, namespace, bucket, args.size_mb, args.small_mb, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
