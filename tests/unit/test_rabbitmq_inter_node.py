"""RabbitMQ's Erlang distribution over mutual TLS: on for new clusters, what the nodes and the CLI
are started with, and the full restart that moves a running cluster (`spec.tls.interNode`)."""

from dataclasses import replace
from typing import Any

import pytest

from framework.instance_plan import plan
from framework.plugin import Inspection
from framework.rollout.spec import RolloutSpec
from services.rabbitmq import PLUGIN
from services.rabbitmq.inter_node import ERL_ARGS, template_speaks_tls
from services.rabbitmq.plugin import NodeFacts, RabbitMQTls
from services.rabbitmq.scale_down import RunCli, build_cli_job, parse_queues
from tests.unit.test_rabbitmq_plan import CATALOG, SPEC, answer, by_kind, node, observed, pod, with_answers
from tests.unit.test_rollout_plan import running
from tests.unit.test_rollout_plan import spec as web_spec

pytestmark = pytest.mark.unit

TLS_ENV = {"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", "RABBITMQ_CTL_ERL_ARGS"}


def rendered(planned: Any) -> tuple[dict, dict, dict, str]:
    """The rollout's spec, the node container's variables by name, the PDB's spec and the
    distribution's options file."""
    children = by_kind(planned.children)
    rollout = children[("StatefulsetRollout", "events")]["spec"]
    RolloutSpec.model_validate(rollout)
    container = rollout["statefulSet"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    pdb = children[("PodDisruptionBudget", "events")]["spec"]
    return rollout, env, pdb, children[("ConfigMap", "events-config")]["data"]["inter_node_tls.config"]


def statefulset(tls: bool, *, revision: str = "r1", current: str = "r1", updated: int = 3) -> dict:
    """The StatefulSet as the operator's index keeps it (of the pod template, its annotations
    only); its nodes started for `tls` or not."""
    annotations = {"statefleet.dev/config-hash": "c"}
    if tls:
        annotations["statefleet.dev/inter-node"] = "tls"
    return {
        "metadata": {"generation": 4},
        "spec": {
            "replicas": 3,
            "template": {"metadata": {"annotations": annotations}},
            "volumeClaimTemplates": [{"spec": {"resources": {"requests": {"storage": "1Gi"}}}}],
        },
        "status": {
            "observedGeneration": 4,
            "updateRevision": revision,
            "currentRevision": current,
            "updatedReplicas": updated,
            "readyReplicas": 3,
        },
    }


WHOLE = {i: answer([0, 1, 2]) for i in range(3)}
PODS = [pod(0), pod(1), pod(2)]


def made_from(revision: str, updated: int) -> list[dict]:
    """The three pods, the first `updated` made from `revision` (the others from r1)."""
    pods = [pod(i) for i in range(3)]
    for i, made in enumerate(pods):
        made["metadata"]["labels"]["controller-revision-hash"] = revision if i < updated else "r1"
    return pods


def whole_cluster(spec: dict, status: dict, sts: dict, answers: dict = WHOLE, pods: list = PODS) -> Any:
    seen = with_answers(answers, pods, statefulset=sts, status=status)
    return plan(PLUGIN, replace(seen, spec=spec), CATALOG, "uid-1", now=1.0e9)


def test_a_new_cluster_speaks_distribution_over_mutual_tls_with_the_instance_s_certificate() -> None:
    planned = plan(PLUGIN, observed(SPEC), CATALOG, "uid-1")
    rollout, env, pdb, options = rendered(planned)
    # The node and the CLI in its container (kubectl exec rabbitmqctl) alike.
    assert (
        env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
        == env["RABBITMQ_CTL_ERL_ARGS"]
        == ("-proto_dist inet_tls -ssl_dist_optfile /etc/statefleet/inter_node_tls.config")
    )
    assert planned.status["interNodeTls"] is True
    assert "interNodeChange" not in planned.status
    # What the operator reads back from its index of StatefulSets (a template's annotations).
    kept = {"spec": {"template": {"metadata": rollout["statefulSet"]["template"]["metadata"]}}}
    assert template_speaks_tls(kept) is True
    # Both ends present the certificate and verify the other's against the instance's CA.
    server, client = options.split("{client,")
    for side in (server, client):
        assert '{certfile, "/etc/statefleet-tls/tls.crt"}' in side
        assert '{keyfile, "/etc/statefleet-tls/tls.key"}' in side
        assert '{cacertfile, "/etc/statefleet-tls/ca.crt"}' in side
        assert "{verify, verify_peer}" in side
    assert "{fail_if_no_peer_cert, true}" in server
    # The nodes' names (<pod>.events-nodes.apps) against the certificate's wildcard for them.
    assert "public_key:pkix_verify_hostname_match_fun(https)" in client
    assert "server_name_indication" not in options
    assert "*.events-nodes.apps" in RabbitMQTls().hosts("events", "apps")
    assert env["RABBITMQ_NODENAME"] == "rabbit@$(POD_NAME).events-nodes.apps"
    # One node at a time as ever.
    assert rollout["strategy"]["maxUnavailable"] == 1
    assert rollout["strategy"]["hooks"]["beforeTakeDown"]
    assert pdb["maxUnavailable"] == 1


def test_a_new_cluster_may_be_made_with_plaintext_distribution() -> None:
    planned = plan(PLUGIN, observed({**SPEC, "tls": {"interNode": False}}), CATALOG, "uid-1")
    rollout, env, _, _ = rendered(planned)
    assert not TLS_ENV & set(env)
    kept = {"spec": {"template": {"metadata": rollout["statefulSet"]["template"]["metadata"]}}}
    assert template_speaks_tls(kept) is False
    assert planned.status["interNodeTls"] is False


def test_a_cluster_made_before_keeps_plaintext_until_asked() -> None:
    """An operator upgraded under a running cluster restarts no node: its StatefulSet's nodes
    speak plaintext, and so the cluster goes on."""
    planned = whole_cluster(SPEC, {"initialized": True}, statefulset(False))
    rollout, env, _, _ = rendered(planned)
    assert not TLS_ENV & set(env)
    assert planned.status["interNodeTls"] is False
    assert rollout["strategy"]["maxUnavailable"] == 1
    assert not [e for e in planned.operations.events if e.reason.startswith("InterNode")]
    # And the recorded choice stands on later passes, whatever the StatefulSet shows.
    again = whole_cluster(SPEC, {"initialized": True, "interNodeTls": False}, statefulset(True))
    assert not TLS_ENV & set(rendered(again)[1])


def test_moving_a_running_cluster_restarts_every_node_at_once_and_keeps_the_choice_once_done() -> None:
    spec = {**SPEC, "tls": {"interNode": True}}
    status = {"initialized": True, "interNodeTls": False}
    started = whole_cluster(spec, status, statefulset(False))
    rollout, env, pdb, _ = rendered(started)
    assert env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] == ERL_ARGS
    # Every node at once: a node speaking TLS cannot reach one speaking plaintext.
    assert rollout["strategy"]["maxUnavailable"] == "100%"
    assert "hooks" not in rollout["strategy"]
    assert pdb["maxUnavailable"] == "100%"
    change = started.status["interNodeChange"]
    assert (change["to"], change["phase"]) == (True, "Restarting")
    assert started.status["interNodeTls"] is False  # not yet: until every node is back
    (event,) = [e for e in started.operations.events if e.reason == "InterNodeRestart"]
    assert event.type == "Warning"
    assert event.message.startswith("spec.tls.interNode: restarting every node at once")

    # Under way: the StatefulSet has the new template, not every pod runs it yet.
    status = {
        k: v for k, v in started.status.items() if k in ("initialized", "interNodeTls", "interNodeChange")
    }
    midway = whole_cluster(
        spec, status, statefulset(True, revision="r2", current="r1", updated=1), pods=made_from("r2", 1)
    )
    rollout, _, pdb, _ = rendered(midway)
    assert rollout["strategy"]["maxUnavailable"] == "100%"
    assert midway.status["interNodeChange"]["startedAt"] == change["startedAt"]
    ready = next(c for c in midway.status["conditions"] if c["type"] == "Ready")
    assert "restarting every node at once for distribution over TLS" in ready["message"]

    # Every pod runs it, every node ready in one cluster: done, one node at a time again. (The
    # StatefulSet's currentRevision stays behind: the rollout controller moves its partition.)
    done = whole_cluster(
        spec, status, statefulset(True, revision="r2", current="r1"), pods=made_from("r2", 3)
    )
    rollout, env, pdb, _ = rendered(done)
    assert done.status["interNodeTls"] is True
    assert "interNodeChange" not in done.status
    assert rollout["strategy"]["maxUnavailable"] == 1
    assert rollout["strategy"]["hooks"]["beforeTakeDown"]
    assert pdb["maxUnavailable"] == 1
    assert env["RABBITMQ_CTL_ERL_ARGS"] == ERL_ARGS
    assert "InterNodeRestarted" in [e.reason for e in done.operations.events]


