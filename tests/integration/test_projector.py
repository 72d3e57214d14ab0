"""The projector against a real nats-server and a real PostgreSQL: no mocks anywhere.

Every test gets an empty log (the ``event_log`` fixture) and its own database on the session's
PostgreSQL, and checks the tables against ``ClusterState`` folded independently from ``EventLog.replay``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest

from rallypoint.accounting.attempts import AttemptRecord
from rallypoint.cli import projector_cmds
from rallypoint.eventlog import EventLog
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobCancelled,
    JobCancelRequested,
    JobCompleted,
    JobFailed,
    JobPending,
    JobPreempted,
    JobQueued,
    JobRejected,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeDrained,
    NodeHeartbeatLost,
    NodeRecovered,
    NodeRegistered,
    PreemptionRequested,
    RankExited,
    TaskPlacement,
    event_type,
    subjects,
)
from rallypoint.infra import PostgresServer, free_port
from rallypoint.projection import (
    ATTEMPT_COLUMNS,
    EVENT_COLUMNS,
    SCHEMA,
    Batch,
    PositionMoved,
    Projector,
    ReadModel,
    Store,
    attempt_row,
    connect,
    fetch_archive_seqs,
    fetch_attempts,
    fetch_jobs,
    fetch_nodes,
    job_row,
    node_row,
)
from rallypoint.state import ClusterState, JobView

T0 = 1_760_000_000.0
NODES = ("node-a", "node-b", "node-c", "node-d")

# --------------------------------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------------------------------


@pytest.fixture
async def dsn(postgres: PostgresServer) -> AsyncIterator[str]:
    """A fresh database per test, so positions and tables never leak between tests."""
    name = f"proj_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres.dsn_for("postgres"))
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    yield postgres.dsn_for(name)
    admin = await asyncpg.connect(postgres.dsn_for("postgres"))
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@pytest.fixture
async def db(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await connect(dsn, application_name="test-observer")
    try:
        yield conn
    finally:
        await conn.close()


class Writer:
    """Appends events the way the services would: one subject per aggregate, unique msg ids."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.count = 0

    async def put(self, subject: str, event: Event) -> int:
        self.count += 1
        return await self.log.append(
            subject, event, msg_id=f"test:{self.count}:{event_type(event)}", source="test"
        )

    async def many(self, items: list[tuple[str, Event]]) -> None:
        # Concurrent appends: ~20x faster than awaiting each (GUIDE §6); order inside one call is free.
        base = self.count
        self.count += len(items)
        await asyncio.gather(
            *(
                self.log.append(s, e, msg_id=f"test:{base + i + 1}:{event_type(e)}", source="test")
                for i, (s, e) in enumerate(items)
            )
        )


def spec(
    name: str, gpus: int, per_task: int = 8, team: str = "nlp", priority: str = "training-high"
) -> JobSpec:
    return JobSpec(
        name=name,
        team=team,
        gpus=gpus,
        gpus_per_task=per_task,
        ranks_per_task=per_task,
        command=("python", "train.py"),
        priority=priority,
    )


def node(node_id: str, rack: str) -> NodeRegistered:
    gpus = tuple(
        GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", memory_mib=81_920, nvlink_domain=0) for i in range(8)
    )
    return NodeRegistered(
        node_id=node_id,
        address=f"10.0.0.{NODES.index(node_id) + 1}:7000",
        rack=rack,
        gpu_type="H100",
        gpus=gpus,
        cpu_milli=96_000,
        memory_mib=1_048_576,
        agent_instance=f"agent-{node_id}",
        at=T0,
    )


def bind(
    job_id: str, epoch: int, placements: list[tuple[str, tuple[int, ...]]], at: float, attempt: int = 1
) -> GangBound:
    return GangBound(
        job_id=job_id,
        attempt=attempt,
        epoch=epoch,
        placements=tuple(TaskPlacement(task=i, node_id=n, gpus=g) for i, (n, g) in enumerate(placements)),
        computed_at_seq=0,
        policy_version="test-1",
        now=at,
        at=at,
    )


