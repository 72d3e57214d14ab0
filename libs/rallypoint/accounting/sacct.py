"""Finished jobs with Slurm ``sacct``-like columns (``rally history``): pure, over the fold and the ledger."""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from rallypoint.state import TERMINAL, ClusterState, JobView

from .attempts import AttemptLedger, charged_gpu_s, user_of


class FinishedJob(msgspec.Struct, kw_only=True):
    job_id: str
    name: str
    team: str
    user: str
    priority: str
    gpus: int
    state: str
    exit_code: int | None
    reason: str
    submitted_at: float
    first_started_at: float | None
    ended_at: float | None
    #: submission to end, minus the time ranks ran: waiting in the queue, before and between attempts
    queue_s: float
    run_s: float
    gpu_s: float
    gpu_hours: float
    attempts: int
    preemptions: int
    lost_gpu_s: float


def finished_job(job: JobView, ledger: AttemptLedger) -> FinishedJob:
    attempts = ledger.of(job.job_id)
    end = job.ended_at if job.ended_at is not None else job.submitted_at
    run_s = 0.0
    gpu_s = 0.0
    for rec in attempts:
        if rec.started_at is not None and rec.ended_at is not None:
            run_s += max(0.0, rec.ended_at - rec.started_at)
        gpu_s += charged_gpu_s(rec, None, None, end)
    starts = [r.started_at for r in attempts if r.started_at is not None]
    return FinishedJob(
        job_id=job.job_id,
        name=job.spec.name,
        team=job.spec.team,
        user=user_of(job, ledger.users.get(job.job_id)),
        priority=job.spec.priority,
        gpus=job.spec.gpus,
        state=job.state,
        exit_code=job.exit_code,
        reason=job.reason,
        submitted_at=job.submitted_at,
        first_started_at=min(starts) if starts else None,
        ended_at=job.ended_at,
        queue_s=max(0.0, end - job.submitted_at - run_s),
        run_s=run_s,
        gpu_s=gpu_s,
        gpu_hours=gpu_s / 3600,
        attempts=len(attempts),
        preemptions=job.preemptions,
        lost_gpu_s=job.lost_gpu_s,
    )


def finished_jobs(
    state: ClusterState,
    ledger: AttemptLedger,
    *,
    team: str | None = None,
    since: float | None = None,
    until: float | None = None,
    states: Collection[str] | None = None,
) -> list[FinishedJob]:
    """Jobs that ended in [since, until), oldest end first; ``states`` among the terminal ones."""
    rows = []
    for job in state.jobs.values():
        if job.state not in TERMINAL or job.ended_at is None:
            continue
        if team is not None and job.spec.team != team:
            continue
        if states is not None and job.state not in states:
            continue
        if (since is not None and job.ended_at < since) or (until is not None and job.ended_at >= until):
            continue
        rows.append(finished_job(job, ledger))
    rows.sort(key=lambda r: (r.ended_at or 0.0, r.job_id))
    return rows
