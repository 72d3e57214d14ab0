"""Fenced appends on a three-server JetStream cluster (R3), as a partition owner makes them: many at once,
off its tree, each expecting its epoch to be the tree's last. On one server they all pass; a clustered
stream's leader refuses every proposal but one while another that expects the same subject sequence is in
flight (10164). So a writer sends them one at a time (``FencedWriter._turn``): here all pass, none is taken
for a newer owner's fence, and a real newer owner still fences the old one out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rallypoint.eventlog import AppendConflict, EventLog, connect_nats
from rallypoint.eventlog.setup import setup_log
from rallypoint.events import JobStarted, subjects
from rallypoint.infra import NatsServer, free_port
from rallypoint.runtime.fencing import FencedWriter
from rallypoint.runtime.follower import Follower

NAMES = ("f-1", "f-2", "f-3")
PARTITION = 5
ROLE = subjects.partition_role(subjects.CONTROL_ROLE, PARTITION)
TREE = subjects.control_epoch(PARTITION)


@pytest.fixture
async def clustered_log(tmp_path: Path) -> AsyncIterator[EventLog]:
    route_ports = [free_port() for _ in NAMES]
    routes = tuple(f"nats-route://127.0.0.1:{port}" for port in route_ports)
    servers = [
        NatsServer(tmp_path / name, server_name=name, cluster_name="fenced", cluster_port=port, routes=routes)
        for name, port in zip(NAMES, route_ports, strict=True)
    ]
    try:
        await asyncio.gather(*(server.astart() for server in servers))
        nc = await connect_nats([server.url for server in servers], name="fenced-cluster")
        deadline = time.monotonic() + 30
        while True:
            try:
                log = await setup_log(nc, replicas=3)
                break
            except Exception:  # no meta leader yet
                assert time.monotonic() < deadline, "the cluster made no stream in 30 s"
                await asyncio.sleep(0.25)
        yield log
        await nc.close()
    finally:
        await asyncio.gather(*(server.astop() for server in servers))


async def _owner(log: EventLog, instance: str, running: list[asyncio.Task[None]]) -> FencedWriter:
    follower = Follower(log)
    running.append(asyncio.create_task(follower.run()))
    writer = FencedWriter(
        log, follower, role=ROLE, tree=TREE, epoch_subject=TREE, instance=instance, source="test"
    )
    await writer.start_epoch()
    return writer


def _started(i: int) -> JobStarted:
    return JobStarted(job_id=f"j-{i}", attempt=1, at=1.0)


async def test_an_owners_concurrent_appends_all_pass_and_a_newer_owner_still_fences_it(
    clustered_log: EventLog,
) -> None:
    running: list[asyncio.Task[None]] = []
    try:
        await _fence_and_refence(clustered_log, running)
    finally:
        for task in running:
            task.cancel()


async def _fence_and_refence(clustered_log: EventLog, running: list[asyncio.Task[None]]) -> None:
    old = await _owner(clustered_log, "old", running)
    writes = [
        old.append(subjects.job_control(f"j-{i}"), _started(i), f"j-{i}:1:JobStarted") for i in range(40)
    ]
    seqs = await asyncio.gather(*writes, return_exceptions=True)
    refused = [s for s in seqs if isinstance(s, BaseException)]
    assert refused == [], refused[:3]
    assert len(set(seqs)) == 40

    new = await _owner(clustered_log, "new", running)
    assert new.epoch > old.epoch
    with pytest.raises(AppendConflict):
        await old.append(subjects.job_control("j-late"), _started(99), "j-late:1:JobStarted")
    assert await new.append(subjects.job_control("j-late"), _started(99), "j-late:1:JobStarted") > 0
