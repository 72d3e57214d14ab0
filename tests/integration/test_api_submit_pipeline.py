"""A submission is answered once the log acknowledged it, without waiting for the API's fold; the
reads of the same instance wait for its acknowledged writes, so a client still reads its own write.
Real NATS JetStream, the API in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import test_utils, web
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.app import FOLLOWER

from rallypoint.eventlog import EventLog
from rallypoint.events import JobSubmitted

Client = test_utils.TestClient[web.Request, web.Application]
SPEC: dict[str, Any] = {"name": "t", "team": "nlp", "gpus": 1, "command": ["true"]}


@pytest.fixture
async def client(event_log: EventLog) -> AsyncIterator[Client]:
    app = build_app(event_log, config=ApiConfig(source="test-api", ready_wait_s=0.5))
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def _submit_then_read(client: Client, i: int) -> tuple[int, int, int]:
    resp = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": f"k-{i}"})
    assert resp.status == 202, await resp.text()
    job_id = (await resp.json())["job_id"]
    read = await client.get(f"/v1/jobs/{job_id}")
    listed = await client.get("/v1/jobs", params={"limit": "10000"})
    ids = {j["job_id"] for j in (await listed.json())["jobs"]}
    return read.status, listed.status, int(job_id in ids)


async def test_each_accepted_job_is_read_back_at_once(client: Client, event_log: EventLog) -> None:
    # 32 clients, each reading right after its 202: every read finds its job, never a 404.
    results = await asyncio.gather(*(_submit_then_read(client, i) for i in range(32)))
    assert results == [(200, 200, 1)] * 32
    stored = [r.event async for r in event_log.replay() if isinstance(r.event, JobSubmitted)]
    assert len(stored) == 32


async def test_reads_wait_for_the_instances_acknowledged_writes(client: Client, event_log: EventLog) -> None:
    follower = client.app[FOLLOWER]
    resp = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "mark"})
    seq = (await resp.json())["seq"]
    assert follower.written == seq
    # A write acknowledged at the next sequence, which the fold has not seen (the log does not hold it
    # yet): a read waits for it, and answers 503 not-visible when it does not come within the wait.
    follower.wrote(seq + 1)
    assert not await follower.wait_caught_up(0.2)
    read = await client.get("/v1/state")
    assert read.status == 503 and (await read.json())["type"].endswith("/not-visible")
    # Once the log holds it and the fold applied it, the same read is answered.
    waiting = asyncio.create_task(follower.wait_caught_up(5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    other = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "next"})
    assert (await other.json())["seq"] == seq + 1
    assert await waiting
    assert (await (await client.get("/v1/state")).json())["seq"] >= seq + 1


async def test_a_retry_is_replayed_and_a_changed_spec_refused(client: Client, event_log: EventLog) -> None:
    first = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "same"})
    again = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "same"})
    changed = await client.post("/v1/jobs", json={**SPEC, "gpus": 2}, headers={"Idempotency-Key": "same"})
    assert first.status == 202 and "Idempotent-Replayed" not in first.headers
    assert again.status == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert (await again.json())["job_id"] == (await first.json())["job_id"]
    assert changed.status == 422 and (await changed.json())["field"] == "idempotency_key"
    stored = [r.event async for r in event_log.replay() if isinstance(r.event, JobSubmitted)]
    assert len(stored) == 1


async def test_concurrent_twins_create_one_job(client: Client, event_log: EventLog) -> None:
    # The same key sent 8 times at once: the log stores one JobSubmitted; one answer created it and the
    # others are replays of it (found in the fold before appending, or a duplicate append answered from
    # the fold).
    answers = await asyncio.gather(
        *(client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "twin"}) for _ in range(8))
    )
    assert [a.status for a in answers] == [202] * 8
    assert len({(await a.json())["job_id"] for a in answers}) == 1
    assert sum("Idempotent-Replayed" not in a.headers for a in answers) == 1
    stored = [r.event async for r in event_log.replay() if isinstance(r.event, JobSubmitted)]
    assert len(stored) == 1
