"""Benchmark: how fast each archiver stores WAL, ours against barman-cloud-wal-archive and
pgBackRest.

The highest WAL rate an archiver keeps up with is the rate at which it drains a backlog: a
PostgreSQL server (this machine's, the Debian package) archives nothing while pgbench writes
`--wal-mb` of WAL (`archive_command` empty: the server keeps every file, as documented); then
the archiver under test is started and the clock runs until the server has no WAL file left
to archive. All store into the test bed's S3 server, zstd level 3, and the objects are
counted afterwards (every file, or the run fails). The tools take turns, `--repeats` times
each, each on a server of its own.

  ours    the `wal-archiver` sidecar of our pods (`python -m services.postgres.wal_archiver`,
          4 uploads at once) with the `archive-wal.sh` our ConfigMap renders
  barman  `barman-cloud-wal-archive --zstd` as the archive_command (barman's documented use;
          one process per file), installed from PyPI into a venv of the cache
  pgbackrest  `pgbackrest archive-push` (Debian's package) in its asynchronous mode with 4
          processes, zstd level 3, through the S3 server's TLS listener

Two kinds of WAL: `init`, pgbench's table loading (long runs of equal bytes: compresses very
well), and `tpcb`, pgbench's transactions on 4 clients (full-page images of random pages).
Also our archiver's peak memory (VmHWM), which does not depend on the backlog.

    .venv/bin/python -m e2e.bench.wal_archive [--wal-mb 1024] [--repeats 3] [--workload init|tpcb]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from e2e.kube import REPO
from e2e.s3 import new_bucket, s3_api, s3_settings
from framework.catalog import Catalog
from framework.instance_plan import plan
from framework.plugin import Observed
from services.postgres import PLUGIN

MiB = 2**20
SEGMENT = 16 * MiB
# Where the server's user can run it (root's home is closed to it), on Debian's own Python.
BARMAN = Path("/opt/statefleet-bench/barman-3.19.1")
BARMAN_PACKAGES = ["barman[cloud]==3.19.1", "zstandard==0.25.0"]
RUN_AS = "postgres"  # the server refuses root


def postgres_bin() -> Path:
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name)
    )
    if not found:
        sys.exit("no PostgreSQL server here: apt-get install postgresql (make bench does)")
    return found[-1].parent


def barman_bin() -> Path:
    if not (BARMAN / "bin" / "barman-cloud-wal-archive").exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(BARMAN)], check=True)
        subprocess.run([str(BARMAN / "bin" / "pip"), "install", "-q", *BARMAN_PACKAGES], check=True)
    return BARMAN / "bin"


def rendered_archive_script(spool: Path) -> str:
    """archive-wal.sh as our ConfigMap renders it, with the spool moved to `spool`."""
    catalog = Catalog.from_yaml('postgres: {default: "17", versions: {"17": {image: pg:17}}}')
    storage = {"spec": {"s3": {"bucket": "b", "credentialsSecret": "k"}}}
    spec = {"instances": 1, "storage": {"size": "1Gi"}, "walArchive": {"storage": "s3"}}
    observed = Observed(
        name="demo", namespace="bench", generation=1, spec=spec, status={}, references={"walStorage": storage}
    )
    config = next(c for c in plan(PLUGIN, observed, catalog, "uid").children if c["kind"] == "ConfigMap")
    return config["data"]["archive-wal.sh"].replace("/var/run/statefleet-wal", str(spool))


def as_postgres(
    *command: str, env: dict[str, str] | None = None, **kwargs: Any
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", RUN_AS, "--", "env", *(f"{k}={v}" for k, v in (env or {}).items()), *command],
        check=True,
        capture_output=True,
        text=True,
        **kwargs,
    )


def stop_server(data: Path) -> None:
    """An immediate stop of the server on `data`, if one runs there."""
    pg_ctl = str(postgres_bin() / "pg_ctl")
    subprocess.run(
        ["runuser", "-u", RUN_AS, "--", pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
        capture_output=True,
        check=False,
    )


def keys() -> dict[str, str]:
    """The test bed's S3 keys, as the tools read them from their environment."""
    settings = s3_settings()
    return {k: settings[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}


def owned(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    shutil.chown(path, RUN_AS, RUN_AS)
    return path


def tls_settings() -> dict[str, str]:
    lines = (REPO / ".testbed" / "s3-tls.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


class PgBackRest:
    """pgBackRest (Debian's package) with a repository in the bucket, through the S3 server's
    TLS listener (its S3 client speaks only HTTPS; it checks a certificate's DNS names only,
    and the test bed's has an address: not checked); zstd level 3 (its default is gz).
    `parallel`: its asynchronous archiving with that many processes (`archive-async`,
    `process-max`: its mode for a high WAL rate, WAL fetched ahead on restore); else one
    process, synchronous, as it is by default."""

    def __init__(
        self,
        home: Path,
        bucket: str,
        data: Path,
        socket: Path,
        keys: dict[str, str],
        parallel: int = 0,
        repository: str = "/pgbackrest",
    ) -> None:
        tls = tls_settings()
        host, port = tls["S3_TLS_ENDPOINT"].removeprefix("https://").rsplit(":", 1)
        self.config = home / "pgbackrest.conf"
        settings = {
            "repo1-type": "s3",
            "repo1-path": repository,
            "repo1-s3-bucket": bucket,
            "repo1-s3-endpoint": host,
            "repo1-storage-port": port,
            "repo1-storage-verify-tls": "n",
            "repo1-s3-region": "us-east-1",
            "repo1-s3-uri-style": "path",
            "repo1-s3-key": keys["AWS_ACCESS_KEY_ID"],
            "repo1-s3-key-secret": keys["AWS_SECRET_ACCESS_KEY"],
            "repo1-retention-full": "100",
            "compress-type": "zst",
            "compress-level": "3",
            "lock-path": str(home / "lock"),
            "log-path": str(home / "log"),
            "spool-path": str(home / "spool"),
            "log-level-console": "warn",
            "log-level-file": "off",
        }
        if parallel:
            settings |= {"archive-async": "y", "process-max": str(parallel)}
        stanza = {"pg1-path": str(data), "pg1-socket-path": str(socket), "pg1-user": "postgres"}
        lines = ["[global]", *(f"{k}={v}" for k, v in settings.items()), "[demo]"]
        lines += [f"{k}={v}" for k, v in stanza.items()]
        self.config.write_text("\n".join(lines) + "\n")
        shutil.chown(self.config, RUN_AS, RUN_AS)
        for folder in ("lock", "log", "spool"):
            owned(home / folder)

    def argv(self, command: str, *args: str) -> list[str]:
        return ["pgbackrest", f"--config={self.config}", "--stanza=demo", command, *args]

    def run(self, command: str, *args: str) -> str:
        return as_postgres(*self.argv(command, *args)).stdout

    def newest(self) -> dict[str, Any]:
        (stanza,) = json.loads(self.run("info", "--output=json"))
        return stanza["backup"][-1]


class Server:
    """A throwaway PostgreSQL server on a Unix socket, archive_mode on, archiving nothing yet."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root, self.bin, self.env = root, postgres_bin(), env
        self.data = root / "data"

    def pg_ctl(self, *args: str) -> None:
        log = str(self.root / "log")
        as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", log, "-w", *args, env=self.env)

    def pgbench(self, *args: str) -> None:
        as_postgres(str(self.bin / "pgbench"), "-h", str(self.root), "-U", "postgres", *args, "postgres")

    def start(self, workload: str) -> None:
        """A new server; with `tpcb`, its tables made before archiving is on (their WAL is not
        part of the backlog)."""
        as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--data-checksums")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = ''\nunix_socket_directories = '{self.root}'\n"
                "archive_command = ''\nmax_wal_size = 8GB\nshared_buffers = 256MB\n"
            )
        self.pg_ctl("start")
        if workload == "tpcb":
            self.pgbench("-i", "-q", "-s", "20")
            self.sql("checkpoint")
        self.sql("alter system set archive_mode = on")
        self.pg_ctl("restart", "-m", "fast")

    def stop(self) -> None:
        stop_server(self.data)

    def sql(self, text: str) -> str:
        return as_postgres(
            str(self.bin / "psql"), "-h", str(self.root), "-U", "postgres", "-Atqc", text
        ).stdout.strip()

    def write_backlog(self, wal_mb: int, workload: str) -> int:
        """Writes until `wal_mb` of WAL waits; returns the bytes waiting. `init`: pgbench's
        table loading (long runs of the same bytes: compresses well); `tpcb`: pgbench's
        transactions on 4 clients (full-page images of random pages: compresses less)."""
        while self.waiting() * SEGMENT < wal_mb * MiB:
            if workload == "init":
                self.pgbench("-i", "-q", "-s", str(max(wal_mb // 20, 1)))
            else:
                self.pgbench("-c", "4", "-j", "2", "-T", "10")
        self.sql("select pg_switch_wal()")
        time.sleep(0.5)
        return self.waiting() * SEGMENT

    def waiting(self) -> int:
        status = self.data / "pg_wal" / "archive_status"
        return sum(1 for entry in os.scandir(status) if entry.name.endswith(".ready"))


@contextlib.contextmanager
def server(env: dict[str, str], workload: str) -> Iterator[Server]:
    root = Path(tempfile.mkdtemp(prefix="bench-wal-"))
    shutil.chown(root, RUN_AS, RUN_AS)
    running = Server(root, env)
    try:
        running.start(workload)
        yield running
    finally:
        running.stop()
        shutil.rmtree(root, ignore_errors=True)


def drained(running: Server, timeout: float = 1800) -> float:
    started = time.monotonic()
    while running.waiting():
        if (running.root / "log").read_text().count("archive command failed") > 5:
            raise RuntimeError(
                "the archive command keeps failing:\n" + (running.root / "log").read_text()[-2000:]
            )
        if time.monotonic() - started > timeout:
            raise TimeoutError(
                f"{running.waiting()} WAL files still wait after {timeout:.0f} s:\n"
                + (running.root / "log").read_text()[-2000:]
            )
        time.sleep(0.05)
    return time.monotonic() - started


def ours(bucket: str, wal_mb: int, run: int, workload: str) -> dict[str, Any]:
    settings = s3_settings()
    with server({}, workload) as running:
        backlog = running.write_backlog(wal_mb, workload)
        spool, keys = running.root / "spool", running.root / "keys"
        for folder in (spool, spool / "archived", keys):  # archive-wal.sh removes the words
            folder.mkdir()
            shutil.chown(folder, RUN_AS, RUN_AS)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            (keys / name).write_text(settings[name])
        script = running.root / "archive-wal.sh"
        script.write_text(rendered_archive_script(spool))
        prefix = f"ours-{run}"
        archive = {
            "s3": {"endpoint": settings["S3_ENDPOINT"], "bucket": bucket, "credentialsSecret": "k"},
            "prefix": prefix,
            "parallel": 4,
        }
        env = {
            "PGDATA": str(running.data),
            "POD_NAME": "bench",
            "STATEFLEET_WAL_ARCHIVE": json.dumps(archive),
            "STATEFLEET_WAL_SPOOL": str(spool),
            "STATEFLEET_WAL_CREDENTIALS": str(keys),
            "PYTHONPATH": str(REPO),
        }
        started = time.monotonic()
        # As root (it reads the server's pg_wal; this interpreter lives where the server's user
        # cannot reach), with the environment the pod gives it.
        archiver = subprocess.Popen(
            [sys.executable, "-m", "services.postgres.wal_archiver"],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
        )
        try:
            running.sql(f"alter system set archive_command = 'bash {script} %f'")
            running.sql("select pg_reload_conf()")
            drained(running)
            seconds = time.monotonic() - started
            peak = peak_memory(archiver.pid)
        finally:
            archiver.terminate()
            archiver.wait(30)
        files, size = stored(bucket, prefix + "/", ".zst")
    return {
        "tool": "ours",
        "wal_bytes": backlog,
        "seconds": seconds,
        "stored": files,
        "size": size,
        "peak_mib": peak,
    }


def stored(bucket: str, prefix: str, marker: str) -> tuple[int, int]:
    """Objects under `prefix` whose key holds `marker`, and their bytes."""
    pages = s3_api(s3_settings()).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    sizes = [item["Size"] for page in pages for item in page.get("Contents", []) if marker in item["Key"]]
    return len(sizes), sum(sizes)


def peak_memory(pid: int) -> float:
    """A process's VmHWM in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmHWM"].split()[0]) / 1024


def barman(bucket: str, wal_mb: int, run: int, workload: str) -> dict[str, Any]:
    settings = s3_settings()
    tools = barman_bin()
    env = {
        "AWS_ACCESS_KEY_ID": settings["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": settings["AWS_SECRET_ACCESS_KEY"],
    }
    prefix = f"barman-{run}"
    with server(env, workload) as running:
        backlog = running.write_backlog(wal_mb, workload)
        command = (
            f"{tools}/barman-cloud-wal-archive --endpoint-url {settings['S3_ENDPOINT']} --zstd "
            f"--compression-level 3 s3://{bucket}/{prefix} demo %p"
        )
        started = time.monotonic()
        running.sql(f"alter system set archive_command = '{command}'")
        running.sql("select pg_reload_conf()")
        drained(running)
        seconds = time.monotonic() - started
        files, size = stored(bucket, prefix + "/", "/wals/")
    return {
        "tool": "barman",
        "wal_bytes": backlog,
        "seconds": seconds,
        "stored": files,
        "size": size,
        "peak_mib": None,
    }


def pgbackrest(bucket: str, wal_mb: int, run: int, workload: str) -> dict[str, Any]:
    """`pgbackrest archive-push` in its asynchronous mode, 4 processes (its mode for a high WAL
    rate), zstd level 3."""
    repository = f"pgbackrest-{run}"
    with server({}, workload) as running:
        tool = PgBackRest(
            owned(running.root / "pgbackrest"),
            bucket,
            running.data,
            running.root,
            keys(),
            4,
            f"/{repository}",
        )
        tool.run("stanza-create")
        backlog = running.write_backlog(wal_mb, workload)
        started = time.monotonic()
        running.sql(f"alter system set archive_command = '{' '.join(tool.argv('archive-push', '%p'))}'")
        running.sql("select pg_reload_conf()")
        drained(running)
        seconds = time.monotonic() - started
        files, size = stored(bucket, f"{repository}/archive/", ".zst")
    return {
        "tool": "pgbackrest",
        "wal_bytes": backlog,
        "seconds": seconds,
        "stored": files,
        "size": size,
        "peak_mib": None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wal-mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", choices=("init", "tpcb"), default="init")
    parser.add_argument("--tools", default="ours,barman,pgbackrest", help="which of them, comma-separated")
    args = parser.parse_args()
    barman_bin()
    tools = [tool for tool in (ours, barman, pgbackrest) if tool.__name__ in args.tools.split(",")]
    results: dict[str, list[dict[str, Any]]] = {tool.__name__: [] for tool in tools}
    with new_bucket() as bucket:
        for run in range(args.repeats):
            for tool in tools[run % len(tools) :] + tools[: run % len(tools)]:  # each first once
                result = tool(bucket, args.wal_mb, run, args.workload)
                files = result["wal_bytes"] // SEGMENT
                if result["stored"] < files:
                    sys.exit(f"{result['tool']} stored {result['stored']} of {files} WAL files")
                result["mb_s"] = result["wal_bytes"] / MiB / result["seconds"]
                results[result["tool"]].append(result)
                peak = f", archiver peak {result['peak_mib']:.0f} MiB" if result["peak_mib"] else ""
                print(
                    f"run {run + 1} {result['tool']:>6}: {files} WAL files "
                    f"({result['wal_bytes'] / MiB:.0f} MiB) "
                    f"in {result['seconds']:.1f} s = {result['mb_s']:.1f} MiB/s, stored "
                    f"{result['size'] / MiB:.0f} MiB{peak}",
                    flush=True,
                )
    rates = {tool: statistics.median(r["mb_s"] for r in runs) for tool, runs in results.items()}
    print(
        "median WAL archiving rate: " + ", ".join(f"{tool} {rate:.1f} MiB/s" for tool, rate in rates.items())
    )
    for peer in ("barman", "pgbackrest"):
        if peer in rates and "ours" in rates:
            print(f"ratio ours/{peer}: {rates['ours'] / rates[peer]:.2f}x")
    if results.get("ours"):
        print(f"our archiver's peak memory: {max(r['peak_mib'] for r in results['ours']):.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
