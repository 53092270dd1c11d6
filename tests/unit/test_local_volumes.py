from pathlib import Path

import pytest

from testbed.local_volumes import (
    PROVISIONED_BY,
    PROVISIONER,
    SELECTED_NODE,
    build_persistent_volume,
    is_released_volume_of_ours,
    wants_volume,
)

pytestmark = pytest.mark.unit


def claim(**overrides) -> dict:
    base = {
        "metadata": {
            "name": "data-pg-0",
            "namespace": "apps",
            "uid": "1234",
            "annotations": {SELECTED_NODE: "testbed-node"},
        },
        "spec": {
            "storageClassName": "standard",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "2Gi"}},
        },
        "status": {"phase": "Pending"},
    }
    for key, value in overrides.items():
        base[key] = {**base[key], **value}
    return base


def test_volume_is_pinned_to_the_chosen_node_and_bound_to_the_claim() -> None:
    volume = build_persistent_volume(claim(), Path("/data"))
    spec = volume["spec"]
    assert volume["metadata"]["name"] == "pvc-1234"
    assert spec["capacity"] == {"storage": "2Gi"}
    assert spec["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "apps",
        "name": "data-pg-0",
        "uid": "1234",
    }
    assert spec["hostPath"]["path"] == "/data/pvc-1234"
    term = spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert term == {"key": "kubernetes.io/hostname", "operator": "In", "values": ["testbed-node"]}
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"


def test_only_placed_unbound_claims_of_our_class_want_a_volume() -> None:
    assert wants_volume(claim())
    assert not wants_volume(claim(metadata={"annotations": {}}))  # scheduler has not chosen yet
    assert not wants_volume(claim(spec={"volumeName": "pvc-1234"}))
    assert not wants_volume(claim(spec={"storageClassName": "other"}))
    assert not wants_volume(claim(metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"}))


def test_only_our_released_volumes_are_reclaimed() -> None:
    volume = build_persistent_volume(claim(), Path("/data"))
    assert not is_released_volume_of_ours({**volume, "status": {"phase": "Bound"}})
    assert is_released_volume_of_ours({**volume, "status": {"phase": "Released"}})
    foreign = {**volume, "metadata": {"name": "x", "annotations": {PROVISIONED_BY: "other"}}}
    assert not is_released_volume_of_ours({**foreign, "status": {"phase": "Released"}})
    assert volume["metadata"]["annotations"][PROVISIONED_BY] == PROVISIONER
