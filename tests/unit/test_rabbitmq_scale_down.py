"""Scaling RabbitMQ down: which replicas move where, when it is refused, the steps a
scale-down goes through (kept in status), and the script its Jobs run."""

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.rabbitmq.cluster import node_name
from services.rabbitmq.scale_down import (
    FORGETTING,
    MAX_CALLS,
    MOVING,
    STOPPING,
    DeleteJob,
    JobReport,
    Queue,
    RunCli,
    cli_script,
    parse_queues,
    plan_moves,
    step,
)

pytestmark = pytest.mark.unit


def node(i: int) -> str:
    return node_name(f"events-{i}", "events", "apps")


def quorum(name: str, *members: int, vhost: str = "/") -> dict[str, Any]:
    return {
        "name": name,
        "vhost": vhost,
        "type": "quorum",
        "leader": node(members[0]),
        "members": [node(m) for m in members],
        "messages": 10,
        "durable": True,
    }


def classic(name: str, on: int, messages: int = 0, durable: bool = True, exclusive: bool = False) -> dict:
    return {
        "name": name,
        "vhost": "/",
        "type": "classic",
        "node": node(on),
        "messages": messages,
        "durable": durable,
        "exclusive": exclusive,
    }


LEAVING, REMAINING = [node(3), node(4)], [node(0), node(1), node(2)]


def test_a_quorum_queue_gets_new_members_before_it_loses_the_leaving_ones() -> None:
    moves = plan_moves(parse_queues([quorum("orders", 0, 3, 4)]), LEAVING, REMAINING)
    assert moves.commands == (
        ("rabbitmq-queues", "add_member", "--vhost", "/", "orders", node(1)),
        ("rabbitmq-queues", "add_member", "--vhost", "/", "orders", node(2)),
        ("rabbitmq-queues", "delete_member", "--vhost", "/", "orders", node(3)),
        ("rabbitmq-queues", "delete_member", "--vhost", "/", "orders", node(4)),
    )
    assert moves.replicas_moved == 2
    assert moves.refusal is None


def test_a_queue_on_every_node_keeps_as_many_members_as_nodes_remain() -> None:
    moves = plan_moves(parse_queues([quorum("all", 0, 1, 2, 3, 4)]), LEAVING, REMAINING)
    assert [c[1] for c in moves.commands] == ["delete_member", "delete_member"]


def test_new_members_go_to_the_nodes_holding_the_fewest() -> None:
    queues = parse_queues([quorum("a", 0, 1, 3), quorum("b", 0, 1, 4), quorum("c", 2, 3, 4)])
    adds = [c for c in plan_moves(queues, LEAVING, REMAINING).commands if c[1] == "add_member"]
    # a and b each need one: node 2 holds one member, nodes 0 and 1 two; then c needs two.
    assert [(c[4], c[5]) for c in adds] == [
        ("a", node(2)),
        ("b", node(2)),
        ("c", node(0)),
        ("c", node(1)),
    ]


def test_streams_move_with_their_own_tool_and_other_vhosts_are_named() -> None:
    stream = {**quorum("log", 3, 0, 1, vhost="billing"), "type": "stream"}
    assert plan_moves(parse_queues([stream]), LEAVING, REMAINING).commands == (
        ("rabbitmq-streams", "add_replica", "--vhost", "billing", "log", node(2)),
        ("rabbitmq-streams", "delete_replica", "--vhost", "billing", "log", node(3)),
    )


def test_classic_queues_that_would_be_lost_refuse_the_scale_down_naming_them() -> None:
    queues = parse_queues(
        [
            classic("jobs", on=4, messages=3),
            classic("empty-durable", on=3),
            classic("elsewhere", on=0, messages=9),
            classic("transient", on=3, durable=False),
            classic("exclusive", on=3, messages=1, exclusive=True),
            quorum("orders", 0, 3, 4),
        ]
    )
    moves = plan_moves(queues, LEAVING, REMAINING)
    assert moves.commands == ()
    assert not moves.done
    assert moves.refusal == (
        "classic queues live only on the leaving nodes and would be lost: empty-durable on events-3 "
        "(0 messages), jobs on events-4 (3 messages); drain and delete them (or make them quorum "
        "queues) first"
    )


def test_nothing_on_the_leaving_nodes_is_done() -> None:
    queues = parse_queues([quorum("orders", 0, 1, 2), classic("local", on=1, messages=5)])
    assert plan_moves(queues, LEAVING, REMAINING).done


def go(**given: Any) -> Any:
    arguments: dict[str, Any] = {
        "name": "events",
        "wanted": 3,
        "running": 5,
        "state": None,
        "pods": [f"events-{i}" for i in range(5)],
        "members": [node(i) for i in range(5)],
        "queues": None,
        "job": None,
        "node": lambda pod: node_name(pod, "events", "apps"),
        "now": 1000.0,
    }
    return step(**{**arguments, **given})


