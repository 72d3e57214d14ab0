"""A follower's change feed names the jobs and nodes each applied event touched, per consumer; its waiters
wake when what they wait for has happened, and only then."""

from __future__ import annotations

import asyncio

from rallypoint.eventlog import EventLog
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobCompleted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeLost,
    NodeRegistered,
    TaskPlacement,
    subjects,
)
from rallypoint.runtime.follower import Follower


def _node(node_id: str) -> NodeRegistered:
    gpus = tuple(GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(2))
    return NodeRegistered(
        node_id=node_id,
        address="-",
        rack="r",
        gpu_type="sim",
        gpus=gpus,
        cpu_milli=1,
        memory_mib=1,
        agent_instance="a",
        at=1.0,
    )


def _job(job_id: str) -> JobSubmitted:
    spec = JobSpec(name=job_id, team="t", gpus=2, gpus_per_task=2, ranks_per_task=1, command=("x",))
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=1.0)


def _bind(job_id: str, node_id: str) -> GangBound:
    places = (TaskPlacement(task=0, node_id=node_id, gpus=(0, 1)),)
    return GangBound(
        job_id=job_id,
        attempt=1,
        epoch=1,
        placements=places,
        computed_at_seq=0,
        policy_version="p",
        now=2,
        at=2,
    )


async def _append(log: EventLog, *events: Event) -> int:
    seq = 0
    for i, event in enumerate(events):
        seq = await log.append(subjects.for_event(event), event, msg_id=f"e{i}-{event!r}"[:200], source="t")
    return seq


async def test_each_consumer_takes_the_jobs_and_nodes_touched_since_its_last_take(
    event_log: EventLog,
) -> None:
    follower = Follower(event_log)
    early = follower.changes()
    await _append(event_log, LeaderEpochStarted(epoch=1, leader_id="s", at=0.0), _node("n1"), _node("n2"))
    await _append(event_log, _job("j1"))
    await follower.catch_up()
    first = early.take()
    assert first.everything  # a new consumer starts by looking at everything
    assert first.jobs == {"j1"} and first.nodes == {"n1", "n2"}
    late = follower.changes()
    late.take()
    await _append(event_log, _bind("j1", "n2"), JobStarted(job_id="j1", attempt=1, resume_step=None, at=3.0))
    await follower.catch_up()
    bound = early.take()
    # the bind changed n2's allocations; the start touched only the job
    assert (bound.jobs, bound.nodes, bound.everything) == ({"j1"}, {"n2"}, False)
    assert late.take() == bound
    assert not early.take()  # taken: empty until the next event
    await _append(
        event_log, NodeLost(node_id="n1", reason="r", at=4.0), JobCompleted(job_id="j1", attempt=1, at=5)
    )
    await follower.catch_up()
    assert early.take() == late.take()
    assert follower.state.free_gpus() == 2  # n1 lost, n2 freed


async def test_a_wait_wakes_when_its_sequence_is_applied_and_not_before(event_log: EventLog) -> None:
    first = await _append(event_log, _node("n1"))
    follower = Follower(event_log)
    await follower.catch_up()
    far = asyncio.create_task(follower.wait_for(first + 2, timeout=10.0))
    near = asyncio.create_task(follower.wait_for(first + 1, timeout=10.0))
    change = asyncio.create_task(follower.next_change(timeout=10.0))
    await follower.wait_for(first, timeout=0.1)  # applied already: returns at once
    await _append(event_log, _node("n2"))
    await follower.catch_up()
    await asyncio.wait_for(asyncio.gather(near, change), 2.0)
    assert change.result() is True
    assert not far.done()
    await _append(event_log, _node("n3"))
    await follower.catch_up()
    await asyncio.wait_for(far, 2.0)


async def test_timed_out_waits_leave_nothing_behind(event_log: EventLog) -> None:
    follower = Follower(event_log)
    for seq in range(1000, 1200):
        try:
            await follower.wait_for(seq, timeout=0.001)
        except TimeoutError:
            pass
        else:
            raise AssertionError("nothing was appended: the wait must time out")
    assert len(follower._seq_waiters) <= 130  # pruned as they pile up
    assert await follower.next_change(timeout=0.001) is False