async def append_lifecycle(w: Writer) -> None:
    """A realistic little history: two gangs finish, one is cancelled, one fails, nodes come and go."""
    job, sched = subjects.job, subjects.bind
    await w.put(subjects.node_registration("node-a"), node("node-a", "rack-1"))
    await w.put(subjects.node_registration("node-b"), node("node-b", "rack-2"))
    await w.put(subjects.EPOCH, LeaderEpochStarted(epoch=1, leader_id="sched-0", at=T0 + 1))
    # train-1: a 16-GPU gang over both nodes, runs to completion.
    await w.put(job("train-1"), JobSubmitted(job_id="train-1", spec=spec("llama", 16), submitted_at=T0 + 2))
    await w.put(subjects.admission("train-1"), JobQueued(job_id="train-1", queue="nlp", at=T0 + 2.5))
    await w.put(
        subjects.pending("train-1"),
        JobPending(
            job_id="train-1",
            code="Resources",
            message="needs 16 GPUs; 16 free",
            epoch=1,
            computed_at_seq=5,
            at=T0 + 2.7,
        ),
    )
    await w.put(
        sched("train-1"),
        bind("train-1", 1, [("node-a", tuple(range(8))), ("node-b", tuple(range(8)))], T0 + 3.25),
    )
    await w.put(subjects.job_control("train-1"), JobStarted(job_id="train-1", attempt=1, at=T0 + 4.125))
    # A stale second bind for the same job: the fold ignores it, the row must not change.
    await w.put(sched("train-1"), bind("train-1", 1, [("node-a", (0,))], T0 + 4.2))
    # eval-2 arrives while the cluster is full and waits with a reason.
    await w.put(
        job("eval-2"),
        JobSubmitted(job_id="eval-2", spec=spec("eval", 4, 4, team="vision"), submitted_at=T0 + 5),
    )
    await w.put(
        subjects.pending("eval-2"),
        JobPending(
            job_id="eval-2",
            code="Resources",
            message="needs 4 GPUs; 0 free; 1 job ahead",
            epoch=1,
            computed_at_seq=9,
            at=T0 + 5.5,
        ),
    )
    for rank in range(16):
        await w.put(
            subjects.agent_job("node-a" if rank < 8 else "node-b", "train-1"),
            RankExited(
                job_id="train-1",
                attempt=1,
                rank=rank,
                node_id="node-a" if rank < 8 else "node-b",
                exit_code=0,
                at=T0 + 100 + rank / 100,
            ),
        )
    await w.put(subjects.job_control("train-1"), JobCompleted(job_id="train-1", attempt=1, at=T0 + 101))
    # eval-2 now fits on node-b, starts, and is cancelled by its owner.
    await w.put(sched("eval-2"), bind("eval-2", 1, [("node-b", (0, 1, 2, 3))], T0 + 102))
    await w.put(subjects.job_control("eval-2"), JobStarted(job_id="eval-2", attempt=1, at=T0 + 103))
    await w.put(job("eval-2"), JobCancelRequested(job_id="eval-2", at=T0 + 150, requested_by="alice"))
    await w.put(subjects.job_control("eval-2"), JobCancelled(job_id="eval-2", attempt=1, at=T0 + 151))
    # bad-3 is rejected; ft-4 fails with an exit code; node-b is flaky and then drained.
    await w.put(job("bad-3"), JobSubmitted(job_id="bad-3", spec=spec("bad", 12), submitted_at=T0 + 160))
    await w.put(
        subjects.admission("bad-3"),
        JobRejected(
            job_id="bad-3", reason="gpus must be a multiple of gpus_per_task", field="gpus", at=T0 + 160.5
        ),
    )
    await w.put(job("ft-4"), JobSubmitted(job_id="ft-4", spec=spec("finetune", 8), submitted_at=T0 + 170))
    await w.put(sched("ft-4"), bind("ft-4", 1, [("node-a", tuple(range(8)))], T0 + 171))
    await w.put(subjects.job_control("ft-4"), JobStarted(job_id="ft-4", attempt=1, at=T0 + 172))
    await w.put(
        subjects.node_health("node-b"), NodeHeartbeatLost(node_id="node-b", last_seen=T0 + 175, at=T0 + 180)
    )
    await w.put(subjects.node_health("node-b"), NodeRecovered(node_id="node-b", at=T0 + 185))
    await w.put(
        subjects.job_control("ft-4"),
        JobFailed(job_id="ft-4", attempt=1, reason="rank 3 exited 137", exit_code=137, at=T0 + 190),
    )
    await w.put(subjects.node_health("node-b"), NodeDrained(node_id="node-b", reason="xid 79", at=T0 + 200))
    # pre-5 is preempted for a more important job, waits again, and finishes on its second attempt.
    await w.put(
        job("pre-5"),
        JobSubmitted(job_id="pre-5", spec=spec("sweep", 8, priority="batch"), submitted_at=T0 + 210),
    )
    await w.put(sched("pre-5"), bind("pre-5", 1, [("node-a", tuple(range(8)))], T0 + 211))
    await w.put(subjects.job_control("pre-5"), JobStarted(job_id="pre-5", attempt=1, at=T0 + 212))
    await w.put(
        subjects.preempt("pre-5"),
        PreemptionRequested(
            job_id="pre-5",
            role="scheduler",
            attempt=1,
            for_job="train-1",
            reason="priority",
            epoch=1,
            computed_at_seq=0,
            policy_version="test-1",
            now=T0 + 220,
            at=T0 + 220,
        ),
    )
    await w.put(
        subjects.job_control("pre-5"),
        JobPreempted(job_id="pre-5", attempt=1, for_job="train-1", reason="priority", at=T0 + 230),
    )
    await w.put(sched("pre-5"), bind("pre-5", 1, [("node-a", tuple(range(8)))], T0 + 240, attempt=2))
    await w.put(subjects.job_control("pre-5"), JobStarted(job_id="pre-5", attempt=2, at=T0 + 241))
    await w.put(subjects.job_control("pre-5"), JobCompleted(job_id="pre-5", attempt=2, at=T0 + 300))
    # An event for a job nobody submitted: an orphan the fold counts and the views ignore.
    await w.put(subjects.job_control("ghost"), JobStarted(job_id="ghost", attempt=1, at=T0 + 201))


