"""Every manifest Statefleet installs or makes, checked offline: the chart (with the values a
platform team sets) and what the operator renders for every service (the instances'
children, their StatefulSets as the rollout controller makes them, the backup and CLI Jobs).

- kubeconform, strict, against the schemas of the Kubernetes release the test bed runs (made
  from the OpenAPI v3 documents its Go module ships) and of our CRDs: a field Kubernetes does not
  know, a wrong type, a kind without a schema fails;
- kube-score's security and reliability checks: every finding is either fixed or explained in
  `e2e/manifest_findings.yaml` (why it does not apply); an explanation nothing needs any more
  fails too, so that the list stays true.

No cluster is needed: the tools are the test bed's builds (`make testbed-up`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from backup.job import build_job
from backup.storage import S3Spec
from e2e.kube import REPO
from framework.catalog import Catalog
from framework.instance_plan import plan
from framework.network_policy import NetworkPolicies, client_labels
from framework.plugin import Observed
from services.mongodb import PLUGIN as MONGODB
from services.postgres import PLUGIN as POSTGRES
from services.rabbitmq import PLUGIN as RABBITMQ
from services.rabbitmq.scale_down import build_cli_job

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("manifests")]

TOOLS = REPO / ".testbed" / "bin" / "manifest-checks"
FINDINGS = REPO / "e2e" / "manifest_findings.yaml"
CATALOG = Catalog.from_yaml(
    """
postgres: {default: "17", versions: {"17": {image: "localhost/statefleet/postgres:17"}}}
rabbitmq: {default: "4", versions: {"4": {image: "localhost/statefleet/rabbitmq:4"}}}
mongodb:
  default: "7"
  versions:
    "7": {image: "localhost/statefleet/ferretdb:1", flavor: ferretdb}
    "7.0": {image: "mongo:7.0", flavor: mongod}
