"""Continuous WAL archiving: keys, what uploads next, the condition, and what the templates make."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from framework.catalog import Catalog
from framework.instance_plan import plan
from framework.kube import conditions
from framework.plugin import Inspection, Observed
from framework.servers import NO_ANSWERS
from services.postgres import PLUGIN
from services.postgres.plugin import ARCHIVE_REPORTS_EVERY, ServerFacts, next_inspection
from services.postgres.wal_archive import (
    CONDITION,
    STANDBY_DELAY,
    ArchiverReport,
    archive_hold,
    archive_prefix,
    archiving_condition,
    due,
    is_wal_file,
    missing_segments,
    segment_name,
    timeline_switches,
    wal_key,
)

pytestmark = pytest.mark.unit

CATALOG = Catalog.from_yaml('postgres: {default: "17", versions: {"17": {image: pg:17}}}')
SPEC = {"instances": 2, "storage": {"size": "1Gi"}, "walArchive": {"storage": "s3"}}
STORAGE = {
    "spec": {
        "s3": {
            "endpoint": "http://s3.test:9000",
            "bucket": "backups",
            "prefix": "apps",
            "credentialsSecret": "s3-keys",
        }
    }
}


def test_wal_files_are_told_from_everything_else_in_pg_wal() -> None:
    for name in (
        "000000010000000000000003",
        "00000002.history",
        "000000010000000000000003.partial",
        "000000010000000000000003.00000028.backup",
    ):
        assert is_wal_file(name), name
    for name in ("archive_status", "xlogtemp.123", "00000002.history.tmp", "RECOVERYHISTORY", "../etc"):
        assert not is_wal_file(name), name


def test_keys_group_segments_by_timeline_and_log_under_the_instance() -> None:
    prefix = archive_prefix("apps/", "shop", "demo")
    assert prefix == "apps/shop/postgres/demo/wal"
    assert (
        wal_key(prefix, "0000000200000001000000A3")
        == "apps/shop/postgres/demo/wal/0000000200000001/0000000200000001000000A3.zst"
    )
    assert wal_key(prefix, "000000010000000000000003.partial").endswith(
        "/0000000100000000/000000010000000000000003.partial.zst"
    )
    assert wal_key(prefix, "00000002.history") == "apps/shop/postgres/demo/wal/00000002.history.zst"
    assert archive_prefix("", "shop", "demo") == "shop/postgres/demo/wal"


def test_history_first_then_oldest_within_the_free_slots() -> None:
    ready = {
        "000000020000000000000005": 100.0,
        "000000010000000000000004.partial": 100.0,
        "00000002.history": 100.0,
        "000000020000000000000006": 100.0,
        "xlogtemp.1": 100.0,
    }
    assert due(ready, 101.0, standby=False, busy=frozenset(), slots=3) == [
        "00000002.history",
        "000000010000000000000004.partial",
        "000000020000000000000005",
    ]
    busy = frozenset({"00000002.history"})
    assert due(ready, 101.0, standby=False, busy=busy, slots=1) == ["000000010000000000000004.partial"]
    assert due(ready, 101.0, standby=False, busy=busy, slots=0) == []


def test_a_standby_leaves_each_file_to_its_primary_for_a_while() -> None:
    ready = {"000000010000000000000007": 100.0, "000000010000000000000008": 110.0}
    assert due(ready, 101.0, standby=True, busy=frozenset(), slots=4) == []
    assert due(ready, 100.0 + STANDBY_DELAY, standby=True, busy=frozenset(), slots=4) == [
        "000000010000000000000007"
    ]


def test_the_condition_names_the_failure_and_how_much_waits() -> None:
    failing = ArchiverReport(
        failing=True,
        last_failed_wal="000000010000000000000009",
        last_error="AccessDenied: the S3 server refused the credentials: InvalidAccessKeyId",
        pending=3,
        pending_bytes=48 * 2**20,
    )
    condition = archiving_condition("demo-0", failing, primary_ready=True)
    assert (condition.status, condition.reason) == (False, "ArchiveFailing")
    assert "InvalidAccessKeyId" in condition.message
    assert "000000010000000000000009" in condition.message
    assert "3 WAL files (48 MiB) wait on the volume" in condition.message
    working = ArchiverReport(failing=False, last_archived_wal="00000001000000000000000A", pending=0)
    condition = archiving_condition("demo-0", working, primary_ready=True)
    assert (condition.status, condition.reason) == (True, "Archiving")
    assert "00000001000000000000000A" in condition.message
    unknown = archiving_condition("demo-0", None, primary_ready=True)
    assert (unknown.status, unknown.reason) == (None, "ArchiverNotAnswering")
    assert unknown.as_status() == "Unknown"
    assert archiving_condition("demo-0", None, primary_ready=False).reason == "PrimaryNotReady"


def observed(spec: dict[str, Any], **extra: Any) -> Observed:
    return Observed(
        name="demo", namespace="shop", generation=1, spec=spec, status=extra.pop("status", {}), **extra
    )


def pod_spec(planned: Any) -> dict[str, Any]:
    rollout = next(c for c in planned.children if c["kind"] == "StatefulsetRollout")
    return rollout["spec"]["statefulSet"]["template"]["spec"]


def config(planned: Any) -> dict[str, str]:
    return next(c for c in planned.children if c["kind"] == "ConfigMap")["data"]


def test_every_server_gets_the_archiver_beside_it_and_archive_mode_always() -> None:
    planned = plan(PLUGIN, observed(SPEC, references={"walStorage": STORAGE}), CATALOG, "uid-1")
    spec = pod_spec(planned)
    archiver = next(c for c in spec["initContainers"] if c["name"] == "wal-archiver")
    assert archiver["restartPolicy"] == "Always"  # a native sidecar: stops after the server
    env = {e["name"]: e.get("value") for e in archiver["env"]}
    settings = json.loads(env["STATEFLEET_WAL_ARCHIVE"])
    assert settings["prefix"] == "apps/shop/postgres/demo/wal"
    assert settings["s3"]["bucket"] == "backups"
    assert settings["parallel"] == 4
    assert "AWS_SECRET_ACCESS_KEY" not in env  # keys come as files, so new ones reach it
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["wal-credentials"]["secret"]["secretName"] == "s3-keys"
    assert volumes["wal-credentials"]["secret"]["optional"]  # the archiver says it lacks keys
    assert archiver["resources"]["limits"]["memory"] == "416Mi"  # 4 uploads at once
    server = spec["containers"][0]
    assert {"name": "wal-spool", "mountPath": "/var/run/statefleet-wal"} in server["volumeMounts"]
    conf = config(planned)["postgresql.conf"]
    assert "archive_mode = always" in conf
    assert "archive_command = 'bash /etc/statefleet/archive-wal.sh %f'" in conf
    assert "archive_timeout = 5" in conf
    assert {"name": "POSTGRES_INITDB_ARGS", "value": "--data-checksums"} in server["env"]


def test_without_wal_archive_no_archiver_and_no_archiving() -> None:
    planned = plan(PLUGIN, observed({**SPEC, "walArchive": None}), CATALOG, "uid-1")
    spec = pod_spec(planned)
    assert "initContainers" not in spec
    assert "archive_mode" not in config(planned)["postgresql.conf"]
    assert "archive-wal.sh" not in config(planned)


def test_a_missing_storage_still_runs_the_archiver_which_says_why() -> None:
    planned = plan(PLUGIN, observed(SPEC, references={"walStorage": None}), CATALOG, "uid-1")
    archiver = next(c for c in pod_spec(planned)["initContainers"] if c["name"] == "wal-archiver")
    env = {e["name"]: e.get("value") for e in archiver["env"]}
    assert env["STATEFLEET_WAL_ERROR"] == "spec.walArchive.storage: BackupStorage s3 does not exist"
    assert "wal-credentials" not in {v["name"] for v in pod_spec(planned)["volumes"]}


def test_the_archive_command_waits_for_the_archivers_word(tmp_path: Any) -> None:
    planned = plan(PLUGIN, observed(SPEC, references={"walStorage": STORAGE}), CATALOG, "uid-1")
    script = config(planned)["archive-wal.sh"].replace("/var/run/statefleet-wal", str(tmp_path))
    script = script.replace("tries = 3000", "tries = 4")  # 0.08 s instead of 60
    (tmp_path / "archived").mkdir()
    (tmp_path / "archived" / "000000010000000000000003").touch()
    done = subprocess.run(["bash", "-c", script, "archive", "000000010000000000000003"], capture_output=True)
    assert done.returncode == 0
    (tmp_path / "last-error").write_text("AccessDenied: the S3 server refused the credentials\n")
    failed = subprocess.run(
        ["bash", "-c", script, "archive", "000000010000000000000004"], capture_output=True
    )
    assert failed.returncode == 1
    assert b"AccessDenied" in failed.stderr


REQUEST = {
    "statefleet.dev/restore-in-place": json.dumps({"token": "0a1b2c3d", "restore": "undo", "mode": "restore"})
}


def test_a_restore_over_the_instance_holds_its_wal_without_restarting_a_pod(tmp_path: Any) -> None:
    serving = plan(PLUGIN, observed(SPEC, references={"walStorage": STORAGE}), CATALOG, "uid-1")
    assert config(serving)["wal-archive-hold"] == ""
    restoring = plan(
        PLUGIN, observed(SPEC, references={"walStorage": STORAGE}, annotations=REQUEST), CATALOG, "uid-1"
    )
    held = config(restoring)["wal-archive-hold"]
    assert "Restore undo" in held
    assert "never if it is rolled back" in held
    # The archivers read the ConfigMap's key as the kubelet updates it: no pod restarts for it.
    archiver = next(c for c in pod_spec(restoring)["initContainers"] if c["name"] == "wal-archiver")
    assert {"name": "config", "mountPath": "/etc/statefleet", "readOnly": True} in archiver["volumeMounts"]
    assert "wal-archive-hold" not in json.dumps(pod_spec(restoring))
    # archive_command fails at once, saying why, and leaves the file to the server.
    script = config(restoring)["archive-wal.sh"].replace("/etc/statefleet", str(tmp_path))
    (tmp_path / "wal-archive-hold").write_text(held)
    failed = subprocess.run(
        ["bash", "-c", script, "archive", "000000020000000000000003"], capture_output=True
    )
    assert failed.returncode == 1
    assert b"is not archived now: a restore over the instance (Restore undo" in failed.stderr


def test_the_hold_lasts_while_the_restore_is_under_way_and_ends_with_it() -> None:
    request = {"token": "0a1b2c3d", "restore": "undo", "mode": "restore"}
    assert archive_hold(None, None) == ""
    assert "token 0a1b2c3d" in archive_hold(request, None)  # asked: the instance is about to stop
    assert archive_hold({**request, "mode": "rollback"}, {"phase": "Restored"})  # being undone
    # The Restore gone (kept, or undone) while the record is still under way: still held.
    assert archive_hold(None, {"token": "0a1b2c3d", "restore": "undo", "phase": "Stopping"})
    for finished in ("Restored", "RolledBack", "Committed"):
        assert archive_hold(None, {"token": "0a1b2c3d", "phase": finished}) == ""


def test_a_held_archiver_turns_the_condition_false_saying_why() -> None:
    held = ArchiverReport(
        failing=False,
        held="a restore over the instance (Restore undo) is under way",
        pending=2,
        pending_bytes=32 * 2**20,
    )
    condition = archiving_condition("demo-0", held, primary_ready=True)
    assert (condition.status, condition.reason) == (False, "ArchivingHeld")
    assert "demo-0 holds its WAL: a restore over the instance (Restore undo)" in condition.message
    assert "2 WAL files (32 MiB) wait on the volume" in condition.message


def report_facts(report: ArchiverReport | None) -> Inspection:
    facts = ServerFacts(NO_ANSWERS, None, {}, {}, "demo-0", frozenset(), {"demo-0": report})
    return Inspection(at=0.0, facts=facts, answered=True)


def ready_pod(name: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_status_and_condition_follow_the_primarys_archiver_with_an_event_on_each_change() -> None:
    pods = [ready_pod("demo-0"), ready_pod("demo-1")]
    healthy = ArchiverReport(
        pod="demo-0", failing=False, last_archived_wal="000000010000000000000005", pending=0
    )
    first = plan(
        PLUGIN,
        observed(SPEC, references={"walStorage": STORAGE}, pods=pods, inspection=report_facts(healthy)),
        CATALOG,
        "uid-1",
    )
    condition = conditions.find(first.status["conditions"], CONDITION)
    assert condition["status"] == "True"
    assert first.status["walArchive"]["lastArchivedWal"] == "000000010000000000000005"
    assert not [e for e in first.events if e.reason in ("Archiving", "ArchiveFailing")]  # nothing happened
    failing = ArchiverReport(pod="demo-0", failing=True, last_error="AccessDenied: refused", pending=2)
    second = plan(
        PLUGIN,
        observed(
            SPEC,
            references={"walStorage": STORAGE},
            pods=pods,
            inspection=report_facts(failing),
            status=first.status,
        ),
        CATALOG,
        "uid-1",
    )
    condition = conditions.find(second.status["conditions"], CONDITION)
    assert (condition["status"], condition["reason"]) == ("False", "ArchiveFailing")
    assert [e.type for e in second.events if e.reason == "ArchiveFailing"] == ["Warning"]
    off = plan(
        PLUGIN, observed({**SPEC, "walArchive": None}, pods=pods, status=second.status), CATALOG, "uid-1"
    )
    assert conditions.find(off.status["conditions"], CONDITION) is None
    assert off.status.get("walArchive") is None


def test_an_archiver_not_answering_for_a_while_is_no_event() -> None:
    pods = [ready_pod("demo-0")]
    healthy = ArchiverReport(pod="demo-0", failing=False, pending=0)

    def passed(report: ArchiverReport | None, status: dict) -> Any:
        inspection = report_facts(report)
        seen = observed(
            SPEC, references={"walStorage": STORAGE}, pods=pods, inspection=inspection, status=status
        )
        return plan(PLUGIN, seen, CATALOG, "uid-1")

    first = passed(healthy, {})
    silent = passed(None, first.status)  # restarting, or slow to answer
    assert conditions.find(silent.status["conditions"], CONDITION)["status"] == "Unknown"
    back = passed(healthy, silent.status)
    assert conditions.find(back.status["conditions"], CONDITION)["status"] == "True"
    noted = [e.reason for e in (*silent.events, *back.events)]
    assert "ArchiverNotAnswering" not in noted
    assert "Archiving" not in noted
    failing = passed(ArchiverReport(pod="demo-0", failing=True, last_error="x"), back.status)
    assert [e.type for e in failing.events if e.reason == "ArchiveFailing"] == ["Warning"]
    fixed = passed(healthy, failing.status)
    assert [e.type for e in fixed.events if e.reason == "Archiving"] == ["Normal"]


def test_a_gap_is_found_across_timelines_and_a_partial_is_not_taken_for_a_segment() -> None:
    # Timeline 1 ended in segment 5, timeline 2 in segment 8; timeline 3 runs on.
    history = "1\t0/5000060\tno recovery target specified\n\n2\t0/80000A0\tno recovery target specified\n"
    assert timeline_switches(history) == [(1, 0x5000060), (2, 0x80000A0)]
    archived = {segment_name(1, n) for n in range(2, 6)}
    archived |= {segment_name(1, 5) + ".partial", "00000002.history", "00000003.history"}
    archived |= {segment_name(2, n) for n in range(5, 9)} | {segment_name(3, n) for n in range(8, 12)}
    assert missing_segments(archived, 3, history, 11) == []
    assert missing_segments(archived, 3, history, 12) == [segment_name(3, 12)]
    # Segment 6 of timeline 2 lost: the gap is named, not covered by anything else.
    assert missing_segments(archived - {segment_name(2, 6)}, 3, history, 11) == [segment_name(2, 6)]
    # Timeline 2's first segment (5) is needed: timeline 1's own segment 5 does not stand in.
    assert missing_segments(archived - {segment_name(2, 5)}, 3, history, 11) == [segment_name(2, 5)]
    assert segment_name(1, 0x1A3) == "0000000100000001000000A3"
    assert missing_segments({segment_name(1, 3), segment_name(1, 4)}, 1, "", 4) == []


def test_however_quiet_the_instance_its_archivers_are_asked_again_soon() -> None:
    assert next_inspection(None, tls_reload=False, archives=False) is None  # healthy, nothing to ask
    assert next_inspection(None, tls_reload=False, archives=True) == ARCHIVE_REPORTS_EVERY
    assert next_inspection(0.2, tls_reload=False, archives=True) == 0.2  # a failover's pace stays
    assert next_inspection(None, tls_reload=True, archives=True) == ARCHIVE_REPORTS_EVERY


def test_each_pod_is_labelled_with_the_hold_so_that_its_kubelet_updates_it_at_once() -> None:
    record = {"token": "0a1b2c3d", "restore": "undo", "mode": "restore", "pod": "demo-0", "phase": "Restored"}
    pods = [ready_pod("demo-0"), ready_pod("demo-1")]

    def labels(**extra: Any) -> dict[str, dict[str, str]]:
        seen = observed(
            SPEC, references={"walStorage": STORAGE}, pods=pods, status={"inPlaceRestore": record}, **extra
        )
        return plan(PLUGIN, seen, CATALOG, "uid-1").operations.pod_labels

    checking = labels(annotations=REQUEST)  # restored, its check running
    assert {pod: found["statefleet.dev/wal-archive"] for pod, found in checking.items()} == {
        "demo-0": "held",
        "demo-1": "held",
    }
    kept = labels()  # the Restore done: its request gone
    assert {found["statefleet.dev/wal-archive"] for found in kept.values()} == {"archiving"}


def test_a_storage_that_encrypts_gives_the_archiver_its_keys_as_a_volume_and_names_the_current_one() -> None:
    sealed = {
        "spec": {"s3": {**STORAGE["spec"]["s3"], "encryption": {"keysSecret": "wal-keys", "key": "k2"}}}
    }
    planned = plan(PLUGIN, observed(SPEC, references={"walStorage": sealed}), CATALOG, "uid-1")
    spec = pod_spec(planned)
    archiver = next(c for c in spec["initContainers"] if c["name"] == "wal-archiver")
    env = {e["name"]: e.get("value") for e in archiver["env"]}
    # The current key's name is in the settings: pointing it at another entry reaches the archivers.
    assert json.loads(env["STATEFLEET_WAL_ARCHIVE"])["s3"]["encryption"] == {
        "keysSecret": "wal-keys",
        "key": "k2",
    }
    assert not any(name.startswith("STATEFLEET_BACKUP_KEY") for name in env)  # files, not variables
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["wal-keys"]["secret"] == {"secretName": "wal-keys", "defaultMode": 288, "optional": True}
    assert {"name": "wal-keys", "mountPath": "/etc/statefleet-wal-keys", "readOnly": True} in archiver[
        "volumeMounts"
    ]
    plain = pod_spec(plan(PLUGIN, observed(SPEC, references={"walStorage": STORAGE}), CATALOG, "uid-1"))
    assert "wal-keys" not in {v["name"] for v in plain["volumes"]}
