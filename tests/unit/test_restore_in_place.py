"""A physical backup restored over a running instance: the request, the plugin's steps, what
each pod's init container does to its volume, and what the templates render meanwhile."""

from typing import Any

import pytest

from backup import in_place
from backup.restore_plan import RestoreSpec, replace_refusal
from framework.catalog import Catalog
from framework.instance_plan import plan
from framework.plugin import Observed
from framework.rollout.controller import index_statefulset
from framework.rollout.plan import ROLLOUT_LABEL
from services.postgres import PLUGIN
from services.postgres.backup_in_place import (
    COMMITTED,
    DROP_COPY,
    NOTHING_MOVED,
    PUT_BACK,
    RESTORED,
    ROLLED_BACK,
    SKIP,
    TAKE_BACKUP,
    plan_volume,
)
from services.postgres.in_place import POD_ANNOTATION, plan_in_place, pod_annotation

pytestmark = pytest.mark.unit

TOKEN = "0a1b2c3d"
ASK = {"token": TOKEN, "restore": "back", "mode": in_place.RESTORE}
UNDO = {**ASK, "mode": in_place.ROLLBACK}
ENV = {"RESTORE_TOKEN": TOKEN, "RESTORE_MODE": in_place.RESTORE, "RESTORE_POD": "demo-1"}


def pod(name: str, init: dict[str, Any] | None = None) -> dict[str, Any]:
    status = {"initContainerStatuses": [{"name": "restore", **init}]} if init else {}
    return {"metadata": {"name": name}, "status": status}


def statefulset(replicas: int, env: dict[str, str]) -> dict[str, Any]:
    """As the rollout controller's index keeps it: the pod template's annotations only."""
    annotations = {POD_ANNOTATION: pod_annotation(env)} if env else {}
    return {"spec": {"replicas": replicas, "template": {"metadata": {"annotations": annotations}}}}


def ended(code: int, message: str) -> dict[str, Any]:
    return {"state": {"terminated": {"exitCode": code, "message": message}}}


def test_request_is_parsed_strictly() -> None:
    raw = in_place.request(TOKEN, "back", in_place.RESTORE)
    assert in_place.request_of({in_place.ANNOTATION: raw}) == ASK
    for bad in ("", "{", '{"token": "x", "mode": "restore"}', f'{{"token": "{TOKEN}", "mode": "drop"}}'):
        assert in_place.request_of({in_place.ANNOTATION: bad}) is None
    assert in_place.request_of(None) is None


def test_a_request_stops_every_pod_and_holds_the_failover() -> None:
    step = plan_in_place(ASK, None, "demo-1", [pod("demo-0"), pod("demo-1")], None, now="t")
    assert step.stopped
    assert step.held
    assert step.record is not None
    assert step.record["phase"] == in_place.STOPPING
    assert step.record["pod"] == "demo-1"  # the primary's data is what is replaced and kept aside
    assert step.init_env == ENV
    assert [e.reason for e in step.events] == ["RestoreStopping"]
    # Still stopping while a pod runs, or while the StatefulSet lacks the new template.
    again = plan_in_place(ASK, step.record, "demo-1", [], statefulset(0, {}))
    assert again.stopped
    assert again.record == step.record
    assert not again.events
    again = plan_in_place(ASK, step.record, "demo-1", [], statefulset(2, ENV))
    assert again.stopped


def test_pods_start_again_once_none_runs_and_the_template_carries_the_token() -> None:
    stopping = plan_in_place(ASK, None, "demo-1", [pod("demo-1")], None).record
    step = plan_in_place(ASK, stopping, "demo-1", [], statefulset(0, ENV))
    assert not step.stopped
    assert step.held
    assert step.record is not None
    assert step.record["phase"] == in_place.STARTING


def test_a_failed_init_container_fails_the_restore_with_its_reason() -> None:
    starting = {**plan_in_place(ASK, None, "demo-1", [], None).record, "phase": in_place.STARTING}
    error = '{"error": {"reason": "ChecksumMismatch", "message": "object base.tar.zst is corrupted"}}'
    step = plan_in_place(ASK, starting, "demo-1", [pod("demo-1", ended(1, error))], statefulset(2, ENV))
    assert step.record is not None
    assert step.record["phase"] == in_place.FAILED
    assert step.record["reason"] == "ChecksumMismatch"
    assert "corrupted" in step.record["message"]
    assert [e.reason for e in step.events] == ["RestoreFailed"]


