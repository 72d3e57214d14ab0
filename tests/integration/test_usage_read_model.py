"""`rally usage` from the log equals the PostgreSQL read model's answer to the bit, on a recorded history
with preemptions and a retried job (tests/replay/data/usage_history.jsonl, from record_usage_history.py).

The recorded events are appended to a fresh log, projected into a fresh database, and the pure ``usage``
over a replay of the log is compared with the one SQL query over ``rally.attempts``: every group, window
and grouping, float for float.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import msgspec
import pytest

from rallypoint.accounting import AttemptLedger, fold_attempts, usage
from rallypoint.cli.replay import load_history
from rallypoint.eventlog import EventLog
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobCompleted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    MigSlice,
    NodeRegistered,
    TaskPlacement,
    subjects,
)
from rallypoint.events.codec import Quarantined
from rallypoint.infra import PostgresServer
from rallypoint.projection import Projector
from rallypoint.projection.rows import attempt_row
from rallypoint.projection.store import connect, fetch_attempts
from rallypoint.projection.usage import read_model_usage
from rallypoint.state import ClusterState

RECORDED = Path(__file__).parents[1] / "replay" / "data" / "usage_history.jsonl"


@pytest.fixture
async def dsn(postgres: PostgresServer) -> AsyncIterator[str]:
    name = f"usage_{uuid.uuid4().hex[:12]}"
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


async def _projected_and_folded(
    event_log: EventLog, dsn: str, *, batch_size: int
) -> tuple[ClusterState, AttemptLedger]:
    """The log projected into ``dsn``, and the log's own fold of attempts (what ``rally usage`` reads)."""
    projector = Projector(event_log, dsn, batch_size=batch_size)
    try:
        await projector.catch_up()
    finally:
        await projector.close()
    return fold_attempts([(rec.seq, rec.event) async for rec in event_log.replay()])


async def test_usage_from_the_log_equals_the_read_model(event_log: EventLog, dsn: str) -> None:
    history = load_history(str(RECORDED))
    for seq, item in history:
        assert not isinstance(item, Quarantined), item
        await event_log.append(subjects.for_event(item), item, msg_id=f"recorded:{seq}", source="test")
    state, ledger = await _projected_and_folded(event_log, dsn, batch_size=16)
    attempts = list(ledger.records())
    # the recording holds what it claims: preempted attempts and a retried job's failed one
    assert {"preempted", "attempt-failed", "completed", "failed", "cancelled"} <= {
        a.outcome for a in attempts
    }
    assert len(attempts) > len(state.jobs)

    conn = await connect(dsn, application_name="test-usage")
    try:
        assert await fetch_attempts(conn) == [attempt_row(a) for a in attempts]
        starts = sorted(a.started_at for a in attempts if a.started_at is not None)
        ends = sorted(a.ended_at for a in attempts if a.ended_at is not None)
        middle = starts[len(starts) // 2]
        windows = [(None, None), (middle, None), (None, middle), (starts[1], ends[-2])]
        now = ends[-1] + 10.0
        for by in ("team", "user", "class"):
            for since, until in windows:
                from_log = usage(ledger.records(), by, since, until, now=now, price_per_gpu_hour=2.5)
                from_db = await read_model_usage(conn, by, since, until, now=now, price_per_gpu_hour=2.5)
                assert from_log.rows, (by, since, until)
                assert from_db.source == "postgres"
                assert msgspec.structs.replace(from_db, source="log") == from_log, (by, since, until)
    finally:
        await conn.close()
    # to the GPU-second, spelled out: every preempted and retried attempt is charged
    total = sum(a.gpus * (a.ended_at - a.started_at) for a in attempts if a.started_at and a.ended_at)
    assert round(usage(attempts, "team", None, None, now=now).total_gpu_s) == round(total)


def _shared_history() -> list[Event]:
    """One H100 node (GPU 7 in MIG mode): a two-GPU gang, a quarter-GPU notebook and a 3g MIG eval, each
    running an awkward number of seconds."""
    gpus = tuple(
        GpuInfo(index=i, uuid=f"g{i}", memory_mib=81_559, nvlink_domain=0, mig=i == 7) for i in range(8)
    )
    events: list[Event] = [
        NodeRegistered(
            node_id="n1", address="a", rack="r", gpu_type="H100", gpus=gpus, cpu_milli=1, memory_mib=1,
            agent_instance="i", at=0.0,
        ),
        LeaderEpochStarted(epoch=1, leader_id="s", at=0.0),
    ]  # fmt: skip
    asks = {
        "gang": ({"gpus": 2, "gpus_per_task": 2}, TaskPlacement(task=0, node_id="n1", gpus=(0, 1))),
        "notebook": ({"gpu_milli": 250}, TaskPlacement(task=0, node_id="n1", gpus=(2,))),
        "eval": (
            {"mig_profile": "3g.40gb"},
            TaskPlacement(task=0, node_id="n1", gpus=(7,), mig=MigSlice(profile="3g.40gb", start=0)),
        ),
    }
    for i, (job_id, (ask, placement)) in enumerate(asks.items()):
        fields = {"gpus": 1, "gpus_per_task": 1, **ask}
        spec = JobSpec(name=job_id, team=f"team-{i % 2}", ranks_per_task=1, command=("true",), **fields)
        start, end = 10.1 + i, 1_000.7 + 3.3 * i
        events += [
            JobSubmitted(job_id=job_id, spec=spec, submitted_at=1.0),
            GangBound(
                job_id=job_id, attempt=1, epoch=1, placements=(placement,), computed_at_seq=0,
                policy_version="t", now=start, at=start,
            ),
            JobStarted(job_id=job_id, attempt=1, at=start),
            JobCompleted(job_id=job_id, attempt=1, at=end),
        ]  # fmt: skip
    return events


async def test_shares_and_mig_slices_are_charged_their_part_alike_in_the_log_and_the_read_model(
    event_log: EventLog, dsn: str
) -> None:
    for i, event in enumerate(_shared_history()):
        await event_log.append(subjects.for_event(event), event, msg_id=f"shared:{i}", source="test")
    _state, ledger = await _projected_and_folded(event_log, dsn, batch_size=4)
    attempts = {a.job_id: a for a in ledger.records()}
    assert {j: a.gpu_milli for j, a in attempts.items()} == {"gang": None, "notebook": 250, "eval": 428}
    spans = {j: a.ended_at - a.started_at for j, a in attempts.items() if a.started_at and a.ended_at}
    report = usage(attempts.values(), "team", None, None, now=2_000.0)
    charged = {r.key: r.gpu_s for r in report.rows}
    assert charged == {
        "team-0": 2 * spans["gang"] + 428 / 1000 * spans["eval"],
        "team-1": 250 / 1000 * spans["notebook"],
    }
    conn = await connect(dsn, application_name="test-usage-shared")
    try:
        assert await fetch_attempts(conn) == [attempt_row(a) for a in ledger.records()]
        for by in ("team", "user", "class"):
            for since, until in ((None, None), (500.0, None), (None, 600.0)):
                from_log = usage(ledger.records(), by, since, until, now=2_000.0)
                from_db = await read_model_usage(conn, by, since, until, now=2_000.0)
                assert msgspec.structs.replace(from_db, source="log") == from_log, (by, since, until)
    finally:
        await conn.close()
