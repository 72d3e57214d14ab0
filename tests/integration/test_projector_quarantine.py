"""No event stops the projector: what PostgreSQL refuses to store is quarantined, and the rest projected.

Real nats-server, real PostgreSQL, the real `rally serve projector` process: each test appends events
straight to the log (past the API, which refuses such input), one with a NUL in its strings (PostgreSQL's
``\\u0000 cannot be converted to text``) or a number no ``integer`` column holds, and events after it.
Before issue 30 the projector crash-looped on the first of these and never moved again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import test_projector

from rallypoint.eventlog import EventLog, Recorded
from rallypoint.events import Event, JobQueued, JobSpec, JobSubmitted, encode, event_type, subjects
from rallypoint.infra import ManagedProcess, PostgresServer, free_port
from rallypoint.projection import (
    QUARANTINE_TABLE,
    SCHEMA,
    Projector,
    QuarantineCollector,
    ReadModel,
    connect,
    fetch_archive_seqs,
    fetch_jobs,
    job_row,
)

T0 = 1_760_000_000.0
NUL = "\x00"

# --------------------------------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------------------------------

# test_projector's fixtures: a fresh database per test (``dsn``) and a connection to look at it (``db``).
dsn = test_projector.dsn
db = test_projector.db
rally_projector = test_projector.rally_projector


def spec(name: str, *, gpus: int = 8, **fields: Any) -> JobSpec:
    return JobSpec(
        name=name, team="nlp", gpus=gpus, gpus_per_task=8, ranks_per_task=8, command=("true",), **fields
    )


def submitted(job_id: str, job_spec: JobSpec) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, spec=job_spec, submitted_at=T0)


def queued(job_id: str) -> JobQueued:
    return JobQueued(job_id=job_id, queue="nlp", at=T0 + 1)


async def put(log: EventLog, event: Event) -> int:
    """Straight into the log on the event's own subject, as a writer that slipped would append it."""
    job_id = getattr(event, "job_id", "")
    return await log.append(
        subjects.for_event(event), event, msg_id=f"{job_id}:{event_type(event)}", source="test"
    )


async def append_history(log: EventLog) -> int:
    """Good events around one whose spec holds NUL characters; returns the bad event's sequence.

    The NULs are in ``checkpoint_dir`` and ``gpu_type``, which no view column shows, only the archive's
    jsonb: the job's row comes back with its next event, from the fold that applied the refused one.
    """
    await put(log, submitted("ok-1", spec("first")))
    bad = await put(
        log, submitted("bad-2", spec("evil", checkpoint_dir=f"/ckpt{NUL}x", gpu_type=f"H100{NUL}"))
    )
    await put(log, queued("ok-1"))
    await put(log, submitted("ok-3", spec("third")))
    await put(log, queued("ok-3"))
    await put(log, queued("bad-2"))
    return bad


async def fold_log(log: EventLog) -> ReadModel:
    """The fold every service makes of the log, independent of the projector."""
    model = ReadModel()
    async for rec in log.replay(quarantine=True):
        model.apply_stored(rec)
    return model


async def quarantine_rows(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(
        await db.fetch(f"SELECT seq, subject, type, error, data FROM {QUARANTINE_TABLE} ORDER BY seq")
    )


async def position(db: asyncpg.Connection) -> int:
    """The stored position; 0 before the projector has created its tables."""
    if not await db.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{SCHEMA}.projection_position"):
        return 0
    return int(await db.fetchval(f"SELECT seq FROM {SCHEMA}.projection_position") or 0)


async def eventually(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 30.0) -> Any:
    """``check()``'s first truthy answer, polled until a generous deadline."""
    deadline = time.monotonic() + timeout
    while True:
        answer = await check()
        if answer:
            return answer
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f}s"
        await asyncio.sleep(0.05)


def caught_up(db: asyncpg.Connection, log: EventLog) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await position(db) >= await log.last_seq()

    return check


