"""One decision writer on a real NATS: the scheduler writes a cycle's preemption requests beside its binds,
fenced on its own tree; a deposed scheduler's batch is refused whole; the preemption service writes
nothing."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

import pytest
from rallypoint_services.preemption.loop import OVERDUE_MARGIN_S, EvictionWatch
from rallypoint_services.scheduler.leader import SchedulerLoop

from rallypoint.eventlog import AppendConflict, EventLog, Recorded
from rallypoint.events import (
    GpuInfo,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    PreemptionRequested,
    subjects,
)
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy

_clock = itertools.count(1000)


def _now() -> float:
    return float(next(_clock))


async def _register(log: EventLog, node_id: str) -> None:
    gpus = tuple(GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
    event = NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack="rack-1",
        gpu_type="sim",
        gpus=gpus,
        cpu_milli=1000,
        memory_mib=1000,
        agent_instance="a",
        at=1.0,
    )
    await log.append(subjects.node_registration(node_id), event, msg_id=f"{node_id}:reg", source="test")


async def _submit(log: EventLog, job_id: str, priority: str) -> None:
    spec = JobSpec(
        name=job_id, team="t", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",), priority=priority
    )
    event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0)
    await log.append(subjects.job(job_id), event, msg_id=f"{job_id}:0:JobSubmitted", source="test")


async def _records(log: EventLog) -> list[Recorded]:
    return [rec async for rec in log.replay() if isinstance(rec, Recorded)]


@contextlib.asynccontextmanager
async def _following(log: EventLog) -> AsyncIterator[Follower]:
    follower = Follower(log)
    await follower.catch_up()
    task = asyncio.create_task(follower.run())
    try:
        yield follower
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _scheduler(log: EventLog, follower: Follower, name: str) -> SchedulerLoop:
    return SchedulerLoop(log, follower, instance=name, policy=SchedulingPolicy("rallypoint"), clock=_now)


async def _low_job_running(log: EventLog, loop: SchedulerLoop) -> None:
    """One node, filled by a preemptible job; then a production job that needs the node arrives."""
    await _register(log, "n1")
    await _submit(log, "low", "best-effort")
    await loop.follower.wait_for(await log.last_seq())
    await loop.cycle()
    await loop.follower.wait_for(await log.last_seq())
    assert loop.state.jobs["low"].state == "bound"
    await _submit(log, "prod", "production")
    await loop.follower.wait_for(await log.last_seq())


async def test_the_scheduler_writes_the_preemption_request_on_its_fenced_tree(event_log: EventLog) -> None:
    async with _following(event_log) as follower:
        loop = _scheduler(event_log, follower, "s1")
        await loop.start_epoch()
        await _low_job_running(event_log, loop)
        await loop.cycle()
        await follower.wait_for(await event_log.last_seq())
        assert follower.state.jobs["low"].preempt_for == "prod"
    requests = [r for r in await _records(event_log) if isinstance(r.event, PreemptionRequested)]
    assert len(requests) == 1
    request = requests[0]
    assert request.subject == "rally.sched.preempt.low"
    assert isinstance(request.event, PreemptionRequested)
    assert (request.event.role, request.event.epoch, request.event.for_job) == ("scheduler", 1, "prod")
    # nothing is written on the old preemption tree any more
    assert not [r for r in await _records(event_log) if r.subject.startswith("rally.preempt.")]


async def test_a_deposed_schedulers_preemption_batch_is_refused(event_log: EventLog) -> None:
    async with _following(event_log) as follower, _following(event_log) as other:
        old = _scheduler(event_log, follower, "old")
        await old.start_epoch()
        await _low_job_running(event_log, old)
        new = _scheduler(event_log, other, "new")
        assert await new.start_epoch() == 2
        await old.follower.wait_for(await event_log.last_seq())
        with pytest.raises(AppendConflict):
            await old.cycle()  # its cycle would preempt "low": the whole batch is refused
        assert not [r for r in await _records(event_log) if isinstance(r.event, PreemptionRequested)]
        await new.follower.wait_for(await event_log.last_seq())
        await new.cycle()
        await new.follower.wait_for(await event_log.last_seq())
        assert new.state.jobs["low"].preempt_for == "prod"
        assert new.state.stale_decisions == 0


async def test_the_preemption_service_follows_evictions_and_writes_nothing(event_log: EventLog) -> None:
    async with _following(event_log) as follower:
        loop = _scheduler(event_log, follower, "s1")
        await loop.start_epoch()
        await _low_job_running(event_log, loop)
        clock = [0.0]
        watch = EvictionWatch(follower, clock=lambda: clock[0], grace_s=5.0)
        assert watch.step().began == []
        await loop.cycle()
        last = await event_log.last_seq()
        await follower.wait_for(last)
        seen = watch.step()
        assert [e.job_id for e in seen.began] == ["low"]
        assert watch.step().overdue == []
        clock[0] = 5.0 + OVERDUE_MARGIN_S + 1  # past its grace: reported once
        assert [e.job_id for e in watch.step().overdue] == ["low"]
        assert watch.step().overdue == []
        assert await event_log.last_seq() == last
