"""The harness's zombie count: simulated nodes start no process, so this one part runs real agents.

A small cluster (two real node agents, simulated GPUs, real rank processes) runs ``jobs`` short jobs
(``true``), 16 submitted at a time; once they have all completed, the defunct children of each agent
process are counted (``rallypoint.agent.reaper.zombie_children``). Zero is the target: an agent reaps
every rank wrapper it starts.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.agent.reaper import zombie_children
from rallypoint.eventlog import connect_nats
from rallypoint.localcluster.supervisor import LocalCluster

from .loadgen import spec_body, submit_http
from .logwatch import LogWatch

NODES = 2


async def _run_jobs(cluster: LocalCluster, jobs: int, timeout: float) -> int:
    nc = await connect_nats(cluster.nats_url, name="bench-zombies")
    watch = LogWatch(nc)
    try:
        await watch.start(1)
        body = {**spec_body("zombie", 1, 0), "command": ["true"]}
        accepted, _, _ = await submit_http(
            cluster.api_url, jobs, concurrency=16, body=body, prefix="zombie", time_limit_s=timeout
        )
        ids = [s.job_id for s in accepted]
        await watch.wait(lambda: all(j in watch.completed for j in ids), timeout)
        return sum(j in watch.completed for j in ids)
    finally:
        await watch.stop()
        await nc.close()


def zombie_run(jobs: int, *, timeout: float) -> dict[str, Any]:
    if jobs < 1:
        return {"zombies": None, "zombie_jobs": 0, "zombies_measured": "not run (--zombie-jobs 0)"}
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="rally-bench-zombies-") as folder,
        LocalCluster(Path(folder), nodes=NODES, gpus_per_node=8, with_projector=False) as cluster,
    ):
        completed = asyncio.run(_run_jobs(cluster, jobs, timeout))
        time.sleep(1.0)  # one more reap pass of each agent (it polls every 0.2 s)
        agents = [p.pid for name, p in cluster.processes.items() if name.startswith("agent-")]
        zombies = sum(len(zombie_children(pid)) for pid in agents)
    return {
        "zombies": zombies,
        "zombie_jobs": jobs,
        "zombie_jobs_completed": completed,
        "zombie_s": round(time.monotonic() - started, 1),
        "zombies_measured": f"defunct children of {NODES} real agents after {completed} short real jobs",
    }