async def assert_quarantined_and_projected(db: asyncpg.Connection, log: EventLog, bad: int) -> None:
    """Only ``bad`` quarantined, with its event kept whole; every later event projected; the views equal
    the log's fold; the archive holds every sequence once, ``bad`` as a ``quarantined`` row."""
    last = await log.last_seq()
    assert await position(db) == last
    rows = await quarantine_rows(db)
    assert [(r["seq"], r["subject"], r["type"]) for r in rows] == [
        (bad, subjects.job("bad-2"), "JobSubmitted.v1")
    ]
    assert "22P05" in rows[0]["error"] and "\\u0000" in rows[0]["error"]
    (stored,) = [rec async for rec in log.replay(from_seq=bad, to_seq=bad)]
    assert isinstance(stored, Recorded)
    assert bytes(rows[0]["data"]) == encode(stored.event)  # the refused event, byte for byte
    model = await fold_log(log)
    assert await fetch_jobs(db) == model.all_job_rows()
    assert "bad-2" in {row[0] for row in await fetch_jobs(db)}  # back with its next event
    assert await fetch_archive_seqs(db) == list(range(1, last + 1))
    archived = await db.fetchrow(f"SELECT type, data FROM {SCHEMA}.events WHERE seq = $1", bad)
    assert archived["type"] == "quarantined" and archived["data"]["reason"] == "refused"


def nats_url(log: EventLog) -> str:
    assert log.nc.connected_url is not None
    return f"nats://{log.nc.connected_url.netloc}"


def counted(projector: Projector) -> float:
    """The value of the projector's quarantine counter, as /metrics would export it."""
    (family,) = QuarantineCollector(projector).collect()
    (sample,) = family.samples
    assert sample.name == "rally_projector_quarantined_events_total"
    return sample.value


# --------------------------------------------------------------------------------------------------
# the projector in process
# --------------------------------------------------------------------------------------------------


