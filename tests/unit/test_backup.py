"""The backup engine's pure parts: where a backup lives, its manifest, the Postgres driver's
parsers, the Job it runs and what the Job's pod tells when it ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from backup import run
from backup.job import build_job
from backup.manifest import Manifest, ManifestObject, Piece, location, manifest_key
from backup.resources import BackupSpec
from backup.restore_plan import RestoreSpec, replace_refusal, replace_token
from backup.run import bounded
from backup.storage import S3Spec, encryption_args, object_key, piece_key
from framework.kube.jobs import job_name, job_state, last_progress
from framework.kube.times import seconds_between
from framework.plugin import ServicePlugin
from services.postgres import PLUGIN as POSTGRES
from services.postgres.backup_driver import (
    CommandFailed,
    ScriptFilter,
    backup_segments,
    filter_globals,
    parse_backup_history,
    parse_basebackup_log,
)
from services.postgres.backup_replace import ReplaceState, aside_name, parse_state, under_way
from services.rabbitmq import PLUGIN as RABBITMQ
from tests.unit.manifests import physical_manifest

pytestmark = pytest.mark.unit

S3 = S3Spec(endpoint="http://10.244.0.1:9000", bucket="backups", prefix="apps/", credentialsSecret="s3-creds")
BACKUP = {"metadata": {"name": "demo-now", "namespace": "apps", "uid": "0123456789abcdef"}}


def test_a_backup_lives_under_its_own_prefix_and_its_manifest_comes_with_it() -> None:
    where = location("apps/", "apps", "Postgres", "demo", "demo-now", "0123456789abcdef")
    assert where == "apps/apps/postgres/demo/demo-now-01234567"
    assert manifest_key(where) == "apps/apps/postgres/demo/demo-now-01234567/manifest.json"
    assert location("", "apps", "Postgres", "demo", "x", "ffffffff00") == "apps/postgres/demo/x-ffffffff"
    assert object_key("/a/", "", "b/", "c") == "a/b/c"


def test_the_manifest_round_trips_with_sizes_checksums_and_wal_positions() -> None:
    manifest = physical_manifest(
        ManifestObject(name="base.tar", key="k/base.tar", size=10, sha256="ab" * 32),
        physical={"timeline": 2, "startLsn": "0/3000028", "endLsn": "0/3000100"},
    )
    text = json.loads(manifest.to_json())
    assert text["physical"] == {"timeline": 2, "startLsn": "0/3000028", "endLsn": "0/3000100"}
    assert text["startedAt"] == "2026-11-30T02:00:00Z"
    again = Manifest.model_validate_json(manifest.to_json())
    assert again == manifest
    assert again.size == 10


def test_an_object_is_read_as_its_pieces_or_as_one_key_from_an_older_manifest() -> None:
    pieces = [Piece(key=piece_key("k/base.tar", n), size=5, sha256=f"{n:064x}") for n in (1, 2)]
    stored = ManifestObject(name="base.tar", key="k/base.tar", size=10, sha256="ab" * 32, pieces=pieces)
    assert [p.key for p in stored.stored_pieces()] == ["k/base.tar.000001", "k/base.tar.000002"]
    older = ManifestObject.model_validate(
        {"name": "base.tar", "key": "k/base.tar", "size": 10, "sha256": "cd" * 32}
    )
    assert older.stored_pieces() == [Piece(key="k/base.tar", size=10, sha256="cd" * 32)]
    with pytest.raises(ValidationError, match="pieceSizeMiB"):
        S3Spec.model_validate({"bucket": "backups", "credentialsSecret": "s", "pieceSizeMiB": 512})


def test_storage_settings_name_the_bad_field() -> None:
    with pytest.raises(ValidationError, match="bucket"):
        S3Spec(bucket="No_Such", credentialsSecret="s")
    with pytest.raises(ValidationError, match="endpoint"):
        S3Spec(endpoint="minio:9000", bucket="backups", credentialsSecret="s")
    kms = S3Spec(bucket="backups", credentialsSecret="s", serverSideEncryption="aws:kms", kmsKeyId="k1")
    assert encryption_args(kms) == {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "k1"}
    assert encryption_args(S3) == {}


def test_a_backup_spec_refuses_a_short_deadline() -> None:
    spec = {"service": {"kind": "Postgres", "name": "d"}, "storage": "s", "deadlineSeconds": 5}
    with pytest.raises(ValidationError, match=r"deadline_?[sS]econds"):
        BackupSpec.model_validate(spec)


GLOBALS = r'''--
-- Roles
--

CREATE ROLE app;
ALTER ROLE app WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB LOGIN PASSWORD 'SCRAM-SHA-256$4096:x';
CREATE ROLE postgres;
ALTER ROLE postgres WITH SUPERUSER INHERIT CREATEROLE CREATEDB LOGIN REPLICATION BYPASSRLS PASSWORD 'p';
CREATE ROLE streaming_replica;
ALTER ROLE streaming_replica WITH REPLICATION LOGIN PASSWORD 'r';
CREATE ROLE "Odd ""name""";
COMMENT ON ROLE app IS 'statefleet:apps/app';
GRANT app TO "Odd ""name""" GRANTED BY postgres;
'''


def test_restored_roles_leave_the_targets_own_system_roles_alone() -> None:
    kept = filter_globals(GLOBALS)
    assert "CREATE ROLE app;" in kept
    assert "ALTER ROLE app WITH" in kept
    assert 'CREATE ROLE "Odd ""name""";' in kept
    assert "COMMENT ON ROLE app" in kept
    assert "GRANT app TO" in kept
    assert "postgres WITH" not in kept
    assert "CREATE ROLE postgres;" not in kept
    assert "streaming_replica" not in kept
    without_odd = filter_globals(GLOBALS, frozenset({'Odd "name"'}))
    assert 'CREATE ROLE "Odd' not in without_odd
    assert "CREATE ROLE postgres;" in without_odd


def test_wal_positions_come_from_pg_basebackups_report() -> None:
    log = (
        "pg_basebackup: initiating base backup, waiting for checkpoint to complete\n"
        "pg_basebackup: checkpoint completed\n"
        "pg_basebackup: write-ahead log start point: 0/5000028 on timeline 3\n"
        "pg_basebackup: write-ahead log end point: 0/5000138\n"
        "pg_basebackup: base backup completed\n"
    )
    position = parse_basebackup_log(log)
    assert (position.timeline, position.start_lsn, position.end_lsn) == (3, "0/5000028", "0/5000138")
    with pytest.raises(CommandFailed, match="WAL positions"):
        parse_basebackup_log("pg_basebackup: error: connection refused")


def test_without_wal_the_positions_come_from_the_servers_backup_history_file() -> None:
    # What PostgreSQL 15 wrote for `pg_basebackup -X none -l statefleet-abc` (which reports no
    # positions then: its log says only "all required WAL segments have been archived").
    history = (
        "START WAL LOCATION: 0/2000028 (file 000000030000000000000002)\n"
        "STOP WAL LOCATION: 0/3000100 (file 000000030000000000000003)\n"
        "CHECKPOINT LOCATION: 0/2000060\nBACKUP METHOD: streamed\nBACKUP FROM: primary\n"
        "START TIME: 2026-12-05 05:14:06 UTC\nLABEL: statefleet-abc\nSTART TIMELINE: 3\n"
        "STOP TIME: 2026-12-05 05:14:06 UTC\nSTOP TIMELINE: 3\n"
    )
    position = parse_backup_history(history)
    assert (position.timeline, position.start_lsn, position.end_lsn) == (3, "0/2000028", "0/3000100")
    assert backup_segments(position) == ["000000030000000000000002", "000000030000000000000003"]
    with pytest.raises(CommandFailed, match="STOP WAL LOCATION"):
        parse_backup_history(history.replace("STOP WAL", "SOME WAL"))


def test_the_job_runs_once_with_the_storage_keys_from_their_secret() -> None:
    job = build_job(
        owner_kind="Backup",
        owner=BACKUP,
        action="backup",
        request={"action": "backup", "location": "x"},
        storage=S3,
        service_env=[{"name": "PGHOST", "value": "demo-rw"}],
        image="localhost/statefleet/operator:abc",
        deadline_seconds=600,
    )
    assert job["metadata"]["name"] == "demo-now-backup"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "Backup"
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 600
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "s3-creds",
        "key": "AWS_SECRET_ACCESS_KEY",
    }
    assert json.loads(env["STATEFLEET_BACKUP_REQUEST"]["value"])["location"] == "x"
    assert env["PGHOST"]["value"] == "demo-rw"
    assert len(job_name("x" * 80, "restore")) <= 63


def pod_ended(message: str, reason: str = "Error", code: int = 1) -> dict:
    terminated = {"exitCode": code, "reason": reason, "message": message}
    return {"status": {"containerStatuses": [{"state": {"terminated": terminated}}]}}


def test_a_job_that_succeeded_reports_its_result() -> None:
    job = {"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
    report = json.dumps({"result": {"bytes": 42, "manifest": "m"}})
    state = job_state(job, pod_ended(report, "Completed", 0))
    assert state.phase == "Succeeded"
    assert state.result == {"bytes": 42, "manifest": "m"}
    assert job_state(job, None).reason == "NoReport"


def test_a_failed_job_says_why() -> None:
    condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    failed = {"status": {"failed": 1, "conditions": [condition]}}
    report = json.dumps({"error": {"reason": "AccessDenied", "message": "the S3 server refused them"}})
    state = job_state(failed, pod_ended("some log\n" + report))
    assert (state.phase, state.reason) == ("Failed", "AccessDenied")
    killed = job_state(failed, pod_ended("", "Error", 137))
    assert killed.reason == "JobFailed"
    assert "Error" in killed.message
    gone = job_state(failed, None)
    assert "killed or deleted" in gone.message
    late = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}
    assert job_state(late, None).reason == "DeadlineExceeded"
    assert job_state({"status": {"active": 1}}, None).phase == "Running"


def test_a_job_with_retries_left_is_still_running_after_a_failed_pod() -> None:
    error = {"reason": "OperationalError", "message": "the server is starting"}
    report = pod_ended(json.dumps({"error": error}))
    retrying = {"spec": {"backoffLimit": 3}, "status": {"failed": 1, "active": 0}}
    assert job_state(retrying, report).phase == "Running"
    spent = {"spec": {"backoffLimit": 3}, "status": {"failed": 4}}
    assert (job_state(spent, report).phase, job_state(spent, report).reason) == ("Failed", "OperationalError")
    rollback = build_job(
        owner_kind="Restore",
        owner=BACKUP,
        action="rollback",
        request={"action": "rollback"},
        storage=S3,
        service_env=[],
        image="localhost/statefleet/operator:abc",
        retries=3,
        owned_by=("Postgres", {"metadata": {"name": "demo", "uid": "u-demo"}}),
    )
    assert rollback["spec"]["backoffLimit"] == 3
    # Named after the Restore, owned by the instance.
    assert rollback["metadata"]["name"] == "demo-now-rollback"
    assert [(o["kind"], o["name"]) for o in rollback["metadata"]["ownerReferences"]] == [("Postgres", "demo")]


def test_progress_is_the_last_progress_line() -> None:
    tail = '{"progress": {"bytes": 10}}\nnoise\n{"progress": {"bytes": 20, "object": "db/0000.dump"}}\n'
    assert last_progress(tail) == {"bytes": 20, "object": "db/0000.dump"}
    assert last_progress("nothing yet") is None


def test_durations() -> None:
    assert seconds_between("2026-11-30T02:00:00Z", "2026-11-30T02:01:30Z") == 90
    assert seconds_between(None, "2026-11-30T02:01:30Z") is None


def test_a_script_for_an_older_server_loses_only_the_settings_it_refuses() -> None:
    script = [
        b"SET statement_timeout = 0;\n",
        b"SET transaction_timeout = 0;\n",
        b"CREATE TABLE public.notes (body text);\n",
        b"COPY public.notes (body) FROM stdin;\n",
        b"SET transaction_timeout = 0;\n",  # a row that happens to read so: kept
        b"\\.\n",
        b"\\connect shop\n",
        b"SET transaction_timeout = 0;\n",
    ]
    keep = ScriptFilter()
    kept = [line for line in script if keep(line) is not None]
    assert kept == [script[0], script[2], script[3], script[4], script[5], script[6]]


def test_a_restore_goes_into_an_existing_instance_only_when_asked_and_only_as_its_plugin_can() -> None:
    def refusal(
        target: dict, method: str = "logical", plugin: ServicePlugin = POSTGRES
    ) -> tuple[str, str] | None:
        spec = RestoreSpec.model_validate({"backup": "demo-now", "target": {"kind": plugin.kind, **target}})
        return replace_refusal(spec, plugin, method)

    reason, message = refusal({"name": "demo"})
    assert reason == "TargetExists"
    assert "spec.target.replace" in message
    assert refusal({"name": "demo", "replace": True}) is None
    assert refusal({"name": "demo", "replace": True}, "physical") is None  # restored in place
    reason, message = refusal({"name": "demo", "replace": True}, "definitions", RABBITMQ)
    assert (reason, message.split(":")[0]) == ("ReplaceRefused", "spec.target.replace")
    assert "a definitions backup of a RabbitMQ is restored into a new instance only" in message
    reason, message = refusal({"name": "demo", "replace": True, "spec": {"instances": 1}})
    assert message.startswith("spec.target.spec:")


def test_what_a_replacing_restore_sets_aside_is_named_after_the_restore() -> None:
    token = replace_token("0a1b2c3d-4e5f-6789-abcd-ef0123456789")
    assert token == "0a1b2c3d"
    assert aside_name("shop", token) == "shop__before_0a1b2c3d"
    longest = aside_name("x" * 63, token)
    assert len(longest.encode()) <= 63
    assert longest.endswith("__before_0a1b2c3d")
    # Two long names that share their head never meet aside.
    assert aside_name("a" * 50 + "1", token) != aside_name("a" * 50 + "2", token)
    # A multibyte name is cut between characters, never inside one.
    assert len(aside_name("é" * 40, token).encode()) <= 63
    assert aside_name("é" * 40, token).startswith("é")


def test_what_a_replacing_restore_records_reads_back() -> None:
    state = ReplaceState("0a1b2c3d", "restoring", originals=["shop"], created=["new"])
    setconfig = ["work_mem=64MB", f"statefleet.restore={state.to_json()}"]
    assert parse_state(setconfig) == state
    assert parse_state(["work_mem=64MB"]) is None
    assert parse_state(None) is None
    assert parse_state(["statefleet.restore=not json"]) is None
    # Users' databases wait while a restore holds the instance, not after it ended.
    assert under_way(state)
    assert under_way(ReplaceState("0a1b2c3d", "committing"))
    assert not under_way(ReplaceState("0a1b2c3d", "committed"))
    assert not under_way(None)


def test_a_report_fits_the_termination_message_and_stays_json() -> None:
    big = {"result": {"bytes": 5, "details": {"rows": {f"db{i}": i for i in range(2000)}}}}
    text = bounded(big)
    assert len(text.encode()) <= 4000
    assert json.loads(text)["result"] == {"bytes": 5, "details": {"truncated": True}}
    error = {"error": {"reason": "CommandFailed", "message": "x" * 10000}}
    assert json.loads(bounded(error))["error"]["reason"] == "CommandFailed"
    small = {"result": {"bytes": 1}}
    assert json.loads(bounded(small)) == small


@pytest.mark.parametrize(
    ("action", "capability"),
    [("rollback", "ReplacesOnline"), ("restore", "ReplacesOnline"), ("check", "ReplacesInPlace")],
)
def test_a_job_asking_a_driver_for_a_capability_it_lacks_is_refused_naming_both(
    action: str, capability: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    storage = S3Spec(endpoint="http://127.0.0.1:9", bucket="backups", credentialsSecret="s3-creds")
    request = {
        "action": action,
        "driver": "services.rabbitmq.backup_driver",
        "storage": storage.to_api(),
        "location": "apps/demo-now",
        "replace": "0a1b2c3d",
    }
    monkeypatch.setenv("STATEFLEET_BACKUP_REQUEST", json.dumps(request))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setattr(run.signal, "signal", lambda *_: None)
    monkeypatch.setattr(run, "TERMINATION_LOG", tmp_path / "termination-log")
    assert run.main() == 1
    error = json.loads((tmp_path / "termination-log").read_text())["error"]
    assert error["reason"] == "MissingCapability"
    assert capability in error["message"]
    assert "services.rabbitmq.backup_driver.RabbitMQDriver" in error["message"]
