"""The optional NetworkPolicies (`framework.network_policy`): which peers each instance's policy
lets in for which settings and bindings, that the pods meant to pass carry what it selects
(the instance's own, the operator's Jobs) and others do not, the settings the operator refuses,
and the binding's workload as admission takes it."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import pytest
from pydantic import ValidationError

from backup.job import StartJob, build_job
from backup.resources import BackupSpec, BackupStatus
from backup.restore import RestoreKind
from backup.restore_plan import RestoreSpec, RestoreStatus, RestoreView
from backup.storage import S3Spec
from backup.take import BackupKind
from backup.take_plan import BackupStep, BackupView
from framework.binding import ServiceBindingSpec
from framework.instance_controller import binding_key, index_binding
from framework.instance_plan import plan
from framework.kube.meta import LABEL_INSTANCE, LABEL_NAME
from framework.network_policy import (
    NetworkPolicies,
    SettingsError,
    bound_selectors,
    build_network_policy,
    client_labels,
)
from framework.object_controller import Outcome
from framework.plugin import Observed, ServicePlugin
from framework.rollout.controller import selector_matches
from services.postgres import PLUGIN as POSTGRES
from services.rabbitmq import PLUGIN as RABBITMQ
from services.rabbitmq.scale_down import build_cli_job
from statefleet.cli import network_policy_settings
from statefleet.plugins import load_catalog, load_plugins

pytestmark = pytest.mark.unit

PLUGINS = load_plugins()
CATALOG = load_catalog(PLUGINS)
OPERATOR = {"app.kubernetes.io/name": "statefleet", "app.kubernetes.io/instance": "ops"}
SETTINGS = NetworkPolicies("statefleet-system", OPERATOR)
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
S3 = S3Spec(endpoint="http://s3.test:9000", bucket="backups", credentials_secret="k")


def binding(name: str, kind: str, instance: str, workload: Any = None, **metadata: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"service": {"kind": kind, "name": instance}}
    if workload is not None:
        spec["workload"] = workload
    return {"metadata": {"name": name, "namespace": "shop", **metadata}, "spec": spec}


def app(**labels: str) -> dict[str, Any]:
    return {"selector": {"matchLabels": labels}}


def spec_of(plugin: ServicePlugin) -> dict[str, Any]:
    return {**plugin.backups.throwaway_spec, "storage": {"size": "1Gi"}} if plugin.backups else {}


def observed(plugin: ServicePlugin, bindings: list[dict[str, Any]] | None = None) -> Observed:
    return Observed(
        name="orders",
        namespace="shop",
        generation=1,
        spec=spec_of(plugin),
        status={},
        bindings=bindings or [],
    )


def policies(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [child for child in children if child["kind"] == "NetworkPolicy"]


def admitted(
    policy: dict[str, Any], namespace: str, pod_labels: dict[str, str], namespace_labels: Any
) -> bool:
    """Whether `policy` (of namespace `shop`) lets in a pod with these labels from `namespace`
    (its labels: `namespace_labels`), as a NetworkPolicy reads its peers."""
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            if "ipBlock" in peer:
                continue
            if "namespaceSelector" in peer:
                if not selector_matches(peer["namespaceSelector"], namespace_labels):
                    continue
            elif namespace != policy["metadata"].get("namespace", "shop"):
                continue
            if selector_matches(peer.get("podSelector", {}), pod_labels):
                return True
    return False


def test_the_policy_lets_in_the_operator_the_instance_its_jobs_the_bound_apps_and_extra_peers() -> None:
    settings = NetworkPolicies("statefleet-system", OPERATOR, (PROMETHEUS,))
    bindings = [
        binding("web", "Postgres", "orders", app(app="web")),
        binding("billing", "Postgres", "orders", app(app="billing", tier="back")),
    ]
    policy = build_network_policy(settings, "postgres", "Postgres", "orders", bindings)
    assert policy["metadata"] == {"name": "orders-ingress"}
    selector = {LABEL_NAME: "postgres", LABEL_INSTANCE: "orders"}
    assert policy["spec"] == {
        "podSelector": {"matchLabels": selector},
        "policyTypes": ["Ingress"],  # egress stays open: S3, the DNS
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "statefleet-system"}
                        },
                        "podSelector": {"matchLabels": OPERATOR},
                    },
                    {"podSelector": {"matchLabels": selector}},
                    {"podSelector": {"matchLabels": {"statefleet.dev/postgres-client": "orders"}}},
                    # The bindings' workloads, by binding name.
                    {"podSelector": {"matchLabels": {"app": "billing", "tier": "back"}}},
                    {"podSelector": {"matchLabels": {"app": "web"}}},
                    PROMETHEUS,
                ]
            }
        ],
    }


def test_only_the_workloads_of_bindings_to_this_instance_are_let_in_each_once() -> None:
    expressions = {"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]}}
    bindings = [
        binding("a", "Postgres", "orders", app(app="a")),
        binding("same-app", "Postgres", "orders", app(app="a")),  # listed once
        binding("b", "Postgres", "orders", expressions),
        binding("no-workload", "Postgres", "orders"),  # lets nobody in
        binding("elsewhere", "Postgres", "payments", app(app="elsewhere")),
        binding("other-kind", "RabbitMQ", "orders", app(app="other-kind")),  # same name, another service
        binding("going", "Postgres", "orders", app(app="going"), deletionTimestamp="2026-12-06T07:00:00Z"),
        binding("empty", "Postgres", "orders", {"selector": {}}),  # refused at admission: never everyone
    ]
    assert bound_selectors(bindings, "Postgres", "orders") == [
        {"matchLabels": {"app": "a"}},
        {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]},
    ]
    assert bound_selectors(bindings, "RabbitMQ", "orders") == [{"matchLabels": {"app": "other-kind"}}]
    assert bound_selectors([], "Postgres", "orders") == []


def test_an_operator_outside_the_cluster_is_no_peer_its_node_reaches_the_pods() -> None:
    policy = build_network_policy(NetworkPolicies(), "rabbitmq", "RabbitMQ", "events", [])
    peers = policy["spec"]["ingress"][0]["from"]
    assert all("namespaceSelector" not in peer for peer in peers)
    assert peers == [
        {"podSelector": {"matchLabels": {LABEL_NAME: "rabbitmq", LABEL_INSTANCE: "events"}}},
        {"podSelector": {"matchLabels": {"statefleet.dev/rabbitmq-client": "events"}}},
    ]


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.service for p in PLUGINS])
def test_every_service_s_instance_gets_its_policy_first_and_none_when_off(plugin: ServicePlugin) -> None:
    bindings = [binding("web", plugin.kind, "orders", app(app="web"))]
    on = plan(plugin, observed(plugin, bindings), CATALOG, "uid-1", network_policies=SETTINGS)
    (policy,) = policies(on.children)
    assert on.children[0] is policy  # applied before the pods it fences exist
    assert policy["metadata"]["name"] == "orders-ingress"
    assert policy["metadata"]["namespace"] == "shop"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert policy["metadata"]["labels"] == plugin.labels("orders")  # what pruning lists
    # The instance's own pods are what it selects, and they let each other in.
    statefulset = next(c for c in on.children if c["kind"] == "StatefulsetRollout")["spec"]["statefulSet"]
    pod_labels = statefulset["template"]["metadata"]["labels"]
    assert selector_matches(policy["spec"]["podSelector"], pod_labels)
    assert admitted(policy, "shop", pod_labels, {})
    assert admitted(policy, "shop", {"app": "web"}, {})
    assert not admitted(policy, "shop", {"app": "other"}, {})
    assert not admitted(policy, "elsewhere", {"app": "web"}, {"kubernetes.io/metadata.name": "elsewhere"})
    system = {"kubernetes.io/metadata.name": "statefleet-system"}
    assert admitted(policy, "statefleet-system", OPERATOR, system)
    assert not admitted(policy, "statefleet-system", {"app": "other"}, system)
    # Off: none rendered, so the apply prunes the one made before; the rest is the same.
    off = plan(plugin, observed(plugin, bindings), CATALOG, "uid-1")
    assert policies(off.children) == []
    assert off.children == on.children[1:]
    assert off.status["childrenHash"] != on.status["childrenHash"]  # turning it on or off applies


def test_a_binding_s_workload_changes_the_children_so_they_are_applied_again() -> None:
    before = plan(POSTGRES, observed(POSTGRES), CATALOG, "uid-1", network_policies=SETTINGS)
    bound = [binding("web", "Postgres", "orders", app(app="web"))]
    after = plan(POSTGRES, observed(POSTGRES, bound), CATALOG, "uid-1", network_policies=SETTINGS)
    assert before.status["childrenHash"] != after.status["childrenHash"]
    again = plan(POSTGRES, observed(POSTGRES, bound), CATALOG, "uid-1", network_policies=SETTINGS)
    assert again.status["childrenHash"] == after.status["childrenHash"]


def test_the_operator_s_jobs_carry_the_label_their_instance_s_policy_lets_in() -> None:
    policy = build_network_policy(SETTINGS, "postgres", "Postgres", "orders", [])
    owner = {"metadata": {"name": "nightly-1", "namespace": "shop", "uid": "u"}}
    job = build_job(
        owner_kind="Backup", owner=owner, action="backup", request={}, storage=S3, service_env=[],
        image="img", client_of=client_labels("postgres", "orders"),
    )  # fmt: skip
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert admitted(policy, "shop", pod_labels, {})
    assert job["metadata"]["labels"]["statefleet.dev/postgres-client"] == "orders"
    # The Job's pod is no pod of the instance: the policy does not select it, nor its Services.
    assert not selector_matches(policy["spec"]["podSelector"], pod_labels)
    # A Job for another instance is not let in.
    other = build_job(
        owner_kind="Backup", owner=owner, action="backup", request={}, storage=S3, service_env=[],
        image="img", client_of=client_labels("postgres", "payments"),
    )  # fmt: skip
    assert not admitted(policy, "shop", other["spec"]["template"]["metadata"]["labels"], {})


class Recorder:
    """The API calls an executor makes: what it creates."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def create(self, obj: Any) -> Any:
        self.created.append(obj.to_dict())
        return obj


