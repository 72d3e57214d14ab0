"""Two `rally serve projector` processes on one database: one projects, the other stands by warm and
takes over after the first is killed with SIGKILL (issue 34).

Real nats-server, real PostgreSQL, real processes. Who writes is read from PostgreSQL itself: a trigger
the test puts on ``rally.projection_position`` records the backend of every committed move of the
position (a fenced, rolled-back one leaves nothing), so "only one writes" is a fact about commits, not a
log line. The tables must end equal to the log folded independently (``test_projector``'s check).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import test_projector
from test_projector_quarantine import ProjectorProcess, eventually

from rallypoint.eventlog import EventLog
from rallypoint.projection import SCHEMA, Store
from rallypoint.projection.store import APPLICATION_NAME

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
