import pytest

from framework.catalog import Catalog, VersionRefused, resolve
from framework.kube.conditions import READY, Condition, merge_conditions
from framework.kube.quantity import parse_quantity

pytestmark = pytest.mark.unit

CATALOG = Catalog.from_yaml(
    """
postgres:
  default: "17"
  versions:
    "15": {image: img:15, state: deprecated}
    "16": {image: img:16, state: disabled}
    "17": {image: img:17}
"""
)


def test_transition_time_moves_only_when_status_changes() -> None:
    first = merge_conditions(None, [Condition(READY, False, "NotReady", "waiting")], 1, now="T1")
    same = merge_conditions(first, [Condition(READY, False, "NotReady", "still waiting")], 2, now="T2")
    flipped = merge_conditions(same, [Condition(READY, True, "Ready", "up")], 2, now="T3")
    assert first[0]["lastTransitionTime"] == "T1"
    assert same[0]["lastTransitionTime"] == "T1"
    assert same[0]["message"] == "still waiting"
    assert same[0]["observedGeneration"] == 2
    assert flipped[0] == {
        "type": READY,
        "status": "True",
        "reason": "Ready",
        "message": "up",
        "lastTransitionTime": "T3",
        "observedGeneration": 2,
    }


def test_catalog_default_and_deprecated_versions() -> None:
    assert resolve(CATALOG, "postgres", None).image == "img:17"
    deprecated = resolve(CATALOG, "postgres", "15")
    assert deprecated.deprecated
    assert deprecated.image == "img:15"


@pytest.mark.parametrize(("version", "word"), [("14", "not offered"), ("16", "disabled")])
def test_refused_versions_name_the_field_and_the_offered_versions(version: str, word: str) -> None:
    with pytest.raises(VersionRefused) as refused:
        resolve(CATALOG, "postgres", version)
    assert str(refused.value) == f"spec.version: '{version}' is {word}; offered versions: 15, 17"


def test_catalog_rejects_a_disabled_default() -> None:
    with pytest.raises(ValueError, match="default version '16' is not an offered version"):
        Catalog.from_yaml('postgres: {default: "16", versions: {"16": {image: x, state: disabled}}}')


@pytest.mark.parametrize(
    ("text", "value"), [("1Gi", 2**30), ("500M", 500 * 10**6), ("0.5", 0.5), ("250m", 0.25), ("2", 2)]
)
def test_quantities(text: str, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


def test_bad_quantity_is_named() -> None:
    with pytest.raises(ValueError, match="not a quantity: '1GB'"):
        parse_quantity("1GB")
