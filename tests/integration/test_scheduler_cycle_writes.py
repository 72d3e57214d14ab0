"""What one live scheduler cycle writes, on a real NATS log, and that the audit still agrees.

A cycle's admissions (``JobQueued``) ride after its decisions in the same fenced write, for the jobs it does
not bind (a bind admits); a rejection is
written and folded before the decisions are computed. Across cycles the model follows only what the fold
touched (jobs ending, new ones arriving), and ``verify_decisions`` recomputes every bind from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

import msgspec
from prometheus_client import REGISTRY
from rallypoint_services.scheduler.leader import SchedulerLoop

from rallypoint.audit import verify_decisions
from rallypoint.eventlog import EventLog, Recorded
from rallypoint.events import (
    GangBound,
    GangsBound,
    GpuInfo,
    JobCompleted,
    JobQueued,
    JobRejected,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
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
        node_id=node_id, address="h", rack=f"rack-{node_id[-1]}", gpu_type="sim", gpus=gpus, cpu_milli=1000,
        memory_mib=1000, agent_instance="a", at=1.0,
    )  # fmt: skip
    await log.append(subjects.node_registration(node_id), event, msg_id=f"{node_id}:reg", source="test")


async def _submit(log: EventLog, job_id: str, gpus: int) -> None:
    spec = JobSpec(
        name=job_id, team="t", gpus=gpus, gpus_per_task=min(gpus, 8), ranks_per_task=1, command=("true",)
    )
    event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0)
    await log.append(subjects.job(job_id), event, msg_id=f"{job_id}:0:JobSubmitted", source="test")


async def _finish(log: EventLog, job_id: str, attempt: int) -> None:
    for event in (
        JobStarted(job_id=job_id, attempt=attempt, at=_now()),
        JobCompleted(job_id=job_id, attempt=attempt, at=_now()),
    ):
        await log.append(
            subjects.job_control(job_id), event, msg_id=f"{job_id}:{type(event).__name__}", source="t"
        )


async def _records(log: EventLog) -> list[Recorded]:
    return [rec async for rec in log.replay() if isinstance(rec, Recorded)]


@contextlib.asynccontextmanager
async def _leading(log: EventLog) -> AsyncIterator[SchedulerLoop]:
    follower = Follower(log)
    await follower.catch_up()
    task = asyncio.create_task(follower.run())
    loop = SchedulerLoop(log, follower, instance="s1", policy=SchedulingPolicy("rallypoint"), clock=_now)
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


async def test_admissions_ride_after_the_decisions_in_the_same_write(event_log: EventLog) -> None:
    async with _leading(event_log) as loop:
        for n in ("n1", "n2"):
            await _register(event_log, n)
        for k in range(3):
            await _submit(event_log, f"j{k}", 8)
        # three messages: the two binds in one GangsBound, then j2's pending reason and its admission
        assert await _cycle(event_log, loop) == 3
        state = loop.state
        assert all(state.jobs[f"j{k}"].state == "bound" for k in range(2))
        assert all(state.jobs[f"j{k}"].queue == "t" for k in range(3))  # the bound two: by their bind
    records = await _records(event_log)
    assert sum(isinstance(r.event, GangsBound) for r in records) == 1
    cycle = [
        (r.seq, e) for r in records for e in subjects.members(r.event) if isinstance(e, GangBound | JobQueued)
    ]
    kinds = [(type(e).__name__, e.job_id) for _, e in cycle]
    # the job that waits is admitted after the decisions; the two bound need no JobQueued of their own
    assert kinds == [("GangBound", "j0"), ("GangBound", "j1"), ("JobQueued", "j2")], kinds
    # one write: contiguous sequences (pending reasons between), decided on the fold before any of them
    binds = [e for _, e in cycle if isinstance(e, GangBound)]
    assert all(b.computed_at_seq < cycle[0][0] for b in binds)
    report = verify_decisions(((r.seq, r.event) for r in records), SchedulingPolicy("rallypoint"))
    assert report.ok and report.verified == 2, report


async def test_the_leader_times_and_counts_its_writes_and_not_an_idle_cycle(event_log: EventLog) -> None:
    def counted() -> tuple[float, float]:
        return (
            REGISTRY.get_sample_value("rally_scheduler_write_seconds_count") or 0.0,
            REGISTRY.get_sample_value("rally_scheduler_events_written_total") or 0.0,
        )

    async with _leading(event_log) as loop:
        await _register(event_log, "n1")
        await _submit(event_log, "j0", 8)
        writes, events = counted()
        written = await _cycle(event_log, loop)
        assert written >= 1 and counted() == (writes + 1, events + written)  # one write: the bind (it admits)
        assert await _cycle(event_log, loop) == 0
        assert counted() == (writes + 1, events + written), "a cycle with nothing to write is not a write"


async def test_a_rejection_is_folded_before_the_cycle_decides(event_log: EventLog) -> None:
    async with _leading(event_log) as loop:
        await _register(event_log, "n1")
        await _submit(event_log, "huge", 64)
        await _submit(event_log, "fits", 8)
        await _cycle(event_log, loop)
        assert loop.state.jobs["huge"].state == "rejected"
        assert loop.state.jobs["fits"].state == "bound"
    records = await _records(event_log)
    rejected = next(r for r in records if isinstance(r.event, JobRejected))
    bind = next(r.event for r in records if isinstance(r.event, GangBound))
    assert bind.computed_at_seq >= rejected.seq


async def test_cycles_on_a_changing_fold_sync_only_what_it_touched_and_agree_with_the_audit(
    event_log: EventLog,
) -> None:
    """Beside the loop, a second policy follows its own change feed of the same follower and must decide
    on it, at every cycle, byte for byte as a model built from scratch."""
    async with _leading(event_log) as loop:
        beside = SchedulingPolicy("rallypoint")
        feed = loop.follower.changes()

        async def cycle_and_compare() -> None:
            await _cycle(event_log, loop)
            now = _now()
            live = beside.decide_live(loop.state, now, changed=feed.take())
            assert msgspec.json.encode(live) == msgspec.json.encode(beside.decide(loop.state, now))

        for n in ("n1", "n2", "n3"):
            await _register(event_log, n)
        for k in range(8):
            await _submit(event_log, f"a{k}", 4)
        await cycle_and_compare()
        for round_ in range(3):
            bound = sorted(j.job_id for j in loop.state.jobs.values() if j.state == "bound")
            for job_id in bound[:2]:
                await _finish(event_log, job_id, loop.state.jobs[job_id].attempt)
            for k in range(3):
                await _submit(event_log, f"r{round_}-{k}", (1, 2, 8)[k])
            await cycle_and_compare()
        # the first sync compares everything (a feed's first take); every later one only the touched
        for counts in (loop.policy.model_sync.counts, beside.model_sync.counts):
            assert counts.syncs == 4 and counts.incremental == 3 and counts.rebuilds == 1, counts
        assert beside.model_sync.counts.unbinds == 6
    records = await _records(event_log)
    report = verify_decisions(((r.seq, r.event) for r in records), SchedulingPolicy("rallypoint"))
    binds = sum(isinstance(e, GangBound) for r in records for e in subjects.members(r.event))
    assert binds > 6
    assert report.ok and report.verified == binds, report


async def test_back_to_back_cycles_never_admit_a_job_twice(event_log: EventLog) -> None:
    """As ``lead`` runs them: the next cycle starts as soon as the last one returns. Its admissions must see
    the previous cycle's, folded: an atomic batch repeating a stored message id is refused whole, which a
    leader takes for a newer leader's fence."""
    async with _leading(event_log) as loop:
        await _register(event_log, "n1")
        for k in range(400):
            await _submit(event_log, f"w{k:03d}", 8)
        await loop.follower.wait_for(await event_log.last_seq())
        for _ in range(3):
            await loop.cycle()  # raises AppendConflict if it wrote a JobQueued already stored
        await loop.follower.wait_for(await event_log.last_seq())
        assert sum(j.state == "bound" for j in loop.state.jobs.values()) == 1
        assert all(j.queue == "t" for j in loop.state.jobs.values())
    queued = [r for r in await _records(event_log) if isinstance(r.event, JobQueued)]
    assert len(queued) == 399  # each once; the one bound by the cycle that first saw it, none


async def test_a_warmed_up_standby_builds_no_model_in_its_first_cycle(event_log: EventLog) -> None:
    for n in ("n1", "n2"):
        await _register(event_log, n)
    for k in range(3):
        await _submit(event_log, f"s{k}", 8)
    follower = Follower(event_log)
    await follower.catch_up()
    task = asyncio.create_task(follower.run())
    try:
        loop = SchedulerLoop(
            event_log, follower, instance="s1", policy=SchedulingPolicy("rallypoint"), clock=_now
        )
        loop.warm_up()  # as the service does before campaigning
        counts = loop.policy.model_sync.counts
        assert (counts.rebuilds, counts.incremental) == (1, 0)
        await _submit(event_log, "late", 8)  # the fold moves on while it stands by
        await loop.start_epoch()
        await _cycle(event_log, loop)
        assert (counts.rebuilds, counts.incremental) == (1, 1)
        assert sum(j.state == "bound" for j in loop.state.jobs.values()) == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    records = await _records(event_log)
    report = verify_decisions(((r.seq, r.event) for r in records), SchedulingPolicy("rallypoint"))
    assert report.ok and report.verified == 2, report
