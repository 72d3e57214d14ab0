"""A live scheduler grows an elastic gang into idle GPUs when no job waits, as the simulator does.

The core lends idle GPUs to elastic gangs when nobody waits for GPUs (``core.elastic``); the leader used to
skip every cycle with an empty queue, so a live gang never grew then (the twin test,
tests/sim/test_twin.py, found it). Now it cycles while a launched elastic gang is below its maximum
(``scheduling.adapter.cycle_needed``), on a real NATS log, and the audit recomputes the resize.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

from rallypoint_services.scheduler.leader import SchedulerLoop

from rallypoint.audit import verify_decisions
from rallypoint.eventlog import EventLog, Recorded
from rallypoint.events import (
    Event,
    GangResized,
    GpuInfo,
    JobCompleted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    subjects,
)
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy

_ticks = itertools.count(1000)


def _clock() -> float:
    return float(next(_ticks))


async def _append(log: EventLog, subject: str, event: Event, msg_id: str) -> None:
    await log.append(subject, event, msg_id=msg_id, source="test")


async def _node(log: EventLog, node_id: str) -> None:
    gpus = tuple(GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
    event = NodeRegistered(
        node_id=node_id, address="h", rack="r0", gpu_type="sim", gpus=gpus, cpu_milli=1, memory_mib=1,
        agent_instance="a", at=1.0,
    )  # fmt: skip
    await _append(log, subjects.node_registration(node_id), event, f"{node_id}:reg")


async def _job(log: EventLog, job_id: str, *, elastic: bool) -> None:
    spec = JobSpec(
        name=job_id, team="t", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",),
        min_gpus=8 if elastic else None, max_gpus=16 if elastic else None, gpu_step=8 if elastic else None,
    )  # fmt: skip
    event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0)
    await _append(log, subjects.job(job_id), event, f"{job_id}:0:JobSubmitted")


async def _report(log: EventLog, event: JobStarted | JobCompleted) -> None:
    msg_id = f"{event.job_id}:{event.attempt}:{type(event).__name__}"
    await _append(log, subjects.job_control(event.job_id), event, msg_id)


@contextlib.asynccontextmanager
async def _leader(log: EventLog) -> AsyncIterator[SchedulerLoop]:
    follower = Follower(log)
    await follower.catch_up()
    task = asyncio.create_task(follower.run())
    loop = SchedulerLoop(log, follower, instance="s1", policy=SchedulingPolicy("rallypoint"), clock=_clock)
    try:
        await loop.start_epoch()
        yield loop
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _cycle(log: EventLog, loop: SchedulerLoop) -> int:
    await loop.follower.wait_for(await log.last_seq())
    written = await loop.cycle()
    await loop.follower.wait_for(await log.last_seq())
    return written


async def test_an_elastic_gang_grows_into_gpus_freed_while_nothing_waits(event_log: EventLog) -> None:
    async with _leader(event_log) as loop:
        for node in ("n1", "n2"):
            await _node(event_log, node)
        await _job(event_log, "fixed", elastic=False)
        await _job(event_log, "elastic", elastic=True)
        await _cycle(event_log, loop)
        state = loop.state
        assert state.jobs["fixed"].state == state.jobs["elastic"].state == "bound"
        assert state.jobs["elastic"].bound_gpus == 8  # its maximum did not fit beside the other gang
        for job_id in ("fixed", "elastic"):
            await _report(event_log, JobStarted(job_id=job_id, attempt=1, at=_clock()))
        await _report(event_log, JobCompleted(job_id="fixed", attempt=1, at=_clock()))
        assert await _cycle(event_log, loop) > 0  # nothing waits, and still a cycle: the gang can grow
        resize = loop.state.jobs["elastic"].resize
        assert resize is not None and sum(len(p.gpus) for p in resize.placements) == 16
    records = [rec async for rec in event_log.replay() if isinstance(rec, Recorded)]
    grown = [r.event for r in records if isinstance(r.event, GangResized)]
    assert [(e.job_id, e.gpus, e.reason) for e in grown] == [("elastic", 16, "grow into idle GPUs")]
    report = verify_decisions(((r.seq, r.event) for r in records), SchedulingPolicy("rallypoint"))
    assert report.ok and report.verified == 3, report  # two binds and the resize