def test_restored_once_the_pod_took_the_backup_and_answers_as_primary() -> None:
    starting = {**plan_in_place(ASK, None, "demo-1", [], None).record, "phase": in_place.STARTING}
    done = [pod("demo-1", ended(0, '{"result": {"step": "take-backup"}}'))]
    step = plan_in_place(ASK, starting, "demo-1", done, statefulset(2, ENV))
    assert not step.held
    assert step.record["phase"] == in_place.STARTING
    step = plan_in_place(ASK, starting, "demo-1", done, statefulset(2, ENV), frozenset({"demo-1"}))
    assert step.record["phase"] == in_place.RESTORED
    # Once done, the request may go: the record and the template stay as they are.
    later = plan_in_place(None, step.record, "demo-1", done, statefulset(2, ENV))
    assert later.record == step.record
    assert later.init_env == ENV
    assert not later.stopped


def test_a_rollback_stops_again_and_ends_rolled_back_or_committed() -> None:
    restored = {**plan_in_place(ASK, None, "demo-1", [], None).record, "phase": in_place.RESTORED}
    step = plan_in_place(UNDO, restored, "demo-1", [pod("demo-1")], None)
    assert step.stopped
    assert step.record["mode"] == in_place.ROLLBACK
    assert step.init_env["RESTORE_MODE"] == in_place.ROLLBACK
    starting = {**step.record, "phase": in_place.STARTING}
    for report, phase in (
        ('{"result": {"step": "put-back"}}', in_place.ROLLED_BACK),
        ('{"result": {"step": "skip", "committed": true}}', in_place.COMMITTED),
    ):
        pods = [pod("demo-1", ended(0, report))]
        ended_step = plan_in_place(UNDO, starting, "demo-1", pods, None, frozenset({"demo-1"}))
        assert ended_step.record["phase"] == phase


def test_a_restore_no_longer_asked_for_is_undone_and_another_waits_for_that() -> None:
    stopping = plan_in_place(ASK, None, "demo-1", [], None).record
    for request in (None, {**ASK, "token": "ffffffff"}):  # the Restore deleted, or another one's
        step = plan_in_place(request, stopping, "demo-1", [], None)
        assert step.record["token"] == TOKEN
        assert step.record["mode"] == in_place.ROLLBACK
        assert step.stopped
    failed = {**stopping, "phase": in_place.FAILED}
    assert plan_in_place(None, failed, "demo-1", [], None).record["mode"] == in_place.ROLLBACK
    # A restore that was checked is not undone when its request goes.
    restored = {**stopping, "phase": in_place.RESTORED}
    assert plan_in_place(None, restored, "demo-1", [], None).record == restored
    finished = {**stopping, "mode": in_place.ROLLBACK, "phase": in_place.ROLLED_BACK}
    assert (
        plan_in_place({**ASK, "token": "ffffffff"}, finished, "demo-0", [], None).record["token"]
        == "ffffffff"
    )


def test_a_failed_rollback_leaves_the_planning_free() -> None:
    assert plan_in_place(UNDO, None, "demo-1", [], None).record is None  # nothing to undo here
    starting = {
        "token": TOKEN,
        "restore": "back",
        "mode": in_place.ROLLBACK,
        "pod": "demo-1",
        "phase": in_place.STARTING,
    }
    error = '{"error": {"reason": "OSError", "message": "No space left on device"}}'
    step = plan_in_place(UNDO, starting, "demo-1", [pod("demo-1", ended(1, error))], None)
    assert step.record["phase"] == in_place.FAILED
    assert not step.held
    assert [e.reason for e in step.events] == ["RollbackFailed"]


@pytest.mark.parametrize(
    ("mode", "restoring_pod", "marker", "has_data", "has_aside", "step"),
    [
        (in_place.RESTORE, True, "", True, False, TAKE_BACKUP),
        (in_place.RESTORE, True, "", False, True, TAKE_BACKUP),  # killed half-way: again
        (in_place.RESTORE, True, "", False, False, SKIP),  # a claim made anew clones
        (in_place.RESTORE, True, RESTORED, True, True, SKIP),  # a restart after the restore
        (in_place.RESTORE, False, "", True, False, DROP_COPY),
        (in_place.RESTORE, False, RESTORED, True, False, SKIP),  # its clone of the backup stays
        (in_place.ROLLBACK, True, RESTORED, True, True, PUT_BACK),
        (in_place.ROLLBACK, True, "", True, False, NOTHING_MOVED),  # refused before moving anything
        (in_place.ROLLBACK, True, COMMITTED, True, False, SKIP),  # checked: never undone
        (in_place.ROLLBACK, False, RESTORED, True, False, DROP_COPY),
        (in_place.ROLLBACK, False, "", True, False, DROP_COPY),  # no standby to promote meanwhile
        (in_place.RESTORE, True, ROLLED_BACK, True, True, SKIP),
    ],
)
def test_what_each_volume_does(
    mode: str, restoring_pod: bool, marker: str, has_data: bool, has_aside: bool, step: str
) -> None:
    assert plan_volume(mode, restoring_pod, marker, has_data, has_aside) == step