"""
)
STORAGE = {
    "spec": {"s3": {"endpoint": "http://s3.storage.svc:9000", "bucket": "backups", "credentialsSecret": "k"}}
}
TOOLS_IMAGE = "localhost/statefleet/operator:0123456789abcdef"
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
# The operator's NetworkPolicies on, as the chart's networkPolicies value sets them (each instance
# then has one, validated and scored with the rest).
NETWORK_POLICIES = NetworkPolicies(
    "ops", {"app.kubernetes.io/name": "statefleet", "app.kubernetes.io/instance": "statefleet"}, (PROMETHEUS,)
)
BINDINGS = [
    {"metadata": {"name": "web"}, "spec": {"service": {"kind": kind, "name": name}, "workload": workload}}
    for kind, name, workload in (
        ("Postgres", "demo", {"selector": {"matchLabels": {"app": "web"}}}),
        ("RabbitMQ", "events", {"selector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}}),
    )
]
# What a platform team sets, each rendered: the defaults, namespaces named (namespaced
# rights), one replica without leader election, Slack allowed, NetworkPolicies with Prometheus.
CHART_VALUES = [
    [],
    ["--set", "watchNamespaces={shop,billing}"],
    ["--set", "leaderElection.enabled=false", "--set", "replicas=1"],
    ["--set", "outbound.allowedDestinations={*.svc,hooks.slack.com}"],
    [
        "--set",
        "networkPolicies.enabled=true",
        "--set-json",
        f"networkPolicies.extraIngressFrom=[{json.dumps(PROMETHEUS)}]",
    ],
]


def chart() -> Iterator[dict[str, Any]]:
    helm = REPO / ".testbed" / "bin" / "helm"
    for values in CHART_VALUES:
        rendered = subprocess.run(
            [str(helm), "template", "statefleet", str(REPO / "charts" / "statefleet"), "--namespace", "ops",
             "--set", f"image.tag={TOOLS_IMAGE.rsplit(':', 1)[1]}", *values],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        for document in yaml.safe_load_all(rendered):
            if document:
                yield document
    for path in sorted((REPO / "charts" / "statefleet" / "crds").glob("*.yaml")):
        yield from (d for d in yaml.safe_load_all(path.read_text()) if d)


def instances() -> Iterator[dict[str, Any]]:
    """What the operator applies for each service, as a typical spec of each makes it."""
    point_in_time = {"fromBackup": {"name": "nightly"}, "pointInTime": {"time": "2026-12-04T12:00:00Z"}}
    specs = [
        (POSTGRES, "demo", {"instances": 3, "storage": {"size": "10Gi"}, "walArchive": {"storage": "s3"}}),
        (POSTGRES, "restored", {"storage": {"size": "10Gi"}, "bootstrap": point_in_time}),
        (RABBITMQ, "events", {"replicas": 3, "storage": {"size": "5Gi"}}),
        (MONGODB, "catalog", {"version": "7", "storage": {"size": "5Gi"}}),
        (MONGODB, "orders", {"version": "7.0", "members": 3, "storage": {"size": "5Gi"}}),
    ]
    for plugin, name, spec in specs:
        observed = Observed(
            name=name,
            namespace="shop",
            generation=1,
            spec=spec,
            status={},
            references={"walStorage": STORAGE},
            bindings=BINDINGS,
        )
        planned = plan(
            plugin, observed, CATALOG, "uid-1", tools_image=TOOLS_IMAGE, network_policies=NETWORK_POLICIES
        )
        yield from planned.secrets_to_create
        for child in planned.children:
            yield child
            if child["kind"] == "StatefulsetRollout":  # the StatefulSet it makes, as a user gets it
                yield {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "metadata": child["metadata"],
                    "spec": child["spec"]["statefulSet"],
                }
    owner = {"metadata": {"name": "nightly-1", "namespace": "shop", "uid": "u"}}
    storage = S3Spec(endpoint="http://s3.storage.svc:9000", bucket="backups", credentials_secret="k")
    yield build_job(
        owner_kind="Backup", owner=owner, action="backup", request={}, storage=storage, service_env=[],
        image=TOOLS_IMAGE, client_of=client_labels("postgres", "demo"),
    )  # fmt: skip
    owner_reference = {
        "apiVersion": "statefleet.dev/v1alpha1",
        "kind": "RabbitMQ",
        "name": "events",
        "uid": "u",
    }
    yield build_cli_job(
        job="events-scale-down", namespace="shop", instance="events", image="localhost/statefleet/rabbitmq:4",
        script="rabbitmqctl list_queues", cookie_secret="events-erlang-cookie",
        labels=client_labels("rabbitmq", "events"), owner=owner_reference, inter_node_tls=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (TOOLS / "kubeconform").exists():
        raise RuntimeError(f"{TOOLS}/kubeconform is missing: make testbed-up builds it")
    folder = tmp_path_factory.mktemp("manifests")
    (folder / "all.yaml").write_text(yaml.safe_dump_all([*chart(), *instances()], sort_keys=False))
    subprocess.run(
        [sys.executable, str(REPO / "testbed" / "manifest_schemas.py"), str(TOOLS / "openapi-v3"),
         str(REPO / "crds"), str(folder / "schemas")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return folder


def test_every_manifest_is_valid_against_the_kubernetes_and_crd_schemas(manifests: Path) -> None:
    done = subprocess.run(
        [str(TOOLS / "kubeconform"), "-strict", "-summary", "-output", "json",
         "-schema-location", f"{manifests}/schemas/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
         str(manifests / "all.yaml")],
        capture_output=True, text=True,
    )  # fmt: skip
    report = json.loads(done.stdout)
    problems = [
        f"{r['kind']} {r['name']}: {r['status']}: {r.get('msg')}"
        for r in report["resources"]
        if r["status"] != "statusValid"
    ]
    assert problems == [], "\n".join(problems)
    summary = report["summary"]
    assert summary["skipped"] == 0, summary
    assert summary["valid"] > 40, summary


def test_every_kube_score_finding_is_fixed_or_explained(manifests: Path) -> None:
    done = subprocess.run(
        [str(TOOLS / "kube-score"), "score", "--output-format", "json", str(manifests / "all.yaml")],
        capture_output=True, text=True,
    )  # fmt: skip
    found: set[tuple[str, str, str]] = set()
    for scored in json.loads(done.stdout):
        kind = scored["type_meta"]["kind"]
        for check in scored["checks"]:
            if check["skipped"] or check["grade"] >= 10:
                continue
            found.add((check["check"]["id"], kind, scored["object_name"]))
    explained = yaml.safe_load(FINDINGS.read_text())
    covered = {(e["check"], e["kind"]) for e in explained}
    unexplained = sorted(f for f in found if (f[0], f[1]) not in covered)
    assert unexplained == [], (
        "kube-score findings without an explanation in e2e/manifest_findings.yaml:\n"
        + "\n".join(f"{check} on {kind} {name}" for check, kind, name in unexplained)
    )
    stale = sorted(key for key in covered if not any((f[0], f[1]) == key for f in found))
    assert stale == [], f"explanations nothing needs any more (remove them): {stale}"
