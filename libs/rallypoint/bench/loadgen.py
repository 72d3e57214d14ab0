"""The scale harness's load: HTTP submissions, the raw JetStream reference beside them, and bursts.

- ``submit_http``: ``POST /v1/jobs`` with an ``Idempotency-Key``, ``concurrency`` requests in flight, as
  CI systems submit; a submission counts once the API answered 202 (it is in the log, durably).
- ``raw_publish``: the same number of acked JetStream publishes of an event of the same size, at the same
  concurrency, on the same server, into a scratch stream (``RALLYBENCH``, deleted afterwards) so the
  cluster's log and folds are untouched: the ceiling the API is compared with.
- ``append_burst``: a burst of jobs appended straight to the log as the API's ``JobSubmitted`` (same
  subject, message id and expected sequence 0), hundreds in flight: a burst of capacity demand reaches
  the scheduler faster than any API could pass it on, so what follows measures the scheduler.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js.api import StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NoStreamResponseError

from rallypoint.eventlog import EventLog
from rallypoint.events import JobCancelRequested, JobSpec, JobSubmitted, subjects
from rallypoint.events.codec import encode
from rallypoint.localcluster.http import auth_headers

SCRATCH_STREAM = "RALLYBENCH"


@dataclass(frozen=True)
class Submitted:
    job_id: str
    sent_at: float  # wall clock, when the request went out
    latency_s: float


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))], 4)


def spec_body(name: str, gpus: int, seconds: float) -> dict[str, Any]:
    return {
        "name": name,
        "team": "bench",
        "gpus": gpus,
        "gpus_per_task": gpus,
        "ranks_per_task": 1,
        "command": ["sleep", str(seconds)],
    }


async def submit_http(
    api_url: str,
    count: int,
    *,
    concurrency: int,
    body: dict[str, Any],
    prefix: str,
    time_limit_s: float,
    token: str | None = None,
) -> tuple[list[Submitted], float, int]:
    """(accepted submissions, seconds taken, refused or failed) for ``count`` jobs or ``time_limit_s``.

    ``token``: the bearer token to submit with (default: the one the cluster at ``api_url`` registered).
    """
    auth = auth_headers(api_url, token)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)
    accepted: list[Submitted] = []
    failed = 0
    deadline = time.monotonic() + time_limit_s

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal failed
        while not queue.empty() and time.monotonic() < deadline:
            i = queue.get_nowait()
            sent, t0 = time.time(), time.perf_counter()
            headers = {**auth, "Idempotency-Key": f"{prefix}-{i}"}
            try:
                async with session.post(f"{api_url}/v1/jobs", json=body, headers=headers) as response:
                    answer = await response.json()
                    if response.status == 202:
                        accepted.append(Submitted(answer["job_id"], sent, time.perf_counter() - t0))
                    else:
                        failed += 1
            except (aiohttp.ClientError, TimeoutError):
                failed += 1

    timeout = aiohttp.ClientTimeout(total=30)
    start = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return accepted, time.perf_counter() - start, failed


#: How long a scratch stream just created may take to listen on its subjects (see ``create_scratch``).
SCRATCH_READY_S = 5.0


async def create_scratch(js: JetStreamContext) -> None:
    """Create the scratch stream and return once it takes publishes.

    A stream just created may briefly answer a publish with "no responders" before its subjects are
    listened to (seen once, under a loaded machine, on the very first publish after ``add_stream``; the
    NATS clients of other languages retry such a publish for the same reason). One probe, retried until
    the stream answers, keeps that out of the measured loop."""
    await js.add_stream(
        StreamConfig(name=SCRATCH_STREAM, subjects=["rallybench.>"], storage=StorageType.FILE)
    )
    deadline = time.monotonic() + SCRATCH_READY_S
    while True:
        try:
            await js.publish("rallybench.probe", b"", stream=SCRATCH_STREAM)
            return
        except (NoRespondersError, NoStreamResponseError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def raw_publish(nc: Client, count: int, *, concurrency: int) -> float:
    """Acked publishes per second into a scratch stream with the log's storage, ``concurrency`` in flight."""
    js = nc.jetstream()
    await create_scratch(js)
    payload = encode(JobSubmitted(job_id="raw-0", spec=JobSpec(**_spec_fields()), submitted_at=time.time()))
    counter = iter(range(count))

    async def worker() -> None:
        for i in counter:
            headers = {"Nats-Msg-Id": f"raw-{i}:0:JobSubmitted"}
            await js.publish(f"rallybench.job.raw-{i}", payload, headers=headers, stream=SCRATCH_STREAM)

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return count / (time.perf_counter() - start)
    finally:
        await js.delete_stream(SCRATCH_STREAM)


def _spec_fields() -> dict[str, Any]:
    body = spec_body("raw", 1, 10)
    return {**body, "command": tuple(body["command"])}


async def append_burst(log: EventLog, count: int, *, gpus: int, seconds: float, prefix: str) -> list[str]:
    """Append ``count`` JobSubmitted as the API would, 256 in flight; returns the job ids."""
    spec = JobSpec(**{**spec_body(prefix, gpus, seconds), "command": ("sleep", str(seconds))})
    job_ids = [f"{prefix}-{i}" for i in range(count)]
    await append_submitted(log, job_ids, spec)
    return job_ids


def gang_spec(name: str, nodes: int, gpus_per_node: int, seconds: float) -> JobSpec:
    """A gang of one task of ``gpus_per_node`` GPUs on each of ``nodes`` nodes, running ``seconds``."""
    body = spec_body(name, nodes * gpus_per_node, seconds)
    return JobSpec(**{**body, "gpus_per_task": gpus_per_node, "command": ("sleep", str(seconds))})


async def append_submitted(log: EventLog, job_ids: list[str], spec: JobSpec) -> None:
    """Append a JobSubmitted of ``spec`` for each id, as the API would, 256 in flight."""
    semaphore = asyncio.Semaphore(256)

    async def one(job_id: str) -> None:
        async with semaphore:
            event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=time.time())
            await log.append(
                subjects.job(job_id),
                event,
                msg_id=f"{job_id}:0:JobSubmitted",
                source="rallypoint/bench",
                expected_last_subject_seq=0,
            )

    await asyncio.gather(*(one(j) for j in job_ids))


async def append_cancel(log: EventLog, job_id: str) -> None:
    """Ask for a job's cancellation as the API's DELETE does."""
    event = JobCancelRequested(job_id=job_id, at=time.time(), requested_by="bench")
    await log.append(subjects.job(job_id), event, msg_id=f"{job_id}:cancel", source="rallypoint/bench")


def latency_summary(values: list[float], prefix: str) -> dict[str, Any]:
    return {
        f"{prefix}_p50": percentile(values, 0.5),
        f"{prefix}_p95": percentile(values, 0.95),
        f"{prefix}_max": round(max(values), 4) if values else None,
        f"{prefix}_mean": round(statistics.fmean(values), 4) if values else None,
    }