async def append_rounds(w: Writer, rounds: int, *, start: int = 0) -> None:
    """Bulk traffic: each round fills nodes c and d with 1-GPU jobs and runs them to completion."""
    slots = [(n, (g,)) for n in ("node-c", "node-d") for g in range(8)]
    if start == 0:
        await w.put(subjects.node_registration("node-c"), node("node-c", "rack-1"))
        await w.put(subjects.node_registration("node-d"), node("node-d", "rack-2"))
    for r in range(start, start + rounds):
        ids = [f"r{r}-{i}" for i in range(len(slots))]
        at = T0 + 1000 + r * 10
        await w.many(
            [
                (
                    subjects.job(j),
                    JobSubmitted(job_id=j, spec=spec(j, 1, 1, team=f"team{i % 3}"), submitted_at=at),
                )
                for i, j in enumerate(ids)
            ]
        )
        await w.many(
            [(subjects.bind(j), bind(j, 1, [slot], at + 1)) for j, slot in zip(ids, slots, strict=True)]
        )
        await w.many([(subjects.job_control(j), JobStarted(job_id=j, attempt=1, at=at + 2)) for j in ids])
        await w.many([(subjects.job_control(j), JobCompleted(job_id=j, attempt=1, at=at + 3)) for j in ids])


async def fold_log(log: EventLog) -> tuple[ClusterState, ReadModel]:
    """The expected state, folded independently from a fresh replay of the whole log."""
    state = ClusterState()
    model = ReadModel()
    async for rec in log.replay():
        state.apply(rec.seq, rec.event)
        model.apply(rec.seq, rec.event)
    return state, model


async def assert_views_match_log(db: asyncpg.Connection, log: EventLog) -> None:
    """Every row of jobs and nodes equals the fold; the archive holds each seq exactly once."""
    last = await log.last_seq()
    state, model = await fold_log(log)
    assert state.hash() == model.state.hash()
    jobs = await fetch_jobs(db)
    assert jobs == [job_row(state.jobs[j]) for j in sorted(state.jobs)]
    nodes = await fetch_nodes(db)
    # Every column but last_seq comes straight from the plain ClusterState fold...
    assert [n[:-1] for n in nodes] == [node_row(state.nodes[n], 0)[:-1] for n in sorted(state.nodes)]
    # ...and last_seq (when the row last changed) from the projection's own bookkeeping.
    assert nodes == model.all_node_rows()
    # every attempt, not just the current one (accounting.AttemptLedger)
    assert await fetch_attempts(db) == model.all_attempt_rows()
    assert await fetch_archive_seqs(db) == list(range(1, last + 1))
    assert await position(db) == last