def test_backup_and_restore_jobs_are_labelled_clients_of_the_instance_they_reach() -> None:
    client = Recorder()
    spec = BackupSpec.model_validate({"service": {"kind": "Postgres", "name": "orders"}, "storage": "s3"})
    view = BackupView(
        name="nightly-1", namespace="shop", uid="u", spec=spec, status=BackupStatus(), storage=S3
    )
    body = {"metadata": {"name": "nightly-1", "namespace": "shop", "uid": "u"}}
    step = BackupStep(Outcome(False, "Running", ""), (StartJob("backup", {}),))
    asyncio.run(BackupKind(PLUGINS, "img").run(client, body, view, step))  # type: ignore[arg-type]
    restore_spec = RestoreSpec.model_validate(
        {"backup": "nightly-1", "target": {"kind": "Postgres", "name": "copy"}}
    )
    restore = RestoreView(name="back", uid="r", spec=restore_spec, status=RestoreStatus(), storage=S3)
    body = {"metadata": {"name": "back", "namespace": "shop", "uid": "r"}}
    restores = RestoreKind(PLUGINS, "img")
    asyncio.run(restores.act(client, body, restore, None, StartJob("restore", {})))  # type: ignore[arg-type]
    asyncio.run(restores.act(client, body, restore, None, StartJob("verify", {}, service_env=False)))  # type: ignore[arg-type]
    labels = [job["spec"]["template"]["metadata"]["labels"] for job in client.created]
    assert labels[0]["statefleet.dev/postgres-client"] == "orders"
    assert labels[1]["statefleet.dev/postgres-client"] == "copy"
    assert not any(key.endswith("-client") for key in labels[2])  # a verify Job reads the bucket only


