"""Finds the service plugins: every package under `services/` that exposes `PLUGIN`."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import services
from backup.resources import backup_kinds
from framework.binding import ServiceBindingKind
from framework.inservice import InServiceKind
from framework.plugin import ServicePlugin


def load_plugins() -> list[ServicePlugin]:
    plugins = []
    for module in sorted(pkgutil.iter_modules(services.__path__), key=lambda m: m.name):
        package = importlib.import_module(f"services.{module.name}")
        plugin = getattr(package, "PLUGIN", None)
        if isinstance(plugin, ServicePlugin):
            plugins.append(plugin)
    return plugins


def in_service_kinds(plugins: list[ServicePlugin], job_image: str = "") -> list[InServiceKind]:
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
    kinds.update({kind.kind: kind.resource() for kind in in_service_kinds(plugins)})
    return kinds
