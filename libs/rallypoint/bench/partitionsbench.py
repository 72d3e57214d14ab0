"""`rally bench partitions`: how long a killed job controller's partitions stay without an owner.

On a real embedded NATS server, ``replicas`` owners of the job controller's partitions
(``runtime.partitions``, each on its own connection, with its own fold of the log) share them. Then,
``kills`` times: one owner is killed as kill -9 would leave it (its presence and leases abandoned, no
hand-over), a fresh one joins so the count stays, and the clock runs from the kill until every partition
the dead one held is fenced by a live owner (its ``LeaderEpochStarted`` stored and applied). Reported:
that handover per kill and per partition, p50 / p99 / max, seconds. The server expires a key about
0.25 s after its TTL: the handover is about TTL + 0.3 s at worst. Before the kills, what fencing costs an
owner's appends: the job controller's appends, ``IN_FLIGHT`` at a time, plain and fenced on a partition's
epoch (as ``FencedWriter`` writes them), per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.bench.loadgen import percentile
from rallypoint.eventlog import EventLog
from rallypoint.eventlog.setup import PARTITION_TTL_S, open_partition_bucket
from rallypoint.events import JobStarted, subjects
from rallypoint.infra import NatsServer
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.partitions import PartitionOwnership, assigned

COUNT = subjects.CONTROL_PARTITIONS
POLL_S = 0.005
IN_FLIGHT = 256  # the job controller's MAX_ACTIVE_JOBS
APPENDS = 4000


class _Owner:
    def __init__(self, log: EventLog, ownership: PartitionOwnership, tasks: list[asyncio.Task[None]]) -> None:
        self.log = log
        self.ownership = ownership
        self.tasks = tasks

    async def kill(self) -> None:
        self.ownership.abandon()
        for task in self.tasks:
            task.cancel()
        await asyncio.wait(self.tasks, timeout=5.0)
        await self.log.close()


async def _start(url: str, name: str, ttl: float) -> _Owner:
    log = await EventLog.connect(url, name=f"bench-{name}")
    follower = Follower(log)
    await follower.catch_up()
    kv = await open_partition_bucket(log.js, ttl=ttl)
    ownership = PartitionOwnership(
        kv, log, follower, service=subjects.CONTROL_ROLE, member=name, count=COUNT, ttl=ttl, source="bench"
    )
    stop = asyncio.Event()
    return _Owner(log, ownership, [asyncio.create_task(follower.run()), ownership.start(stop)])


def _settled(owners: dict[str, _Owner]) -> bool:
    live = list(owners)
    return all(set(o.ownership.writers) == assigned(n, live, COUNT) for n, o in owners.items())


async def _until(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the owners did not settle on the assignment")
        await asyncio.sleep(POLL_S)


async def _append_rate(owner: _Owner, fenced: bool) -> float:
    """Appends a second of the job controller's events on one owner's connection, plain or fenced."""
    tag = "fenced" if fenced else "plain"
    jobs = [j for i in range(APPENDS * COUNT) if owner.ownership.owns(j := f"{tag}-{i}")][:APPENDS]

    async def one(job_id: str) -> None:
        subject, event = subjects.job_control(job_id), JobStarted(job_id=job_id, attempt=1, at=0.0)
        writer = owner.ownership.writer_for(job_id)
        if fenced and writer is not None:
            await writer.append(subject, event, f"{job_id}:1:JobStarted")
        else:
            await owner.log.append(subject, event, msg_id=f"{job_id}:1:JobStarted", source="bench")

    started = time.perf_counter()
    for chunk in range(0, len(jobs), IN_FLIGHT):
        await asyncio.gather(*(one(j) for j in jobs[chunk : chunk + IN_FLIGHT]))
    return round(len(jobs) / (time.perf_counter() - started))


async def _measure(url: str, replicas: int, kills: int, ttl: float) -> dict[str, Any]:
    owners = {f"r{i}": await _start(url, f"r{i}", ttl) for i in range(replicas)}
    rates: dict[str, float] = {}
    whole: list[float] = []
    each: list[float] = []
    try:
        await _until(lambda: _settled(owners), 30.0)
        first = owners["r0"]
        rates = {"plain_appends_per_s": await _append_rate(first, False)}
        rates["fenced_appends_per_s"] = await _append_rate(first, True)
        for kill in range(kills):
            name = sorted(owners)[kill % replicas]
            victim = owners.pop(name)
            orphans = set(victim.ownership.writers)
            killed_at = time.monotonic()
            await victim.kill()
            joined = f"r{replicas + kill}"
            owners[joined] = await _start(url, joined, ttl)
            taken: dict[int, float] = {}
            while len(taken) < len(orphans):
                now = time.monotonic()
                for owner in owners.values():
                    for partition in orphans & set(owner.ownership.writers):
                        taken.setdefault(partition, now - killed_at)
                if now - killed_at > 10 * ttl:
                    raise TimeoutError(f"partitions {sorted(orphans - set(taken))} were never taken")
                await asyncio.sleep(POLL_S)
            whole.append(max(taken.values(), default=0.0))
            each.extend(taken.values())
            await _until(lambda: _settled(owners), 30.0)
    finally:
        for owner in owners.values():
            with contextlib.suppress(Exception):
                await owner.kill()
    return {
        "replicas": replicas,
        "partitions": COUNT,
        "kills": kills,
        "ttl_s": ttl,
        "handover_s_p50": percentile(whole, 0.5),
        "handover_s_p99": percentile(whole, 0.99),
        "handover_s_max": round(max(whole), 4),
        "partition_handover_s_p50": percentile(each, 0.5),
        "partition_handover_s_p99": percentile(each, 0.99),
        "partitions_moved": len(each),
        **rates,
    }


def run_bench(replicas: int = 3, kills: int = 20, ttl: float = PARTITION_TTL_S) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rally-bench-") as tmp, NatsServer(Path(tmp) / "nats") as server:
        return asyncio.run(_measure(server.url, replicas, kills, ttl))