def test_the_rabbitmq_cli_job_is_let_in_and_is_no_node() -> None:
    policy = build_network_policy(SETTINGS, "rabbitmq", "RabbitMQ", "events", [])
    job = build_cli_job(
        job="events-scale-down", namespace="shop", instance="events", image="rmq", script="true",
        cookie_secret="events-erlang-cookie",
        labels={**RABBITMQ.labels("events"), **client_labels("rabbitmq", "events")}, owner={},
    )  # fmt: skip
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert admitted(policy, "shop", pod_labels, {})
    assert not selector_matches(policy["spec"]["podSelector"], pod_labels)


def test_settings_name_the_operator_s_pods_by_namespace_and_labels_and_check_the_extra_peers() -> None:
    parsed = NetworkPolicies.from_settings("ops", '{"app.kubernetes.io/name": "statefleet"}', None)
    assert (parsed.operator_namespace, dict(parsed.operator_labels)) == (
        "ops",
        {"app.kubernetes.io/name": "statefleet"},
    )
    assert NetworkPolicies.from_settings("ops", "a=b, c=d", "").operator_labels == {"a": "b", "c": "d"}
    assert NetworkPolicies.from_settings(None, None, "[]") == NetworkPolicies()
    block = {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}
    peers = NetworkPolicies.from_settings(None, None, json.dumps([PROMETHEUS, block])).extra_from
    assert peers == (PROMETHEUS, block)


