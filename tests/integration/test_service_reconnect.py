"""A service reaches the log or says it does not: /healthz reports NATS and the fold's lag, and a service
whose nats-server died (kill -9) and came back on the same port and store reconnects and folds on by itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rallypoint.eventlog import EventLog, LogUnavailable
from rallypoint.events import JobQueued, subjects
from rallypoint.infra import NatsServer, free_port
from rallypoint.runtime import ServiceConfig, ServiceContext, run_service_async
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import with_follower


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    nats = NatsServer(tmp_path / "nats").start()  # on this thread: its parent-death signal follows it
    try:
        yield nats
    finally:
        nats.stop()


async def append(log: EventLog, job_id: str, deadline_s: float = 20.0) -> int:
    """Append, retrying while the server is away (the client reconnects by itself)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            event = JobQueued(job_id=job_id, queue="q", at=1.0)
            return await log.append(subjects.admission(job_id), event, msg_id=job_id, source="t")
        except LogUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def health(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """(status, body); (0, {"log": {}}) while the health port is not up yet."""
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as r:
            return r.status, await r.json()
    except aiohttp.ClientConnectionError:
        return 0, {"log": {}}


async def eventually(port: int, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20.0
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        _, body = await health(port, "/healthz")
        if check(body):
            return body
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: never; last /healthz {body}")


async def test_health_reports_the_log_and_a_service_reconnects_to_a_restarted_server(
    server: NatsServer,
) -> None:
    admin = await EventLog.connect(server.url, name="admin", create=True)
    for i in range(5):
        await append(admin, f"before-{i}")
    port = free_port()
    stop = asyncio.Event()

    async def main(ctx: ServiceContext) -> int:
        async def idle(follower: Follower) -> None:
            await ctx.stop.wait()

        return await with_follower(ctx, idle)

    config = ServiceConfig(service="probe", nats_url=server.url, instance="p1", health_port=port)
    running = asyncio.create_task(run_service_async(main, config, stop=stop))
    try:
        body = await eventually(port, lambda b: b["log"].get("lag") == 0, "caught up")
        assert body["status"] == "ok" and body["log"] == {
            "connected": True,
            "fold_seq": 5,
            "stream_seq": 5,
            "lag": 0,
            "read_pacing_s": 0.0,  # a service not in READ_PACING_S reads at once
            "read_pauses": 0,
        }

        os.kill(server.pid or 0, signal.SIGKILL)
        body = await eventually(port, lambda b: b["log"]["connected"] is False, "disconnect seen")
        assert body["status"] == "degraded" and "NATS not connected" in body["degraded"][0]
        assert (await health(port, "/healthz"))[0] == 200  # alive: a restart would not bring NATS back
        assert (await health(port, "/readyz"))[0] == 503  # but not ready

        server.restart()  # same port, same store
        last = max([await append(admin, f"after-{i}") for i in range(3)])
        folded = lambda b: b["log"].get("fold_seq") == last == b["log"]["stream_seq"]  # noqa: E731
        body = await eventually(port, folded, "folded the events appended after the restart")
        assert body["status"] == "ok" and body["log"]["connected"] and last == 8
        assert (await health(port, "/readyz"))[0] == 200
    finally:
        stop.set()
        await admin.close()
    assert await asyncio.wait_for(running, 15) == 0
