"""The pieces every controller shares: which namespaces an operator watches, and the echo of
its own status write."""

from __future__ import annotations

import pytest

from framework.kube.runtime import StatusWriter, listed_namespaces, watched

pytestmark = pytest.mark.unit


def test_an_operator_told_no_namespaces_watches_them_all_and_patterns_pick_otherwise() -> None:
    assert watched("apps", [])
    assert watched("t3-backup-1a2b", ["t3-*"])
    assert not watched("t4-backup-1a2b", ["t3-*"])
    assert watched("shop", ["t3-*", "shop"])


def test_named_namespaces_are_listed_one_by_one_and_patterns_across_the_cluster() -> None:
    # Named: an operator with namespaced Roles only may list nothing cluster-wide.
    assert listed_namespaces(["shop", "billing"]) == ["shop", "billing"]
    assert listed_namespaces([]) == ["*"]
    assert listed_namespaces(["shop", "t3-*"]) == ["*"]
    assert listed_namespaces(["!kube-system"]) == ["*"]


def test_only_the_resource_version_the_last_write_made_is_its_echo() -> None:
    writer = StatusWriter[tuple[str, str]](client=None)  # type: ignore[arg-type]
    key = ("apps", "demo")
    writer._written[key] = "41"
    assert writer.is_echo(key, {"metadata": {"resourceVersion": "41"}})
    assert not writer.is_echo(key, {"metadata": {"resourceVersion": "42"}})  # someone else's change
    writer.forget(key)
    assert not writer.is_echo(key, {"metadata": {"resourceVersion": "41"}})
