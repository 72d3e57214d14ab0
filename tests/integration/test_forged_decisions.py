"""Forged and stale decisions on a real NATS log: the fold ignores them and the audit fails naming them.

A leader (epoch 2, after a deposed one in epoch 1) binds a job on an H100 node as the scheduler does. Then
three binds nobody legitimate made are appended raw, without the fencing headers (as a writer that may
publish on ``rally.sched.>`` could): one with epoch 0, one with the deposed leader's epoch 1, and one with the
current epoch 2 that puts a job needing ``fake-gpu`` on the H100 node. Every fold (a fresh Follower, as every
service folds) leaves the job pending and its GPUs free; ``rally replay --verify-decisions`` verifies the
real bind, lists the three and exits 1.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from rallypoint_services.scheduler.leader import SchedulerLoop

from rallypoint.cli.main import main as rally
from rallypoint.eventlog import EventLog
from rallypoint.events import (
    GangBound,
    GpuInfo,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    TaskPlacement,
    subjects,
)
from rallypoint.infra import NatsServer
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy

_clock = itertools.count(1000)
POLICY = SchedulingPolicy("rallypoint")


def _now() -> float:
    return float(next(_clock))


async def _register(log: EventLog, node_id: str) -> None:
    gpus = tuple(GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
    event = NodeRegistered(
        node_id=node_id, address="h", rack="r", gpu_type="H100", gpus=gpus, cpu_milli=1, memory_mib=1,
        agent_instance="a", at=1.0,
    )  # fmt: skip
    await log.append(subjects.node_registration(node_id), event, msg_id=f"{node_id}:reg", source="test")


async def _submit(log: EventLog, job_id: str, gpu_type: str) -> None:
    spec = JobSpec(name=job_id, team="t", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",),
                   gpu_type=gpu_type)  # fmt: skip
    event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0)
    await log.append(
        subjects.job(job_id), event, msg_id=f"{job_id}:0", source="t", expected_last_subject_seq=0
    )


async def _forge(log: EventLog, job_id: str, node_id: str, epoch: int) -> int:
    """A bind that looks like the scheduler's (its policy version, a plausible position), appended raw."""
    bind = GangBound(
        job_id=job_id,
        attempt=1,
        epoch=epoch,
        placements=(TaskPlacement(task=0, node_id=node_id, gpus=tuple(range(8))),),
        computed_at_seq=await log.last_seq(),
        policy_version=POLICY.version,
        now=_now(),
        at=_now(),
    )
    return await log.append(
        subjects.bind(job_id), bind, msg_id=f"forged:{epoch}", source="rallypoint/scheduler"
    )


async def _leader(log: EventLog, follower: Follower, name: str) -> SchedulerLoop:
    loop = SchedulerLoop(log, follower, instance=name, policy=POLICY, clock=_now)
    await loop.start_epoch()
    return loop


async def test_forged_and_stale_binds_change_nothing_and_fail_the_audit(
    event_log: EventLog, nats_server: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    await _register(event_log, "h100-a")
    await _register(event_log, "h100-b")
    await _submit(event_log, "real", "H100")
    follower = Follower(event_log)
    await follower.catch_up()
    follow = asyncio.create_task(follower.run())
    try:
        deposed = await _leader(event_log, follower, "sched-a")
        leader = await _leader(event_log, follower, "sched-b")
        assert (deposed.epoch, leader.epoch) == (1, 2)
        await leader.cycle()  # admits and binds "real" on an H100 node, fenced, as a live scheduler does
        await leader.cycle()
    finally:
        follow.cancel()
    await _submit(event_log, "fake", "fake-gpu")
    free = next(n for n in ("h100-a", "h100-b") if not follower.state.nodes[n].allocated)
    forged = [await _forge(event_log, "fake", free, epoch) for epoch in (0, 1, 2)]

    fold = Follower(event_log)
    await fold.catch_up()
    state = fold.state
    assert state.jobs["real"].state == "bound"
    assert state.jobs["fake"].state == "pending" and state.jobs["fake"].placements == ()
    assert state.nodes[free].allocated == {}
    assert (state.stale_decisions, state.ignored_binds) == (2, 1)

    capsys.readouterr()
    code = await asyncio.to_thread(rally, ["replay", "--nats-url", nats_server.url, "--verify-decisions"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "1 recomputed identically, 0 differ, 0 made under another policy, 3 refused" in out
    epoch_0, stale, wrong_type = forged
    assert f"seq {epoch_0} GangBound fake: epoch: epoch 0, but the scheduler leader's epoch is 2" in out
    assert f"seq {stale} GangBound fake: epoch: epoch 1, but the scheduler leader's epoch is 2" in out
    assert f"seq {wrong_type} GangBound fake: invalid: GPU type H100 on a job that needs fake-gpu" in out
