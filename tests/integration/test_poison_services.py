"""Real service processes on a log with poison in it: they fold past it, act on what comes after, restart
without crash-looping, and their /healthz says which newer event version they meet.

Before issue 14 both messages below stalled the scheduler and the inventory without a log line, and a
restarted service crash-looped on its catch-up. Each process here is `rally serve NAME` on its own
nats-server (a service restores shared snapshots, so it must not share a server with other tests).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rallypoint.eventlog import EventLog
from rallypoint.events import GangBound, GpuInfo, JobSpec, JobSubmitted, NodeRegistered, subjects
from rallypoint.infra import ManagedProcess, NatsServer, free_port

JUNK = b"\x00junk"
V2 = b'{"type":"JobSubmitted.v2","job_id":"j-v2","spec":{"name":"x"},"submitted_at":1.0,"band":3}'


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    nats = await NatsServer(tmp_path / "nats").astart()
    try:
        yield nats
    finally:
        await nats.astop()


@pytest.fixture
async def log(server: NatsServer) -> AsyncIterator[EventLog]:
    event_log = await EventLog.connect(server.url, name="test-poison-services")
    try:
        yield event_log
    finally:
        await event_log.close()


class Service:
    """`rally serve NAME` as its own process, with /healthz on a free port."""

    def __init__(self, name: str, url: str, workdir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.argv = [sys.executable, "-m", "rallypoint.cli.serve", name, "--nats-url", url]
        self.argv += ["--instance", f"{name}-1", "--health-port", str(self.port)]
        self.log_path = workdir / f"{name}.log"
        self.proc = self.start()

    def start(self) -> ManagedProcess:
        return ManagedProcess(self.argv, log_path=self.log_path)

    def restart(self) -> None:
        self.proc.stop()
        self.proc = self.start()

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


@pytest.fixture
def services(server: NatsServer, tmp_path: Path) -> Iterator[Callable[[str], Service]]:
    started: list[Service] = []

    def start(name: str) -> Service:
        started.append(Service(name, server.url, tmp_path))
        return started[-1]

    try:
        yield start
    finally:
        for service in started:
            service.proc.stop()


async def eventually(check: Callable[[], Any], what: str, service: Service, timeout: float = 30.0) -> Any:
    """``check()``'s first truthy answer; a service that died or never got there fails with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.proc.running():
            pytest.fail(f"{service.name} died waiting for {what}:\n{service.proc.log_tail()}")
        try:
            answer = await asyncio.to_thread(check)
        except OSError:
            answer = None
        if answer:
            return answer
        await asyncio.sleep(0.2)
    pytest.fail(f"{service.name}: no {what} within {timeout:.0f}s:\n{service.proc.log_tail()}")


async def publish_raw(log: EventLog, data: bytes) -> int:
    return int((await log.js.publish("rally.job.x", data, stream=log.stream)).seq)


async def register_node(log: EventLog, node_id: str) -> None:
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
        at=time.time(),
    )
    await log.append(subjects.node(node_id), event, msg_id=f"{node_id}:reg", source="test")


async def submit(log: EventLog, job_id: str) -> None:
    spec = JobSpec(name=job_id, team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=8, command=("true",))
    event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=time.time())
    await log.append(subjects.job(job_id), event, msg_id=f"{job_id}:0:JobSubmitted", source="test")


async def until_bound(log: EventLog, job_id: str, scheduler: Service, timeout: float = 30.0) -> None:
    """Until the scheduler appended a GangBound for ``job_id``: it folded the job, past any poison."""
    deadline = time.monotonic() + timeout
    while True:
        binds = [rec.event async for rec in log.replay(subjects=subjects.SCHEDULER_TREE)]
        if any(isinstance(e, GangBound) and e.job_id == job_id for e in binds):
            return
        assert scheduler.proc.running(), scheduler.proc.log_tail()
        assert time.monotonic() < deadline, f"{job_id} never bound:\n{scheduler.proc.log_tail()}"
        await asyncio.sleep(0.2)


def degraded_for_v2(service: Service) -> bool:
    status, body = service.get("/healthz")
    return status == 200 and body["status"] == "degraded" and "JobSubmitted.v2" in " ".join(body["degraded"])


async def test_the_scheduler_binds_past_poison_restarts_and_says_it_is_degraded(
    log: EventLog, services: Callable[[str], Service]
) -> None:
    await register_node(log, "n0")
    await publish_raw(log, JUNK)  # already in the log when the scheduler starts: its catch-up path
    scheduler = services("scheduler")
    await eventually(lambda: scheduler.get("/healthz")[1]["status"] == "ok", "healthy start", scheduler)

    v2 = await publish_raw(log, V2)  # while it follows: the live path
    await submit(log, "j-after")
    await until_bound(log, "j-after", scheduler)

    await eventually(lambda: degraded_for_v2(scheduler), "degraded health", scheduler)
    status, body = scheduler.get("/readyz")
    assert status == 503 and body["status"] == "degraded" and f"seq {v2}" in body["degraded"][0]
    assert f"quarantined the message at seq {v2} on rally.job.x" in scheduler.proc.log_tail(100_000)

    # A restart catches up over both messages again instead of crash-looping, and still binds.
    scheduler.restart()
    await eventually(lambda: degraded_for_v2(scheduler), "degraded health after a restart", scheduler)
    await register_node(log, "n1")
    await submit(log, "j-after-restart")
    await until_bound(log, "j-after-restart", scheduler)


async def test_the_inventory_answers_with_nodes_registered_after_poison(
    log: EventLog, services: Callable[[str], Service]
) -> None:
    await register_node(log, "n0")
    await publish_raw(log, JUNK)
    inventory = services("inventory")
    await eventually(lambda: inventory.get("/healthz")[1]["status"] == "ok", "healthy start", inventory)
    await publish_raw(log, V2)
    await register_node(log, "n1")

    async def nodes() -> set[str]:
        reply = await log.nc.request(subjects.query("inventory", "nodes"), b"", timeout=2)
        view = msgspec.json.decode(reply.data)
        return {n["node_id"] for n in view["nodes"]}

    deadline = time.monotonic() + 30
    while await nodes() != {"n0", "n1"}:
        assert time.monotonic() < deadline, inventory.proc.log_tail()
        await asyncio.sleep(0.2)
    await eventually(lambda: degraded_for_v2(inventory), "degraded health", inventory)
