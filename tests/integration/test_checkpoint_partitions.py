"""Three checkpoint services share the jobs' partitions on a real NATS; one is killed.

In this process, as in ``test_controller_partitions``: each replica has its own fold of the log, its own
share of the partitions and a verifier that counts its calls. Twelve jobs (four of each replica's
partitions) commit two steps each: every step is verified once, by its partition's owner, and read from
disk once (a repeated append would be deduped by its message id, so the verifier's calls are what tell
double work). One replica is killed as kill -9 would (leases and presence abandoned); its jobs commit a
third step before the others own their partitions, and a survivor verifies it once, within seconds of the
kill; every job's third step is verified and its first removed by retention, once. The killed replica
writes nothing after its death, and neither its stale writer nor its file work can act on a job whose
partition it lost.

A loaded machine can delay a live replica's renewal past its lease's safety margin (TTL 1 s here): it
drops that partition and claims it again, and whoever owns it next reads its steps again, as designed
(work in flight on a lost partition is redone, never believed). The exactly-once reads and the owner of
each verdict are therefore asserted for the jobs of partitions nobody lost; every verdict in the log is
still asserted once for all jobs, since a repeated append is deduped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import partition_replicas
import pytest
from nats.js.kv import KeyValue
from partition_replicas import TTL, Losses, fresh_bucket, lost_by_any, settled
from rallypoint_services.checkpoint.actions import CheckpointActions
from rallypoint_services.checkpoint.keeper import CheckpointKeeper
from test_checkpoint_service import commit, on_disk, save_step, statuses, submit
from test_trace_chain import until

from rallypoint.checkpoints import Delete, RetentionPolicy, Verify, VerifyOutcome
from rallypoint.ckpt import step_dir, verify_checkpoint
from rallypoint.eventlog import AppendConflict, EventLog, Recorded
from rallypoint.events import CheckpointDeleted, CheckpointVerified, subjects
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.partitions import NotOwner, PartitionOwnership, assigned

COUNT = subjects.CHECKPOINT_PARTITIONS
NAMES = ("a", "b", "c")
JOBS_EACH = 4


class Replica(partition_replicas.Replica):
    """One checkpoint service with its fold, its share of the partitions and a counting verifier."""

    def __init__(self, log: EventLog, kv: KeyValue, name: str, reads: Counter[tuple[str, str]]) -> None:
        super().__init__()
        self.name = name
        self.follower = Follower(log)
        self.partitions = PartitionOwnership(
            kv,
            log,
            self.follower,
            service=subjects.CHECKPOINT_ROLE,
            member=name,
            count=COUNT,
            ttl=TTL,
            source=f"test/{name}",
        )

        def verifier(path: str) -> VerifyOutcome:
            reads[(name, path)] += 1
            return verify_checkpoint(path)

        self.actions = CheckpointActions(log, self.follower, verifier, partitions=self.partitions)
        self.keeper = CheckpointKeeper(
            log,
            self.follower,
            self.actions,
            policy=RetentionPolicy(keep=2),
            tick_s=0.2,
            partitions=self.partitions,
        )
        self.losses = Losses(self.partitions)

    async def kill(self) -> None:
        self.losses.dead = True
        await super().kill()

    async def work(self, stop: asyncio.Event) -> None:
        await self.keeper.run(stop)


def _jobs_of(member: str) -> list[str]:
    """``JOBS_EACH`` job ids whose partitions ``member`` owns while all of ``NAMES`` live."""
    mine = assigned(member, NAMES, COUNT)
    ids = (f"ck-{member}-{i}" for i in range(10_000))
    return [job_id for job_id in ids if subjects.partition_of(job_id, COUNT) in mine][:JOBS_EACH]


def _steady(replicas: dict[str, Replica], jobs: list[str]) -> list[str]:
    """The jobs of partitions no live replica has lost so far (see the module's docstring)."""
    lost = lost_by_any(replica.losses for replica in replicas.values())
    return [j for j in jobs if subjects.partition_of(j, COUNT) not in lost]


def _reads_of(reads: Counter[tuple[str, str]], jobs: list[str]) -> dict[tuple[str, str, int], int]:
    """Disk reads of ``jobs``' steps, as (reader, job, step): count."""
    return {
        (name, Path(path).parent.name, int(Path(path).name.split("-")[1])): n
        for (name, path), n in reads.items()
        if Path(path).parent.name in jobs
    }


def _settled(replicas: dict[str, Replica], live: list[str]) -> bool:
    return settled({name: replica.partitions for name, replica in replicas.items()}, live)


@contextlib.asynccontextmanager
async def _replicas(
    log: EventLog, names: tuple[str, ...] = NAMES
) -> AsyncIterator[tuple[dict[str, Replica], Counter[tuple[str, str]]]]:
    reads: Counter[tuple[str, str]] = Counter()
    async with fresh_bucket(log, TTL) as kv:
        started = {name: Replica(log, kv, name, reads) for name in names}
        for replica in started.values():
            await replica.start()
        try:
            yield started, reads
        finally:
            for replica in started.values():
                await replica.kill()


async def test_three_checkpoint_services_share_the_jobs_and_survive_one_killed(
    event_log: EventLog, tmp_path: Path
) -> None:
    async with _replicas(event_log) as (services, reads):
        await _share_and_survive(event_log, services, reads, tmp_path)


async def _share_and_survive(
    event_log: EventLog, services: dict[str, Replica], reads: Counter[tuple[str, str]], tmp_path: Path
) -> None:
    owner = {job_id: name for name in NAMES for job_id in _jobs_of(name)}
    jobs = list(owner)
    fold = Follower(event_log)
    await fold.catch_up()
    folding = asyncio.create_task(fold.run())

    def steps_are(step: int, status: str, among: list[str]) -> bool:
        return all(statuses(fold.state.jobs[j]).get(step) == status for j in among)

    try:
        await until(lambda: _settled(services, list(NAMES)), "three replicas split the partitions", 15.0)
        for job_id in jobs:
            await submit(event_log, job_id, tmp_path / job_id)
        lines = {(j, step): save_step(tmp_path / j, j, step) for j in jobs for step in (1, 2, 3)}
        for job_id in jobs:
            for step in (1, 2):
                await commit(event_log, lines[(job_id, step)])
        await until(lambda: steps_are(1, "verified", jobs) and steps_are(2, "verified", jobs), "steps 1-2")
        await until(lambda: all(r.keeper.idle for r in services.values()), "the replicas to be idle")
        # each step read from disk once, by its job's owner: the verification I/O is split by job
        steady = _steady(services, jobs)
        assert _reads_of(reads, steady) == {(owner[j], j, step): 1 for j in steady for step in (1, 2)}, reads
        assert {j for _, j, _ in _reads_of(reads, jobs)} == set(jobs), reads

        killed = services["c"]
        theirs = [j for j in jobs if owner[j] == "c"]
        stale = killed.partitions.writers[subjects.partition_of(theirs[0], COUNT)]
        await killed.kill()
        # its death: what it had already sent on the shared connection is stored before this answer
        killed_from = await event_log.last_seq()
        # c's jobs commit a third step while c is dead and its leases not yet expired: nobody owns their
        # partitions, so the survivors drop these commits unplanned; their gain must pick them up
        for job_id in theirs:
            await commit(event_log, lines[(job_id, 3)])
        lost = {subjects.partition_of(j, COUNT) for j in theirs}
        assert not any(lost & services[n].partitions.writers.keys() for n in ("a", "b"))
        # liveness only: how fast a partition is handed over is `rally bench partitions`' figure, not a test's
        await until(lambda: _settled(services, ["a", "b"]), "c's partitions to be taken", 30.0)
        await until(lambda: steps_are(3, "verified", theirs), "c's jobs' step 3 verified by a survivor", 30.0)

        # the others' third step, committed to their unchanged owners; the first step of every job then
        # falls out of the newest two (keep=2)
        for job_id in jobs:
            if job_id not in theirs:
                await commit(event_log, lines[(job_id, 3)])
        await until(lambda: steps_are(3, "verified", jobs) and steps_are(1, "deleted", jobs), "steps 3 and 1")
        assert all(on_disk(tmp_path / j) == [2, 3] for j in jobs)

        # c's writer from before its death: refused by the server (the new owner's epoch is stored)
        refused = CheckpointVerified(job_id=theirs[0], step=99, ok=True, at=time.time())
        with pytest.raises(AppendConflict):
            await stale.append(subjects.for_event(refused), refused, "deposed:verified")
        # nor does c's file work touch a job whose partition it lost: no read, no removal
        line = lines[(theirs[0], 2)]
        task = {
            "job_id": theirs[0],
            "step": 2,
            "path": line["path"],
            "manifest_sha256": line["manifest_sha256"],
        }
        with pytest.raises(NotOwner):
            await killed.actions.verify(Verify(**task))
        with pytest.raises(NotOwner):
            await killed.actions.delete(Delete(**task, reason="a deposed owner's retention"))
        assert step_dir(tmp_path / theirs[0], 2).is_dir()
    finally:
        folding.cancel()

    records = [r async for r in event_log.replay(subjects=subjects.CHECKPOINTS) if isinstance(r, Recorded)]
    verified = Counter(
        (r.event.job_id, r.event.step) for r in records if isinstance(r.event, CheckpointVerified)
    )
    deleted = Counter(
        (r.event.job_id, r.event.step) for r in records if isinstance(r.event, CheckpointDeleted)
    )
    assert verified == Counter({(j, step): 1 for j in jobs for step in (1, 2, 3)}), verified
    assert deleted == Counter({(j, 1): 1 for j in jobs}), deleted
    # every step read once in all, though c's jobs changed owner between their second and third
    steady = _steady(services, jobs)
    once = _reads_of(reads, steady)
    assert sorted(once.values()) == [1] * 3 * len(steady) and len({k[1:] for k in once}) == len(once), reads
    for r in records:
        if not isinstance(r.event, CheckpointVerified | CheckpointDeleted):
            continue
        source = r.envelope.get("source")
        if r.event.job_id not in steady:
            assert r.seq <= killed_from or source != "test/c", (r.seq, r.event, source)
        elif owner[r.event.job_id] != "c":
            assert source == f"test/{owner[r.event.job_id]}", (r.seq, r.event, source)
        elif r.seq <= killed_from:
            assert source == "test/c", (r.seq, r.event, source)
        else:  # c's jobs after its death: by the survivor that took the partition
            assert source in ("test/a", "test/b"), (r.seq, r.event, source)
    late = [r for r in records if r.seq > killed_from and r.envelope.get("source") == "test/c"]
    assert late == [], late  # the killed replica wrote nothing after its death


async def test_a_paused_owner_is_refused_by_the_server_and_drops_the_partition(
    event_log: EventLog, tmp_path: Path
) -> None:
    async with _replicas(event_log, ("old",)) as (services, _reads):
        old = services["old"]
        await until(lambda: len(old.partitions.writers) == COUNT, "old to own every partition", 15.0)
        old.pause()  # it still believes it owns every partition
        new = Replica(event_log, old.partitions.kv, "new", Counter())
        await new.start()
        services["new"] = new
        await until(lambda: len(new.partitions.writers) == COUNT, "new to own every partition", 15.0)

        await submit(event_log, "late", tmp_path / "late")
        await old.follower.wait_for(await event_log.last_seq())
        partition = old.partitions.partition_of("late")
        assert partition in old.partitions.writers
        # Back from its pause, the old owner appends what it thinks is its job's verdict: refused.
        verdict = CheckpointVerified(job_id="late", step=1, ok=True, at=time.time())
        with pytest.raises(AppendConflict):
            await old.actions._append(verdict, "late:ckpt:1:verified")
        assert partition not in old.partitions.writers  # it dropped the partition at once
        with pytest.raises(NotOwner):
            await old.actions._append(verdict, "late:ckpt:1:verified")
    assert not [
        r async for r in event_log.replay() if isinstance(getattr(r, "event", None), CheckpointVerified)
    ]
