"""One trace follows a job from the HTTP submit to its ranks running, across the services (on real NATS).

The API app, a scheduler loop, a job controller and a node agent run in this process, each with its own
fold of the log, as their services do; spans go to an in-memory exporter. The submit's context crosses
the log in the ``JobSubmitted`` headers and the agent request's headers: the test checks each service's
span hangs from the one before it, in the trace the caller's ``traceparent`` started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rallypoint_services.api.app import build_app
from rallypoint_services.job_controller.controller import JobController
from rallypoint_services.scheduler.leader import SchedulerLoop

from rallypoint.agent import RankLauncher, SimulatedGpus
from rallypoint.agent.node import AgentConfig, NodeAgent
from rallypoint.agent.workdir import read_record
from rallypoint.eventlog import EventLog
from rallypoint.infra import free_port
from rallypoint.observability import tracing
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> AsyncIterator[InMemorySpanExporter]:  # type: ignore[misc]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()


@contextlib.asynccontextmanager
async def following(log: EventLog) -> AsyncIterator[Follower]:
    follower = Follower(log)
    await follower.catch_up()
    task = asyncio.create_task(follower.run())
    try:
        yield follower
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if await result if not isinstance(result, bool) else result:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def node_agent(log: EventLog, backend: SimulatedGpus, work_dir: Path) -> NodeAgent:
    """An agent for node-1 on ``backend`` (not started yet)."""
    config = AgentConfig(
        node_id="node-1", rack="r1", heartbeat_interval_s=0.5, cpu_milli=8000, memory_mib=8192
    )
    return NodeAgent(log, backend, RankLauncher(work_dir), config)


async def serve_api(log: EventLog) -> tuple[web.AppRunner, int]:
    """The API app on a free local port: its runner (to clean up) and the port."""
    runner = web.AppRunner(build_app(log), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def control(
    log: EventLog, sched_fold: Follower, ctl_fold: Follower, stop: asyncio.Event, **controller: Any
) -> tuple[SchedulerLoop, asyncio.Task[None]]:
    """A scheduler loop in its epoch (cycled by the test) and a job controller running until ``stop``."""
    scheduler = SchedulerLoop(log, sched_fold, instance="s1", policy=SchedulingPolicy("rallypoint"))
    await scheduler.start_epoch()
    jobs = JobController(log.nc, log, ctl_fold, command_timeout=5.0, **controller)
    return scheduler, asyncio.create_task(jobs.run(stop))


def kill_ranks(work_dir: Path) -> None:
    for pid_file in work_dir.rglob("rank-*.pid"):
        record = read_record(pid_file) or {}
        with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
            os.killpg(record.get("pid"), signal.SIGKILL)  # type: ignore[arg-type]


async def shut_down(
    stop: asyncio.Event,
    tasks: list[asyncio.Task[None]],
    agent: NodeAgent,
    runner: web.AppRunner,
    work_dir: Path,
) -> None:
    """Stop the controller tasks, the agent and the API, and kill the ranks left behind."""
    stop.set()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 5.0)
    await agent.close()
    await runner.cleanup()
    kill_ranks(work_dir)


async def test_one_trace_spans_api_scheduler_job_controller_and_agent(
    event_log: EventLog, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    stop = asyncio.Event()
    work_dir = tmp_path / "work"
    agent = node_agent(event_log, SimulatedGpus("node-1", 4), work_dir)
    runner, port = await serve_api(event_log)
    tasks: list[asyncio.Task[None]] = []
    try:
        async with following(event_log) as sched_fold, following(event_log) as ctl_fold:
            await agent.start()
            await until(lambda: "node-1" in sched_fold.state.nodes, "the node registered")
            scheduler, controller = await control(event_log, sched_fold, ctl_fold, stop)
            tasks.append(controller)

            body = {
                "name": "traced",
                "team": "t",
                "gpus": 2,
                "gpus_per_task": 2,
                "ranks_per_task": 1,
                "command": [sys.executable, "-c", "import time; time.sleep(30)"],
            }
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{port}/v1/jobs"
                async with http.post(url, json=body, headers={"traceparent": CALLER}) as response:
                    assert response.status == 202, await response.text()
                    job_id = (await response.json())["job_id"]

            async def running() -> bool:
                await scheduler.cycle()
                job = ctl_fold.state.jobs.get(job_id)
                return job is not None and job.state == "running"

            await until(running, "the job running")
    finally:
        await shut_down(stop, tasks, agent, runner, work_dir)

    finished = spans.get_finished_spans()
    by_name: dict[str, ReadableSpan] = {}
    for span in finished:
        by_name.setdefault(span.name, span)
    assert {"POST /v1/jobs", "queued", "bind", "launch", "agent.launch", "rank 0 running"} <= set(by_name), (
        sorted(by_name)
    )
    api = by_name["POST /v1/jobs"]

    def trace_of(span: ReadableSpan) -> str:
        assert span.context is not None
        return format(span.context.trace_id, "032x")

    def parent_of(span: ReadableSpan) -> int | None:
        return span.parent.span_id if span.parent is not None else None

    # the caller's trace goes on: every span of the job is in it
    for name in ("POST /v1/jobs", "queued", "bind", "launch", "agent.launch", "rank 0 running"):
        assert trace_of(by_name[name]) == CALLER_TRACE, name
    assert api.context is not None
    # API -> scheduler (through the JobSubmitted headers), API -> job controller (same), job controller ->
    # agent (through the launch request's headers), agent -> each rank
    assert parent_of(by_name["queued"]) == api.context.span_id
    assert parent_of(by_name["bind"]) == api.context.span_id
    assert parent_of(by_name["launch"]) == api.context.span_id
    launch = by_name["launch"].context
    assert launch is not None and parent_of(by_name["agent.launch"]) == launch.span_id
    agent_span = by_name["agent.launch"].context
    assert agent_span is not None and parent_of(by_name["rank 0 running"]) == agent_span.span_id
    assert by_name["queued"].attributes is not None and by_name["queued"].attributes["rally.job_id"] == job_id
