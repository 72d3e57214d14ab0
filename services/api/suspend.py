"""Suspend and resume: POST /v1/jobs/{job_id}/suspend and /resume (the job's team or an admin).

A suspend appends ``JobSuspendRequested``; the job controller gives a running attempt the preemption grace to
checkpoint, stops every rank and records ``JobSuspended`` (a waiting job is suspended at once). The job then
holds no GPU and the scheduler leaves it alone. A resume appends ``JobResumed``: the job waits again in its
original place, and its next attempt resumes from its latest checkpoint; a resume before the suspension took
effect withdraws the request. Both answer 202 with the job's state once the fold has the event; a request
that cannot apply is a 409 naming the state (a finished job; a suspend of a suspended one; a resume of one
neither suspended nor being suspended).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Literal

from aiohttp import web

from rallypoint.eventlog import EventLog, LogUnavailable
from rallypoint.events import JobResumed, JobSuspendRequested, subjects
from rallypoint.events.subjects import TOKEN_PATTERN
from rallypoint.state import JobView

from .auth import not_theirs, principal
from .fold import FoldFollower
from .problems import not_found, problem, unavailable
from .views import job_links

Action = Literal["suspend", "resume"]

__all__ = ["add_suspend_routes"]


class SuspendOps:
    def __init__(
        self,
        log: EventLog,
        follower: FoldFollower,
        source: str,
        wait: float,
        ready: Callable[[], Awaitable[web.Response | None]],
    ) -> None:
        self.log = log
        self.follower = follower
        self.source = source
        self.wait = wait
        self.ready = ready

    async def suspend(self, request: web.Request) -> web.Response:
        return await self._act(request, "suspend")

    async def resume(self, request: web.Request) -> web.Response:
        return await self._act(request, "resume")

    async def _act(self, request: web.Request, action: Action) -> web.Response:
        if (not_ready := await self.ready()) is not None:
            return not_ready
        job_id = request.match_info["job_id"]
        job = self.follower.state.jobs.get(job_id) if TOKEN_PATTERN.match(job_id) else None
        if job is None:
            return not_found("job", job_id)
        if (refused := not_theirs(request, job)) is not None:
            return refused
        if (conflict := _conflict(job, action)) is not None:
            return conflict
        who = principal(request).user
        event = (
            JobSuspendRequested(job_id=job_id, at=time.time(), requested_by=who)
            if action == "suspend"
            else JobResumed(job_id=job_id, at=time.time(), requested_by=who)
        )
        try:
            # a retry of the same request (the job unchanged since) is de-duplicated by the server
            msg_id = f"{job_id}:{action}:{job.last_seq}"
            seq = await self.log.append(subjects.job(job_id), event, msg_id=msg_id, source=self.source)
        except LogUnavailable as exc:
            return unavailable(f"the event log did not acknowledge the {action} ({exc}); retry")
        self.follower.wrote(seq)
        await self.follower.wait_for_seq(seq, self.wait)
        current = self.follower.state.jobs.get(job_id, job)
        body = {
            "job_id": job_id,
            "seq": seq,
            "state": current.state,
            "suspend_requested": current.suspend_requested,
            "links": job_links(job_id),
        }
        return web.json_response(body, status=202)


def _conflict(job: JobView, action: Action) -> web.Response | None:
    """409 when ``action`` cannot apply to ``job`` in its state."""
    if job.terminal:
        detail = f"job {job.job_id} is already {job.state}; nothing to {action}"
    elif action == "suspend" and (job.state == "suspended" or job.suspend_requested):
        how = "suspended" if job.state == "suspended" else "being suspended"
        detail = f"job {job.job_id} is already {how}"
    elif action == "resume" and job.state != "suspended" and not job.suspend_requested:
        detail = f"job {job.job_id} is {job.state}, not suspended; nothing to resume"
    else:
        return None
    return problem(409, f"Cannot {action} the job", detail, slug=f"job-not-{action}able", state=job.state)


def add_suspend_routes(
    app: web.Application,
    log: EventLog,
    follower: FoldFollower,
    source: str,
    wait: float,
    ready: Callable[[], Awaitable[web.Response | None]],
) -> None:
    ops = SuspendOps(log, follower, source, wait, ready)
    app.router.add_post("/v1/jobs/{job_id}/suspend", ops.suspend)
    app.router.add_post("/v1/jobs/{job_id}/resume", ops.resume)