async def position(db: asyncpg.Connection) -> int:
    try:
        return int(await db.fetchval(f"SELECT seq FROM {SCHEMA}.projection_position") or 0)
    except asyncpg.UndefinedTableError:
        return 0  # a projector task started a moment ago has not migrated yet


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def caught_up(db: asyncpg.Connection, log: EventLog) -> Callable[[], Awaitable[bool]]:
    target = await log.last_seq()

    async def check() -> bool:
        return await position(db) >= target

    return check


async def snapshot_tables(db: asyncpg.Connection) -> dict[str, list[Any]]:
    return {
        "jobs": await fetch_jobs(db),
        "nodes": await fetch_nodes(db),
        "attempts": await fetch_attempts(db),
        "events": [tuple(r) for r in await db.fetch(f"SELECT * FROM {SCHEMA}.events ORDER BY seq")],
        "position": [await position(db)],
    }


# --------------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------------


async def test_lifecycle_projects_to_the_fold(event_log: EventLog, dsn: str, db: asyncpg.Connection) -> None:
    w = Writer(event_log)
    await append_lifecycle(w)
    projector = Projector(event_log, dsn, batch_size=7)  # small batches: many transactions, odd edges
    try:
        assert await projector.catch_up() == await event_log.last_seq()
    finally:
        await projector.close()
    await assert_views_match_log(db, event_log)

    # Spot checks in plain words, so a bug shared by the fold and the rows still shows.
    rows = {r["job_id"]: r for r in await db.fetch(f"SELECT * FROM {SCHEMA}.jobs")}
    assert set(rows) == {"train-1", "eval-2", "bad-3", "ft-4", "pre-5"}  # the orphan made no row
    p5 = rows["pre-5"]
    assert (p5["state"], p5["attempt"], p5["preemptions"]) == ("completed", 2, 1)
    assert p5["last_preempted_at"].timestamp() == T0 + 230
    t1 = rows["train-1"]
    assert (t1["state"], t1["exit_code"], t1["gpus"]) == ("completed", 0, 16)
    assert t1["nodes"] == ["node-a", "node-b"]
    assert t1["placements"][1] == {"task": 1, "node_id": "node-b", "gpus": list(range(8))}
    assert t1["started_at"].timestamp() == T0 + 4.125 and t1["queue"] == "nlp"
    assert (rows["eval-2"]["state"], rows["eval-2"]["cancel_requested"]) == ("cancelled", True)
    assert rows["eval-2"]["pending_code"] == ""  # cleared by the bind
    assert (rows["bad-3"]["state"], rows["bad-3"]["reason"]) == (
        "rejected",
        "gpus must be a multiple of gpus_per_task",
    )
    assert (rows["ft-4"]["state"], rows["ft-4"]["exit_code"]) == ("failed", 137)
    nodes = {r["node_id"]: r for r in await db.fetch(f"SELECT * FROM {SCHEMA}.nodes")}
    assert (nodes["node-a"]["gpus_free"], nodes["node-a"]["status"]) == (8, "up")
    assert (nodes["node-b"]["status"], nodes["node-b"]["status_reason"]) == ("drained", "xid 79")
    # node-a last changed when pre-5 completed and released its GPUs (a job event, not a node event).
    done_seq = await db.fetchval(f"SELECT max(seq) FROM {SCHEMA}.events WHERE type = 'JobCompleted.v1'")
    assert nodes["node-a"]["last_seq"] == done_seq
    archived = await db.fetchrow(f"SELECT * FROM {SCHEMA}.events WHERE seq = 4")
    assert archived["type"] == "JobSubmitted.v1" and archived["subject"] == "rally.job.train-1"
    assert archived["data"]["spec"]["gpus"] == 16 and archived["envelope"]["source"] == "test"
    assert archived["time"].timestamp() == T0 + 2


