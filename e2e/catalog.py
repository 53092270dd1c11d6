"""The version catalog the e2e operators run with: each service's own, but for a platform team
that is moving its users from Postgres 15 to 17 (15 deprecated: it works, with a warning Event)
and has switched 13 off."""

from __future__ import annotations

import os
from pathlib import Path

from framework.catalog import CatalogVersion, VersionState
from statefleet.plugins import load_catalog, load_plugins

REPO = Path(__file__).resolve().parent.parent


def e2e_catalog() -> Path:
    """The catalog, written where the operators read it (the same text by every worker)."""
    catalog = load_catalog(load_plugins())
    postgres = catalog.services["postgres"]
    offered = postgres.versions["15"]
    postgres.versions["15"] = offered.model_copy(update={"state": VersionState.DEPRECATED})
    postgres.versions["13"] = CatalogVersion(
        image=offered.image.rsplit(":", 1)[0] + ":13", state=VersionState.DISABLED
    )
    path = REPO / ".testbed" / "e2e-catalog.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_suffix(f".{os.getpid()}")
    written.write_text(catalog.to_yaml())
    written.replace(path)  # a worker reading it never sees half of it
    return path
