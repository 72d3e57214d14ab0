"""Two schedulers on a real NATS: the newer epoch fences the older one, and no GPU is bound twice."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest
from rallypoint_services.scheduler.leader import SchedulerLoop

from rallypoint.eventlog import AppendConflict, EventLog
from rallypoint.events import (
    GangBound,
    GpuInfo,
    JobSpec,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    subjects,
)
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import ClusterState

_clock = itertools.count(1000)


def _now() -> float:
    return float(next(_clock))


async def _register(log: EventLog, node_id: str, gpus: int = 8) -> None:
    event = NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack="rack-1",
        gpu_type="sim",
        gpus=tuple(
            GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(gpus)
        ),
        cpu_milli=1000,
        memory_mib=1000,
        agent_instance="a",
        at=1.0,
    )
    await log.append(subjects.node_registration(node_id), event, msg_id=f"{node_id}:reg", source="test")


async def _submit(log: EventLog, job_id: str, gpus: int) -> None:
    spec = JobSpec(
        name=job_id, team="t", gpus=gpus, gpus_per_task=min(gpus, 8), ranks_per_task=1, command=("true",)
    )
    await log.append(
        subjects.job(job_id),
        JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0),
        msg_id=f"{job_id}:0:JobSubmitted",
        source="test",
        expected_last_subject_seq=0,
    )


async def _replayed(log: EventLog) -> ClusterState:
    state = ClusterState()
    async for rec in log.replay():
        state.apply(rec.seq, rec.event)
    return state


@contextlib.asynccontextmanager
async def _scheduler(log: EventLog, name: str):  # type: ignore[no-untyped-def]
    follower = Follower(log)
    await follower.catch_up()
    task = asyncio.create_task(follower.run())
    try:
        yield SchedulerLoop(log, follower, instance=name, policy=SchedulingPolicy("rallypoint"), clock=_now)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_old_leaders_late_write_is_rejected_after_a_new_epoch(event_log: EventLog) -> None:
    await _register(event_log, "n1")
    async with _scheduler(event_log, "old") as old, _scheduler(event_log, "new") as new:
        assert await old.start_epoch() == 1
        await _submit(event_log, "j1", 8)
        await old.follower.wait_for(await event_log.last_seq())
        assert await old.cycle() >= 1  # the old leader binds j1 while it still leads
        await old.follower.wait_for(await event_log.last_seq())
        assert old.state.jobs["j1"].state == "bound"

        # The old leader pauses; a new one is elected and fences it.
        assert await new.start_epoch() == 2
        await _submit(event_log, "j2", 8)
        await old.follower.wait_for(await event_log.last_seq())
        # The old leader wakes up with a stale view of the tree: the server refuses its write.
        await event_log.append(
            subjects.job_control("j1"), _completed("j1"), msg_id="j1:1:done", source="test"
        )
        await old.follower.wait_for(await event_log.last_seq())
        with pytest.raises(AppendConflict) as refused:
            await old.cycle()
        assert refused.value.code in (10071, 10164)
        # The new leader proceeds and binds j2 on the GPUs j1 released.
        await new.follower.wait_for(await event_log.last_seq())
        assert await new.cycle() >= 1

    state = await _replayed(event_log)
    binds = [s for s in state.jobs.values() if s.state in ("bound", "running")]
    assert [j.job_id for j in binds] == ["j2"]
    assert state.ignored_binds == 0
    assert state.epoch == 2


async def test_two_contenders_for_one_epoch_exactly_one_wins(event_log: EventLog) -> None:
    """Both read the same tree sequence, then both try to start epoch 1: the server accepts one."""
    await _register(event_log, "n1")
    async with _scheduler(event_log, "a") as a, _scheduler(event_log, "b") as b:
        tip = await event_log.last_seq(subjects.SCHEDULER_TREE)
        a.writer.fence = b.writer.fence = tip
        results = await asyncio.gather(
            *(
                loop.writer.append(
                    subjects.EPOCH,
                    LeaderEpochStarted(epoch=1, leader_id=loop.instance, at=1.0),
                    f"scheduler-epoch:1:{loop.instance}",
                )
                for loop in (a, b)
            ),
            return_exceptions=True,
        )
    winners = [r for r in results if isinstance(r, int)]
    losers = [r for r in results if isinstance(r, AppendConflict)]
    assert len(winners) == 1 and len(losers) == 1, results


async def test_contenders_starting_epochs_never_share_one(event_log: EventLog) -> None:
    """However they interleave, two contenders never both lead the same epoch: a later one fences."""
    await _register(event_log, "n1")
    async with _scheduler(event_log, "a") as a, _scheduler(event_log, "b") as b:
        results = await asyncio.gather(a.start_epoch(), b.start_epoch(), return_exceptions=True)
    epochs = [r for r in results if isinstance(r, int)]
    assert all(isinstance(r, int | AppendConflict) for r in results), results
    assert epochs and len(set(epochs)) == len(epochs)
    state = await _replayed(event_log)
    assert state.epoch == max(epochs)


async def test_concurrent_leaders_never_bind_a_gpu_twice(event_log: EventLog) -> None:
    """Both believe they lead (a split brain the lease did not prevent); each GPU is still bound once."""
    await _register(event_log, "n1")
    await _register(event_log, "n2")
    for i in range(6):
        await _submit(event_log, f"j{i}", 8)
    async with _scheduler(event_log, "a") as a, _scheduler(event_log, "b") as b:
        await a.start_epoch()
        # b fences a, then both run cycles concurrently; a's writes must all be refused.
        await b.start_epoch()
        await a.follower.wait_for(await event_log.last_seq())
        outcome = await asyncio.gather(a.cycle(), b.cycle(), return_exceptions=True)
    assert isinstance(outcome[0], AppendConflict)
    state = await _replayed(event_log)
    held = [(n.node_id, g) for n in state.nodes.values() for g in n.allocated]
    assert len(held) == len(set(held)) == 16
    bound = [j for j in state.jobs.values() if j.state == "bound"]
    assert len(bound) == 2
    assert state.ignored_binds == 0


def _completed(job_id: str) -> object:
    from rallypoint.events import JobCompleted

    return JobCompleted(job_id=job_id, attempt=1, at=5.0)


_ = GangBound  # the decisions checked above are GangBound events; imported for readers of this test
