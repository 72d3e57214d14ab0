"""The projector on a log with poison in it, against a real nats-server and a real PostgreSQL.

It must neither stop nor loop at a message it cannot read: the position moves past it, the archive
gets a `quarantined` row for it (so every sequence is still archived once), the views equal the shared
fold, and a restart (a new projector from the stored position) picks up exactly where the last one was.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from rallypoint.eventlog import EventLog, stored
from rallypoint.events import GpuInfo, JobSpec, JobSubmitted, NodeRegistered, subjects
from rallypoint.infra import PostgresServer
from rallypoint.projection import SCHEMA, Projector, connect, fetch_archive_seqs, fetch_jobs, job_row
from rallypoint.state import ClusterState

JUNK = b"\x00junk"
V2 = b'{"type":"JobSubmitted.v2","job_id":"j-v2","spec":{"name":"x"},"submitted_at":1.0,"band":3}'


@pytest.fixture
async def db(postgres: PostgresServer) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A fresh database on the session's PostgreSQL, and a connection to look at it."""
    name = f"poison_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres.dsn_for("postgres"))
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    conn = await connect(postgres.dsn_for(name), application_name="test-poison")
    try:
        yield postgres.dsn_for(name), conn
    finally:
        await conn.close()
        admin = await asyncpg.connect(postgres.dsn_for("postgres"))
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()


async def publish_raw(log: EventLog, data: bytes) -> int:
    return int((await log.js.publish("rally.job.x", data, stream=log.stream)).seq)


async def submit(log: EventLog, job_id: str) -> int:
    spec = JobSpec(name=job_id, team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=8, command=("true",))
    event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=1.0)
    return await log.append(subjects.job(job_id), event, msg_id=f"{job_id}:0:JobSubmitted", source="test")


async def register_node(log: EventLog, node_id: str) -> int:
    gpus = tuple(GpuInfo(index=g, uuid=f"{node_id}-{g}", memory_mib=81559, nvlink_domain=0) for g in range(8))
    event = NodeRegistered(
        node_id=node_id,
        address="10.0.0.1",
        rack="r0",
        gpu_type="H100",
        gpus=gpus,
        cpu_milli=96000,
        memory_mib=1 << 20,
        agent_instance="test",
        at=1.0,
    )
    return await log.append(subjects.node(node_id), event, msg_id=f"{node_id}:reg", source="test")


async def fresh_fold(log: EventLog) -> ClusterState:
    state = ClusterState()
    async for rec in log.replay(quarantine=True):
        state.apply_stored(rec.seq, stored(rec))
    return state


async def test_the_projector_archives_poison_as_quarantined_and_goes_on(
    event_log: EventLog, db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, conn = db
    await register_node(event_log, "n0")
    await submit(event_log, "j-before")
    poison = [await publish_raw(event_log, JUNK), await publish_raw(event_log, V2)]
    await submit(event_log, "j-after")
    last_poison = await publish_raw(event_log, JUNK)  # poison as the log's last message

    first = Projector(event_log, dsn, batch_size=2)  # small batches: poison lands at every position
    try:
        assert await first.catch_up() == last_poison
    finally:
        await first.close()

    state = await fresh_fold(event_log)
    assert await fetch_jobs(conn) == [job_row(state.jobs[j]) for j in sorted(state.jobs)]
    assert await fetch_archive_seqs(conn) == list(range(1, last_poison + 1))
    rows = await conn.fetch(
        f"SELECT seq, type, data FROM {SCHEMA}.events WHERE type = 'quarantined' ORDER BY seq"
    )
    assert [r["seq"] for r in rows] == [*poison, last_poison]
    assert rows[1]["data"]["reason"] == "newer-version" and rows[1]["data"]["event_type"] == "JobSubmitted.v2"

    # A restart synchronises over the poison from the stored position, then follows new events.
    await submit(event_log, "j-later")
    second = Projector(event_log, dsn, batch_size=500)
    stop = asyncio.Event()
    task = asyncio.create_task(second.run(stop))
    try:
        target = await event_log.last_seq()
        deadline = time.monotonic() + 10
        while await conn.fetchval(f"SELECT seq FROM {SCHEMA}.projection_position") < target:
            assert time.monotonic() < deadline and not task.done(), "the projector stopped at the poison"
            await asyncio.sleep(0.05)
        assert second.model.state.hash() == (await fresh_fold(event_log)).hash()
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await second.close()
    assert {r[0] for r in await fetch_jobs(conn)} == {"j-before", "j-after", "j-later"}
