"""Forged node facts on a real NATS log: no fold believes them and the audit fails naming each one.

A leader binds a 2-node gang as the scheduler does and the job controller's JobStarted follows. Then facts
nobody entitled wrote are appended raw (as an identity that slipped past the permissions, or the admin):
a rank exit reported by a node that does not run that rank, a NodeLost on the node agent's registration
subject, and a NodeLost on the health monitor's subject with no heartbeat lost before it. No fold counts the
exit or the misplaced verdict; ``rally replay --verify-decisions`` verifies the real bind and exits 1 naming
each forged event.
"""

from __future__ import annotations

import asyncio

import pytest
from test_forged_decisions import _leader, _now, _register  # this folder is on sys.path

from rallypoint.cli.main import main as rally
from rallypoint.eventlog import EventLog
from rallypoint.events import JobSpec, JobStarted, JobSubmitted, NodeLost, RankExited, subjects
from rallypoint.infra import NatsServer
from rallypoint.runtime.follower import Follower


async def _running_gang(log: EventLog) -> tuple[str, str]:
    """A 16-GPU gang bound and started on two nodes; (the node of rank 0, the node of rank 1)."""
    for node_id in ("n1", "n2"):
        await _register(log, node_id)
    spec = JobSpec(name="gang", team="t", gpus=16, gpus_per_task=8, ranks_per_task=1, command=("true",))
    submitted = JobSubmitted(job_id="gang", spec=spec, submitted_at=2.0)
    await log.append(subjects.job("gang"), submitted, msg_id="gang:0", source="t")
    follower = Follower(log)
    await follower.catch_up()
    follow = asyncio.create_task(follower.run())
    try:
        leader = await _leader(log, follower, "sched")
        await leader.cycle()
        await leader.cycle()
    finally:
        follow.cancel()
    started = JobStarted(job_id="gang", attempt=1, at=_now())
    await log.append(subjects.job_control("gang"), started, msg_id="gang:1:started", source="t")
    await follower.catch_up()
    by_task = {p.task: p.node_id for p in follower.state.jobs["gang"].placements}
    return by_task[0], by_task[1]


async def test_forged_node_facts_change_nothing_and_fail_the_audit_by_name(
    event_log: EventLog, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = await _running_gang(event_log)
    exit_of_other = RankExited(job_id="gang", attempt=1, rank=1, node_id=first, exit_code=1, at=_now())
    lost = NodeLost(node_id=second, reason="forged", at=_now())
    forged = {
        "foreign exit": await event_log.append(
            subjects.agent_job(first, "gang"), exit_of_other, msg_id="f1", source="t"
        ),
        "agent verdict": await event_log.append(
            subjects.node_registration(second), lost, msg_id="f2", source="t"
        ),
        "unheard loss": await event_log.append(subjects.node_health(second), lost, msg_id="f3", source="t"),
    }

    fold = Follower(event_log)
    await fold.catch_up()
    gang = fold.state.jobs["gang"]
    assert gang.state == "running" and gang.ranks_exited == {}
    assert fold.state.foreign_exits == 1
    # the loss on the monitor's own subject is applied (the monitor is the writer there), and the audit
    # names it as against the monitor's rules: a node is lost only after its heartbeat was
    assert fold.state.nodes[second].status == "lost"

    capsys.readouterr()
    code = await asyncio.to_thread(rally, ["replay", "--nats-url", nats_server.url, "--verify-decisions"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "writers: 3 event(s) not their writer's" in out
    assert (
        f"seq {forged['foreign exit']} RankExited.v1: node {first} does not run rank 1 of gang attempt 1"
        in out
    )
    assert f"seq {forged['agent verdict']} NodeLost.v1 on rally.node.{second}.agent:" in out
    assert (
        f"seq {forged['unheard loss']} NodeLost.v1: node {second} lost without its heartbeat lost first"
        in out
    )
    assert "  gang attempt 1" in out