CATALOG = Catalog.from_yaml('postgres: {default: "17", versions: {"17": {image: pg:17}}}')


def test_the_plugin_renders_zero_replicas_and_the_init_container() -> None:
    spec = {"version": "17", "instances": 2, "storage": {"size": "1Gi"}}
    observed = Observed(
        name="demo",
        namespace="apps",
        generation=1,
        spec=spec,
        status={"currentPrimary": "demo-1", "initialized": True},
        annotations={in_place.ANNOTATION: in_place.request(TOKEN, "back", in_place.RESTORE)},
        pods=[pod("demo-0"), pod("demo-1")],
    )
    planned = plan(PLUGIN, observed, CATALOG, "uid", tools_image="statefleet:1")
    sts = next(c for c in planned.children if c["kind"] == "StatefulsetRollout")["spec"]["statefulSet"]
    assert sts["replicas"] == 0
    init = sts["template"]["spec"]["initContainers"][0]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert {k: env[k] for k in ENV} == ENV
    assert init["image"] == "statefleet:1"
    # The pod that takes the backup may replay an archive after it: the sidecar that serves it.
    sidecar = sts["template"]["spec"]["initContainers"][1]
    assert (sidecar["name"], sidecar["restartPolicy"]) == ("wal-restore", "Always")
    config = next(c for c in planned.children if c["kind"] == "ConfigMap")
    assert "restore-wal.sh" in config["data"]
    assert sts["template"]["metadata"]["annotations"][POD_ANNOTATION] == f"{TOKEN}/restore/demo-1"
    assert planned.status[in_place.STATUS_FIELD]["phase"] == in_place.STOPPING
    assert not planned.operations.actions
    assert not planned.operations.pod_labels
    assert "restoring in place (Stopping)" in planned.status["conditions"][0]["message"]


def test_replace_is_refused_for_a_physical_backup_only_where_not_served() -> None:
    spec = RestoreSpec.model_validate(
        {"backup": "b", "target": {"kind": "Postgres", "name": "demo", "replace": True}}
    )
    assert replace_refusal(spec, PLUGIN, "physical") is None
    not_in_place = type("NotInPlace", (type(PLUGIN.backups),), {"restores_in_place": False})()
    not_served = type("NotInPlace", (type(PLUGIN),), {"backups": not_in_place})()
    refusal = replace_refusal(spec, not_served, "physical")
    assert refusal is not None
    assert refusal[0] == "ReplaceRefused"


async def test_the_statefulset_index_keeps_only_the_pod_templates_annotations() -> None:
    template = {"metadata": {"annotations": {POD_ANNOTATION: "x"}}, "spec": {"containers": [{"name": "pg"}]}}
    body = {
        "metadata": {"name": "demo", "namespace": "apps", "labels": {ROLLOUT_LABEL: "demo"}},
        "spec": {"replicas": 0, "template": template},
    }
    (kept,) = (await index_statefulset(body)).values()
    assert kept["spec"]["template"] == {"metadata": {"annotations": {POD_ANNOTATION: "x"}}}
    assert kept["spec"]["replicas"] == 0


def test_another_restores_request_holds_the_instance_until_that_restore_ended() -> None:
    theirs, mine = "aaaa1111", "bbbb2222"
    asked = {in_place.ANNOTATION: in_place.request(theirs, "first", in_place.RESTORE)}

    def record(mode: str, phase: str) -> dict[str, Any]:
        return {"token": theirs, "restore": "first", "mode": mode, "phase": phase, "pod": "demo-0"}

    # Claimed but not yet answered; stopping; restored and being checked: held.
    assert in_place.held_by(asked, {}, mine) == "first"
    assert in_place.held_by(asked, record(in_place.RESTORE, in_place.STOPPING), mine) == "first"
    assert in_place.held_by(asked, record(in_place.RESTORE, in_place.RESTORED), mine) == "first"
    assert in_place.held_by(asked, record(in_place.RESTORE, in_place.FAILED), mine) == "first"
    # Ended: rolled back, committed, or a rollback that failed (its request may stay forever).
    assert in_place.held_by(asked, record(in_place.ROLLBACK, in_place.ROLLED_BACK), mine) is None
    assert in_place.held_by(asked, record(in_place.ROLLBACK, in_place.COMMITTED), mine) is None
    assert in_place.held_by(asked, record(in_place.ROLLBACK, in_place.FAILED), mine) is None
    # Its own request never holds it; a record under way for another does, request or not.
    assert in_place.held_by(asked, record(in_place.RESTORE, in_place.STARTING), theirs) is None
    assert in_place.held_by(None, record(in_place.ROLLBACK, in_place.STOPPING), mine) == "first"
    assert in_place.held_by(None, record(in_place.ROLLBACK, in_place.ROLLED_BACK), mine) is None