REFUSED_SETTINGS = {
    "namespace without labels": ("ops", None, None, "namespace and its labels together"),
    "labels without namespace": (None, "a=b", None, "namespace and its labels together"),
    "labels not key=value": ("ops", "a", None, "'a' is not key=value"),
    "not JSON": (None, None, "[{", "extraIngressFrom is not JSON"),
    "not a list": (None, None, "{}", "must be a list"),
    "an unknown field": (None, None, '[{"podSelecter": {}}]', r"extraIngressFrom\[0\]\.podSelecter"),
    "an empty peer": (None, None, "[{}]", "needs podSelector, namespaceSelector or ipBlock"),
    "ipBlock with a selector": (
        None,
        None,
        '[{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]',
        "ipBlock goes alone",
    ),
    "a bad network": (None, None, '[{"ipBlock": {"cidr": "10.0.0.300/8"}}]', "10.0.0.300/8"),
    "a bad operator": (
        None,
        None,
        '[{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}]',
        r"extraIngressFrom\[0\]\.podSelector\.matchExpressions\.0\.operator",
    ),
}


@pytest.mark.parametrize("case", REFUSED_SETTINGS)
def test_settings_the_operator_cannot_use_are_refused_naming_them(case: str) -> None:
    namespace, labels, extra, message = REFUSED_SETTINGS[case]
    with pytest.raises(SettingsError, match=message):
        NetworkPolicies.from_settings(namespace, labels, extra)


def test_the_operator_makes_none_unless_asked_and_stops_on_settings_it_cannot_use() -> None:
    def args(**given: Any) -> argparse.Namespace:
        values = {
            "network_policies": True,
            "operator_namespace": "ops",
            "operator_pod_labels": "app.kubernetes.io/name=statefleet",
            "network_policy_extra_from": None,
            **given,
        }
        return argparse.Namespace(**values)

    assert network_policy_settings(args(network_policies=False)) is None
    assert network_policy_settings(args()) == NetworkPolicies("ops", {"app.kubernetes.io/name": "statefleet"})
    with pytest.raises(SystemExit, match=r"--network-policies: extraIngressFrom\[0\]"):
        network_policy_settings(args(network_policy_extra_from='[{"nothing": 1}]'))


def test_a_binding_s_workload_must_name_labels() -> None:
    base = {"service": {"kind": "Postgres", "name": "orders"}}
    spec = ServiceBindingSpec.model_validate(
        {**base, "workload": {"selector": {"matchLabels": {"app": "web"}}}}
    )
    assert spec.workload is not None
    assert spec.workload.selector.to_api() == {"matchLabels": {"app": "web"}}
    assert ServiceBindingSpec.model_validate(base).workload is None
    for selector, message in (
        ({}, "an empty one would let in every pod"),
        ({"matchLabels": {}}, "an empty one would let in every pod"),
        ({"matchExpressions": [{"key": "app", "operator": "In"}]}, "In and NotIn take values"),
        ({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}, "take values"),
    ):
        with pytest.raises(ValidationError, match=message):
            ServiceBindingSpec.model_validate({**base, "workload": {"selector": selector}})


def test_the_crd_refuses_an_empty_workload_selector_at_admission() -> None:
    from framework.binding import ServiceBindingKind

    crd = ServiceBindingKind([]).crd()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    workload = spec["properties"]["workload"]
    assert "empty one would let in every pod" in workload["x-kubernetes-validations"][0]["message"]
    expression = workload["properties"]["selector"]["properties"]["matchExpressions"]["items"]
    assert expression["properties"]["operator"]["enum"] == ["In", "NotIn", "Exists", "DoesNotExist"]


def test_the_controller_indexes_each_binding_under_the_instance_it_names() -> None:
    body = {
        "metadata": {"name": "web", "namespace": "shop", "uid": "u", "managedFields": [{"big": "x"}]},
        "spec": {"service": {"kind": "Postgres", "name": "orders"}, "workload": app(app="web")},
        "status": {"binding": {"name": "web"}},
    }
    assert binding_key(body) == ("shop", "Postgres", "orders")
    indexed = asyncio.run(index_binding(body))  # type: ignore[arg-type]
    assert indexed == {("shop", "Postgres", "orders"): {"metadata": {"name": "web"}, "spec": body["spec"]}}
    # What the index holds is what the policy reads.
    (kept,) = indexed.values()
    assert bound_selectors([kept], "Postgres", "orders") == [{"matchLabels": {"app": "web"}}]
    assert binding_key({"metadata": {"namespace": "shop"}, "spec": {}}) is None
    assert asyncio.run(index_binding({"metadata": {"name": "x", "namespace": "shop"}, "spec": {}})) == {}  # type: ignore[arg-type]
