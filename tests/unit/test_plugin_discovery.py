"""How the operator finds its service plugins: this repository's `services/`, and packages
installed beside it that declare an entry point of the group `statefleet.services`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.postgres import PLUGIN as POSTGRES
from statefleet.plugins import ENTRY_POINTS, PluginError, checked, load_plugins

pytestmark = pytest.mark.unit

A_SEPARATE_PACKAGE = """
from pydantic import BaseModel

from framework.plugin import ServicePlan, ServicePlugin, ServiceStatus


class EchoSpec(BaseModel):
    version: str | None = None


class EchoPlugin(ServicePlugin):
    kind = "Echo"
    plural = "echoes"
    service = "echo"
    spec_model = EchoSpec

    def plan(self, spec, version, observed, now):
        return ServicePlan(ServiceStatus(0, 1, False, "never ready"))


PLUGIN = EchoPlugin()
"""


def test_the_repository_s_services_are_found_sorted_by_name() -> None:
    assert [plugin.service for plugin in load_plugins()] == ["mongodb", "postgres", "rabbitmq"]


def test_a_service_shipped_as_a_package_of_its_own_is_found_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "statefleet_echo").mkdir()
    (tmp_path / "statefleet_echo" / "__init__.py").write_text(A_SEPARATE_PACKAGE)
    metadata = tmp_path / "statefleet_echo-1.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: statefleet-echo\nVersion: 1.0\n")
    (metadata / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\necho = statefleet_echo:PLUGIN\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        plugins = load_plugins()
    finally:
        sys.modules.pop("statefleet_echo", None)
    assert [plugin.service for plugin in plugins] == ["echo", "mongodb", "postgres", "rabbitmq"]
    assert plugins[0].kind == "Echo"


def test_what_is_not_a_plugin_is_refused_naming_where_it_came_from() -> None:
    with pytest.raises(PluginError, match="entry point echo = echo:PLUGIN is a dict, not a ServicePlugin"):
        checked([("entry point echo = echo:PLUGIN", {})])


def test_a_kind_served_twice_is_refused() -> None:
    class SecondPostgres(type(POSTGRES)):  # type: ignore[misc]
        service = "postgres-too"

    serves_it = r"serves the kind Postgres, which services\.postgres\.PLUGIN serves"
    with pytest.raises(PluginError, match=serves_it):
        checked([("services.postgres.PLUGIN", POSTGRES), ("elsewhere", SecondPostgres())])


def test_a_second_plugin_of_one_service_is_refused() -> None:
    class Other(type(POSTGRES)):  # type: ignore[misc]
        kind, plural = "Other", "others"

        def in_service_kinds(self) -> list:
            return []

    with pytest.raises(PluginError, match="elsewhere is a second plugin of the service postgres"):
        checked([("services.postgres.PLUGIN", POSTGRES), ("elsewhere", Other())])