def test_a_scale_down_from_start_to_end() -> None:
    assert go(running=3).state is None
    assert go(running=3).replicas == 3

    started = go()
    assert started.state["phase"] == MOVING
    assert started.replicas == 5
    assert started.events[0][1] == "ScalingDown"
    assert go(state=started.state).replicas == 5  # the queues are not known yet: wait

    queues = [Queue("/", "orders", "quorum", node(0), (node(0), node(3), node(4)), 10, True, False)]
    moving = go(state=started.state, queues=queues)
    (run,) = moving.actions
    assert isinstance(run, RunCli)
    assert run.job == "events-scale-down-1"
    assert run.calls[0] == (node(0), "rabbitmq-queues", "add_member", "--vhost", "/", "orders", node(1))
    assert moving.replicas == 5
    # An inspection from before the Job, or with the Job running, changes nothing.
    assert go(state=moving.state, queues=queues).actions == ()
    running_job = JobReport("events-scale-down-1", "Running")
    assert go(state=moving.state, queues=queues, job=running_job).actions == ()
    moved = [Queue("/", "orders", "quorum", node(0), (node(0), node(1), node(2)), 10, True, False)]
    finished = go(state=moving.state, queues=moved, job=JobReport("events-scale-down-1", "Succeeded"))
    assert finished.actions == (DeleteJob("events-scale-down-1"),)
    assert "job" not in finished.state

    # Nothing left on them: the leaving nodes are drained, and the queues listed once more.
    draining = go(state=finished.state, queues=moved)
    (run,) = draining.actions
    assert run.calls == ((node(3), "rabbitmq-upgrade", "drain"), (node(4), "rabbitmq-upgrade", "drain"))
    drained = go(state=draining.state, queues=moved, job=JobReport(run.job, "Succeeded"))
    assert drained.state["drained"] == [node(3), node(4)]
    # A queue put there meanwhile: the nodes are revived (its replicas there were stopped), then it moves.
    late = [*moved, Queue("/", "late", "quorum", node(3), (node(3), node(4), node(0)), 0, True, False)]
    (revive,) = go(state=drained.state, queues=late).actions
    assert revive.calls == ((node(3), "rabbitmq-upgrade", "revive"), (node(4), "rabbitmq-upgrade", "revive"))
    finished = drained

    stopping = go(state=finished.state, queues=moved)
    assert stopping.state["phase"] == STOPPING
    assert stopping.replicas == 3
    assert stopping.events[0][1] == "QueuesMoved"
    # The pods of the leaving nodes still exist: wait, whatever spec.replicas says now.
    assert go(state=stopping.state, running=3, wanted=5).state["phase"] == STOPPING
    forgetting = go(state=stopping.state, running=3, pods=["events-0", "events-1", "events-2"])
    assert forgetting.state["phase"] == FORGETTING

    forget = go(state=forgetting.state, running=3, pods=["events-0", "events-1", "events-2"])
    (run,) = forget.actions
    assert run.calls == (
        (node(0), "rabbitmqctl", "forget_cluster_node", node(3)),
        (node(0), "rabbitmqctl", "forget_cluster_node", node(4)),
    )
    assert run.job == "events-scale-down-3"
    done = go(
        state={**forget.state, "job": None},
        running=3,
        pods=["events-0", "events-1", "events-2"],
        members=[node(0), node(1), node(2)],
    )
    assert done.state is None
    assert done.replicas == 3
    assert done.events == (("Normal", "ScaledDown", "scaled down from 5 to 3 nodes"),)


def test_a_big_move_goes_in_several_jobs() -> None:
    many = [
        Queue("/", f"q{i:04d}", "quorum", node(3), (node(3), node(4), node(0)), 0, True, False)
        for i in range(200)
    ]
    state = {"from": 5, "to": 3, "phase": MOVING, "jobs": 1}
    (run,) = go(state=state, queues=many).actions
    assert len(run.calls) == MAX_CALLS
    assert {call[2] for call in run.calls} == {"add_member"}  # every addition before any removal


