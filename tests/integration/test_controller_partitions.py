"""Three job controllers share the jobs' partitions on a real NATS; one is killed mid-stream.

In this process, as in ``test_trace_chain``: a scheduler loop, a node agent on simulated GPUs and three job
controllers, each with its own fold of the log and its own share of the partitions. One controller is
killed as kill -9 would (its leases and presence abandoned, no hand-over); jobs submitted before and after
all run to completion, the killed one's partitions are owned by the others within seconds, every launch
request of an attempt is sent once, and the killed controller writes nothing after its death.

A loaded machine can delay a live controller's renewal past its lease's safety margin (TTL 1 s here): it
drops that partition and claims it again, and a launch in flight then is sent again by whoever owns the
partition next, as designed (the agent takes a repeated launch of a running attempt as done). So "sent
once" is asserted for the jobs of partitions no live controller lost; every JobStarted and JobCompleted is
still asserted once for all jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from partition_replicas import Losses, lost_by_any
from rallypoint_services.job_controller.controller import JobController
from rallypoint_services.scheduler.leader import SchedulerLoop
from test_trace_chain import node_agent, until

from rallypoint.agent import SimulatedGpus
from rallypoint.eventlog import AppendConflict, EventLog
from rallypoint.eventlog.setup import open_partition_bucket
from rallypoint.events import JobCompleted, JobSpec, JobStarted, JobSubmitted, subjects
from rallypoint.protocol import LaunchTask
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.partitions import PARTITION_BUCKET, NotOwner, PartitionOwnership, assigned
from rallypoint.scheduling import SchedulingPolicy

TTL = 1.0
COUNT = subjects.CONTROL_PARTITIONS
NAMES = ("a", "b", "c")


class Replica:
    """One job controller with its fold and its share of the partitions."""

    def __init__(self, log: EventLog, kv: object, name: str) -> None:
        self.name = name
        self.follower = Follower(log)
        self.partitions = PartitionOwnership(
            kv,  # type: ignore[arg-type]
            log,
            self.follower,
            service=subjects.CONTROL_ROLE,
            member=name,
            count=COUNT,
            ttl=TTL,
            source=f"test/{name}",
        )
        self.controller = JobController(
            log.nc, log, self.follower, partitions=self.partitions, command_timeout=5.0, tick_s=0.2
        )
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.losses = Losses(self.partitions)

    async def start(self) -> None:
        await self.follower.catch_up()
        self.tasks = [
            asyncio.create_task(self.follower.run()),
            self.partitions.start(self.stop),
            asyncio.create_task(self.controller.run(self.stop)),
        ]

    async def kill(self) -> None:
        """As kill -9: everything stops at once; presence and leases stay until they expire."""
        self.losses.dead = True
        self.partitions.abandon()
        for task in self.tasks:
            task.cancel()
        await asyncio.wait(self.tasks, timeout=5.0)


@contextlib.asynccontextmanager
async def _controllers(log: EventLog, names: tuple[str, ...] = NAMES) -> AsyncIterator[dict[str, Replica]]:
    with contextlib.suppress(Exception):
        await log.js.delete_key_value(PARTITION_BUCKET)
    kv = await open_partition_bucket(log.js, ttl=TTL)
    replicas = {name: Replica(log, kv, name) for name in names}
    for replica in replicas.values():
        await replica.start()
    try:
        yield replicas
    finally:
        for replica in replicas.values():
            await replica.kill()
        await log.js.delete_key_value(PARTITION_BUCKET)


async def _submit(log: EventLog, job_id: str) -> None:
    spec = JobSpec(name=job_id, team="t", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",))
    event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=time.time())
    await log.append(subjects.job(job_id), event, msg_id=f"{job_id}:0:JobSubmitted", source="test")


def _settled(replicas: dict[str, Replica], live: list[str]) -> bool:
    return all(set(replicas[n].partitions.writers) == assigned(n, live, COUNT) for n in live)


async def test_three_controllers_share_the_jobs_and_survive_one_killed(
    event_log: EventLog, tmp_path: Path
) -> None:
    launches: Counter[tuple[str, int]] = Counter()

    async def seen(msg: object) -> None:  # every launch request, whichever controller sent it
        task = msgspec.json.decode(msg.data, type=LaunchTask)  # type: ignore[attr-defined]
        launches[(task.job_id, task.attempt)] += 1

    watch = await event_log.nc.subscribe(subjects.agent_command("node-1", "launch"), cb=seen)
    agent = node_agent(event_log, SimulatedGpus("node-1", 8), tmp_path / "work")
    stop = asyncio.Event()
    cycling: asyncio.Task[None] | None = None
    try:
        async with _controllers(event_log) as replicas:
            await agent.start()
            sched_fold = Follower(event_log)
            await sched_fold.catch_up()
            fold_task = asyncio.create_task(sched_fold.run())
            scheduler = SchedulerLoop(
                event_log, sched_fold, instance="s1", policy=SchedulingPolicy("rallypoint")
            )
            await scheduler.start_epoch()

            async def cycle() -> None:
                while not stop.is_set():
                    await scheduler.cycle()
                    await asyncio.sleep(0.05)

            cycling = asyncio.create_task(cycle())
            await until(
                lambda: _settled(replicas, list(NAMES)), "three controllers split the partitions", 15.0
            )

            jobs = [f"job-{i}" for i in range(24)]
            for job_id in jobs[:12]:
                await _submit(event_log, job_id)
            await until(
                lambda: (
                    sum(j in sched_fold.state.jobs and sched_fold.state.jobs[j].terminal for j in jobs[:4])
                    >= 4
                ),
                "the first jobs to run",
            )
            killed = replicas["c"]
            await killed.kill()
            # its death: what it had already sent on the shared connection is stored before this answer
            killed_from = await event_log.last_seq()
            for job_id in jobs[12:]:
                await _submit(event_log, job_id)
            # liveness only: handover speed is `rally bench partitions`' figure, not a test's
            await until(lambda: _settled(replicas, ["a", "b"]), "c's partitions to be taken", 30.0)

            def done() -> bool:
                state = sched_fold.state.jobs
                return all(j in state and state[j].state == "completed" for j in jobs)

            await until(done, "every job to complete", 60.0)
    finally:
        stop.set()
        if cycling is not None:
            cycling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await cycling
            fold_task.cancel()
        await watch.unsubscribe()
        await agent.close()

    records = [r async for r in event_log.replay()]
    started = Counter((r.event.job_id, r.event.attempt) for r in records if isinstance(r.event, JobStarted))
    completed = Counter(r.event.job_id for r in records if isinstance(r.event, JobCompleted))
    assert all(n == 1 for n in started.values()), started
    assert set(completed) == set(jobs) and all(n == 1 for n in completed.values()), completed
    lost = lost_by_any(replica.losses for replica in replicas.values())
    steady = {job for job, _ in launches if subjects.partition_of(job, COUNT) not in lost}
    assert all(n == 1 for (job, _), n in launches.items() if job in steady), (launches, lost)  # none twice
    assert {job for job, _ in launches} == set(jobs)
    late = [r for r in records if r.seq > killed_from and r.envelope.get("source") == "test/c"]
    assert late == [], late  # the killed controller wrote nothing after its death
    writers = {r.envelope.get("source") for r in records if isinstance(r.event, JobCompleted)}
    assert writers <= {"test/a", "test/b", "test/c"} and len(writers) >= 2


async def test_a_paused_owner_is_refused_by_the_server_and_drops_the_partition(event_log: EventLog) -> None:
    async with _controllers(event_log, ("old",)) as replicas:
        old = replicas["old"]
        await until(lambda: len(old.partitions.writers) == COUNT, "old to own every partition", 15.0)
        # Paused (SIGSTOP, a long GC): no more rounds or renewals, but it still believes it owns them all.
        old.tasks[1].cancel()
        old.tasks[2].cancel()
        for lease in old.partitions.leases.values():
            lease.abandon()
        new = Replica(event_log, old.partitions.kv, "new")
        await new.start()
        replicas["new"] = new
        await until(lambda: len(new.partitions.writers) == COUNT, "new to own every partition", 15.0)

        await _submit(event_log, "late")
        await old.follower.wait_for(await event_log.last_seq())
        partition = old.partitions.partition_of("late")
        assert partition in old.partitions.writers
        # Back from its pause, the old owner acts on what it thinks is its job: the server refuses it.
        with pytest.raises(AppendConflict):
            await old.controller._append("late", JobStarted(job_id="late", attempt=1, at=time.time()))
        assert partition not in old.partitions.writers  # it dropped the partition at once
        with pytest.raises(NotOwner):
            await old.controller._append("late", JobStarted(job_id="late", attempt=1, at=time.time()))
    assert not [r async for r in event_log.replay() if isinstance(r.event, JobStarted)]
