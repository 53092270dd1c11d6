"""Our own log lines carry the object they are about, as kopf's do."""

from __future__ import annotations

import json
import logging

import kopf
import pytest

from framework.kube.api import about

pytestmark = pytest.mark.unit


def test_json_log_lines_name_their_object() -> None:
    kopf.configure(log_format=kopf.LogFormat.JSON)
    # The handler kopf installed (pytest adds its own).
    handler = next(h for h in logging.getLogger().handlers if "Json" in type(h.formatter).__name__)
    record = logging.getLogger("statefleet").makeRecord(
        "statefleet",
        logging.INFO,
        __file__,
        1,
        "applied %d children",
        (6,),
        None,
        extra=about("Postgres", "apps", "demo"),
    )
    line = json.loads(handler.formatter.format(record))
    assert line["message"] == "applied 6 children"
    assert line["severity"] == "info"
    assert line["object"] == {
        "apiVersion": "statefleet.dev/v1alpha1",
        "kind": "Postgres",
        "namespace": "apps",
        "name": "demo",
    }
