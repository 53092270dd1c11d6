"""The rollout CLI's pure parts and the controller's selector and revision readers."""

from __future__ import annotations

import pytest

from framework.rollout.commands.status import bar, render, settled
from framework.rollout.commands.undo import earlier_revision
from framework.rollout.controller import revision_template, selector_matches

pytestmark = pytest.mark.unit


def test_the_progress_bar_fills_in_proportion() -> None:
    assert bar(0, 5, width=10) == "[..........] 0/5"
    assert bar(3, 5, width=10) == "[######....] 3/5"
    assert bar(5, 5, width=10) == "[##########] 5/5"
    assert bar(0, 0, width=4) == "[####] 0/0"


def body(**status: object) -> dict:
    return {"metadata": {"name": "web", "namespace": "apps", "generation": 2}, "status": status}


def test_status_shows_the_step_the_bars_and_the_history() -> None:
    text = render(
        body(
            phase="Paused",
            message="paused at step 1 until promoted",
            replicas=5,
            updatedReplicas=1,
            availableReplicas=5,
            steps=5,
            currentStepIndex=1,
            stableTemplateHash="aaa",
            updateTemplateHash="bbb",
            history=[{"step": 0, "description": "setPercent 20", "finishedAt": "2026-11-30T10:00:00Z"}],
        )
    )
    assert text.splitlines() == [
        "StatefulsetRollout apps/web: Paused",
        "  paused at step 1 until promoted",
        "  step       2/5",
        "  updated    [######........................] 1/5",
        "  available  [##############################] 5/5",
        "  templates  stable aaa -> update bbb",
        "  done       step 1: setPercent 20 at 2026-11-30T10:00:00Z",
    ]


def test_watch_stops_when_settled_or_paused_for_this_generation() -> None:
    assert settled(body(observedGeneration=2, phase="Healthy", replicas=5, availableReplicas=5))
    assert not settled(body(observedGeneration=2, phase="Healthy", replicas=5, availableReplicas=4))
    assert not settled(body(observedGeneration=1, phase="Healthy", replicas=5, availableReplicas=5))
    assert settled(body(observedGeneration=2, phase="Paused"))
    assert not settled(body(observedGeneration=2, phase="Progressing"))


def test_undo_picks_the_newest_earlier_revision_or_the_one_asked() -> None:
    revisions = [
        {"metadata": {"name": "web-a"}, "revision": 3},
        {"metadata": {"name": "web-b"}, "revision": 4},
        {"metadata": {"name": "web-c"}, "revision": 2},
    ]
    assert earlier_revision(revisions, "web-b", None)["metadata"]["name"] == "web-a"
    assert earlier_revision(revisions, "web-b", 2)["metadata"]["name"] == "web-c"
    with pytest.raises(SystemExit, match="--to-revision: no revision 9; there are 2, 3, 4"):
        earlier_revision(revisions, "web-b", 9)


def test_selectors_match_labels_and_expressions() -> None:
    labels = {"app": "web", "tier": "front"}
    assert selector_matches({"matchLabels": {"app": "web"}}, labels)
    assert not selector_matches({"matchLabels": {"app": "db"}}, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]}, labels
    )
    assert not selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}, labels
    )
    assert selector_matches({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, labels)
    assert selector_matches({}, labels)  # policy/v1: an empty selector selects every pod
    assert not selector_matches(None, labels)  # and a null one none


def test_a_controller_revision_gives_back_its_pod_template() -> None:
    revision = {
        "data": {
            "spec": {"template": {"$patch": "replace", "metadata": {"labels": {"app": "web"}}, "spec": {}}}
        }
    }
    assert revision_template(revision) == {"metadata": {"labels": {"app": "web"}}, "spec": {}}
