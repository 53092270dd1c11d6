"""The status and Events of objects inside services (users) and bindings, from one pass."""

from __future__ import annotations

import pytest

from framework.object_controller import Outcome, plan_status, transition_events

pytestmark = pytest.mark.unit

BODY = {"metadata": {"name": "reporting", "namespace": "apps", "generation": 2}, "status": {}}


def test_a_pass_writes_ready_its_fields_and_the_generation_it_saw() -> None:
    status = plan_status(BODY, Outcome(True, "Reconciled", "role reporting", fields={"role": "reporting"}))
    assert status["role"] == "reporting"
    assert status["observedGeneration"] == 2
    ready = status["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Reconciled")


def test_an_event_on_each_transition_and_never_a_repeat() -> None:
    waiting = Outcome(False, "InstanceNotFound", "spec.instance: Postgres demo does not exist")
    assert [e.reason for e in transition_events(BODY, waiting)] == ["InstanceNotFound"]
    body = {**BODY, "status": plan_status(BODY, waiting)}
    assert transition_events(body, waiting) == []  # the same again: silent
    other = Outcome(False, "SecretNotFound", "spec.passwordSecret: ...")
    assert [(e.type, e.reason) for e in transition_events(body, other)] == [("Warning", "SecretNotFound")]
    done = Outcome(True, "Reconciled", "ok")
    assert [(e.type, e.reason) for e in transition_events(body, done)] == [("Normal", "Reconciled")]


def test_a_field_set_to_none_leaves_the_status() -> None:
    body = {"metadata": {"generation": 1}, "status": {"phase": "Running", "progress": {"bytes": 5}}}
    status = plan_status(
        body, Outcome(True, "Completed", "done", fields={"phase": "Completed", "progress": None})
    )
    assert "progress" not in status
    assert status["phase"] == "Completed"
