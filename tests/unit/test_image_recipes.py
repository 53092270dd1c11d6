"""Each image a service's own catalog offers is built by a recipe of the test bed
(`testbed/images/<recipe>/image.conf`), which builds every recipe it finds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from statefleet.plugins import load_catalog, load_plugins

pytestmark = pytest.mark.unit

IMAGES = Path(__file__).resolve().parents[2] / "testbed" / "images"


def built_images() -> dict[str, str]:
    """Image reference -> the recipe that builds it."""
    refs = {}
    for conf in IMAGES.glob("*/image.conf"):
        found = re.search(r"^REF=(\S+)$", conf.read_text(), re.MULTILINE)
        assert found, f"{conf} names no REF"
        refs[found.group(1)] = conf.parent.name
    return refs


def test_every_image_the_services_offer_has_a_recipe() -> None:
    catalog = load_catalog(load_plugins())
    offered = {
        f"{service} {version}: {entry.image}"
        for service, versions in catalog.services.items()
        for version, entry in versions.versions.items()
    }
    built = built_images()
    assert [line for line in sorted(offered) if line.rsplit(": ", 1)[1] not in built] == []
    assert {built[line.rsplit(": ", 1)[1]] for line in offered} == {
        "postgres-15",
        "postgres-17",
        "rabbitmq-3",
        "rabbitmq-4",
        "ferretdb-1",
    }