def test_a_failed_job_is_tried_again_later_from_the_queues_as_they_are() -> None:
    state = {
        "from": 5,
        "to": 3,
        "phase": MOVING,
        "jobs": 2,
        "drained": [node(3), node(4)],
        "job": "events-scale-down-2",
        "purpose": "move",
    }
    failed = go(state=state, job=JobReport("events-scale-down-2", "Failed", "add_member: timeout"), queues=[])
    assert failed.actions == (DeleteJob("events-scale-down-2"),)
    assert failed.state["retryAt"] == 1015.0
    assert failed.state["failures"] == 1
    assert failed.events[0][:2] == ("Warning", "ScaleDownStepFailed")
    assert "add_member: timeout" in failed.state["message"]
    assert go(state=failed.state, queues=[]).state["phase"] == MOVING  # not before retryAt
    later = go(state=failed.state, queues=[], now=1016.0)
    assert later.state["phase"] == STOPPING
    assert "retryAt" in later.state  # cleared by the next Job that succeeds
    # A refusal is not held back by a retry time.
    stuck = go(state=failed.state, queues=parse_queues([classic("jobs", on=4, messages=1)]))
    assert stuck.refusal is not None
    gone = go(state=state, job=JobReport("events-scale-down-2", "Missing"))
    assert "the Job is gone" in gone.state["message"]
    succeeded = go(
        state={**failed.state, "job": "events-scale-down-3", "purpose": "move"},
        job=JobReport("events-scale-down-3", "Succeeded"),
    )
    assert "retryAt" not in succeeded.state
    assert "failures" not in succeeded.state


def test_a_scale_down_is_cancelled_while_the_queues_move_and_the_drained_nodes_revived() -> None:
    state = {"from": 5, "to": 3, "phase": MOVING, "jobs": 1}
    cancelled = go(state=state, wanted=5)
    assert cancelled.state is None
    assert cancelled.replicas == 5
    drained = {**state, "drained": [node(3), node(4)]}
    reviving = go(state=drained, wanted=5)
    (run,) = reviving.actions
    assert run.calls == ((node(3), "rabbitmq-upgrade", "revive"), (node(4), "rabbitmq-upgrade", "revive"))
    assert reviving.replicas == 5
    revived = go(state=reviving.state, wanted=5, job=JobReport(run.job, "Succeeded"))
    done = go(state=revived.state, wanted=5)
    assert done.state is None
    assert done.events[0][1] == "ScaleDownCancelled"
    deeper = go(state=state, wanted=1, queues=[])
    assert deeper.state["to"] == 1
    assert deeper.actions[0].calls[0] == (node(1), "rabbitmq-upgrade", "drain")
    # Fewer nodes still once two were drained: those are revived first, then all four drained.
    (revive,) = go(state=drained, wanted=1, queues=[]).actions
    assert [call[2] for call in revive.calls] == ["revive", "revive"]


def test_a_refused_scale_down_keeps_every_node() -> None:
    refused = go(state=go().state, queues=parse_queues([classic("jobs", on=4, messages=3)]))
    assert refused.replicas == 5
    assert refused.actions == ()
    assert refused.refusal.startswith("spec.replicas: scaling down from 5 to 3 nodes would lose data")
    assert refused.refusal.endswith("or set spec.replicas back to 5")


def fake_tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_script(script: str, folder: Path) -> tuple[int, str]:
    # The Job writes its report to /dev/termination-log; here to a file of the test's own.
    log = folder / "termination-log"
    script = script.replace("/dev/termination-log", str(log))
    env = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False)
    return done.returncode, log.read_text()


def test_the_job_script_runs_each_call_against_the_target_and_reports(tmp_path: Path) -> None:
    fake_tool(tmp_path, "rabbitmq-queues", f'echo "$*" >> {tmp_path}/calls')
    calls = ((node(0), "rabbitmq-queues", "add_member", "--vhost", "a b", "q'1", node(1)),)
    code, report = run_script(cli_script(calls), tmp_path)
    assert code == 0
    assert json.loads(report) == {"result": {"calls": 1}}
    assert (tmp_path / "calls").read_text() == (
        f"-n {node(0)} --longnames add_member --vhost a b q'1 {node(1)}\n"
    )


def test_the_job_script_stops_at_the_first_failure_and_says_why_in_json(tmp_path: Path) -> None:
    fake_tool(tmp_path, "rabbitmq-queues", 'echo "Error: {\\"not_found\\", \\\\ back}"; exit 69')
    fake_tool(tmp_path, "rabbitmqctl", f"touch {tmp_path}/ran")
    calls = (
        (node(0), "rabbitmq-queues", "delete_member", "--vhost", "/", "orders", node(3)),
        (node(0), "rabbitmqctl", "forget_cluster_node", node(3)),
    )
    code, report = run_script(cli_script(calls), tmp_path)
    assert code == 1
    assert not (tmp_path / "ran").exists()
    error = json.loads(report)["error"]
    assert error["reason"] == "CommandFailed"
    assert error["message"].startswith(f"rabbitmq-queues -n {node(0)} --longnames delete_member")
    assert error["message"].endswith('Error: {"not_found", \\ back}')
