"""The Postgres plugin through the framework's pure plan: what a reconcile would do."""

import base64
import subprocess
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from framework.catalog import Catalog
from framework.certificates import choose_tls_provider, plan_tls
from framework.instance_plan import plan
from framework.kube.pods import has_run
from framework.kube.status import status_changed
from framework.plugin import Observed
from framework.rollout.spec import RolloutSpec
from services.postgres import PLUGIN

pytestmark = pytest.mark.unit

CATALOG = Catalog.from_yaml(
    'postgres: {default: "17", versions: {"15": {image: pg:15}, "17": {image: pg:17}, '
    '"14": {image: pg:14, state: deprecated}}}'
)


def observed(spec: dict[str, Any], **extra: Any) -> Observed:
    return Observed(
        name="demo", namespace="apps", generation=1, spec=spec, status=extra.pop("status", {}), **extra
    )


def by_kind(children: list[dict]) -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def ready_pod(name: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_renders_every_child_owned_and_labelled() -> None:
    planned = plan(
        PLUGIN, observed({"version": "15", "instances": 3, "storage": {"size": "1Gi"}}), CATALOG, "uid-1"
    )
    children = by_kind(planned.children)
    assert set(children) == {
        ("ConfigMap", "demo-config"),
        ("Service", "demo"),
        ("Service", "demo-rw"),
        ("Service", "demo-ro"),
        ("PodDisruptionBudget", "demo"),
        ("StatefulsetRollout", "demo"),
    }
    for child in planned.children:
        assert child["metadata"]["namespace"] == "apps"
        assert child["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert child["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"
    rollout = children[("StatefulsetRollout", "demo")]["spec"]
    # Replicas first, one at a time, the primary (ordinal 0) last, after a checkpoint.
    assert rollout["strategy"]["steps"] == [{"setCount": 2}, {"setPercent": 100}]
    assert rollout["strategy"]["maxUnavailable"] == 1
    assert rollout["strategy"]["hooks"]["beforeTakeDown"] == [
        {"inProcess": {"name": "postgres-primary-last"}},
        {"inProcess": {"name": "postgres-checkpoint"}},
    ]
    RolloutSpec.model_validate(rollout)  # what the rollout controller will accept
    sts = rollout["statefulSet"]
    assert sts["replicas"] == 3
    assert sts["podManagementPolicy"] == "Parallel"
    assert sts["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    container = sts["template"]["spec"]["containers"][0]
    assert container["image"] == "pg:15"
    assert sts["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert children[("Service", "demo-rw")]["spec"]["selector"]["statefleet.dev/role"] == "primary"
    assert children[("Service", "demo-ro")]["spec"]["selector"]["statefleet.dev/role"] == "replica"
    assert children[("Service", "demo")]["spec"]["clusterIP"] == "None"


def test_superuser_and_replication_secrets_are_created_once() -> None:
    spec = {"storage": {"size": "1Gi"}}
    first = plan(PLUGIN, observed(spec), CATALOG, "uid")
    names = sorted(s["metadata"]["name"] for s in first.secrets_to_create)
    assert names == ["demo-replication", "demo-superuser"]
    passwords = {s["metadata"]["name"]: s["stringData"]["password"] for s in first.secrets_to_create}
    assert len(passwords["demo-superuser"]) == 32
    assert passwords["demo-superuser"] != passwords["demo-replication"]
    existing = {
        s["metadata"]["name"].removeprefix("demo-"): {"data": {"password": base64.b64encode(b"x").decode()}}
        for s in first.secrets_to_create
    }
    assert plan(PLUGIN, observed(spec, secrets=existing), CATALOG, "uid").secrets_to_create == []


@pytest.mark.parametrize(
    ("unsafe", "message"),
    [
        (
            {"parameters": {"work_mem": "4MB\n"}},
            "spec.parameters.work_mem: '4MB\\n' holds control characters",
        ),
        (
            {"parameters": {"Archive_Command": "true"}},
            "spec.parameters.Archive_Command: managed by the operator",
        ),
        ({"parameters": {"ssl_ciphers": "HIGH"}}, "spec.parameters.ssl_ciphers: managed by the operator"),
        ({"parameters": {"INCLUDE_dir": "/tmp"}}, "spec.parameters.INCLUDE_dir: managed by the operator"),
        ({"parameters": {"work mem": "4MB"}}, "spec.parameters.work mem: not a PostgreSQL parameter name"),
        ({"pgHba": ["host all all 0.0.0.0/0 trust\nlocal all all trust"]}, "spec.pgHba[0]: "),
    ],
)
def test_values_the_templates_cannot_take_are_refused_while_the_instance_is_still_operated(
    unsafe: dict, message: str
) -> None:
    """Admission refuses them (CEL); an object stored before a rule existed gets its change
    refused, naming the field, and keeps its probes, labels and failover."""
    pods = [{"metadata": {"name": "demo-0", "labels": {}}, "status": {}}]
    planned = plan(PLUGIN, observed({"storage": {"size": "1Gi"}, **unsafe}, pods=pods), CATALOG, "uid")
    assert not planned.apply
    assert planned.children == []
    ready = next(c for c in planned.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ChangeRefused")
    assert ready["message"].startswith(message), ready["message"]
    assert set(planned.operations.pod_labels["demo-0"]) == {"statefleet.dev/role"}  # still labelled


def test_a_value_is_quoted_as_postgresql_conf_reads_it() -> None:
    spec = {"storage": {"size": "1Gi"}, "parameters": {"dynamic_library_path": "C:\\lib\\", "x.y": "it's"}}
    conf = by_kind(plan(PLUGIN, observed(spec), CATALOG, "uid").children)[("ConfigMap", "demo-config")][
        "data"
    ]
    assert "dynamic_library_path = 'C:\\\\lib\\\\'" in conf["postgresql.conf"]  # the quote not escaped
    assert "x.y = 'it''s'" in conf["postgresql.conf"]


def test_parameters_and_overrides_reach_the_pods() -> None:
    spec = {
        "storage": {"size": "1Gi"},
        "parameters": {"max_connections": "200", "search_path": "it's"},
        "pgHba": ["host all app 10.0.0.0/8 scram-sha-256"],
        "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}},
        "podTemplate": {"nodeSelector": {"disk": "ssd"}, "labels": {"team": "orders"}},
        "deletionPolicy": "Delete",
    }
    planned = plan(PLUGIN, observed(spec), CATALOG, "uid")
    children = by_kind(planned.children)
    config = children[("ConfigMap", "demo-config")]["data"]
    assert "max_connections = '200'" in config["postgresql.conf"]
    assert "search_path = 'it''s'" in config["postgresql.conf"]
    assert config["pg_hba.conf"].index("10.0.0.0/8") < config["pg_hba.conf"].index("host all all all")
    pod = children[("StatefulsetRollout", "demo")]["spec"]["statefulSet"]["template"]
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert pod["metadata"]["labels"]["team"] == "orders"
    assert pod["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "250m"},
        "limits": {"memory": "1Gi"},
    }
    assert (
        children[("StatefulsetRollout", "demo")]["spec"]["statefulSet"][
            "persistentVolumeClaimRetentionPolicy"
        ]["whenDeleted"]
        == "Delete"
    )
    baseline = plan(PLUGIN, observed({"storage": {"size": "1Gi"}}), CATALOG, "uid")
    baseline_hash = by_kind(baseline.children)[("StatefulsetRollout", "demo")]["spec"]["statefulSet"][
        "template"
    ]["metadata"]["annotations"]
    assert (
        pod["metadata"]["annotations"]["statefleet.dev/config-hash"]
        != baseline_hash["statefleet.dev/config-hash"]
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"instances": 3}, "spec.storage: Field required"),
        (
            {"instances": 12, "storage": {"size": "1Gi"}},
            "spec.instances: Input should be less than or equal to 9",
        ),
        ({"storage": {"size": "lots"}}, "spec.storage.size: String should match pattern"),
        ({"storage": {"size": "1Gi"}, "colour": "blue"}, "spec.colour: Extra inputs are not permitted"),
        (
            {"storage": {"size": "1Gi"}, "version": "16"},
            "spec.version: '16' is not offered; offered versions: 14, 15, 17",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_applied(spec: dict, message: str) -> None:
    planned = plan(PLUGIN, observed(spec), CATALOG, "uid")
    assert not planned.apply
    ready = next(c for c in planned.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert ready["reason"] == "InvalidSpec"
    assert message in ready["message"]
    assert [e.reason for e in planned.events] == ["InvalidSpec"]
    # The same bad input again posts no second Event.
    again = plan(PLUGIN, observed(spec, status=planned.status), CATALOG, "uid")
    assert again.events == []


def existing_statefulset(size: str, storage_class: str | None = "standard") -> dict:
    claim_spec: dict = {"resources": {"requests": {"storage": size}}}
    if storage_class:
        claim_spec["storageClassName"] = storage_class
    return {"spec": {"volumeClaimTemplates": [{"spec": claim_spec}]}}


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ({"size": "512Mi"}, "spec.storage.size: shrinking the volumes from 1Gi to 512Mi would lose data"),
        (
            {"size": "1Gi", "storageClass": "fast"},
            "spec.storage.storageClass: moving the volumes from standard to fast",
        ),
    ],
)
def test_changes_that_would_lose_data_are_refused(storage: dict, message: str) -> None:
    planned = plan(
        PLUGIN, observed({"storage": storage}, statefulset=existing_statefulset("1Gi")), CATALOG, "uid"
    )
    assert not planned.apply
    ready = next(c for c in planned.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ChangeRefused"
    assert message in ready["message"]


def test_a_class_added_to_volumes_made_with_the_default_class_is_refused() -> None:
    made_with_default = existing_statefulset("1Gi", storage_class=None)
    added = plan(
        PLUGIN,
        observed({"storage": {"size": "1Gi", "storageClass": "fast"}}, statefulset=made_with_default),
        CATALOG,
        "uid",
    )
    ready = next(c for c in added.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ChangeRefused"
    assert "from the cluster's default class to fast" in ready["message"]
    # Leaving the field out keeps the volumes where they are: nothing to refuse.
    kept = plan(
        PLUGIN,
        observed({"storage": {"size": "1Gi"}}, statefulset=existing_statefulset("1Gi", "standard")),
        CATALOG,
        "uid",
    )
    assert kept.apply
    rollout = next(c for c in kept.children if c["kind"] == "StatefulsetRollout")
    assert rollout["spec"]["statefulSet"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "standard"


def test_status_roles_and_a_second_pass_change_nothing() -> None:
    spec = {"instances": 3, "storage": {"size": "1Gi"}}
    pods = [ready_pod("demo-0"), ready_pod("demo-1")]
    first = plan(PLUGIN, observed(spec, pods=pods), CATALOG, "uid")
    # No server has answered yet (no inspection): nobody is behind <name>-rw.
    assert first.operations.pod_labels == {
        "demo-0": {"statefleet.dev/role": "replica"},
        "demo-1": {"statefleet.dev/role": "replica"},
    }
    status = first.status
    assert status["currentPrimary"] == "demo-0"
    assert status["instances"] == "2/3"
    assert status["endpoints"]["rw"] == "demo-rw.apps.svc:5432"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Degraded"]["status"] == "True"
    assert [e.reason for e in first.events] == ["Ready", "CertificateIssued"]
    assert [s["metadata"]["name"] for s in first.secrets_to_apply] == ["demo-ca", "demo-tls"]
    made = {"superuser": {}, "replication": {}, "ca": {}, "tls": {}}  # exist, not read again
    second = plan(PLUGIN, observed(spec, pods=pods, status=status, secrets=made), CATALOG, "uid")
    assert not status_changed(status, second.status)
    assert second.events == []


def running_pod(name: str) -> dict:
    pod = ready_pod(name)
    pod["status"]["containerStatuses"] = [{"name": "postgres", "state": {"running": {}}}]
    return pod


def test_servers_reload_a_certificate_only_when_one_replaces_what_they_read() -> None:
    spec = {"instances": 1, "storage": {"size": "1Gi"}}
    # The first: the pods start with it (their Secret volume waits for it): nothing to reload.
    first = plan(PLUGIN, observed(spec), CATALOG, "uid", now=100.0)
    assert [e.reason for e in first.events if e.reason.startswith("Certificate")] == ["CertificateIssued"]
    assert "issuedAtSeconds" not in first.status["tls"]
    assert not [a for a in first.operations.actions if type(a).__name__ == "ReloadConfiguration"]
    # The server Secret lost while the server runs: a new one, which it reloads for a while.
    ca = next(s for s in first.secrets_to_apply if s["metadata"]["name"] == "demo-ca")
    again = plan(
        PLUGIN,
        observed(spec, status=first.status, secrets={"ca": ca}, pods=[running_pod("demo-0")]),
        CATALOG,
        "uid",
        now=200.0,
    )
    assert [s["metadata"]["name"] for s in again.secrets_to_apply] == ["demo-tls"]
    assert again.status["tls"]["issuedAtSeconds"] == 200.0
    assert has_run(running_pod("demo-0"))
    assert not has_run(ready_pod("demo-0"))
    waiting = {"status": {"containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    assert not has_run({"metadata": {"name": "demo-0"}, **waiting})


def test_a_deprecated_version_works_with_one_warning() -> None:
    spec = {"version": "14", "storage": {"size": "1Gi"}}
    first = plan(PLUGIN, observed(spec), CATALOG, "uid")
    assert first.apply
    assert [e.reason for e in first.events if e.type == "Warning"] == ["DeprecatedVersion"]
    again = plan(PLUGIN, observed(spec, status=first.status), CATALOG, "uid")
    assert [e for e in again.events if e.reason == "DeprecatedVersion"] == []


def test_a_major_version_change_is_refused_not_applied() -> None:
    running = observed(
        {"version": "17", "storage": {"size": "1Gi"}},
        statefulset=existing_statefulset("1Gi"),
        status={"version": "15"},
    )
    planned = plan(PLUGIN, running, CATALOG, "uid")
    assert not planned.apply
    ready = next(c for c in planned.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ChangeRefused"
    assert ready["message"].startswith(
        "spec.version: upgrading the data from PostgreSQL 15 to 17 needs a major upgrade"
    )


def test_children_are_reapplied_only_when_they_would_change() -> None:
    spec = {"storage": {"size": "1Gi"}}
    first = plan(PLUGIN, observed(spec), CATALOG, "uid")
    assert first.apply
    sts = {"spec": {"volumeClaimTemplates": [{"spec": {"resources": {"requests": {"storage": "1Gi"}}}}]}}
    settled = plan(PLUGIN, observed(spec, status=first.status, statefulset=sts), CATALOG, "uid")
    assert not settled.apply  # a pod or StatefulSet event: status only
    assert plan(
        PLUGIN, observed(spec, status=first.status, statefulset=sts), CATALOG, "uid", force_apply=True
    ).apply
    assert plan(PLUGIN, observed(spec, status=first.status), CATALOG, "uid").apply  # StatefulSet gone
    changed = {**spec, "parameters": {"work_mem": "64MB"}}
    assert plan(PLUGIN, observed(changed, status=first.status, statefulset=sts), CATALOG, "uid").apply


def rendered(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    planned = plan(PLUGIN, observed({"storage": {"size": "1Gi"}, **spec}, status=status), CATALOG, "uid")
    return {child["kind"]: child for child in planned.children}


def test_scaling_down_keeps_the_primary_pod_until_it_moved() -> None:
    children = rendered({"instances": 2}, {"currentPrimary": "demo-2"})
    assert children["StatefulsetRollout"]["spec"]["statefulSet"]["replicas"] == 3
    children = rendered({"instances": 2}, {"currentPrimary": "demo-0"})
    assert children["StatefulsetRollout"]["spec"]["statefulSet"]["replicas"] == 2


def test_synchronous_replication_and_the_start_script() -> None:
    children = rendered({"instances": 3, "synchronous": {"number": 1}}, {"initialized": True})
    config = children["ConfigMap"]["data"]
    assert "synchronous_standby_names = 'ANY 1 (*)'" in config["postgresql.conf"]
    assert "wal_log_hints = on" in config["postgresql.conf"]
    # Once a primary answered, no instance may create a cluster again.
    assert config["cluster-state"] == "initialized"
    assert rendered({}, {})["ConfigMap"]["data"]["cluster-state"] == "new"
    container = children["StatefulsetRollout"]["spec"]["statefulSet"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["bash", "/etc/statefleet/start.sh"]
    checked = subprocess.run(
        ["shellcheck", "-s", "bash", "-"],
        input=config["start.sh"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout


def test_a_synchronous_count_without_enough_standbys_is_invalid_naming_the_field() -> None:
    planned = plan(
        PLUGIN,
        observed({"instances": 2, "storage": {"size": "1Gi"}, "synchronous": {"number": 2}}),
        CATALOG,
        "uid",
    )
    ready = next(c for c in planned.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec"
    assert "synchronous.number: 2 synchronous standbys need at least 3 instances" in ready["message"]


def test_an_instance_made_from_a_backup_fetches_it_before_its_server_starts() -> None:
    spec = {"version": "15", "storage": {"size": "1Gi"}, "bootstrap": {"fromBackup": {"name": "nightly"}}}
    planned = plan(PLUGIN, observed(spec), CATALOG, "uid-1", tools_image="statefleet/operator:abc")
    pod = by_kind(planned.children)[("StatefulsetRollout", "demo")]["spec"]["statefulSet"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["image"] == "statefleet/operator:abc"
    assert init["command"] == ["python3", "-m", "backup"]
    env = {e["name"]: e for e in init["env"]}
    assert env["STATEFLEET_BACKUP_REQUEST"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-bootstrap",
        "key": "request",
    }
    mounts = {m["mountPath"] for m in init["volumeMounts"]}
    assert mounts == {"/var/lib/postgresql/data", "/etc/statefleet", "/tmp"}
    # An operator upgrade (another image of its own) leaves the instance's pods as they are.
    upgraded = plan(
        PLUGIN, observed(spec, status=planned.status), CATALOG, "uid-1", tools_image="statefleet/operator:def"
    )
    assert upgraded.status["childrenHash"] == planned.status["childrenHash"]
    assert upgraded.status["toolsImage"] == "statefleet/operator:abc"
    plain = plan(PLUGIN, observed({"version": "15", "storage": {"size": "1Gi"}}), CATALOG, "uid-1")
    assert (
        "initContainers"
        not in by_kind(plain.children)[("StatefulsetRollout", "demo")]["spec"]["statefulSet"]["template"][
            "spec"
        ]
    )


def test_a_physical_backup_starts_only_its_own_major_version() -> None:
    assert PLUGIN.backups.restored_spec({"instances": 2}, "15.14", "physical") == {
        "instances": 2,
        "version": "15",
    }
    with pytest.raises(ValueError, match="version 17"):
        PLUGIN.backups.restored_spec({"version": "17"}, "15.14", "physical")
    assert PLUGIN.backups.restored_spec({"version": "17"}, "15.14", "logical") == {"version": "17"}


def cert_manager_secret(
    not_after_days: int, owners: list[dict] | None = None, now: datetime | None = None
) -> dict:
    """A Secret as cert-manager writes it: annotated, with a certificate for the instance that
    expires `not_after_days` after `now` (to the second: one `now` makes the same certificate)."""
    issued = plan_tls(
        None, None, ["demo-rw"], (now or datetime.now(UTC)) - timedelta(days=90 - not_after_days)
    )
    assert issued.server is not None
    return {
        "metadata": {
            "name": "demo-tls",
            "annotations": {"cert-manager.io/certificate-name": "demo-tls"},
            "ownerReferences": owners or [],
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in issued.server.items()},
    }


def test_with_cert_manager_served_a_new_instance_gets_its_certificates_from_it() -> None:
    spec = {"instances": 2, "storage": {"size": "1Gi"}}
    first = plan(PLUGIN, observed(spec, cert_manager=True), CATALOG, "uid")
    assert first.secrets_to_apply == []  # the operator makes no certificate of its own
    objects = {(r["kind"], r["metadata"]["name"]): r for r in first.tls_resources}
    assert list(objects) == [
        ("Issuer", "demo-selfsigned"),
        ("Certificate", "demo-ca"),
        ("Issuer", "demo-ca"),
        ("Certificate", "demo-tls"),
    ]
    server = objects[("Certificate", "demo-tls")]["spec"]
    assert server["secretName"] == "demo-tls"  # what the pods mount and bindings read
    assert "demo-rw.apps.svc" in server["dnsNames"]
    assert "*.demo.apps.svc" in server["dnsNames"]
    assert server["issuerRef"]["name"] == "demo-ca"
    assert objects[("Certificate", "demo-ca")]["spec"]["isCA"] is True
    assert all(r["metadata"]["ownerReferences"][0]["uid"] == "uid" for r in first.tls_resources)
    tls = first.status["tls"]
    assert tls["provider"] == "cert-manager"
    assert "demo-tls" in tls["waiting"]
    assert "not there yet" in tls["waiting"]
    assert [e.reason for e in first.events if e.reason.startswith("Certificate")] == ["CertificatePending"]

    # Issued: the Secret is adopted, the certificate noted (the servers reload it), once.
    certificate = {
        "metadata": {"name": "demo-tls", "uid": "cert-uid"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    issued_at = datetime.now(UTC)
    secrets = {"tls": cert_manager_secret(89, now=issued_at)}
    second = plan(
        PLUGIN, observed(spec, status=first.status, secrets=secrets, certificate=certificate), CATALOG, "uid"
    )
    assert second.tls_resources == []  # applied, unchanged, and there
    assert [s["metadata"]["name"] for s in second.secrets_to_apply] == ["demo-tls"]
    # Owned by its Certificate (the instance's): gone with it, never written again after.
    (owner,) = second.secrets_to_apply[0]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Certificate", "cert-uid")
    assert "waiting" not in second.status["tls"]
    # No server has started yet: each reads this one when it starts, no reload is scheduled.
    assert "issuedAtSeconds" not in second.status["tls"]
    assert [e.reason for e in second.events if e.reason.startswith("Certificate")] == ["CertificateIssued"]
    owned = {"tls": cert_manager_secret(89, owners=[{"uid": "cert-uid"}], now=issued_at)}
    third = plan(
        PLUGIN, observed(spec, status=second.status, secrets=owned, certificate=certificate), CATALOG, "uid"
    )
    assert third.secrets_to_apply == []
    assert not [e for e in third.events if e.reason.startswith("Cert")]
    assert not status_changed(second.status, third.status)


def test_cert_manager_failing_is_said_in_status_and_a_renewal_is_noticed() -> None:
    spec = {"instances": 1, "storage": {"size": "1Gi"}}
    failing = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "Failed",
                    "message": "issuer demo-ca not ready",
                }
            ]
        }
    }
    first = plan(PLUGIN, observed(spec, cert_manager=True, certificate=failing), CATALOG, "uid")
    assert (
        first.status["tls"]["waiting"]
        == "cert-manager has not issued demo-tls: Failed: issuer demo-ca not ready"
    )
    issued = plan(
        PLUGIN, observed(spec, status=first.status, secrets={"tls": cert_manager_secret(30)}), CATALOG, "uid"
    )
    serving = [running_pod("demo-0")]
    renewed = plan(
        PLUGIN,
        observed(spec, status=issued.status, secrets={"tls": cert_manager_secret(89)}, pods=serving),
        CATALOG,
        "uid",
        now=500.0,
    )
    assert renewed.status["tls"]["notAfter"] > issued.status["tls"]["notAfter"]
    assert renewed.status["tls"]["issuedAtSeconds"] == 500.0  # the running server reloads the new one


def test_the_provider_is_chosen_once_and_kept() -> None:
    operator_made = {"metadata": {"name": "demo-tls"}, "data": {}}
    assert choose_tls_provider({}, None, served=True) == "cert-manager"
    assert choose_tls_provider({}, None, served=False) == "operator"
    # Certificates the operator made before cert-manager came stay the operator's.
    assert choose_tls_provider({}, operator_made, served=True) == "operator"
    assert choose_tls_provider({"notAfter": "x"}, None, served=True) == "operator"  # from before the choice
    assert choose_tls_provider({"provider": "cert-manager"}, None, served=False) == "cert-manager"
    # An operator-made instance stays so when cert-manager is installed later.
    made = plan(PLUGIN, observed({"instances": 1, "storage": {"size": "1Gi"}}), CATALOG, "uid")
    assert made.status["tls"]["provider"] == "operator"
    again = plan(
        PLUGIN,
        observed({"instances": 1, "storage": {"size": "1Gi"}}, status=made.status, cert_manager=True),
        CATALOG,
        "uid",
    )
    assert again.tls_resources == []
    assert again.status["tls"]["provider"] == "operator"


def test_answers_collected_under_another_primary_decide_nothing_and_are_asked_again() -> None:
    """Servers asked before the primary changed (a second operator completed a failover
    meanwhile): what they said then would start a second change. Nothing is planned on it."""
    from framework.plugin import Inspection
    from framework.servers import NO_ANSWERS
    from services.postgres.plugin import ServerFacts

    spec = {"instances": 2, "storage": {"size": "1Gi"}}
    pods = [ready_pod("demo-0"), ready_pod("demo-1")]
    status = {"initialized": True, "currentPrimary": "demo-1", "targetPrimary": None}
    stale = Inspection(
        at=0.0,
        facts=ServerFacts(NO_ANSWERS, None, {}, {}, "demo-0", frozenset()),
        answered=True,
    )
    planned = PLUGIN.operations(
        PLUGIN.spec_model.model_validate(spec),
        observed(spec, pods=pods, status=status, inspection=stale),
        0.0,
    )
    assert planned.actions == []
    assert planned.pod_labels == {}
    assert planned.status == {}
    assert planned.inspect_in == 0.0


def test_answers_collected_before_a_promotion_in_place_was_completed_decide_nothing() -> None:
    """A primary promoted again in place keeps its name: answers asked while it was a standby
    replaying its WAL (less of it than a standby has) must not start a failover once another
    operator completed the promotion (a second promotion: a timeline more)."""
    from framework.plugin import Inspection
    from framework.servers import NO_ANSWERS
    from services.postgres.plugin import ServerFacts
    from services.postgres.primary import change_mark

    spec = {"instances": 2, "storage": {"size": "1Gi"}}
    pods = [ready_pod("demo-0"), ready_pod("demo-1")]
    restarting = {
        "initialized": True,
        "currentPrimary": "demo-0",
        "targetPrimary": "demo-0",
        "failover": {"kind": "Restart", "startedAt": "2026-12-06T04:00:00Z", "promoting": "demo-0"},
    }
    completed = {
        **restarting,
        "targetPrimary": None,
        "failover": {**restarting["failover"], "completedAt": "2026-12-06T04:00:01Z"},
    }
    assert change_mark(restarting) != change_mark(completed)
    asked_then = ServerFacts(NO_ANSWERS, None, {}, {}, "demo-0", frozenset(), change=change_mark(restarting))
    planned = PLUGIN.operations(
        PLUGIN.spec_model.model_validate(spec),
        observed(
            spec, pods=pods, status=completed, inspection=Inspection(at=0.0, facts=asked_then, answered=True)
        ),
        0.0,
    )
    assert (planned.actions, planned.status, planned.inspect_in) == ([], {}, 0.0)
    # Asked under the status it is planned on: it decides.
    asked_now = replace(asked_then, change=change_mark(completed))
    planned = PLUGIN.operations(
        PLUGIN.spec_model.model_validate(spec),
        observed(
            spec, pods=pods, status=completed, inspection=Inspection(at=0.0, facts=asked_now, answered=True)
        ),
        0.0,
    )
    assert planned.status != {}
