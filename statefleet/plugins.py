"""Finds the service plugins and puts together every kind the operator serves.

A plugin is a `ServicePlugin` instance. Those of this repository are the packages under
`services/` that expose `PLUGIN`; a service shipped as a package of its own declares its plugin
as an entry point of the group `statefleet.services`:

    [project.entry-points."statefleet.services"]
    redis = "statefleet_redis:PLUGIN"
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import services
from backup.kinds import backup_kinds
from framework.binding import ServiceBindingKind
from framework.catalog import Catalog
from framework.object_controller import ObjectKind
from framework.plugin import ServicePlugin
from framework.rollout.hooks import InProcess

ENTRY_POINTS = "statefleet.services"


class PluginError(Exception):
    """A plugin that cannot be served: not a ServicePlugin, or a kind or service served twice."""


def load_plugins() -> list[ServicePlugin]:
    """Every plugin, by service name; two plugins of one kind or one service are an error."""
    found: list[tuple[str, Any]] = []
    for module in pkgutil.iter_modules(services.__path__):
        package = importlib.import_module(f"{services.__name__}.{module.name}")
        if hasattr(package, "PLUGIN"):
            found.append((f"{package.__name__}.PLUGIN", package.PLUGIN))
    for entry in entry_points(group=ENTRY_POINTS):
        found.append((f"entry point {entry.name} = {entry.value}", entry.load()))
    return checked(found)


def checked(found: list[tuple[str, Any]]) -> list[ServicePlugin]:
    """Pure: the plugins `found` (where each came from, the object), sorted by service, or
    PluginError naming the source of the first that cannot be served."""
    plugins: dict[str, ServicePlugin] = {}
    kinds: dict[str, str] = {}
    for source, plugin in found:
        if not isinstance(plugin, ServicePlugin):
            raise PluginError(f"{source} is a {type(plugin).__name__}, not a ServicePlugin")
        for owned in (plugin.kind, *(kind.kind for kind in plugin.in_service_kinds())):
            if owned in kinds:
                raise PluginError(f"{source} serves the kind {owned}, which {kinds[owned]} serves already")
            kinds[owned] = source
        if plugin.service in plugins:
            raise PluginError(f"{source} is a second plugin of the service {plugin.service}")
        plugins[plugin.service] = plugin
    return [plugins[service] for service in sorted(plugins)]


def in_process_hooks(plugins: list[ServicePlugin]) -> dict[str, InProcess]:
    """Every plugin's in-process rollout hooks, by name (a name two plugins give is an error)."""
    hooks: dict[str, InProcess] = {}
    for plugin in plugins:
        for name, hook in plugin.rollout_hooks.items():
            if name in hooks:
                raise PluginError(
                    f"{plugin.service} offers the rollout hook {name}, which another plugin offers"
                )
            hooks[name] = hook
    return hooks


def load_catalog(plugins: list[ServicePlugin], path: Path | None = None) -> Catalog:
    """The version catalog: the platform team's (`path`) where it names a service, each
    plugin's own versions elsewhere."""
    chosen = Catalog.from_file(path) if path else Catalog()
    return chosen.over({plugin.service: plugin.offered_versions() for plugin in plugins})


def object_kinds(plugins: list[ServicePlugin], job_image: str = "") -> list[ObjectKind]:
    """Bindings, backups, and every plugin's kinds of objects inside its instances. `job_image`:
    the image of backup Jobs (the operator's own)."""
    return [
        ServiceBindingKind(plugins),
        *backup_kinds(plugins, job_image),
        *(kind for plugin in plugins for kind in plugin.in_service_kinds()),
    ]


def watched_kinds(plugins: list[ServicePlugin]) -> dict[str, Any]:
    """Kind -> resource class of every kind a binding or a user may wait for."""
    kinds: dict[str, Any] = {plugin.kind: plugin.resource() for plugin in plugins}
    kinds.update({kind.kind: kind.resource() for kind in object_kinds(plugins)})
    return kinds
