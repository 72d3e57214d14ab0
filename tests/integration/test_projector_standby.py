"""Two `rally serve projector` processes on one database: one projects, the other stands by warm and
takes over after the first is killed with SIGKILL (issue 34).

Real nats-server, real PostgreSQL, real processes. Who writes is read from PostgreSQL itself: a trigger
the test puts on ``rally.projection_position`` records the backend of every committed move of the
position (a fenced, rolled-back one leaves nothing), so "only one writes" is a fact about commits, not a
log line. The tables must end equal to the log folded independently (``test_projector``'s check).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import nats.js.errors
import pytest
import test_nats_acl
import test_projector
from test_projector_quarantine import ProjectorProcess, eventually

from rallypoint.eventlog import EventLog, NatsCredentials, connect_nats
from rallypoint.projection import SCHEMA, Projector, Store
from rallypoint.projection.standby import project_while_elected
from rallypoint.projection.store import APPLICATION_NAME
from rallypoint.runtime import LeaderLease
from rallypoint.runtime.leader import LEADER_BUCKET
from rallypoint.security import ADMIN

dsn = test_projector.dsn
db = test_projector.db

# The lease TTL the test asks for; a rally-leader bucket made earlier in the session keeps its own TTL
# (3 s by default), which the deadlines below allow for.
LEASE_TTL = "1"
TAKEOVER_DEADLINE_S = 30.0


@pytest.fixture
async def writers(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """The schema made up front, and a trigger recording which backend committed each move."""
    store = await Store.open(dsn)
    await store.close()
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        f"""
        CREATE TABLE public.position_writers (seq bigint NOT NULL, backend int NOT NULL);
        CREATE FUNCTION public.record_writer() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.position_writers VALUES (NEW.seq, pg_backend_pid());
            RETURN NEW;
        END $$;
        CREATE TRIGGER record_writer AFTER UPDATE ON {SCHEMA}.projection_position
            FOR EACH ROW EXECUTE FUNCTION public.record_writer();
        """
    )
    try:
        yield conn
    finally:
        await conn.close()


class Replica(ProjectorProcess):
    """One named replica with its own log file and a short lease."""

    def __init__(self, log: EventLog, dsn: str, workdir: Path, instance: str) -> None:
        self.instance = instance
        extra = ("--instance", instance, "--lease-ttl", LEASE_TTL)
        super().__init__(log, dsn, workdir, *extra, log_name=f"{instance}.log")

    async def leads(self) -> bool | None:
        found = await self.health()
        return None if found is None else bool(found["leader"])

    async def leader_gauge(self) -> str:
        _, text = await self.get("/metrics")
        return next(line for line in text.splitlines() if line.startswith("rally_leader{"))


async def backends(db: asyncpg.Connection) -> set[int]:
    rows = await db.fetch("SELECT pid FROM pg_stat_activity WHERE application_name = $1", APPLICATION_NAME)
    return {int(row["pid"]) for row in rows}


async def writers_since(conn: asyncpg.Connection, seq: int) -> set[int]:
    rows = await conn.fetch("SELECT DISTINCT backend FROM public.position_writers WHERE seq > $1", seq)
    return {int(row["backend"]) for row in rows}


def one_leads(replicas: list[Replica]) -> Callable[[], Awaitable[Replica | None]]:
    async def check() -> Replica | None:
        found = [await r.leads() for r in replicas]
        if None in found or found.count(True) != 1:
            return None
        return replicas[found.index(True)]

    return check


async def test_the_standby_takes_over_after_a_kill_and_nothing_is_written_twice(
    event_log: EventLog,
    dsn: str,
    db: asyncpg.Connection,
    writers: asyncpg.Connection,
    tmp_path: Path,
) -> None:
    w = test_projector.Writer(event_log)
    await test_projector.append_lifecycle(w)
    replicas = [Replica(event_log, dsn, tmp_path, name) for name in ("proj-a", "proj-b")]
    try:
        active: Any = await eventually(one_leads(replicas), "one projector leads", timeout=60)
        standby = next(r for r in replicas if r is not active)
        await test_projector.append_rounds(w, 3)
        await eventually(await test_projector.caught_up(db, event_log), "projected by the leader")
        assert (
            await active.leader_gauge()
            == f'rally_leader{{instance="{active.instance}",role="projector"}} 1.0'
        )
        assert (
            await standby.leader_gauge()
            == f'rally_leader{{instance="{standby.instance}",role="projector"}} 0.0'
        )
        assert "standing by" in standby.proc.log_tail(20_000)

        # Every committed move so far came from one connection: the standby's never wrote.
        both = await eventually(lambda: _two(db), "both projectors connected")
        first = await writers_since(writers, 0)
        assert len(first) == 1 and first < both, (first, both)

        # kill -9 the active one: no resign, its lease expires on the server's clock.
        killed_at_seq = await test_projector.position(db)
        os.kill(active.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        await test_projector.append_rounds(w, 2, start=3)
        await eventually(standby.leads, "the standby takes the lease", timeout=TAKEOVER_DEADLINE_S)
        await eventually(
            await test_projector.caught_up(db, event_log), "projected by the new leader", TAKEOVER_DEADLINE_S
        )
        took = time.monotonic() - killed_at
        print(f"takeover and catch-up {took:.1f}s after the kill", file=sys.stderr)
        assert (
            await standby.leader_gauge()
            == f'rally_leader{{instance="{standby.instance}",role="projector"}} 1.0'
        )

        # What moved the position after the kill came from the survivor's connection alone.
        after = await writers_since(writers, killed_at_seq)
        assert after and after.isdisjoint(first), (after, first)
        assert after <= await backends(db), after
    finally:
        for replica in replicas:
            replica.proc.stop(timeout=30)
    await test_projector.assert_views_match_log(db, event_log)


async def _two(db: asyncpg.Connection) -> set[int] | None:
    found = await backends(db)
    return found if len(found) == 2 else None


async def test_a_holder_that_loses_its_lease_stands_by_and_keeps_its_fold_warm(
    event_log: EventLog, dsn: str, db: asyncpg.Connection, request: pytest.FixtureRequest
) -> None:
    """In one process, so the lease can be lost without a death (as a pause or a cut from NATS would):
    the holder stops after its batch, stands by, and follows the stored position; the other projects."""
    w = test_projector.Writer(event_log)
    await test_projector.append_lifecycle(w)
    bucket = f"leader-{request.node.name.replace('_', '-')}"[:60]
    pairs = []
    for holder in ("one", "two"):
        lease = await LeaderLease.open(event_log.js, holder=holder, key="projector", bucket=bucket, ttl=1.0)
        pairs.append((Projector(event_log, dsn, batch_size=40), lease))
    (first, first_lease), (second, second_lease) = pairs
    stop = asyncio.Event()
    # The first leads; once deposed it tries again only every 2 s, so the second (every 0.1 s) wins.
    tasks = [asyncio.create_task(project_while_elected(first, first_lease, stop, poll=2.0))]
    try:
        await eventually(await test_projector.caught_up(db, event_log), "projected", TAKEOVER_DEADLINE_S)
        tasks.append(asyncio.create_task(project_while_elected(second, second_lease, stop, poll=0.1)))
        await eventually(_true(lambda: second.position == first.position), "the standby's fold warm")
        assert first_lease.is_leader and not second_lease.is_leader
        first_lease.abandon()  # lost, as by a holder that could not renew: the key expires on the server
        await eventually(
            _true(lambda: second_lease.is_leader), "the other takes the lease", TAKEOVER_DEADLINE_S
        )
        await test_projector.append_rounds(w, 2)
        await eventually(await test_projector.caught_up(db, event_log), "projected by the new holder")
        stored = await test_projector.position(db)
        # the deposed one stands by: it holds no lease and its fold follows what the other committed
        await eventually(_true(lambda: first.position == stored), "the deposed one's fold kept warm")
        assert not first_lease.is_leader
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        for projector, lease in pairs:
            await lease.resign()
            await projector.close()
    await test_projector.assert_views_match_log(db, event_log)


def _true(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def wrapped() -> bool:
        return check()

    return wrapped


# The projector's own NATS user (the permission matrix, on a live server): it may hold its lease key and
# no other. Both configs: the local cluster's and deploy/nats/accounts.conf.
secured = test_nats_acl.secured


async def test_the_projector_user_holds_its_own_lease_and_no_other(secured: test_nats_acl.Secured) -> None:
    credentials = NatsCredentials("projector", secured.credentials.passwords["projector"])
    nc = await connect_nats(secured.server.url, name="acl-projector", credentials=credentials)
    try:
        lease = await LeaderLease.open(nc.jetstream(), holder="proj-a", key="projector")
        assert await lease.try_acquire() and await lease.renew()
        assert not await LeaderLease(lease.kv, key="scheduler", holder="proj-a", ttl=lease.ttl).try_acquire()
        await lease.resign()  # deletes the key: a standby takes over at its next try
        successor = LeaderLease(lease.kv, key="projector", holder="proj-b", ttl=lease.ttl)
        assert await successor.try_acquire()
        await successor.resign()
    finally:
        await nc.close()
    admin = await secured.connect(ADMIN)
    try:
        kv = await admin.jetstream().key_value(LEADER_BUCKET)
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get("scheduler")  # the refused create left nothing
    finally:
        await admin.close()
