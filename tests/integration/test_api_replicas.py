"""Two `rally serve api` processes on one log, as production runs them behind a load balancer.

A client that submits through replica A and reads through replica B right away must find its job (never
a 404 for an accepted job), and must see its own cancel: a read that starts after a write was
acknowledged, by either replica, sees it. A 503 `not-visible` is allowed only with Retry-After, and the
retry must then find the job. Real nats-server, real API processes, real HTTP.

Right after a 202 replica B's fold is usually there already (it is a millisecond behind), so the second
test pauses B (SIGSTOP: a long GC pause, a descheduled pod) while A acknowledges writes, then reads
through B as it resumes with the events still unread on its NATS socket: what B answers from its fold
alone is out of date, and only a read that first asks the log where it ends is right.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import test_utils
from rallypoint_services.api import build_app
from rallypoint_services.api.readindex import stream_tip

from rallypoint.eventlog import EventLog, LogUnavailable, connect_nats
from rallypoint.eventlog.setup import setup_log
from rallypoint.events import GpuInfo, NodeRegistered, subjects
from rallypoint.infra import ManagedProcess, NatsServer, free_port
from rallypoint.security.tokens import create_token

JOBS = 200
IN_FLIGHT = 16
CANCELS = 60
PROBLEM = "application/problem+json"
SPEC: dict[str, Any] = {"name": "r", "team": "nlp", "gpus": 8, "command": ["sleep", "1"]}


@dataclass(frozen=True)
class Replicas:
    a: str
    b: str
    headers: dict[str, str]
    b_pid: int


async def _register_nodes(log: EventLog) -> None:
    for i in range(2):
        gpus = tuple(GpuInfo(index=g, uuid=f"GPU-{i}-{g}", memory_mib=1, nvlink_domain=0) for g in range(8))
        node = NodeRegistered(
            node_id=f"n{i}", address=f"10.0.0.{i}", rack="r0", gpu_type="H100", gpus=gpus,
            cpu_milli=1000, memory_mib=1024, agent_instance="test", at=1.0,
        )  # fmt: skip
        await log.append(
            subjects.node_registration(f"n{i}"), node, msg_id=f"n{i}:0:NodeRegistered", source="test"
        )


def _start_api(server: NatsServer, workdir: Path, name: str, port: int, tokens: Path) -> ManagedProcess:
    argv = [
        sys.executable, "-m", "rallypoint.cli.serve", "api", "--nats-url", server.url,
        "--instance", name, "--http-port", str(port), "--tokens-file", str(tokens),
    ]  # fmt: skip
    return ManagedProcess(argv, log_path=workdir / f"{name}.log", cwd=workdir)


async def _wait_healthy(http: aiohttp.ClientSession, url: str, proc: ManagedProcess) -> None:
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        assert proc.running(), proc.log_tail()
        try:
            async with http.get(f"{url}/healthz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} did not become healthy:\n{proc.log_tail()}")


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(tmp_path / "nats") as server:
        yield server


@pytest.fixture
async def replicas(nats: NatsServer, tmp_path: Path) -> AsyncIterator[Replicas]:
    nc = await connect_nats(nats.url, name="test-replicas")
    await _register_nodes(await setup_log(nc))
    await nc.close()
    tokens = tmp_path / "tokens.json"
    _, token = create_token(tokens, user="nlp", team="nlp")
    ports = (free_port(), free_port())
    procs = [_start_api(nats, tmp_path, f"api-{n}", p, tokens) for n, p in zip("ab", ports, strict=True)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        async with aiohttp.ClientSession() as http:
            for url, proc in zip(urls, procs, strict=True):
                await _wait_healthy(http, url, proc)
        yield Replicas(a=urls[0], b=urls[1], headers={"Authorization": f"Bearer {token}"}, b_pid=procs[1].pid)
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGCONT)  # a failed paused test must not leave B stopped
            proc.stop()


async def _read(http: aiohttp.ClientSession, url: str, outcomes: Counter[str]) -> dict[str, Any]:
    """GET ``url``; a 503 must be `not-visible` with Retry-After, and is retried until it answers."""
    for _ in range(20):
        async with http.get(url) as resp:
            body: dict[str, Any] = await resp.json(content_type=None)
            outcomes[str(resp.status)] += 1
            assert resp.status != 404, f"GET {url} after its write was acknowledged: 404 {body}"
            if resp.status == 200:
                return body
            assert resp.status == 503, body
            assert resp.content_type == PROBLEM and body["type"].endswith("/not-visible"), body
            assert int(resp.headers["Retry-After"]) > 0
        await asyncio.sleep(0.05)  # sooner than Retry-After says: the test must stay fast
    raise AssertionError(f"GET {url} never found the job")


async def _submit_then_read(
    http: aiohttp.ClientSession, replicas: Replicas, i: int, outcomes: Counter[str]
) -> str:
    async with http.post(f"{replicas.a}/v1/jobs", json={**SPEC, "name": f"r{i}"}) as resp:
        assert resp.status == 202, await resp.text()
        job_id: str = (await resp.json())["job_id"]
    job = await _read(http, f"{replicas.b}/v1/jobs/{job_id}", outcomes)
    assert job["job_id"] == job_id and job["state"] == "pending"
    return job_id


async def _cancel_then_read(
    http: aiohttp.ClientSession, replicas: Replicas, job_id: str, outcomes: Counter[str]
) -> None:
    async with http.delete(f"{replicas.a}/v1/jobs/{job_id}") as resp:
        assert resp.status == 202, await resp.text()
    job = await _read(http, f"{replicas.b}/v1/jobs/{job_id}", outcomes)
    assert job["cancel_requested"] is True, f"replica B does not show the cancel acknowledged by A: {job}"


async def _in_parallel(count: int, work: Any) -> list[Any]:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> Any:
        async with gate:
            return await work(i)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def test_a_write_through_one_replica_is_read_through_the_other(replicas: Replicas) -> None:
    outcomes: Counter[str] = Counter()
    started = time.monotonic()
    async with aiohttp.ClientSession(headers=replicas.headers) as http:
        job_ids = await _in_parallel(JOBS, lambda i: _submit_then_read(http, replicas, i, outcomes))
        assert len(set(job_ids)) == JOBS
        await _in_parallel(CANCELS, lambda i: _cancel_then_read(http, replicas, job_ids[i], outcomes))
        # And the other way round: B lists every job A accepted.
        async with http.get(f"{replicas.b}/v1/jobs", params={"limit": "1000"}) as resp:
            assert resp.status == 200
            listed = {j["job_id"] for j in (await resp.json())["jobs"]}
        assert listed == set(job_ids)
    assert time.monotonic() - started < 60
    print(f"reads through replica B: {dict(outcomes)}")


async def test_a_replica_that_was_paused_reads_what_the_other_acknowledged(replicas: Replicas) -> None:
    outcomes: Counter[str] = Counter()
    async with aiohttp.ClientSession(headers=replicas.headers) as http:
        earlier = await _in_parallel(CANCELS, lambda i: _submit_then_read(http, replicas, i, outcomes))
        before = await _read_index_counters(http, replicas.b)
        os.kill(replicas.b_pid, signal.SIGSTOP)
        try:
            job_ids = await _in_parallel(JOBS, lambda i: _submit(http, replicas, i))
            await _in_parallel(CANCELS, lambda i: _cancel(http, replicas, earlier[i]))
            # Every write above was acknowledged before these reads start: B must show all of them.
            reads = [asyncio.create_task(_read(http, f"{replicas.b}/v1/jobs/{j}", outcomes)) for j in job_ids]
            cancelled = [
                asyncio.create_task(_read(http, f"{replicas.b}/v1/jobs/{j}", outcomes)) for j in earlier
            ]
            await asyncio.sleep(0.3)  # the requests reach B's socket while it is stopped
        finally:
            os.kill(replicas.b_pid, signal.SIGCONT)
        jobs = await asyncio.gather(*reads)
        assert [j["job_id"] for j in jobs] == job_ids
        stale = [j["job_id"] for j in await asyncio.gather(*cancelled) if not j["cancel_requested"]]
        assert not stale, f"replica B does not show {len(stale)} cancels acknowledged by A"
        after = await _read_index_counters(http, replicas.b)
    reads, questions = after[0] - before[0], after[1] - before[1]
    # The reads that queued up while B was stopped shared their questions to the log.
    assert reads >= JOBS + CANCELS and questions * 4 <= reads, (reads, questions)
    print(f"reads through the paused replica B: {dict(outcomes)}; they asked the log {questions} times")


async def _read_index_counters(http: aiohttp.ClientSession, url: str) -> tuple[int, int]:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    values = dict(line.split() for line in text.splitlines() if line.startswith("rally_api_read_index_"))
    # Zero when absent, so that an API without them fails on what it answers first, not on its metrics.
    reads, questions = (f"rally_api_read_index_{name}_total" for name in ("reads", "questions"))
    return int(values.get(reads, 0)), int(values.get(questions, 0))


async def _submit(http: aiohttp.ClientSession, replicas: Replicas, i: int) -> str:
    async with http.post(f"{replicas.a}/v1/jobs", json={**SPEC, "name": f"p{i}"}) as resp:
        assert resp.status == 202, await resp.text()
        job_id: str = (await resp.json())["job_id"]
        return job_id


async def _cancel(http: aiohttp.ClientSession, replicas: Replicas, job_id: str) -> None:
    async with http.delete(f"{replicas.a}/v1/jobs/{job_id}") as resp:
        assert resp.status == 202, await resp.text()


async def test_the_tip_is_the_streams_last_sequence_and_reads_refuse_without_it(tmp_path: Path) -> None:
    server = await NatsServer(tmp_path / "nats").astart()
    log = await EventLog.connect(server.url, name="tip-test")
    try:
        tip = stream_tip(log, timeout=1.0)
        assert await tip() == 0
        await _register_nodes(log)
        assert await tip() == 2
        async with test_utils.TestClient(test_utils.TestServer(build_app(log))) as c:
            assert (await c.get("/v1/jobs")).status == 200
            await server.astop(remove_data=False)
            started = time.monotonic()
            resp = await c.get("/v1/jobs")
            # Its fold still holds both nodes, but it cannot know what else was acknowledged meanwhile.
            assert resp.status == 503 and resp.headers["Retry-After"]
            assert (await resp.json())["type"].endswith("/log-unavailable")
            assert time.monotonic() - started < 3.0
        with pytest.raises(LogUnavailable):
            await tip()
    finally:
        await log.close()
        await server.astop()
