"""The job controller bounds the jobs whose commands and appends are on the wire at once: a burst of binds
queues in the controller, not in the connection's outbound buffer (past which every request fails)."""

from __future__ import annotations

import asyncio

from rallypoint_services.job_controller.controller import JobController

from rallypoint.control import Launch
from rallypoint.events import JobStarted
from rallypoint.runtime.follower import Follower


class Wire:
    """Stands in for the agents and the log: each call takes a little while; counts how many overlap."""

    def __init__(self) -> None:
        self.active = 0
        self.most = 0
        self.appended: list[str] = []

    async def call(self) -> None:
        self.active += 1
        self.most = max(self.most, self.active)
        await asyncio.sleep(0.001)
        self.active -= 1

    async def launch(self, _action: Launch) -> None:
        await self.call()
        return None  # every agent confirmed

    async def append(self, job_id: str, _event: object) -> None:
        await self.call()
        self.appended.append(job_id)


async def test_a_burst_of_launches_goes_out_at_most_the_limit_at_a_time() -> None:
    controller = JobController(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        Follower(log=None),  # type: ignore[arg-type]
        max_active_jobs=8,
    )
    wire = Wire()
    controller._launch = wire.launch  # type: ignore[method-assign,assignment]
    controller._append = wire.append  # type: ignore[method-assign,assignment]
    jobs = [f"job-{i}" for i in range(200)]
    launch = Launch(tasks=(), then=JobStarted(job_id="x", attempt=1, at=0.0))
    await asyncio.gather(*(controller._execute(job_id, [launch]) for job_id in jobs))
    assert sorted(wire.appended) == sorted(jobs)  # every job launched and its start appended
    assert wire.most == 8  # never more than the limit at once, and the limit used
