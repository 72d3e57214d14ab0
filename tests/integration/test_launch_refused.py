"""A launch the node agent refuses ends the job with the agent's reason, not a job stuck ``bound``.

On real NATS, in this process as in ``test_trace_chain``: the API app, a scheduler loop, a job controller
and a node agent, each with its own fold of the log. The node registers 4 GPUs, then two of them vanish
(the node changed under the binds): every launch on GPUs 2-3 is refused with ``unknown_gpus``. The
controller records an infrastructure failure (the job is requeued and bound again), and past the
infrastructure cap fails the job; ``GET /v1/jobs/{id}`` shows the agent's words within seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
from test_trace_chain import control, following, node_agent, serve_api, shut_down, until

from rallypoint.agent import GpuDevice, SimulatedGpus
from rallypoint.control import RecoveryConfig
from rallypoint.eventlog import EventLog


class ShrunkGpus(SimulatedGpus):
    """Simulated GPUs of which all but the first ``left`` vanish once ``shrunk`` is set."""

    shrunk = False
    left = 2

    def inventory(self) -> tuple[GpuDevice, ...]:
        devices = super().inventory()
        return devices[: self.left] if self.shrunk else devices


async def test_a_refused_launch_fails_the_job_with_the_agents_reason(
    event_log: EventLog, tmp_path: Path
) -> None:
    stop = asyncio.Event()
    work_dir = tmp_path / "work"
    backend = ShrunkGpus("node-1", 4)
    agent = node_agent(event_log, backend, work_dir)
    runner, port = await serve_api(event_log)
    tasks: list[asyncio.Task[None]] = []
    try:
        async with following(event_log) as sched_fold, following(event_log) as ctl_fold:
            await agent.start()
            await until(lambda: "node-1" in sched_fold.state.nodes, "the node registered")
            backend.shrunk = True  # the fold still says 4 GPUs: the scheduler binds GPUs 2-3 too
            recovery = RecoveryConfig(max_infra_retries=1)
            scheduler, controller = await control(event_log, sched_fold, ctl_fold, stop, recovery=recovery)
            tasks.append(controller)

            body = {
                "name": "refused",
                "team": "t",
                "gpus": 4,
                "gpus_per_task": 4,
                "ranks_per_task": 1,
                "command": [sys.executable, "-c", "pass"],
            }
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{port}/v1/jobs"
                async with http.post(base, json=body) as response:
                    assert response.status == 202, await response.text()
                    job_id = (await response.json())["job_id"]
                started = time.monotonic()

                async def ended() -> bool:
                    await scheduler.cycle()
                    job = ctl_fold.state.jobs.get(job_id)
                    return job is not None and job.terminal

                await until(ended, "the refused job to end", timeout=15.0)

                view: dict[str, object] = {}

                async def api_failed() -> bool:
                    nonlocal view
                    async with http.get(f"{base}/{job_id}") as response:
                        assert response.status == 200, await response.text()
                        view = await response.json()
                    return view.get("state") == "failed"

                await until(api_failed, "the API to show the job failed", timeout=10.0)
                elapsed = time.monotonic() - started
    finally:
        await shut_down(stop, tasks, agent, runner, work_dir)

    reason = str(view.get("reason"))
    assert "launch refused by node node-1: no such GPUs on node-1: [2, 3]" in reason, view
    assert "gave up after 1 earlier infrastructure failures" in reason, view
    assert elapsed < 20.0
    job = ctl_fold.state.jobs[job_id]
    assert (job.attempt, job.infra_failures, job.user_failures) == (2, 1, 0)  # retried once, then failed
    assert job.attempt_reasons == ["attempt 1: launch refused by node node-1: no such GPUs on node-1: [2, 3]"]
