"""The projector's own work per job, without the log: fold a synthetic history and write it to PostgreSQL.

``python -m rallypoint.bench.projectionbench --jobs 8000`` starts a throwaway PostgreSQL, builds the log of
``--nodes`` registrations and ``--jobs`` one-GPU jobs (submitted, queued, bound, started, one rank
exited, completed: what a short job writes), interleaved by time as the live log has them, and projects
it in batches of ``--batch`` events (``ReadModel.fold`` then the fenced ``Store.write``, as the service
does). It prints the CPU per job of this process (the fold, the rows, asyncpg) and of the PostgreSQL
backend serving it (read from /proc), with the load average: on a shared machine compare runs of one
session, alternated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from rallypoint.eventlog import Recorded
from rallypoint.events import Event, JobSubmitted, LeaderEpochStarted, subjects
from rallypoint.events.codec import envelope_from_headers, envelope_headers
from rallypoint.events.synthetic import job_life, node_name, registered_node
from rallypoint.infra import PostgresServer
from rallypoint.infra.proccpu import cpu_seconds
from rallypoint.projection.rows import ReadModel
from rallypoint.projection.store import Store

T0 = 1_760_000_000.0


def _cpu_seconds(pid: int) -> float:
    used = cpu_seconds(pid)
    if used is None:
        raise RuntimeError(f"PostgreSQL backend {pid} is gone")
    return used


def _job(j: int, nodes: int) -> list[tuple[str, Event, float]]:
    """A one-GPU job's life, 4 ms after the previous job's submission, running 10 s."""
    at = T0 + 1 + j * 0.004
    life = job_life(
        f"job-{j}", node_id=node_name(j % nodes), gpus=((j // nodes) % 8,), ranks=1, at=at, run_s=10
    )
    return [_placed(e) for phase in life for e in phase]


def _placed(event: Event) -> tuple[str, Event, float]:
    """An event with its subject and its time (a submission's is ``submitted_at``, the others' ``at``)."""
    at = event.submitted_at if isinstance(event, JobSubmitted) else getattr(event, "at")  # noqa: B009
    return subjects.for_event(event), event, float(at)


def history(nodes: int, jobs: int) -> list[Recorded]:
    """The registrations and the scheduler's epoch, then every job's events in time order, with the
    envelopes the log stores. The first ``nodes + 1`` records are the cluster before any job."""
    lives = sorted((e for j in range(jobs) for e in _job(j, nodes)), key=lambda e: e[2])
    # the scheduler's epoch: the fold ignores binds of an epoch it has not seen begin
    epoch = (subjects.EPOCH, LeaderEpochStarted(epoch=1, leader_id="bench", at=T0), T0)
    out = []
    nodes_up = [_placed(registered_node(i, at=T0)) for i in range(nodes)]
    for seq, (subject, event, at) in enumerate([*nodes_up, epoch, *lives], 1):
        headers = envelope_headers(event, event_id=f"bench-{seq}", source="bench", subject=subject, at=at)
        out.append(Recorded(seq=seq, subject=subject, event=event, envelope=envelope_from_headers(headers)))
    return out


async def _project(dsn: str, records: list[Recorded], nodes: int, batch: int) -> tuple[float, float]:
    """(this process's, the backend's) CPU seconds to project the jobs' part of ``records``."""
    store = await Store.open(dsn)
    try:
        backend = int(await store.conn.fetchval("SELECT pg_backend_pid()"))
        model = ReadModel()
        registered = model.fold(records[: nodes + 1])
        assert registered is not None
        await store.write(registered, expected=0)
        client, server = time.process_time(), _cpu_seconds(backend)
        for start in range(nodes + 1, len(records), batch):
            before = model.position
            folded = model.fold(records[start : start + batch])
            assert folded is not None
            await store.write(folded, expected=before)
        return time.process_time() - client, _cpu_seconds(backend) - server
    finally:
        await store.close()


def run(nodes: int, jobs: int, batch: int) -> dict[str, Any]:
    records = history(nodes, jobs)
    load_before = os.getloadavg()[0]
    with PostgresServer() as postgres:
        client, server = asyncio.run(_project(postgres.dsn, records, nodes, batch))
    return {
        "nodes": nodes,
        "jobs": jobs,
        "batch": batch,
        "client_cpu_ms_per_job": round(client * 1000 / jobs, 4),
        "postgres_cpu_ms_per_job": round(server * 1000 / jobs, 4),
        "load_1m_before": round(load_before, 2),
        "load_1m_after": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.bench.projectionbench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=500, help="nodes registered first (default 500)")
    parser.add_argument("--jobs", type=int, default=8000, help="one-GPU jobs (default 8000)")
    parser.add_argument("--batch", type=int, default=100, help="events per batch (default 100)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.nodes, args.jobs, args.batch), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