async def test_a_nul_is_quarantined_and_the_events_after_it_projected(
    event_log: EventLog, dsn: str, db: asyncpg.Connection
) -> None:
    """A live projector whose batch holds the bad event among good ones: the batch is refused, its
    events written one by one, the bad one quarantined; the projector follows what comes next."""
    projector = Projector(event_log, dsn, batch_size=500, batch_wait=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        assert projector.degraded() == [] and counted(projector) == 0
        bad = await append_history(event_log)
        await eventually(caught_up(db, event_log), "projection past the NUL")
        await put(event_log, submitted("ok-4", spec("after")))
        await eventually(caught_up(db, event_log), "projection of a later event")
        assert not task.done()
        assert projector.resyncs == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await projector.close()
    await assert_quarantined_and_projected(db, event_log, bad)
    assert counted(projector) == 1
    (reason,) = projector.degraded()
    assert f"seq {bad} on {subjects.job('bad-2')}: JobSubmitted.v1 refused by PostgreSQL" in reason
    # The projection's fold still applied the refused event: it equals every other fold of the log.
    assert projector.model.state.hash() == (await fold_log(event_log)).state.hash()

    # A restart reads the quarantine back: still degraded, still counted, nothing quarantined twice.
    again = Projector(event_log, dsn)
    try:
        assert await again.catch_up() == await event_log.last_seq()
        assert again.degraded() == projector.degraded() and counted(again) == 1
    finally:
        await again.close()
    assert len(await quarantine_rows(db)) == 1


@pytest.mark.parametrize("batch_size", [1, 2])
async def test_a_number_out_of_range_and_the_jobs_later_events_are_quarantined(
    event_log: EventLog, dsn: str, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture, batch_size: int
) -> None:
    """``gpus`` 2^40 decodes (an int64) but no ``integer`` column holds it (22003). The job's later
    events are refused too, since its row holds the number, and quarantined alone: only the first
    refused batch (none with batches of one) is re-synchronised and written one event at a time, not
    the batch that holds the job's next event. The other jobs are projected."""
    await put(event_log, submitted("ok-1", spec("first")))
    huge = await put(event_log, submitted("huge-2", spec("huge", gpus=2**40)))
    huge_queued = await put(event_log, queued("huge-2"))
    await put(event_log, queued("ok-1"))
    projector = Projector(event_log, dsn, batch_size=batch_size)
    try:
        with caplog.at_level(logging.WARNING, logger="rallypoint.projection"):
            assert await projector.catch_up() == await event_log.last_seq()
    finally:
        await projector.close()
    rows = await quarantine_rows(db)
    assert [r["seq"] for r in rows] == [huge, huge_queued]
    assert all("22003" in r["error"] and "\n" not in r["error"] for r in rows)
    assert await fetch_jobs(db) == [job_row((await fold_log(event_log)).state.jobs["ok-1"])]
    assert counted(projector) == 2 and len(projector.degraded()) == 2
    one_by_one = [r for r in caplog.records if "writing its events one by one" in r.getMessage()]
    assert len(one_by_one) == (0 if batch_size == 1 else 1)


async def test_an_outage_is_retried_and_only_the_refused_event_quarantined(event_log: EventLog) -> None:
    """PostgreSQL itself goes away while the bad event and good ones arrive: the failed connects and
    writes are retried (no fault of the events), and once it is back only the NUL is quarantined."""
    # Its own server (default temp dir: postgres may run as another OS user), so the shared one stays up.
    server = await PostgresServer(port=free_port()).astart()
    projector = Projector(event_log, server.dsn, batch_size=500)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        await put(event_log, submitted("ok-0", spec("before")))
        observer = await connect(server.dsn)
        await eventually(caught_up(observer, event_log), "projection before the outage")
        await observer.close()

        await asyncio.to_thread(server.stop, remove_data=False)
        retried = projector.retries
        bad = await append_history(event_log)  # written to the log while the read models are down

        async def failing() -> bool:
            return projector.retries > retried

        await eventually(failing, "a failed write during the outage")
        assert projector.quarantined_total == 0
        await server.astart()

        observer = await connect(server.dsn)
        try:
            await eventually(caught_up(observer, event_log), "projection after the outage")
            await assert_quarantined_and_projected(observer, event_log, bad)
        finally:
            await observer.close()
        assert projector.quarantined_total == 1 and not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await projector.close()
        await server.astop(remove_data=True)


async def test_rebuild_quarantines_the_same_event_and_status_names_it(
    event_log: EventLog, dsn: str, db: asyncpg.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rally projector rebuild` over a log with the bad event: exit 0, the same tables as the
    incremental projection, the quarantine filled again; `rally projector status` names the event."""
    bad = await append_history(event_log)
    projector = Projector(event_log, dsn, batch_size=2)
    try:
        await projector.catch_up()
    finally:
        await projector.close()
    incremental = await tables(db)

    url = nats_url(event_log)
    rebuild = ["projector", "rebuild", "--nats-url", url, "--postgres-dsn", dsn, "--batch-size", "500"]
    assert await asyncio.to_thread(rally_projector, rebuild) == 0
    assert "1 events refused by PostgreSQL were quarantined" in capsys.readouterr().err
    assert await tables(db) == incremental
    await assert_quarantined_and_projected(db, event_log, bad)

    status = ["projector", "status", "--nats-url", url, "--postgres-dsn", dsn]
    assert await asyncio.to_thread(rally_projector, [*status, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["quarantined_total"] == 1 and report["lag"] == 0
    (named,) = report["quarantined"]
    assert (named["seq"], named["subject"], named["type"]) == (bad, subjects.job("bad-2"), "JobSubmitted.v1")
    assert await asyncio.to_thread(rally_projector, status) == 0
    assert f"seq {bad} on {subjects.job('bad-2')}: JobSubmitted.v1: " in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        await asyncio.to_thread(rally_projector, [*status, "--limit", "0"])
    assert refused.value.code == 2 and "must be at least 1, not 0" in capsys.readouterr().err


async def tables(db: asyncpg.Connection) -> dict[str, list[Any]]:
    """Every table the projection writes, quarantine included (its time of writing left out)."""
    found: dict[str, list[Any]] = {}
    for table, key in (("events", "seq"), ("jobs", "job_id"), ("attempts", "job_id, attempt")):
        found[table] = [tuple(r) for r in await db.fetch(f"SELECT * FROM {SCHEMA}.{table} ORDER BY {key}")]
    found["quarantine"] = [tuple(r) for r in await quarantine_rows(db)]
    return found


# --------------------------------------------------------------------------------------------------
# `rally serve projector`: /healthz and /metrics
# --------------------------------------------------------------------------------------------------


class ProjectorProcess:
    """`rally serve projector` as its own process, /healthz and /metrics on a free port."""

    def __init__(
        self, log: EventLog, dsn: str, workdir: Path, *extra: str, log_name: str = "projector.log"
    ) -> None:
        self.port = free_port()
        self.argv = [sys.executable, "-m", "rallypoint.cli.main", "serve", "projector"]
        self.argv += ["--nats-url", nats_url(log), "--health-port", str(self.port), "--log-format", "text"]
        self.argv += extra
        self.env = {**os.environ, "RALLY_POSTGRES_DSN": dsn}
        self.log_path = workdir / log_name
        self.proc = self.start()

    def start(self) -> ManagedProcess:
        return ManagedProcess(self.argv, log_path=self.log_path, env=self.env)

    async def get(self, path: str) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"http://127.0.0.1:{self.port}{path}", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp,
        ):
            return resp.status, await resp.text()

    async def health(self) -> dict[str, Any] | None:
        assert self.proc.running(), self.proc.log_tail()
        try:
            status, body = await self.get("/healthz")
        except aiohttp.ClientError:
            return None  # not listening yet
        assert status == 200, body
        found: dict[str, Any] = json.loads(body)
        return found

    def reports(self, status: str, reason: str = "") -> Callable[[], Awaitable[bool]]:
        """A check that /healthz says ``status`` and, when given, a degraded reason holding ``reason``
        (other reasons may come and go: a NATS reconnect under load says degraded too)."""

        async def check() -> bool:
            found = await self.health()
            if found is None or found["status"] != status:
                return False
            return not reason or any(reason in line for line in found["degraded"])

        return check

    async def counter_line(self) -> str:
        _, text = await self.get("/metrics")
        return next(
            line for line in text.splitlines() if line.startswith("rally_projector_quarantined_events_total")
        )


async def test_the_service_says_degraded_names_the_event_and_counts_it(
    event_log: EventLog, dsn: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    zero = 'rally_projector_quarantined_events_total{projection="read_models"} 0.0'
    one = 'rally_projector_quarantined_events_total{projection="read_models"} 1.0'
    await put(event_log, submitted("ok-0", spec("before")))
    service = ProjectorProcess(event_log, dsn, tmp_path)
    try:
        await eventually(caught_up(db, event_log), "projection of the first event")
        await eventually(service.reports("ok"), "/healthz ok")
        assert await service.counter_line() == zero

        bad = await append_history(event_log)
        named = f"quarantined seq {bad} on {subjects.job('bad-2')}: JobSubmitted.v1 refused by PostgreSQL"
        await eventually(service.reports("degraded", named), "degraded /healthz naming the event")
        await eventually(caught_up(db, event_log), "projection past the NUL")
        assert await service.counter_line() == one
        assert named in service.proc.log_tail(20_000)  # the WARNING

        # A restart is no crash loop: it comes back degraded, with the same count, and follows on.
        assert service.proc.stop(timeout=30) == 0, service.proc.log_tail()
        service.proc = service.start()
        await eventually(service.reports("degraded", named), "degraded /healthz after a restart")
        assert await service.counter_line() == one
        await put(event_log, submitted("ok-9", spec("later")))
        await eventually(caught_up(db, event_log), "projection after the restart")
    finally:
        service.proc.stop(timeout=30)
    await assert_quarantined_and_projected(db, event_log, bad)
