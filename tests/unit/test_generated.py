"""The files generated from the plugins and models are those in the repository: the CRDs and
the chart's RBAC rules for Statefleet's kinds (`python -m statefleet.generate` writes them)."""

from __future__ import annotations

import pytest

from framework.object_controller import ObjectKind
from framework.plugin import ServicePlugin
from services.postgres import PLUGIN as POSTGRES
from statefleet.generate import REPO, generated_files, kind_rules, left_over
from statefleet.plugins import load_plugins, object_kinds

pytestmark = pytest.mark.unit

EVERYTHING_BUT_DELETE = ["get", "list", "watch", "create", "patch"]
INSIDE = ["servicebindings", "backupstorages", "backups", "backupplans", "restores", "postgresusers"]


def test_every_generated_file_is_up_to_date_and_none_is_left_over() -> None:
    files = generated_files()
    stale = [
        str(path.relative_to(REPO))
        for path, text in files.items()
        if not path.exists() or path.read_text() != text
    ]
    assert stale == [], "run python -m statefleet.generate"
    assert left_over(files) == [], "run python -m statefleet.generate"


def test_the_operator_may_do_to_a_plugin_s_kinds_what_it_does_and_what_the_plugin_asks_for() -> None:
    every = ["postgreses", "statefulsetrollouts", *INSIDE]
    assert kind_rules([POSTGRES]) == [
        {
            "apiGroups": ["statefleet.dev"],
            "resources": ["postgreses", "statefulsetrollouts"],
            "verbs": [*EVERYTHING_BUT_DELETE, "delete"],
        },
        {"apiGroups": ["statefleet.dev"], "resources": INSIDE, "verbs": EVERYTHING_BUT_DELETE},
        {"apiGroups": ["statefleet.dev"], "resources": ["backups", "restores"], "verbs": ["delete"]},
        {
            "apiGroups": ["statefleet.dev"],
            "resources": [f"{p}/status" for p in every],
            "verbs": ["get", "patch"],
        },
        {
            "apiGroups": ["statefleet.dev"],
            "resources": [f"{p}/finalizers" for p in every],
            "verbs": ["update"],
        },
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},
    ]


def test_every_status_schema_is_generated_from_a_status_model() -> None:
    """No hand-written status schema: each kind's status is a model, read and written typed."""
    plugins = load_plugins()
    hand_written = [
        type(kind).__name__
        for kind in object_kinds(plugins)
        if type(kind).status_properties is not ObjectKind.status_properties
    ] + [
        type(p).__name__ for p in plugins if type(p).status_properties is not ServicePlugin.status_properties
    ]
    assert hand_written == []
    assert all(plugin.status_model is not None for plugin in plugins)
