"""The eviction protocol as the preemption service watches it. Pure.

The scheduler decides who is preempted (``PreemptionRequested``, one decision among a cycle's others); the
job controller stops the victim (SIGTERM, a grace period for a checkpoint, SIGKILL, then ``JobPreempted``
with the work lost since the newest complete checkpoint). The preemption service follows each request from
the log to its end: ``review`` says which evictions began, which outlived their grace period (a victim that
still holds GPUs its preemptor waits for), and which ended, with the time they took and the work lost.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import msgspec

from rallypoint.state import ACTIVE, ClusterState, JobView

#: An eviction is (job id, attempt): a job preempted again on a later attempt is a new eviction.
Key = tuple[str, int]


class Eviction(msgspec.Struct, frozen=True, kw_only=True):
    """One open request to stop a victim, from the moment the watcher first saw it."""

    job_id: str
    attempt: int
    for_job: str
    reason: str
    gpus: int
    seen_at: float
    lost_gpu_s_before: float


class Ended(msgspec.Struct, frozen=True, kw_only=True):
    eviction: Eviction
    took_s: float
    lost_gpu_s: float
    outcome: str  # the victim's state now: "pending" (preempted and requeued), or how it ended otherwise


class Review(msgspec.Struct, frozen=True, kw_only=True):
    open: dict[Key, Eviction]
    began: list[Eviction]
    overdue: list[Eviction]
    ended: list[Ended]


def _requested(job: JobView) -> bool:
    return job.preempt_for is not None and job.state in ACTIVE


def review(
    state: ClusterState,
    known: dict[Key, Eviction],
    warned: set[Key],
    now: float,
    *,
    overdue_after_s: float,
    touched: Collection[str] | None = None,
) -> Review:
    """Compare the fold's open requests with those ``known`` at the last review. ``warned``: the evictions
    already reported overdue (each is reported once). ``touched``: the jobs the fold changed since the last
    review (None: look at every job). Only an event about a job opens or closes its request, so the jobs
    touched and the open evictions are all a review must look at: the answer is the same as over every
    job, and its cost follows the events, not the jobs ever submitted."""
    current: dict[Key, Eviction] = {}
    began: list[Eviction] = []
    for job in _candidates(state, known, touched):
        if not _requested(job):
            continue
        key = (job.job_id, job.attempt)
        eviction = known.get(key)
        if eviction is None:
            eviction = Eviction(
                job_id=job.job_id,
                attempt=job.attempt,
                for_job=job.preempt_for or "",
                reason=job.preempt_reason,
                gpus=job.bound_gpus,
                seen_at=now,
                lost_gpu_s_before=job.lost_gpu_s,
            )
            began.append(eviction)
        current[key] = eviction
    overdue = [
        e for key, e in sorted(current.items()) if key not in warned and now - e.seen_at > overdue_after_s
    ]
    ended = [_ended(state, e, now) for key, e in sorted(known.items()) if key not in current]
    began.sort(key=lambda e: (e.job_id, e.attempt))
    return Review(open=dict(sorted(current.items())), began=began, overdue=overdue, ended=ended)


def _candidates(
    state: ClusterState, known: dict[Key, Eviction], touched: Collection[str] | None
) -> Iterable[JobView]:
    """Every job, or only those touched and those with an eviction open at the last review."""
    if touched is None:
        return state.jobs.values()
    ids = set(touched) | {job_id for job_id, _ in known}
    return [state.jobs[i] for i in sorted(ids) if i in state.jobs]


def _ended(state: ClusterState, eviction: Eviction, now: float) -> Ended:
    job = state.jobs.get(eviction.job_id)
    lost = job.lost_gpu_s - eviction.lost_gpu_s_before if job is not None else 0.0
    outcome = job.state if job is not None else "unknown"
    return Ended(eviction=eviction, took_s=now - eviction.seen_at, lost_gpu_s=lost, outcome=outcome)
