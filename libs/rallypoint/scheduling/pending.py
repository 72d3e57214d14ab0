"""The core's pending reasons as appends: kept fresh without flooding the log, and the impossible rejected.

A reason is appended when its code changes, and again when its numbers (message, position) change, at most
once every ``REFRESH_S`` per job and ``REFRESH_PER_CYCLE`` jobs per cycle, the stalest first: a queue of
thousands does not write thousands of events a cycle, and no reason stays stale for long ("4 free" after
12 were freed). The rule reads only the fold (the last reason's code, numbers and ``at``) and the cycle's
``at``, so it is recomputable from the log like every other decision.

A job the core says can never run (``GangTooLarge``: larger than the cluster, a task larger than any node,
a GPU type no node has; ``Invalid``: a spec no cluster satisfies) is rejected at once with the core's reason,
as the simulator rejects it, instead of waiting forever.
"""

from __future__ import annotations

import hashlib
import re

from rallypoint.core.types import Decisions, PendingReason
from rallypoint.events import JobPending, JobRejected, subjects
from rallypoint.state import ClusterState, JobView

from .writes import Write

#: Seconds between two refreshes of one job's numbers (a code change is written at once).
REFRESH_S = 15.0
#: Refreshes of numbers alone per cycle at most (the stalest first); code changes are not counted.
REFRESH_PER_CYCLE = 128
#: Codes that no change of the cluster's load can clear: the job is rejected.
NEVER_FITS: frozenset[str] = frozenset({"GangTooLarge", "Invalid"})

# The queue part the core appends to every reason; a rejection has no queue to be in.
_AHEAD = re.compile(r"; \d+ jobs? ahead$")


def pending_writes(
    decisions: Decisions, state: ClusterState, *, epoch: int, policy_version: str, at: float
) -> list[Write]:
    """Rejections and changed codes (in decision order), then the stalest changed numbers."""
    writes: list[Write] = []
    stale: list[tuple[float, str, PendingReason, JobView]] = []
    for reason in decisions.pending:
        job = state.jobs.get(reason.job_id)
        if job is None or job.state != "pending":
            continue
        if reason.code in NEVER_FITS:
            writes.append(rejection(reason, job, at=at))
        elif job.pending_code != reason.code:
            writes.append(
                _reason(
                    reason, job, state, epoch=epoch, policy_version=policy_version, at=at, now=decisions.now
                )
            )
        elif _numbers_changed(reason, job) and _due(job, at):
            stale.append(
                (job.pending_at if job.pending_at is not None else float("-inf"), job.job_id, reason, job)
            )
    stale.sort(key=lambda s: (s[0], s[1]))
    writes.extend(
        _reason(reason, job, state, epoch=epoch, policy_version=policy_version, at=at, now=decisions.now)
        for _at, _id, reason, job in stale[:REFRESH_PER_CYCLE]
    )
    return writes


def rejection_writes(decisions: Decisions, state: ClusterState, *, at: float) -> list[Write]:
    """The rejections of ``pending_writes`` alone, in the same order: what a run forward that writes no
    reasons still folds (``predict.live``). No decision reads a pending reason, only its rejection."""
    return [
        rejection(reason, job, at=at)
        for reason in decisions.pending
        if reason.code in NEVER_FITS and (job := state.jobs.get(reason.job_id)) is not None
        if job.state == "pending"
    ]


def _numbers_changed(reason: PendingReason, job: JobView) -> bool:
    return reason.message != job.pending_message or reason.position != job.pending_position


def _due(job: JobView, at: float) -> bool:
    return job.pending_at is None or at - job.pending_at >= REFRESH_S


def _reason(
    reason: PendingReason,
    job: JobView,
    state: ClusterState,
    *,
    epoch: int,
    policy_version: str,
    at: float,
    now: float,
) -> Write:
    event = JobPending(
        job_id=reason.job_id,
        code=reason.code,
        message=reason.message,
        position=reason.position,
        epoch=epoch,
        computed_at_seq=state.last_seq,
        policy_version=policy_version,
        at=at,
        now=now,
    )
    # the numbers are in the id: a refresh at the same sequence with other numbers is a new event, a retry
    # of the same one is deduplicated
    digest = hashlib.sha256(f"{reason.position}\0{reason.message}".encode()).hexdigest()[:12]
    return Write(
        subject=subjects.pending(reason.job_id),
        event=event,
        msg_id=f"{reason.job_id}:{job.attempt}:JobPending:{state.last_seq}:{reason.code}:{digest}",
    )


def rejection(reason: PendingReason, job: JobView, *, at: float) -> Write:
    """``JobRejected`` with the core's reason (without its queue position): what can never be met."""
    why = _AHEAD.sub("", reason.message)
    event = JobRejected(job_id=job.job_id, field=_field(reason), at=at, reason=f"can never run here: {why}")
    return Write(subject=subjects.admission(job.job_id), event=event, msg_id=f"{job.job_id}:0:JobRejected")


def _field(reason: PendingReason) -> str | None:
    """The spec field the reason is about, when it names one."""
    if reason.code != "GangTooLarge":
        return None
    if reason.message.startswith("no node has GPU type"):
        return "gpu_type"
    if reason.message.startswith("a task needs"):
        return "gpus_per_task"
    return "gpus"
