"""What every plugin owes the framework, checked on each one found."""

from __future__ import annotations

import asyncio

import pytest

from framework.plugin import Observed, ServicePlugin, UnknownAction
from statefleet.plugins import load_plugins

pytestmark = pytest.mark.unit

PLUGINS = load_plugins()


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.service for p in PLUGINS])
def test_an_action_a_plugin_does_not_carry_out_is_an_error_not_skipped(plugin: ServicePlugin) -> None:
    observed = Observed(name="demo", namespace="apps", generation=1, spec={}, status={})
    with pytest.raises(UnknownAction, match=f"{plugin.kind} does not carry out 'switch it off'"):
        asyncio.run(plugin.perform(None, observed, "switch it off"))
