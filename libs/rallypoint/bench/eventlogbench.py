"""`rally bench eventlog`: the event log's rates on a real embedded NATS server.

Measures what the services live on: sequential appends (the API's per-request path), appends in flight
together (the agents' and controllers' bursts), fenced appends on the scheduler's tree (each waits for the
previous one's sequence), fenced atomic batches (the scheduler's cycle: up to ``MAX_BATCH`` events all
or nothing, each batch fenced on the previous one's last sequence), and a gapless replay of the whole
stream into the shared fold.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.eventlog.log import MAX_BATCH, Append, EventLog, stored
from rallypoint.events import GangBound, JobSpec, JobSubmitted, LeaderEpochStarted, TaskPlacement, subjects
from rallypoint.infra import NatsServer
from rallypoint.state import ClusterState

_SPEC = JobSpec(name="b", team="bench", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",))


def _submitted(i: int) -> JobSubmitted:
    return JobSubmitted(job_id=f"j{i}", spec=_SPEC, submitted_at=float(i))


def _bound(i: int) -> GangBound:
    placement = TaskPlacement(task=0, node_id=f"n{i}", gpus=tuple(range(8)))
    return GangBound(
        job_id=f"j{i}",
        attempt=1,
        epoch=1,
        placements=(placement,),
        computed_at_seq=1,
        policy_version="bench",
        now=0.0,
        at=0.0,
    )


async def _append_fenced_batches(log: EventLog, events: int, fence: int) -> None:
    """``events`` binds on the scheduler's tree as fenced atomic batches, as ``FencedWriter.append_many``."""
    for chunk in range(0, events, MAX_BATCH):
        batch = [
            Append(subjects.bind(f"j{i}"), _bound(i), f"j{i}:1:GangBound")
            for i in range(chunk, min(chunk + MAX_BATCH, events))
        ]
        result = await log.append_batch(
            batch,
            source="bench",
            expected_last_subject_seq=fence,
            expected_subject_filter=subjects.SCHEDULER_TREE,
        )
        fence = result.last_seq


async def _measure(url: str, events: int) -> dict[str, Any]:
    log = await EventLog.connect(url, name="bench")
    try:
        start = time.perf_counter()
        for i in range(events):
            await log.append(subjects.job(f"j{i}"), _submitted(i), msg_id=f"j{i}:s", source="bench")
        sequential = events / (time.perf_counter() - start)

        start = time.perf_counter()
        base = events
        for chunk in range(0, events, 500):
            await asyncio.gather(
                *(
                    log.append(
                        subjects.job(f"j{base + i}"),
                        _submitted(base + i),
                        msg_id=f"j{base + i}:s",
                        source="bench",
                    )
                    for i in range(chunk, min(chunk + 500, events))
                )
            )
        concurrent = events / (time.perf_counter() - start)

        fence = await log.last_seq(subjects.SCHEDULER_TREE)
        fenced_count = max(events // 4, 1)
        start = time.perf_counter()
        for i in range(fenced_count):
            fence = await log.append(
                subjects.EPOCH,
                LeaderEpochStarted(epoch=i + 1, leader_id="bench", at=0.0),
                msg_id=f"e{i}",
                source="bench",
                expected_last_subject_seq=fence,
                expected_subject_filter=subjects.SCHEDULER_TREE,
            )
        fenced = fenced_count / (time.perf_counter() - start)

        start = time.perf_counter()
        await _append_fenced_batches(log, events, fence)
        batched = events / (time.perf_counter() - start)

        total = await log.last_seq()
        state = ClusterState()
        start = time.perf_counter()
        # The way every service folds (quarantine on), so the figure is what services get.
        async for rec in log.replay(quarantine=True):
            state.apply_stored(rec.seq, stored(rec))
        replay = total / (time.perf_counter() - start)
        return {
            "events_replayed": total,
            "append_sequential_per_s": round(sequential),
            "append_500_in_flight_per_s": round(concurrent),
            "append_fenced_per_s": round(fenced),
            "append_fenced_batch_per_s": round(batched),
            "replay_and_fold_per_s": round(replay),
        }
    finally:
        await log.close()


def run_bench(events: int = 5000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rally-bench-") as tmp, NatsServer(Path(tmp) / "nats") as server:
        return asyncio.run(_measure(server.url, events))