def test_the_restart_waits_for_a_whole_cluster_and_holds_a_scale_down_back() -> None:
    spec = {**SPEC, "tls": {"interNode": True}}
    status = {"initialized": True, "interNodeTls": False}
    one_down = {0: answer([0, 1], [2]), 1: answer([0, 1], [2]), 2: None}
    waiting = whole_cluster(spec, status, statefulset(False), one_down, [pod(0), pod(1), pod(2, ready=False)])
    rollout, env, pdb, _ = rendered(waiting)
    assert pdb["maxUnavailable"] == 1
    assert not TLS_ENV & set(env)  # nothing restarts yet
    assert rollout["strategy"]["maxUnavailable"] == 1
    change = waiting.status["interNodeChange"]
    assert change["phase"] == "Waiting"
    assert change["message"] == (
        "spec.tls.interNode: distribution over TLS needs every node restarted at once; "
        "waiting until every node runs in one cluster"
    )
    # Said once, not on every pass.
    status = {**status, "interNodeChange": change}
    again = whole_cluster(spec, status, statefulset(False), one_down, [pod(0), pod(1), pod(2, ready=False)])
    assert "InterNodeWaiting" not in [e.reason for e in again.operations.events]
    # Set back: nothing to wait for.
    back = whole_cluster(SPEC, status, statefulset(False))
    assert "interNodeChange" not in back.status

    # A scale-down asked while every node restarts waits for the restart: refused, naming both.
    restarting = {**status, "interNodeChange": {"to": True, "phase": "Restarting"}}
    refused = whole_cluster({**spec, "replicas": 1}, restarting, statefulset(True, revision="r2", updated=0))
    ready = next(c for c in refused.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ChangeRefused"
    assert ready["message"] == (
        "spec.replicas: scaling down from 3 to 1 nodes waits until the full restart for "
        "spec.tls.interNode is over; or set spec.replicas back to 3"
    )
    assert "scaleDown" not in refused.status


def test_the_scale_down_s_cli_jobs_speak_what_the_cluster_speaks() -> None:
    status = {"initialized": True, "interNodeTls": True}
    started = whole_cluster({**SPEC, "replicas": 1}, status, statefulset(True))
    assert started.status["scaleDown"]["phase"] == "MovingQueues"
    # A quorum queue with members on the leaving nodes: a Job moves them, over TLS.
    queue = {"name": "q", "vhost": "/", "type": "quorum", "members": [node(0), node(1), node(2)]}
    seen = with_answers(WHOLE, PODS, statefulset=statefulset(True), status={**status, **started.status})
    facts = NodeFacts(seen.inspection.facts.nodes, queues=parse_queues([queue]))
    seen = replace(
        seen, spec={**SPEC, "replicas": 1}, inspection=Inspection(at=1.0, facts=facts, answered=True)
    )
    moving = plan(PLUGIN, seen, CATALOG, "uid-1", now=1.0e9)
    (run,) = [a for a in moving.operations.actions if isinstance(a, RunCli)]
    assert run.inter_node_tls is True
    assert run.calls[0][1] == "rabbitmq-queues"
    job = dict(
        job="events-scale-down-1",
        namespace="apps",
        instance="events",
        image="rmq:3",
        script="true",
        cookie_secret="events-erlang-cookie",
        labels={"app.kubernetes.io/instance": "events"},
        owner={"kind": "RabbitMQ", "name": "events"},
    )
    built = build_cli_job(**job, inter_node_tls=True)["spec"]["template"]["spec"]
    (container,) = built["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RABBITMQ_CTL_ERL_ARGS"] == ERL_ARGS
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/etc/statefleet"] == "config"
    assert mounts["/etc/statefleet-tls"] == "tls"
    volumes = {v["name"]: v for v in built["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "events-config"
    assert volumes["tls"]["secret"] == {"secretName": "events-tls", "defaultMode": 0o440}
    assert built["securityContext"]["fsGroup"] == 999  # the key is readable by group rabbitmq
    plain = build_cli_job(**job)["spec"]["template"]["spec"]["containers"][0]
    assert "RABBITMQ_CTL_ERL_ARGS" not in {e["name"] for e in plain["env"]}


def test_reads_what_a_statefulset_starts_its_nodes_with() -> None:
    assert template_speaks_tls(None) is None
    assert template_speaks_tls(statefulset(False)) is False
    assert template_speaks_tls(statefulset(True)) is True


def test_the_full_restart_s_strategy_takes_every_node_down_in_one_batch() -> None:
    """The rendered strategy through the rollout's planner (its StatefulSet controller model):
    all three pods go at once, where a configuration change takes them one by one."""
    status = {"initialized": True, "interNodeTls": False}
    moving = whole_cluster({**SPEC, "tls": {"interNode": True}}, status, statefulset(False))
    settled = whole_cluster(SPEC, status, statefulset(False))
    for planned, most in ((moving, 3), (settled, 1)):
        strategy = {k: v for k, v in rendered(planned)[0]["strategy"].items() if k != "hooks"}
        cluster = running(web_spec(replicas=3))
        cluster.run({**web_spec("web:2", replicas=3), "strategy": strategy}, 60)
        assert cluster.images() == ["web:2"] * 3
        assert cluster.most_down == most
