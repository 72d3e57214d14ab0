"""`rally bench binds`: binds written per second by the live ``SchedulerLoop`` on a real NATS server.

A fresh embedded server gets ``nodes`` registered nodes and ``pending`` one-node gangs (alternately 1 and
8 GPUs, already admitted unless ``admit_in_cycle``: then their binds admit them); one leader then runs
cycles until nothing is left pending. The rate is the binds folded back from the log over the time from the
first cycle to the fold of the last bind: what a burst of placements costs end to end (decide, write fenced,
fold), not the core alone.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint_services.scheduler.heap import settle_heap
from rallypoint_services.scheduler.leader import SchedulerLoop

from rallypoint.eventlog import EventLog
from rallypoint.events import Event, GpuInfo, JobQueued, JobSpec, JobSubmitted, NodeRegistered, subjects
from rallypoint.infra import NatsServer
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy

_IN_FLIGHT = 500
_MAX_CYCLES = 200


def _node(i: int, gpus: int) -> NodeRegistered:
    node_id = f"n{i:05d}"
    return NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack=f"rack-{i // 32}",
        spine=f"spine-{i // 1024}",
        gpu_type="sim",
        gpus=tuple(
            GpuInfo(index=g, uuid=f"{node_id}-{g}", memory_mib=1, nvlink_domain=0) for g in range(gpus)
        ),
        cpu_milli=64_000,
        memory_mib=512_000,
        agent_instance="bench",
        at=1.0,
    )


def _job(i: int, gpus_per_node: int) -> JobSubmitted:
    gpus = 1 if i % 2 == 0 else gpus_per_node
    spec = JobSpec(
        name=f"b{i}", team="bench", gpus=gpus, gpus_per_task=gpus, ranks_per_task=1, command=("true",)
    )
    return JobSubmitted(job_id=f"b{i:06d}", spec=spec, submitted_at=1.0)


async def _write_all(log: EventLog, events: list[tuple[str, Event, str]]) -> None:
    """Setup writes, many in flight (plain appends, so the bench runs on any version of the writer)."""
    for start in range(0, len(events), _IN_FLIGHT):
        chunk = events[start : start + _IN_FLIGHT]
        await asyncio.gather(*(log.append(s, e, msg_id=m, source="bench") for s, e, m in chunk))


async def _setup(log: EventLog, nodes: int, gpus_per_node: int, pending: int, admit: bool) -> None:
    await _write_all(
        log,
        [
            (subjects.node_registration(f"n{i:05d}"), _node(i, gpus_per_node), f"n{i}:reg")
            for i in range(nodes)
        ],
    )
    jobs = [_job(i, gpus_per_node) for i in range(pending)]
    await _write_all(log, [(subjects.job(j.job_id), j, f"{j.job_id}:0:JobSubmitted") for j in jobs])
    if admit:
        queued = [JobQueued(job_id=j.job_id, queue="bench", at=1.0) for j in jobs]
        await _write_all(log, [(subjects.admission(q.job_id), q, f"{q.job_id}:0:JobQueued") for q in queued])


def _bound(loop: SchedulerLoop) -> int:
    return sum(1 for j in loop.state.jobs.values() if j.state == "bound")


async def _run_cycles(loop: SchedulerLoop) -> tuple[int, list[float]]:
    """Cycles until nothing is pending or a cycle binds nothing more; (events written, seconds per cycle)."""
    written, times, bound = 0, [], -1
    for _ in range(_MAX_CYCLES):
        await loop.follower.wait_for(await loop.log.last_seq(), timeout=120.0)
        now_bound = _bound(loop)
        if not loop.state.pending_jobs() or now_bound == bound:
            break
        bound = now_bound
        start = time.perf_counter()
        written += await loop.cycle()
        times.append(time.perf_counter() - start)
    return written, times


async def _measure(
    url: str, nodes: int, gpus_per_node: int, pending: int, admit_in_cycle: bool
) -> dict[str, Any]:
    log = await EventLog.connect(url, name="bench-binds")
    follower = Follower(log)
    task: asyncio.Task[None] | None = None
    try:
        start = time.perf_counter()
        await _setup(log, nodes, gpus_per_node, pending, admit=not admit_in_cycle)
        setup_s = time.perf_counter() - start
        await follower.catch_up()
        settle_heap()  # as the service does once caught up
        task = asyncio.create_task(follower.run())
        loop = SchedulerLoop(
            log, follower, instance="bench", policy=SchedulingPolicy("rallypoint"), clock=lambda: 2.0
        )
        await loop.start_epoch()
        start = time.perf_counter()
        written, times = await _run_cycles(loop)
        elapsed = time.perf_counter() - start
        bound = _bound(loop)
        return {
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "pending": pending,
            "admitted_in_cycle": admit_in_cycle,
            "setup_s": round(setup_s, 2),
            "binds": bound,
            "cycles": len(times),
            "events_written": written,
            "elapsed_s": round(elapsed, 3),
            "binds_per_s": round(bound / elapsed) if elapsed > 0 else 0,
            "first_cycle_s": round(times[0], 3) if times else 0.0,
        }
    finally:
        if task is not None:
            task.cancel()
        await log.close()


def run_bench(
    *, nodes: int = 12_500, gpus_per_node: int = 8, pending: int = 20_000, admit_in_cycle: bool = False
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rally-bench-") as tmp, NatsServer(Path(tmp) / "nats") as server:
        return asyncio.run(_measure(server.url, nodes, gpus_per_node, pending, admit_in_cycle))
