"""Finds the service plugins: every package under `services/` that exposes `PLUGIN`."""

from __future__ import annotations

import importlib
import pkgutil

import services
from framework.plugin import ServicePlugin


def load_plugins() -> list[ServicePlugin]:
    plugins = []
    for module in sorted(pkgutil.iter_modules(services.__path__), key=lambda m: m.name):
        package = importlib.import_module(f"services.{module.name}")
        plugin = getattr(package, "PLUGIN", None)
        if isinstance(plugin, ServicePlugin):
            plugins.append(plugin)
    return plugins
