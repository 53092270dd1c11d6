"""A `Postgres` that cannot be served as asked: refused at admission by the CRD's rules, or by
the operator with a condition that names the field, and nothing changed. No server is needed
to check what the operator writes; the instances here never get a pod."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Event, PersistentVolumeClaim

from e2e.kube import apply, get_or_none, wait_reason, wait_until
from e2e.test_postgres import Postgres, condition, create, patch_spec
from e2e.test_postgres_users import PostgresUser, ServiceBinding

pytestmark = pytest.mark.controller

SMALL = {"storage": {"size": "1Gi"}}


def statefulset(kube: Client, namespace: str, name: str) -> StatefulSet:
    return wait_until(
        f"StatefulSet {name}",
        lambda: get_or_none(kube, StatefulSet, name, namespace),
        timeout=30,
        interval=0.2,
    )


def refusal(kube: Client, namespace: str, name: str, field: str) -> dict[str, Any]:
    """The Ready condition once it refuses a change of `field`."""

    def refused() -> dict[str, Any] | None:
        found = condition(kube, namespace, name)
        return found if found and found["reason"] == "ChangeRefused" and field in found["message"] else None

    return wait_until(f"ChangeRefused for {field}", refused, timeout=30, interval=0.2)


def test_what_the_schema_can_say_is_refused_at_admission(kube: Client, namespace: str) -> None:
    with pytest.raises(ApiError) as refused:
        create(kube, namespace, "toomany", {**SMALL, "instances": 12})
    assert refused.value.status.code == 422
    assert "spec.instances" in refused.value.status.message

    with pytest.raises(ApiError) as refused:
        create(kube, namespace, "managed", {**SMALL, "parameters": {"port": "6000"}})
    assert "parameters may not set what the operator manages" in refused.value.status.message
    # Matched as PostgreSQL matches names, whole families included; values that would leave their
    # line in postgresql.conf (and their place in the ConfigMap) are refused, naming the field.
    for name, parameters, said in (
        ("cased", {"Archive_Command": "true"}, "parameters may not set what the operator manages"),
        ("family", {"ssl_ciphers": "HIGH"}, "parameters may not set what the operator manages"),
        ("newline", {"work_mem": "4MB\n"}, "parameter values may not hold control characters"),
        ("named", {"work mem": "4MB"}, "parameter names are PostgreSQL's"),
    ):
        with pytest.raises(ApiError) as refused:
            create(kube, namespace, name, {**SMALL, "parameters": parameters})
        assert refused.value.status.code == 422
        assert "spec.parameters" in refused.value.status.message
        assert said in refused.value.status.message
    with pytest.raises(ApiError) as refused:
        create(
            kube, namespace, "hba", {**SMALL, "pgHba": ["host all all 0.0.0.0/0 trust\nlocal all all trust"]}
        )
    assert "spec.pgHba" in refused.value.status.message
    assert "pgHba lines may not hold control characters" in refused.value.status.message

    with pytest.raises(ApiError) as refused:
        create(kube, namespace, "lonely", {**SMALL, "instances": 2, "synchronous": {"number": 2}})
    assert "synchronous.number must be below instances" in refused.value.status.message

    # Another storage class would leave the data behind.
    create(kube, namespace, "classy", {"storage": {"size": "1Gi", "storageClass": "standard"}})
    with pytest.raises(ApiError) as refused:
        patch_spec(kube, namespace, "classy", {"storage": {"size": "1Gi", "storageClass": "fast"}})
    assert refused.value.status.code == 422
    assert "spec.storage.storageClass: Invalid value" in refused.value.status.message
    assert "storageClass is immutable" in refused.value.status.message


def test_versions_the_catalog_does_not_offer_are_refused_naming_the_offered_ones(
    kube: Client, namespace: str
) -> None:
    create(kube, namespace, "unknown", {**SMALL, "version": "16"})
    invalid = wait_until("InvalidSpec", lambda: condition(kube, namespace, "unknown"), timeout=30)
    assert invalid["reason"] == "InvalidSpec"
    assert invalid["message"] == "spec.version: '16' is not offered; offered versions: 15, 17"
    # The platform team switched 13 off: refused the same way.
    create(kube, namespace, "switched-off", {**SMALL, "version": "13"})
    invalid = wait_until("InvalidSpec", lambda: condition(kube, namespace, "switched-off"), timeout=30)
    assert invalid["reason"] == "InvalidSpec"
    assert invalid["message"] == "spec.version: '13' is disabled; offered versions: 15, 17"
    assert not list(kube.list(StatefulSet, namespace=namespace))


def test_changes_that_would_lose_data_are_refused_and_nothing_is_changed(
    kube: Client, namespace: str
) -> None:
    create(kube, namespace, "keep", {**SMALL, "version": "15"})
    made = statefulset(kube, namespace, "keep")
    image = made.spec.template.spec.containers[0].image

    # Shrinking the volumes would lose data.
    patch_spec(kube, namespace, "keep", {"storage": {"size": "500Mi"}})
    refused = refusal(kube, namespace, "keep", "spec.storage.size")
    assert "spec.storage.size: shrinking the volumes from 1Gi to 500Mi would lose data" in refused["message"]
    sts = kube.get(StatefulSet, "keep", namespace=namespace)
    assert sts.spec.volumeClaimTemplates[0].spec.resources.requests["storage"] == "1Gi"

    # A class added to volumes made with the default one would move them.
    patch_spec(kube, namespace, "keep", {"storage": {"size": "1Gi", "storageClass": "fast"}})
    refused = refusal(kube, namespace, "keep", "storageClass")
    assert refused["message"].startswith(
        "spec.storage.storageClass: moving the volumes from the cluster's default class to fast"
    )
    sts = kube.get(StatefulSet, "keep", namespace=namespace)
    assert sts.spec.volumeClaimTemplates[0].spec.storageClassName is None
    # (The StatefulSet controller makes a pod's claim before the pod, which the quota refuses.)
    claim = wait_until(
        "the claim data-keep-0",
        lambda: get_or_none(kube, PersistentVolumeClaim, "data-keep-0", namespace),
        timeout=30,
        interval=0.2,
    )
    assert claim.spec.storageClassName == "standard"

    # A major upgrade (15 -> 17) is refused, never a server that cannot read its data.
    patch_spec(kube, namespace, "keep", {"storage": {"size": "1Gi", "storageClass": None}, "version": "17"})
    refused = refusal(kube, namespace, "keep", "spec.version")
    assert refused["message"] == (
        "spec.version: upgrading the data from PostgreSQL 15 to 17 needs a major upgrade (pg_upgrade), "
        "which is not supported yet; set it back to 15"
    )

    # Put back: the refusal is lifted and the StatefulSet was never changed.
    patch_spec(kube, namespace, "keep", {"version": "15"})
    wait_until(
        "the refusal lifted",
        lambda: (found := condition(kube, namespace, "keep")) and found["reason"] != "ChangeRefused",
        timeout=30,
        interval=0.2,
    )
    sts = kube.get(StatefulSet, "keep", namespace=namespace)
    assert sts.metadata.generation == made.metadata.generation
    assert sts.spec.template.spec.containers[0].image == image

    # 15 is deprecated in this catalog: it runs, with one warning Event.
    warnings = [
        e
        for e in kube.list(Event, namespace=namespace, fields={"involvedObject.name": "keep"})
        if e.reason == "DeprecatedVersion"
    ]
    assert len(warnings) == 1
    assert warnings[0].type == "Warning"
    assert warnings[0].message == "version 15 is deprecated in the catalog"


def test_users_and_bindings_of_what_does_not_exist_say_so_naming_the_field(
    kube: Client, namespace: str
) -> None:
    # (A binding to an instance not made yet: ServiceNotFound, in e2e/test_postgres_users.py, where
    # the instance then comes.) A binding to a kind that takes none:
    apply(kube, ServiceBinding, namespace, "bogus", {"service": {"kind": "Redis", "name": "x"}})
    message = wait_reason(kube, ServiceBinding, namespace, "bogus", "UnknownService")
    assert message == "spec.service.kind: Redis cannot be bound; one of MongoDB, Postgres, RabbitMQ"

    apply(kube, PostgresUser, namespace, "lost", {"instance": "nowhere"})
    message = wait_reason(kube, PostgresUser, namespace, "lost", "InstanceNotFound")
    assert message == f"spec.instance: Postgres nowhere does not exist in namespace {namespace}"

    # The server's own roles, and the superuser's powers, are refused at admission.
    with pytest.raises(ApiError, match="server's own"):
        apply(kube, PostgresUser, namespace, "sneaky", {"instance": "demo", "role": "postgres"})
    with pytest.raises(ApiError, match="memberOf may not grant the superuser's powers"):
        apply(
            kube,
            PostgresUser,
            namespace,
            "sneaky",
            {"instance": "demo", "memberOf": ["pg_read_server_files"]},
        )
    assert get_or_none(kube, Postgres, "demo", namespace) is None