async def test_restart_midway_has_no_duplicates(
    event_log: EventLog, dsn: str, db: asyncpg.Connection
) -> None:
    w = Writer(event_log)
    await append_lifecycle(w)
    await append_rounds(w, 6)
    last = await event_log.last_seq()

    # First run stops at an arbitrary sequence, not on a batch boundary.
    first = Projector(event_log, dsn, batch_size=50)
    assert await first.catch_up(to_seq=last // 3) == last // 3
    await first.close()
    assert await position(db) == last // 3
    assert await fetch_archive_seqs(db) == list(range(1, last // 3 + 1))

    # Second run follows live and is killed (task cancelled) while more events are arriving.
    second = Projector(event_log, dsn, batch_size=40, snapshot_every=100)
    stop = asyncio.Event()
    task = asyncio.create_task(second.run(stop))
    await eventually(lambda: _above(db, last // 3 + 100))
    more = asyncio.create_task(append_rounds(w, 3, start=6))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await second.close()
    await more
    # Both read in one snapshot: a COMMIT the cancelled run had already sent may still land on the server
    # after close() (it does not wait for it), between two separate reads; one snapshot sees it whole or not.
    async with db.transaction(isolation="repeatable_read", readonly=True):
        mid = await position(db)
        archived = await fetch_archive_seqs(db)
    assert last // 3 < mid <= await event_log.last_seq()
    assert archived == list(range(1, mid + 1))  # consistent at the crash point
    snap_seq = await db.fetchval(f"SELECT seq FROM {SCHEMA}.projection_snapshot")
    assert snap_seq is not None and 0 < snap_seq <= mid

    # Third run starts from the stored snapshot + position and finishes the job.
    third = Projector(event_log, dsn, batch_size=500)
    try:
        await third.catch_up()
    finally:
        await third.close()
    await assert_views_match_log(db, event_log)


async def _above(db: asyncpg.Connection, seq: int) -> bool:
    return await position(db) >= seq


async def test_rebuild_equals_incremental(
    event_log: EventLog,
    dsn: str,
    db: asyncpg.Connection,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = Writer(event_log)
    projector = Projector(event_log, dsn, batch_size=64)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        # Incremental: the projector follows while the history is written in several bursts.
        await append_lifecycle(w)
        await append_rounds(w, 2)
        await eventually(await caught_up(db, event_log))
        await append_rounds(w, 2, start=2)
        await eventually(await caught_up(db, event_log))
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await projector.close()
    incremental = await snapshot_tables(db)
    await assert_views_match_log(db, event_log)

    # Rebuild through the real command line (its own asyncio loop, hence a thread).
    argv = [
        "projector",
        "rebuild",
        "--nats-url",
        _url(event_log),
        "--postgres-dsn",
        dsn,
        "--batch-size",
        "97",
    ]
    assert await asyncio.to_thread(rally_projector, argv) == 0
    assert await snapshot_tables(db) == incremental

    capsys.readouterr()
    argv = ["projector", "status", "--nats-url", _url(event_log), "--postgres-dsn", dsn, "--json"]
    assert await asyncio.to_thread(rally_projector, argv) == 0
    status = json.loads(capsys.readouterr().out)
    last = await event_log.last_seq()
    assert (status["position"], status["log_last_seq"], status["lag"]) == (last, last, 0)
    assert status["archived"] == last and status["jobs"] == len(incremental["jobs"])

    # No flags, in a folder where `rally up` runs: .rally/cluster.json names both, as for every command.
    (tmp_path / ".rally").mkdir()
    info = {"nats_url": _url(event_log), "postgres_dsn": dsn}
    (tmp_path / ".rally" / "cluster.json").write_text(json.dumps(info))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RALLY_NATS_URL", raising=False)
    monkeypatch.delenv("RALLY_POSTGRES_DSN", raising=False)
    assert await asyncio.to_thread(rally_projector, ["projector", "status", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["position"], found["log_last_seq"], found["jobs"]) == (last, last, status["jobs"])


def rally_projector(argv: list[str]) -> int:
    """`rally projector ...` through its own parser (the full `rally` parser imports every group)."""
    parser = argparse.ArgumentParser(prog="rally")
    projector_cmds.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def _url(log: EventLog) -> str:
    assert log.nc.connected_url is not None
    return f"nats://{log.nc.connected_url.netloc}"


async def test_failed_batch_leaves_position_and_views_consistent(
    event_log: EventLog, dsn: str, db: asyncpg.Connection
) -> None:
    w = Writer(event_log)
    await append_lifecycle(w)
    projector = Projector(event_log, dsn, batch_size=1000)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        await eventually(await caught_up(db, event_log))
        before = await position(db)
        before_tables = await snapshot_tables(db)

        # Freeze the next batch mid-transaction: it can insert into the archive but blocks on the
        # jobs table, which another session holds locked.
        blocker = await connect(dsn, application_name="test-blocker")
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute(f"LOCK TABLE {SCHEMA}.jobs IN SHARE MODE")
        await append_rounds(w, 1)
        await eventually(_projector_waiting_on_lock(db))

        # Mid-transaction: nothing of the batch is visible, the position has not moved.
        assert await snapshot_tables(db) == before_tables
        # Kill the projector's connection (as a PostgreSQL restart or a network cut would).
        killed = await db.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            "rally-projector",
        )
        assert killed == 1
        await lock.rollback()
        await blocker.close()
        # Still nothing half-written: the transaction rolled back as a whole.
        assert await position(db) == before
        assert await fetch_archive_seqs(db) == list(range(1, before + 1))

        # The projector reconnects by itself and retries the same batch exactly once.
        await eventually(await caught_up(db, event_log))
        assert projector.retries >= 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await projector.close()
    await assert_views_match_log(db, event_log)


def _projector_waiting_on_lock(db: asyncpg.Connection) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool(
            await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rally-projector' "
                "AND wait_event_type = 'Lock'"
            )
        )

    return check


async def test_two_projectors_fence_each_other(event_log: EventLog, dsn: str, db: asyncpg.Connection) -> None:
    """Two instances on one database (a botched deploy): the position lock keeps the effect exactly-once."""
    w = Writer(event_log)
    one = Projector(event_log, dsn, batch_size=30)
    two = Projector(event_log, dsn, batch_size=45)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(p.run(stop)) for p in (one, two)]
    try:
        await append_lifecycle(w)
        await append_rounds(w, 4)
        await eventually(await caught_up(db, event_log))
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        await one.close()
        await two.close()
    await assert_views_match_log(db, event_log)


async def test_service_follows_and_stops_on_sigterm(
    event_log: EventLog, dsn: str, db: asyncpg.Connection
) -> None:
    w = Writer(event_log)
    await append_lifecycle(w)
    env = {**os.environ, "RALLY_POSTGRES_DSN": dsn}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rallypoint.cli.main",
            "serve",
            "projector",
            "--nats-url",
            _url(event_log),
            "--log-format",
            "text",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        await eventually(await caught_up(db, event_log), timeout=20)
        await append_rounds(w, 2)
        await eventually(await caught_up(db, event_log))
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 10)
        output = proc.stdout.read().decode() if proc.stdout else ""
        assert code == 0, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    await assert_views_match_log(db, event_log)


async def test_survives_a_postgres_restart(event_log: EventLog) -> None:
    """The server itself goes away (not just our connection): the projector waits, reconnects, resumes."""
    # Its own server (default temp dir: postgres may run as another OS user), so the shared one stays up.
    server = await PostgresServer(port=free_port()).astart()
    w = Writer(event_log)
    projector = Projector(event_log, server.dsn, batch_size=100)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        await append_lifecycle(w)
        observer = await connect(server.dsn)
        await eventually(await caught_up(observer, event_log))
        await observer.close()

        await asyncio.to_thread(server.stop, remove_data=False)
        await append_rounds(w, 2)  # written to the log while the read models are down
        await asyncio.sleep(0.3)  # let the projector fail and back off at least once
        await server.astart()

        observer = await connect(server.dsn)
        try:
            await eventually(await caught_up(observer, event_log), timeout=20)
            assert projector.retries >= 1
            await assert_views_match_log(observer, event_log)
        finally:
            await observer.close()
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await projector.close()
        await server.astop(remove_data=True)


async def test_stops_promptly_while_postgres_is_down(event_log: EventLog) -> None:
    """SIGTERM during a PostgreSQL outage must not wait out the backoff (nor the shutdown grace)."""
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/rallypoint"
    projector = Projector(event_log, nowhere)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    await eventually(_retried(projector))
    stop.set()
    await asyncio.wait_for(task, 2)
    await projector.close()


def _retried(projector: Projector) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return projector.retries >= 2

    return check


# --------------------------------------------------------------------------------------------------
# the batch write itself
# --------------------------------------------------------------------------------------------------

# Text that JSON and SQL both escape: quotes, a backslash, a newline, a tab, non-ASCII.
AWKWARD = "a \"quoted\" \\ back\nslash\t, 'single', ünï 😀 {brace} [bracket]"


def awkward_job(state: str, last_seq: int) -> JobView:
    placements = (
        TaskPlacement(task=0, node_id="node-b", gpus=(0, 1)),
        TaskPlacement(task=1, node_id="node-a", gpus=(7,)),
        TaskPlacement(task=2, node_id="node-b", gpus=(2,)),
    )
    return JobView(
        job_id="job-" + AWKWARD,
        spec=spec(AWKWARD, 4, per_task=2, team="team " + AWKWARD),
        submitted_at=T0 + 0.123456,
        submitted_seq=1,
        state=state,  # type: ignore[arg-type]
        queue=AWKWARD,
        attempt=2,
        placements=placements,
        bound_at=T0 + 1.000001,
        started_at=T0 + 2.5,
        exit_code=None,
        reason=AWKWARD,
        cancel_requested=True,
        preempt_for="other " + AWKWARD,
        last_seq=last_seq,
    )


def awkward_attempt(last_seq: int) -> AttemptRecord:
    return AttemptRecord(
        job_id="job-" + AWKWARD,
        attempt=2,
        team="team",
        user=AWKWARD,
        priority="training-high",
        gpus=4,
        placements=(TaskPlacement(task=0, node_id="node-a", gpus=(0, 1, 2, 3)),),
        bound_at=T0,
        started_at=T0 + 0.1 + 0.2,  # a float whose shortest repr has 17 digits: must arrive bit-exact
        ended_at=None,
        outcome="running",
        exit_code=-9,
        lost_gpu_s=1 / 3,
        resume_step=None,
        last_seq=last_seq,
    )


def awkward_node(gpus_free: int, last_seq: int) -> tuple[Any, ...]:
    return ("node-" + AWKWARD, "10.0.0.1", "rack " + AWKWARD, "spine-1", "H100", 8, gpus_free, "up", AWKWARD,
            "healthy", last_seq)  # fmt: skip


def archive_row(seq: int) -> tuple[Any, ...]:
    data = msgspec.Raw(json.dumps({"text": AWKWARD, "n": seq}).encode())
    envelope = msgspec.Raw(json.dumps({"source": AWKWARD}).encode())
    return (
        seq,
        f"rally.job.j{seq}",
        "JobStarted",
        dt.datetime.fromtimestamp(T0 + seq / 7, tz=dt.UTC),
        data,
        envelope,
    )


async def test_store_write_round_trips_every_value_and_fences(dsn: str, db: asyncpg.Connection) -> None:
    """A batch's rows read back equal to what was written (escapes, arrays, JSON, microseconds, floats
    to the bit), a second batch updates them in place, and a batch folded from a stale position writes
    nothing and says where the position is."""
    store = await Store.open(dsn)
    try:
        first = Batch(
            first_seq=1,
            last_seq=2,
            events=[archive_row(1), archive_row(2)],
            jobs=[job_row(awkward_job("running", 2))],
            nodes=[awkward_node(4, 2)],
            attempts=[attempt_row(awkward_attempt(2))],
        )
        await store.write(first, expected=0)
        assert await fetch_jobs(db) == first.jobs
        assert await fetch_nodes(db) == first.nodes
        assert await fetch_attempts(db) == first.attempts
        assert (await fetch_attempts(db))[0][ATTEMPT_COLUMNS.index("started_s")] == T0 + 0.1 + 0.2
        assert await fetch_archive_seqs(db) == [1, 2]
        archived = await db.fetch(f"SELECT {', '.join(EVENT_COLUMNS)} FROM {SCHEMA}.events ORDER BY seq")
        assert [tuple(r) for r in archived] == [
            (*row[:4], json.loads(bytes(row[4])), json.loads(bytes(row[5]))) for row in first.events
        ]

        second = Batch(
            first_seq=3,
            last_seq=3,
            events=[archive_row(3)],
            jobs=[job_row(awkward_job("completed", 3))],
            nodes=[],
            attempts=[],
        )
        await store.write(second, expected=2)
        assert await fetch_jobs(db) == second.jobs
        assert await fetch_nodes(db) == first.nodes
        assert await store.position() == 3

        stale = Batch(
            first_seq=3, last_seq=3, events=[archive_row(4)], jobs=first.jobs, nodes=[], attempts=[]
        )
        with pytest.raises(PositionMoved) as moved:
            await store.write(stale, expected=2)
        assert (moved.value.expected, moved.value.found) == (2, 3)
        assert await fetch_jobs(db) == second.jobs
        assert await fetch_archive_seqs(db) == [1, 2, 3]
        assert await store.position() == 3
    finally:
        await store.close()
