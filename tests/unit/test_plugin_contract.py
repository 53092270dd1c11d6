"""What every plugin owes the framework, checked on each one found."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backup.driver import BootstrapsPhysical, Driver, ReplacesInPlace, ReplacesOnline, load_driver
from framework import credentials
from framework.instance_plan import plan
from framework.plugin import Backups, Observed, Operations, ServicePlugin, UnknownAction
from services.postgres import PLUGIN as POSTGRES_PLUGIN
from statefleet.plugins import PluginError, in_process_hooks, load_catalog, load_plugins

pytestmark = pytest.mark.unit

PLUGINS = load_plugins()
BACKED_UP = [p for p in PLUGINS if p.backups]


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.service for p in PLUGINS])
def test_an_action_a_plugin_does_not_carry_out_is_an_error_not_skipped(plugin: ServicePlugin) -> None:
    observed = Observed(name="demo", namespace="apps", generation=1, spec={}, status={})
    with pytest.raises(UnknownAction, match=f"{plugin.kind} does not carry out 'switch it off'"):
        asyncio.run(plugin.perform(None, observed, "switch it off"))


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.service for p in PLUGINS])
def test_every_in_process_hook_the_templates_name_is_one_the_plugin_offers(plugin: ServicePlugin) -> None:
    spec = {**plugin.backups.throwaway_spec, "storage": {"size": "1Gi"}} if plugin.backups else {}
    observed = Observed(name="demo", namespace="apps", generation=1, spec=spec, status={})
    planned = plan(plugin, observed, load_catalog(PLUGINS), "uid")
    (rollout,) = [child for child in planned.children if child["kind"] == "StatefulsetRollout"]
    named = [
        hook["inProcess"]["name"]
        for moment in rollout["spec"]["strategy"].get("hooks", {}).values()
        for hook in moment
        if "inProcess" in hook
    ]
    assert named
    assert set(named) <= set(plugin.rollout_hooks)


def test_a_rollout_hook_two_plugins_offer_is_refused() -> None:
    first, second = PLUGINS[0], PLUGINS[1]
    twice = type(second)(
        rollout_hooks={next(iter(first.rollout_hooks)): first.rollout_hooks[next(iter(first.rollout_hooks))]}
    )
    with pytest.raises(PluginError, match=f"{second.service} offers the rollout hook"):
        in_process_hooks([first, twice])


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.service for p in PLUGINS])
def test_the_user_kind_a_binding_makes_is_one_of_the_plugin_s_kinds(plugin: ServicePlugin) -> None:
    if plugin.bindings is None:
        pytest.skip(f"{plugin.kind} takes no bindings")
    assert plugin.bindings.user_kind in [kind.kind for kind in plugin.in_service_kinds()]


def test_an_action_outside_the_plugin_s_set_is_refused_when_planned() -> None:
    class Leaky(type(POSTGRES_PLUGIN)):  # type: ignore[misc]
        def operations(self, spec: Any, observed: Observed, now: float) -> Operations:
            return Operations(actions=["drop the database"])

    spec = {"instances": 1, "storage": {"size": "1Gi"}}
    observed = Observed(name="demo", namespace="apps", generation=1, spec=spec, status={})
    with pytest.raises(UnknownAction, match="Postgres does not carry out 'drop the database'"):
        plan(Leaky(), observed, load_catalog(PLUGINS), "uid")


def asked_of_the_driver(backups: Backups) -> list[type[Driver]]:
    """The driver capabilities the operator asks for, given what the plugin declares."""
    declared = {
        ReplacesOnline: bool(backups.replaces_online),
        BootstrapsPhysical: bool(backups.bootstrap_methods),
        ReplacesInPlace: backups.restores_in_place,
    }
    return [kind for kind, asked in declared.items() if asked]


@pytest.mark.parametrize("plugin", BACKED_UP, ids=[p.service for p in BACKED_UP])
def test_a_plugin_s_driver_has_every_capability_the_plugin_declares(plugin: ServicePlugin) -> None:
    assert plugin.backups is not None
    backups = plugin.backups
    driver = load_driver(backups.driver)
    assert isinstance(driver, Driver)
    missing = [kind.__name__ for kind in asked_of_the_driver(backups) if not isinstance(driver, kind)]
    assert missing == [], f"{backups.driver}: the plugin {plugin.service} asks for what its driver lacks"
    assert sorted(driver.methods) == sorted(backups.methods)
    assert set(backups.bootstrap_methods + backups.replaces_online) <= set(backups.methods)


ROTATING = [p for p in PLUGINS if p.rotation]


@pytest.mark.parametrize("plugin", ROTATING, ids=[p.service for p in ROTATING])
def test_a_plugin_that_rotates_credentials_takes_the_request_and_rotates_generated_secrets(
    plugin: ServicePlugin,
) -> None:
    """The spec model declares `rotateCredentials` (else the request is refused as unknown), the
    Secrets that rotate are generated ones with a random `password`, and the apply action is one
    of the plugin's."""
    assert plugin.rotation is not None
    assert credentials.SPEC_FIELD in plugin.spec_model.model_json_schema(by_alias=True)["properties"]
    for secret in plugin.rotation.secrets:
        assert secret in plugin.generated_secrets
        assert "password" in secret.random
    observed = Observed(name="demo", namespace="apps", generation=1, spec={}, status={})
    assert isinstance(plugin.rotation.apply(observed), plugin.actions)
    assert credentials.SPEC_FIELD in plugin.one_shot_fields()
